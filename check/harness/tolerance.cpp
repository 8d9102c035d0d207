// Tolerances: one table, per op family and dtype; docs/tolerances.md shows the same numbers.
//
// Model: |actual - expected| <= abs + rel * |expected|, with
//   u_out  = unit roundoff of the output's storage type (2^-24 f32, 2^-53 f64, 2^-11 f16, 2^-8 bf16)
//   u_c    = unit roundoff of the compute type (2^-24, or 2^-53 for f64)
// An output is rounded once, so rel starts at 2 u_out (one ulp); the computation adds k u_c, where
// k counts the roundings and the amplification of the formula; sums over n terms add n-dependent
// terms to abs, scaled by the magnitude of the terms the test data produces.
#include <cmath>

#include "harness/checker.hpp"

namespace gradops::check {
namespace {

double unit_roundoff(DType t) {
  switch (t) {
    case DType::f64: return 0x1p-53;
    case DType::f16: return 0x1p-11;
    case DType::bf16: return 0x1p-8;
    case DType::f32: break;
  }
  return 0x1p-24;
}
// Smallest positive subnormal: the absolute floor of an output that underflows.
double underflow_floor(DType t) {
  switch (t) {
    case DType::f64: return 0x1p-1074;
    case DType::f16: return 0x1p-24;
    case DType::bf16: return 0x1p-133;
    case DType::f32: break;
  }
  return 0x1p-149;
}
double compute_roundoff(DType t) { return t == DType::f64 ? 0x1p-53 : 0x1p-24; }

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Tolerance activation(const Problem& p, int output) {
  const OpSchema& op = op_schema(p.op);
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t), uc = compute_roundoff(t);
  // k: roundings times amplification, stated with each op's formula in the oracle's table.
  const double k = oracle::activation_amplification(op.name);
  Tolerance tol{underflow_floor(t) + k * uc * 2.0 /* |dY| <= 2 */, 2 * uo + k * uc};
  if (op.outputs[output].name == "dB") {
    // A column sum over rows of dX: each term carries the dX tolerance, plus summation error.
    const int64_t cols = p.shape.empty() ? 1 : p.shape.back();
    const double rows = cols ? static_cast<double>(numel(p.shape) / std::max<int64_t>(cols, 1)) : 0;
    tol.abs += rows * (2 * uo + k * uc) * 2.0 + 2 * rows * uc * 2.0;
  }
  return tol;
}

// Softmax family. The oracle draws x ~ U(-4, 4) (the forwards' input; the gradients' Y is the
// softmax or log-softmax of such an x, rounded to Y's dtype) and dY ~ U(-1, 1), sd_dy = 1/sqrt(3).
// With n the group length and lambda = 6:
//   L(n)  = min(n, lambda sqrt(n)): a sum of n terms in any fixed order (sequential, interleaved
//           lanes, a tree) has error <= L(n) u_c R, R a bound on its partial sums: n roundings at
//           worst, a random walk of sqrt(n) of them in practice (Higham and Mary's probabilistic
//           bound).
//   p_max bounds a group's largest probability: e^4 / (e^4 + (n-1) e^-4) always, and
//           e^4 / (n mu - lambda sqrt(n) sd) once the n draws of e^x (mean mu = 6.822, sd = 11.83)
//           concentrate. Typical probabilities are ~1/n, so this is what scales the gradients' abs.
// SoftmaxGrad:    dx = y (dy - s), s = sum(y dy). s's partial sums are below sum(y) = 1 and, as a
//   walk of mean-zero steps, below lambda sd_dy sqrt(sum y^2) <= lambda sd_dy sqrt(p_max): R is the
//   smaller. |err| <= y (L(n) + 1) u_c R (sum, products) + 3 u_c |dx| (dy - s, the product, the
//   f32 -> storage rounding counted in u_o): abs = p_max (L(n) + 1) u_c R, rel += 3 u_c.
// LogSoftmaxGrad: dx = dy - exp(y) S, S = sum(dy), R = min(n, lambda sd_dy sqrt(n)).
//   |err| <= exp(y) (L(n) + 3) u_c R (sum; exp, product) + u_c |dx| (the subtraction):
//   abs = p_max (L(n) + 3) u_c R, rel += 2 u_c.
// Softmax:        y = exp(x - m) / D. x - m is off by u_c |x - m| <= 8 u_c and exp by an ulp, so
//   every term by 10 u_c relative; D adds L(n) u_c; 1/D and the product 2 u_c:
//   rel += (L(n) + 22) u_c.
// LogSoftmax:     y = (x - m) - log D. Absolute: 8 u_c (x - m), (L(n) + 10) u_c (D's relative
//   error through log), u_c log n (rounding log D <= log n): abs = (L(n) + 19 + log n) u_c;
//   rel += 2 u_c (the subtraction, an ulp of slack).
// Each abs gets a factor 2 for what the model leaves out (second-order terms, exp(y) of a rounded
// log-probability exceeding p_max by up to |y| u_o).
Tolerance softmax(const Problem& p, int output) {
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t), uc = compute_roundoff(t);
  // n: the dims from the axis on (opset 1-12), or the one dim at the axis (the _13 names).
  const int64_t rank = static_cast<int64_t>(p.shape.size());
  const int64_t axis = static_cast<int64_t>(full_attrs(p).at("axis"));
  const int64_t a = std::max<int64_t>(axis < 0 ? axis + rank : axis, 0);
  const bool single = p.op == OpId::SoftmaxGrad_13 || p.op == OpId::LogSoftmaxGrad_13 ||
                      p.op == OpId::Softmax_13 || p.op == OpId::LogSoftmax_13;
  double n = 1;
  for (int64_t d = a; d < (single ? std::min(a + 1, rank) : rank); ++d) n *= static_cast<double>(p.shape[d]);
  n = std::max(n, 1.0);

  constexpr double kLambda = 6, kMu = 6.822, kSd = 11.83, kSdDy = 0.57735026918962576;
  const double e4 = std::exp(4.0);
  const double L = std::min(n, kLambda * std::sqrt(n));
  double p_max = e4 / (e4 + (n - 1) * std::exp(-4.0));
  if (const double low = n * kMu - kLambda * std::sqrt(n) * kSd; low > e4) p_max = std::min(p_max, e4 / low);

  const double floor = underflow_floor(t);
  switch (p.op) {
    case OpId::SoftmaxGrad: case OpId::SoftmaxGrad_13: {
      const double r = std::min(1.0, kLambda * kSdDy * std::sqrt(p_max));
      return {floor + 2 * p_max * (L + 1) * uc * r, 2 * uo + 3 * uc};
    }
    case OpId::LogSoftmaxGrad: case OpId::LogSoftmaxGrad_13: {
      const double r = std::min(n, kLambda * kSdDy * std::sqrt(n));
      return {floor + 2 * p_max * (L + 3) * uc * r, 2 * uo + 2 * uc};
    }
    case OpId::Softmax: case OpId::Softmax_13:
      return {floor, 2 * uo + (L + 22) * uc};
    default:  // LogSoftmax, LogSoftmax_13
      return {floor + 2 * (L + 19 + std::log(n)) * uc, 2 * uo + 2 * uc};
  }
}

// LayerNorm family. The data bounds come from the oracle (check/oracle/layer_norm.cpp): |dY| <= 1
// with sd 1/sqrt(3), 0.5 <= |scale| <= 1.5, |bias| <= 1, and each row of X is o + s z with |o| <= 4,
// 0.5 <= s <= 2 and z of mean 0 and rms 1 (|z| < 3). Hence, for cols n >= 2:
//   G = 1.5 >= |g| = |dy scale|; sd = G / sqrt(3) bounds the sd of g and of g xhat (rms xhat ~ 1);
//   Xh = 3 >= |xhat|; R = 2.5 >= r (1/std after rounding X); mean |x| <= 6 = Ax.
// For n = 1, r may reach 1/sqrt(epsilon) while xhat ~ 0 (LN) or |xhat| < 1 (RMSNorm).
// Compute roundoff u: 2^-53 when any of T, U, V is f64, else 2^-24 (that is what the kernels use).
// Sums, with lambda = 6 (Higham and Mary's probabilistic bounds, as for softmax), in any order:
//   mean-zero terms of sd sd and |term| <= M (the row sums S1, S2; the column sums dscale, dbias):
//     |err| <= u min(n^2 M, lambda sd n)  (n roundings of partial sums below n M, or a random walk)
//   positive terms summing to S (sum (x - mu)^2, sum x^2; sum |x| for sum x): |err| <= L(n) u S,
//     L(n) = min(n, lambda sqrt(n)).
// Gradients: dx = r (g - m1 - xhat m2), m1 = S1/n, m2 = S2/n, |m1| <= min(G, lambda sd / sqrt(n)),
//   |m2| <= min(G Xh, lambda sd / sqrt(n)).
//   e1 = err(S1)/n + u |m1|;  e2 = (err(S2) + E4)/n + u |m2|, E4 = u min(4 n G Xh, 4 lambda sd sqrt(n))
//   the terms' own errors (g, xhat (2), g xhat: 4 roundings each, independent from term to term)
//   |err dx| <= r [u (3 G + 2 |m1| + 4 Xh |m2|) (g, xhat m2, two subtractions) + e1 + Xh e2] + u |dx|.
//   dbias = sum over rows of dy (exact terms): err(m, 1/sqrt(3), 1).
//   dscale = sum over rows of dy xhat: err(m, 1/sqrt(3) * 1.1, Xh) + 3 u Xh min(m, lambda sqrt(m)).
// Forwards: e_mu = L(n) u Ax + u 4 (mean); var or mean square relative error (L(n) + 3) u, so r's
//   relative error is e_r = (L(n) + 3) u / 2 + 3 u (eps, sqrt, divide).
//   LN:  |err Y| <= 1.5 (r e_mu + Xh (e_r + 2 u)) + 2 u (|Y| <= 1.5 Xh + 1).
//   RMS: relative e_r + 3 u.
// Every abs gets a factor 2 for what the model leaves out (second-order terms); every output
// adds its own rounding, 2 u_o relative (one ulp), and the underflow floor.
Tolerance layer_norm(const Problem& p, int output) {
  const OpSchema& op = op_schema(p.op);
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t);
  bool f64 = false;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) f64 = f64 || p.sig.types[v] == DType::f64;
  const double u = f64 ? 0x1p-53 : 0x1p-24;
  const oracle::Attrs attrs = full_attrs(p);
  const int64_t rank = static_cast<int64_t>(p.shape.size());
  int64_t axis = static_cast<int64_t>(attrs.at("axis"));
  if (axis < 0) axis += rank;
  double m = 1, n = 1;
  for (int64_t d = 0; d < rank; ++d) (d < axis ? m : n) *= static_cast<double>(p.shape[d]);
  const double eps = attrs.count("epsilon") ? attrs.at("epsilon") : static_cast<double>(1e-5f);

  constexpr double kLambda = 6, G = 1.5, Ax = 6, kSdDy = 0.57735026918962576;
  const double sd = G * kSdDy;
  const double Xh = n >= 2 ? 3.0 : 1.0;
  const double R = n >= 2 ? 2.5 : 1 / std::sqrt(eps);
  auto L = [&](double k) { return std::min(k, kLambda * std::sqrt(k)); };
  auto zero_mean_err = [&](double k, double s, double M) { return u * std::min(k * k * M, kLambda * s * k); };
  const double floor = underflow_floor(t);
  const std::string_view name = op.outputs[output].name;

  if (op.gradient) {
    const double nn = std::max(n, 1.0);
    const bool rms = p.op == OpId::SimplifiedLayerNormalizationGrad;
    if (name == "X_grad") {
      const double m1 = rms ? 0 : std::min(G, kLambda * sd / std::sqrt(nn));
      const double m2 = std::min(G * Xh, kLambda * sd / std::sqrt(nn));
      const double e1 = rms ? 0 : zero_mean_err(nn, sd, G) / nn + u * m1;
      const double terms = u * std::min(nn * 4 * G * Xh, kLambda * 4 * sd * std::sqrt(nn));
      const double e2 = (zero_mean_err(nn, sd, G * Xh) + terms) / nn + u * m2;
      const double abs = R * (u * (3 * G + 2 * m1 + 4 * Xh * m2) + e1 + Xh * e2);
      return {floor + 2 * abs, 2 * uo + u};
    }
    if (name == "bias_grad") return {floor + 2 * zero_mean_err(m, kSdDy, 1), 2 * uo};
    // scale_grad
    return {floor + 2 * (zero_mean_err(m, kSdDy * 1.1, Xh) + 3 * u * Xh * L(m)), 2 * uo};
  }

  const double e_mu = L(n) * u * Ax + 4 * u;
  const double e_r = (L(n) + 3) * u / 2 + 3 * u;
  if (name == "Y") {
    if (p.op == OpId::SimplifiedLayerNormalization) return {floor, 2 * uo + 2 * (e_r + 3 * u)};
    return {floor + 2 * (1.5 * (R * e_mu + Xh * (e_r + 2 * u)) + 2 * u * (1.5 * Xh + 1)), 2 * uo};
  }
  if (name == "Mean") return {floor + 2 * e_mu, 2 * uo};
  return {floor, 2 * uo + 2 * e_r};  // InvStdDev, inv_std_var
}

// BatchNorm (both ops): worst-case bounds (Wilkinson style, not probabilistic), so a pass never
// depends on luck. Every implementation forms a channel sum over its Mc values so that no term sits
// behind more than k = min(Mc, 256) + 4·ceil(log2(Mc + 1)) + 8 roundings (sequential runs of at
// most 256 terms, combined by balanced trees; the CPU kernel's runs are <= 191 terms); a sum of
// terms t_i is then off by at most k·u_c·Σ|t_i|. The magnitudes are those of the oracle's test data
// (check/oracle/batch_norm.cpp): |dY| <= 2, |X| <= 6.1, |scale| <= 1.5, |B| <= 1, biased
// variance <= 4.1, input_var <= 2, and for Mc >= 2 inv_std <= 4.6, |xhat| <= min(4.7,
// sqrt(Mc - 1) + 0.02) (Samuelson's bound plus the rounding of the saved mean); for Mc = 1,
// inv_std <= 1/sqrt(epsilon) and xhat is 0 up to the rounding of mean to T2 times inv_std
// (6.1·u_T2/sqrt(epsilon), at least 2e-4), and |S2| = |dY·xhat|.
//   bias_grad  = S1 = Σ dY:            abs k·u_c·2·Mc
//   scale_grad = S2 = istd·Σ dY(x - mean): two more roundings per term, and Σ|dY·xhat| <= 2.1·Mc
//                (Cauchy-Schwarz: the rms of xhat is 1 up to the rounding of the statistics):
//                                      abs (k + 3)·u_c·2.1·Mc
//   X_grad = a·dY + b + c·(x - mean) with a = scale·istd, b = -a·S1/Mc, c = -a·istd·S2/Mc: the
//            errors of S1/Mc and S2/Mc scaled by |a| and |a·xhat|, a few roundings of each
//            coefficient, and 4 roundings of terms as large as |a|(|dY| + |S1|/Mc + |xhat S2|/Mc).
//            The cancellation in dY - S1/Mc - xhat·S2/Mc is why this is absolute, not relative.
//   Forward: the mean is off by (k + 2)·u_c·6.1 (0 for Mc = 1); the sum of squared deviations is a
//            sum of positive terms, so the variance is off by (k + 8)·u_c relatively, inv_std by
//            half that plus 3 roundings; running = m·old + (1 - m)·batch adds 3 roundings of each
//            term; Y = (x - mean)·(istd·scale) + B sees the mean's error times |scale|·istd and
//            inv_std's relative error times |scale·xhat|. The variance is formed in f64 from the
//            sums about K = input_mean, S2/Mc − d² with d = S1/Mc = mean − K, which cancels: it
//            adds c64·u64·(var + d²) absolutely, c64 = 4·ceil(log2(Mc + 1)) + 8 roundings, |d| <=
//            |X| + |input_mean| <= 7.1; relative to var + epsilon that is at most 907·c64·u64 for
//            Mc >= 2 (var >= 0.0556) and nothing for Mc = 1 (the variance of one value is 0).
//   The split (BatchNormStatsApply, BatchNormGradApply) has the fused op's bounds; the oracle gives
//   it exact sums. Its reduce halves' sums tensor: grad max(|ΔS1|, |ΔS2|) as above; forward
//   S1 = Σ (x − K) and S2 = Σ (x − K)², off by what summing the terms in the compute type costs:
//   |x − K| <= 7.1 gives (k + 1)·u_c·7.1·Mc for S1 and (k + 2)·u_c·50.4·Mc for S2, whether the
//   terms are taken about K directly or about a piece's mean m (|x − m| <= 4, with 2·|m − K|·|ΔΣ(x −
//   m)| <= 57·(k + 1)·u_c·Mc), plus c64·u64·101·Mc for the f64 additions; the count is exact.
// Every output also gets rel = 2·u_out for its own rounding. f16/bf16 storage enters only there:
// inputs are exact in the compute type and the reference uses the statistics as stored.
Tolerance batch_norm(const Problem& p, int output) {
  const oracle::Attrs at = full_attrs(p);
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t), uc = compute_roundoff(p.sig.types[0]), floor = underflow_floor(t);
  const int rank = static_cast<int>(p.shape.size());
  const bool last = at.count("channels_last") && at.at("channels_last") != 0;
  const int64_t channels = rank < 2 ? 1 : last ? p.shape[rank - 1] : p.shape[1];
  const double mc = channels ? static_cast<double>(numel(p.shape) / channels) : 0;
  const double k = std::min(mc, 256.0) + 4 * std::ceil(std::log2(mc + 1)) + 8;
  const double dy_max = 2, x_max = 6.1, scale_max = 1.5, b_max = 1, var_max = 4.1, old_var_max = 2;
  const double eps = at.count("epsilon") ? at.at("epsilon") : 0;
  const bool grad = p.op == OpId::BatchNormalizationGrad || p.op == OpId::BatchNormGradApply ||
                    p.op == OpId::BatchNormGradReduce;
  const double u64 = 0x1p-53, c64 = 4 * std::ceil(std::log2(mc + 1)) + 8;
  const double stats_eps = grad ? (eps > 0 ? eps : 1e-5) : std::max(eps, 1e-30);
  const double istd_max = mc >= 2 ? 4.6 : 1 / std::sqrt(stats_eps);
  // Mc = 1: x - mean is the rounding of the mean to T2 (|x| <= 6.1), times inv_std, which a tiny
  // epsilon makes as large as 1/sqrt(epsilon): x̂ is then rounding noise, not bounded by the data.
  const double xhat_max =
      mc >= 2 ? std::min(4.7, std::sqrt(mc - 1) + 0.02)
              : std::max(2e-4, 1.01 * x_max * unit_roundoff(p.sig.types[2]) * istd_max);
  const std::string_view name = op_schema(p.op).outputs[output].name;
  if (grad) {
    const double n = std::max(mc, 1.0);
    // |S2|/Mc: at most 2.1 by Cauchy-Schwarz for Mc >= 2; for one value |dY·x̂|.
    const double m2 = mc >= 2 ? 2.1 : std::max(2.1, dy_max * xhat_max);
    const double e1 = k * uc * dy_max * n, e2 = (k + 3) * uc * m2 * n;  // |ΔS1|, |ΔS2|
    if (name == "sums") return {floor + std::max(e1, e2), 2 * uo};
    if (name == "bias_grad") return {floor + e1, 2 * uo};
    if (name == "scale_grad") return {floor + e2, 2 * uo};
    const double a = scale_max * istd_max, m1 = dy_max;  // |S1|/Mc
    const double e = a * (e1 / n + 3 * uc * m1) + a * xhat_max * (e2 / n + 5 * uc * m2) +
                     4 * uc * a * (dy_max + m1 + xhat_max * m2);
    return {floor + e, 2 * uo};
  }
  const double m = at.count("momentum") ? at.at("momentum") : 0.9, keep = std::fabs(1 - m);
  if (name == "sums") {
    const double n = std::max(mc, 1.0);
    const double e1 = (k + 1) * uc * 7.1 * n, e2 = std::max((k + 2) * uc * 50.4 * n, 57 * (k + 1) * uc * n + (k + 2) * uc * 16 * n);
    return {floor + std::max(e1, e2) + c64 * u64 * 101 * n, 2 * uo};
  }
  // mean = K + S1/Mc in f64 adds two f64 roundings of |K| + |mean − K| <= 7.1 (even for Mc = 1,
  // where the compute type's mean is otherwise exact).
  const double dmean = (mc > 1 ? (k + 2) * uc * x_max : 0) + 2 * u64 * 7.1;
  const double ev = (k + 8) * uc + (mc >= 2 ? 907 * c64 * u64 : 0);
  if (name == "saved_mean") return {floor + dmean, 2 * uo};
  if (name == "saved_inv_std") return {floor, 2 * uo + ev / 2 + 3 * uc};
  if (name == "running_mean") return {floor + keep * dmean + 3 * uc * (std::fabs(m) + keep * x_max), 2 * uo};
  if (name == "running_var") {
    const double unbiased_max = 2 * var_max;
    return {floor + keep * unbiased_max * (ev + 2 * uc) + 3 * uc * (std::fabs(m) * old_var_max + keep * unbiased_max),
            2 * uo};
  }
  const double e = scale_max * istd_max * dmean + scale_max * xhat_max * (ev / 2 + 4 * uc) +
                   4 * uc * (scale_max * xhat_max + b_max);
  return {floor + e, 2 * uo};  // Y
}

}  // namespace

Tolerance tolerance(const Problem& p, int output) {
  switch (op_schema(p.op).family) {
    case OpFamily::activation: return activation(p, output);
    case OpFamily::softmax: return softmax(p, output);
    case OpFamily::layer_norm: return layer_norm(p, output);
    case OpFamily::batch_norm: return batch_norm(p, output);
  }
  return {};
}

}  // namespace gradops::check
