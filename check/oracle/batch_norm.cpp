// Oracle for the batch_norm family: per-channel statistics and gradients in float64 (long double
// sums), straight from docs/semantics.md B6, in either layout (attribute channels_last).
//
// Test data (the tolerances in check/harness/tolerance.cpp rely on these ranges):
//   X:     per channel an offset o in [-4, 4] and a spread s in [0.5, 2]; each value is
//          o ± s·U(0.5, 1), with the signs split as evenly as possible (floor(Mc/2) negative) and
//          shuffled. The two clusters lie at least s apart, so for Mc >= 2 the batch variance is at
//          least (2/9)·s²·(1 - rounding) and inv_std <= 4.6, |xhat| <= 4.7, |X| <= 6.1.
//   dY:    per channel an offset in [-1, 1] plus U(-1, 1): |dY| <= 2, and sum dY does not cancel
//          (the offset shrinks as 16384/Mc past Mc = 16384, keeping sums within f16's range).
//   scale: ±U(0.5, 1.5); B, input_mean: U(-1, 1); input_var: U(0.5, 2).
//   BatchNormalizationGrad's mean and "variance" (the inverse std) are what BatchNormInternal would
//   save for the rounded X: biased variance, epsilon from the attribute (1e-5 if it is 0 or less,
//   ORT's BatchNormalization default, so that Mc = 1 stays finite), rounded to T2.
//
// The split (gradops' own ops): BatchNormStatsReduce gives [Σ (x − K), Σ (x − K)², Mc] per channel
// about K = input_mean, BatchNormGradReduce [Σ dY, Σ dY·x̂, Mc]; the apply halves take such sums
// (made here exactly, from the same data, rounded to f64) and compute the fused op's outputs from
// them alone: mean = K + S1/Mc, biased variance = S2/Mc − (S1/Mc)², and the grad's formula with
// the given S1, S2 and Mc.
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "oracle/oracle.hpp"

namespace gradops::oracle {
namespace {

// X viewed per channel: value e of the flat tensor belongs to channel ch(e) as its m(e)-th value.
struct Layout {
  int64_t n = 1, c = 1, s = 1;  // NCHW [n, c, s] or NHWC [n, s, c]
  bool last = false;
  int64_t count() const { return n * s; }
  int64_t channel(int64_t e) const { return last ? e % c : (e / s) % c; }
};

Layout layout_of(const std::vector<int64_t>& shape, const Attrs& attrs) {
  Layout l;
  auto it = attrs.find("channels_last");
  l.last = it != attrs.end() && it->second != 0;
  const int r = static_cast<int>(shape.size());
  if (r == 0) return l;  // a scalar: one value of one channel
  l.n = shape[0];
  if (r == 1) return l;
  l.c = l.last ? shape[r - 1] : shape[1];
  l.s = 1;
  for (int i = 1; i < r; ++i)
    if (i != (l.last ? r - 1 : 1)) l.s *= shape[i];
  return l;
}

double attr_or(const Attrs& a, const char* name, double fallback) {
  auto it = a.find(name);
  return it == a.end() ? fallback : it->second;
}

// Saved epsilon for the grad's statistics (its own attribute is unused by the op).
double stats_epsilon(const Attrs& a) {
  const double e = attr_or(a, "epsilon", 1e-5);
  return e > 0 ? e : 1e-5;
}

struct Stats {
  std::vector<double> mean, var;  // biased
};

// Two-pass mean and biased variance per channel in long double.
Stats channel_stats(const Tensor& x, const Layout& l) {
  std::vector<long double> sum(l.c, 0.0L), sq(l.c, 0.0L);
  for (int64_t e = 0; e < x.numel(); ++e) sum[l.channel(e)] += x.v[e];
  Stats st;
  st.mean.assign(l.c, 0.0);
  st.var.assign(l.c, 0.0);
  const int64_t mc = l.count();
  if (mc == 0) return st;
  for (int64_t ch = 0; ch < l.c; ++ch) st.mean[ch] = static_cast<double>(sum[ch] / mc);
  for (int64_t e = 0; e < x.numel(); ++e) {
    const long double d = static_cast<long double>(x.v[e]) - st.mean[l.channel(e)];
    sq[l.channel(e)] += d * d;
  }
  for (int64_t ch = 0; ch < l.c; ++ch) st.var[ch] = static_cast<double>(sq[ch] / mc);
  return st;
}

Tensor make_x(const std::vector<int64_t>& shape, const Layout& l, DType t, Rng& rng) {
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  Tensor x(shape);
  const int64_t mc = l.count();
  std::vector<double> offset(l.c), spread(l.c);
  std::vector<std::vector<signed char>> signs(l.c);
  std::vector<int64_t> next(l.c, 0);
  for (int64_t ch = 0; ch < l.c; ++ch) {
    offset[ch] = -4 + 8 * u01(rng);
    spread[ch] = 0.5 + 1.5 * u01(rng);
    signs[ch].assign(mc, 1);
    std::fill(signs[ch].begin(), signs[ch].begin() + mc / 2, -1);
    std::shuffle(signs[ch].begin(), signs[ch].end(), rng);
  }
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t ch = l.channel(e);
    x.v[e] = round_to(t, offset[ch] + signs[ch][next[ch]++] * spread[ch] * (0.5 + 0.5 * u01(rng)));
  }
  return x;
}

Tensor channel_vector(int64_t c, DType t, double lo, double hi, Rng& rng, bool random_sign = false) {
  Tensor v({c});
  fill_uniform(v, DType::f64, lo, hi, rng);
  std::bernoulli_distribution coin(0.5);
  for (double& e : v.v) e = round_to(t, random_sign && coin(rng) ? -e : e);
  return v;
}

// The shift of the forward's sums: input_mean, or 0 where it is not finite (any shared value
// serves; a non-finite one would poison the statistics).
double shift_of(double input_mean) { return std::isfinite(input_mean) ? input_mean : 0.0; }

// Σ (x − K) and Σ (x − K)² per channel, K = shift_of(shift).
std::pair<std::vector<long double>, std::vector<long double>> shifted_sums(const Tensor& x, const Layout& l,
                                                                         const Tensor& shift) {
  std::vector<long double> s1(l.c, 0.0L), s2(l.c, 0.0L);
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t ch = l.channel(e);
    const long double d = static_cast<long double>(x.v[e]) - shift_of(shift.v[ch]);
    s1[ch] += d;
    s2[ch] += d * d;
  }
  return {s1, s2};
}

// Σ dY and Σ dY·x̂ per channel, x̂ = (x − mean)·inv_std with the given statistics.
std::pair<std::vector<long double>, std::vector<long double>> grad_sums(const Tensor& dy, const Tensor& x,
                                                                      const Layout& l, const Tensor& mean,
                                                                      const Tensor& inv_std) {
  std::vector<long double> s1(l.c, 0.0L), s2(l.c, 0.0L);
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t ch = l.channel(e);
    s1[ch] += dy.v[e];
    s2[ch] += dy.v[e] * ((static_cast<long double>(x.v[e]) - mean.v[ch]) * inv_std.v[ch]);
  }
  return {s1, s2};
}

// The split's sums tensor [S1 per channel, S2 per channel, count], rounded to f64 as stored.
Tensor sums_tensor(const std::vector<long double>& s1, const std::vector<long double>& s2, int64_t count) {
  const int64_t c = static_cast<int64_t>(s1.size());
  Tensor t({2 * c + 1});
  for (int64_t ch = 0; ch < c; ++ch) {
    t.v[ch] = static_cast<double>(s1[ch]);
    t.v[c + ch] = static_cast<double>(s2[ch]);
  }
  t.v[2 * c] = static_cast<double>(count);
  return t;
}

bool is_batch_norm(std::string_view op) {
  return op == "BatchNormalizationGrad" || op == "BatchNormInternal" || op == "BatchNormStatsReduce" ||
         op == "BatchNormStatsApply" || op == "BatchNormGradReduce" || op == "BatchNormGradApply";
}

}  // namespace

bool make_batch_norm_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                            std::span<const DType> dt, Rng& rng, Tensors& out) {
  if (!is_batch_norm(op)) return false;
  const bool grad = op == "BatchNormalizationGrad" || op == "BatchNormGradReduce" || op == "BatchNormGradApply";
  const std::vector<int64_t> s(shape.begin(), shape.end());
  const Layout l = layout_of(s, attrs);
  if (op == "BatchNormStatsReduce") {  // X, input_mean
    out.push_back(make_x(s, l, dt[0], rng));
    out.push_back(channel_vector(l.c, dt[1], -1, 1, rng));
    return true;
  }
  if (grad) {
    // dY, X, scale, mean, variance (= saved inverse std); the reduce half takes no scale. Its
    // dtypes: dt[2] is scale's, or the statistics' when there is no scale.
    const bool with_scale = op != "BatchNormGradReduce";
    const DType t_stats = with_scale ? dt[3] : dt[2];
    Tensor dy(s);
    std::uniform_real_distribution<double> u(-1.0, 1.0);
    // The offset shrinks beyond 16,384 values per channel so that Σ dY stays within f16's range.
    const double shrink = std::min(1.0, 16384.0 / static_cast<double>(std::max<int64_t>(l.count(), 1)));
    std::vector<double> dy_offset(l.c);
    for (double& o : dy_offset) o = shrink * u(rng);
    for (int64_t e = 0; e < dy.numel(); ++e) dy.v[e] = round_to(dt[0], dy_offset[l.channel(e)] + u(rng));
    Tensor x = make_x(s, l, dt[1], rng);
    Tensor scale = channel_vector(l.c, with_scale ? dt[2] : DType::f64, 0.5, 1.5, rng, true);
    const Stats st = channel_stats(x, l);
    const double eps = stats_epsilon(attrs);
    Tensor mean({l.c}), inv_std({l.c});
    for (int64_t ch = 0; ch < l.c; ++ch) {
      mean.v[ch] = round_to(t_stats, st.mean[ch]);
      inv_std.v[ch] = round_to(t_stats, 1.0 / std::sqrt(st.var[ch] + eps));
    }
    Tensor sums;
    if (op == "BatchNormGradApply") {
      const auto [s1, s2] = grad_sums(dy, x, l, mean, inv_std);
      sums = sums_tensor(s1, s2, l.count());
    }
    out.push_back(std::move(dy));
    out.push_back(std::move(x));
    if (with_scale) out.push_back(std::move(scale));
    out.push_back(std::move(mean));
    out.push_back(std::move(inv_std));
    if (op == "BatchNormGradApply") out.push_back(std::move(sums));
    return true;
  }
  // X, scale, B, input_mean, input_var
  out.push_back(make_x(s, l, dt[0], rng));
  out.push_back(channel_vector(l.c, dt[1], 0.5, 1.5, rng, true));
  out.push_back(channel_vector(l.c, dt[2], -1, 1, rng));
  out.push_back(channel_vector(l.c, dt[3], -1, 1, rng));
  out.push_back(channel_vector(l.c, dt[4], 0.5, 2, rng));
  if (op == "BatchNormStatsApply") {
    const auto [s1, s2] = shifted_sums(*out[0], l, *out[3]);
    out.push_back(sums_tensor(s1, s2, l.count()));
  }
  return true;
}

bool batch_norm_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out) {
  if (!is_batch_norm(op)) return false;
  const bool grad = op == "BatchNormalizationGrad" || op == "BatchNormGradReduce" || op == "BatchNormGradApply";
  const Tensor& x = *in[grad ? 1 : 0];
  const Layout l = layout_of(x.shape, attrs);
  const int64_t local = l.count();
  // Mc: this call's count, or for the apply halves the count in their sums, a real number (the
  // formulas take it as given: the contract makes it the participants' total, an integer).
  long double mc = static_cast<long double>(local);

  if (op == "BatchNormStatsReduce") {
    const auto [s1, s2] = shifted_sums(x, l, *in[1]);
    out.push_back(sums_tensor(s1, s2, local));
    return true;
  }
  if (op == "BatchNormGradReduce") {
    const auto [s1, s2] = grad_sums(*in[0], x, l, *in[2], *in[3]);
    out.push_back(sums_tensor(s1, s2, local));
    return true;
  }

  if (grad) {
    // xhat = (x - mean)·inv_std with the given statistics; S1 = Σ dY, S2 = Σ dY·xhat per channel;
    // X_grad = scale·inv_std·(dY - S1/Mc - xhat·S2/Mc), scale_grad = S2, bias_grad = S1. The apply
    // half takes S1, S2 and Mc from its sums.
    const Tensor &dy = *in[0], &scale = *in[2], &mean = *in[3], &inv_std = *in[4];
    auto [s1, s2] = grad_sums(dy, x, l, mean, inv_std);
    if (op == "BatchNormGradApply") {
      const Tensor& sums = *in[5];
      for (int64_t ch = 0; ch < l.c; ++ch) s1[ch] = sums.v[ch], s2[ch] = sums.v[l.c + ch];
      mc = sums.v[2 * l.c];
    }
    auto xhat = [&](int64_t e) {
      const int64_t ch = l.channel(e);
      return (static_cast<long double>(x.v[e]) - mean.v[ch]) * inv_std.v[ch];
    };
    // No count (an apply half given Mc <= 0): nothing to subtract.
    const long double inv_mc = mc > 0 ? 1.0L / mc : 0.0L;
    Tensor dx(x.shape), dscale({l.c}), dbias({l.c});
    for (int64_t e = 0; e < x.numel(); ++e) {
      const int64_t ch = l.channel(e);
      const long double k = static_cast<long double>(scale.v[ch]) * inv_std.v[ch];
      dx.v[e] = static_cast<double>(k * (dy.v[e] - s1[ch] * inv_mc - xhat(e) * s2[ch] * inv_mc));
    }
    for (int64_t ch = 0; ch < l.c; ++ch) {
      dscale.v[ch] = static_cast<double>(s2[ch]);
      dbias.v[ch] = static_cast<double>(s1[ch]);
    }
    out.push_back(std::move(dx));
    out.push_back(std::move(dscale));
    out.push_back(std::move(dbias));
    return true;
  }

  // Training step. Mc = 0: running statistics pass through, saved ones are mean 0 and
  // 1/sqrt(epsilon). Mc = 1: the unbiased variance is undefined, running_var is NaN.
  const Tensor &scale = *in[1], &b = *in[2], &old_mean = *in[3], &old_var = *in[4];
  const double eps = attr_or(attrs, "epsilon", 1e-5), m = attr_or(attrs, "momentum", 0.9);
  Stats st = channel_stats(x, l);
  std::vector<long double> unbiased_of;  // the apply half's, from its sums
  if (op == "BatchNormStatsApply") {  // the statistics from the given sums alone
    const Tensor& sums = *in[5];
    mc = sums.v[2 * l.c];
    unbiased_of.assign(l.c, 0.0L);
    for (int64_t ch = 0; ch < l.c; ++ch) {
      // M2 = S2 - S1·d, the sum of squared deviations; one value has none, and rounding may leave
      // it just below 0 (NaN stays NaN).
      const long double s1 = sums.v[ch], d = s1 / mc, raw = sums.v[l.c + ch] - s1 * d;
      const long double m2 = mc == 1 || raw < 0 ? 0.0L : raw;
      st.mean[ch] = mc > 0 ? static_cast<double>(shift_of(old_mean.v[ch]) + d) : 0.0;
      st.var[ch] = mc > 0 ? static_cast<double>(m2 / mc) : 0.0;
      unbiased_of[ch] = mc > 1 ? m2 / (mc - 1) : std::numeric_limits<long double>::quiet_NaN();
    }
  }
  Tensor y(x.shape), rmean({l.c}), rvar({l.c}), smean({l.c}), sistd({l.c});
  for (int64_t ch = 0; ch < l.c; ++ch) {
    const long double istd = 1.0L / std::sqrt(static_cast<long double>(st.var[ch]) + eps);
    smean.v[ch] = st.mean[ch];
    sistd.v[ch] = static_cast<double>(istd);
    if (!(mc > 0)) {
      rmean.v[ch] = old_mean.v[ch];
      rvar.v[ch] = old_var.v[ch];
      continue;
    }
    const long double unbiased = !unbiased_of.empty() ? unbiased_of[ch]
                                 : mc > 1           ? static_cast<long double>(st.var[ch]) * mc / (mc - 1)
                                                    : std::numeric_limits<long double>::quiet_NaN();
    rmean.v[ch] = static_cast<double>(m * static_cast<long double>(old_mean.v[ch]) + (1.0L - m) * st.mean[ch]);
    rvar.v[ch] = static_cast<double>(m * static_cast<long double>(old_var.v[ch]) + (1.0L - m) * unbiased);
  }
  // A channel whose variance plus epsilon is 0 has no normalized value: without spread every x is
  // the mean, and (x - mean)·inv_std is 0·inf, NaN, for every element. Said explicitly because the
  // split's mean, recovered from f64 sums about a shift, can miss x by a rounding and give ±inf.
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t ch = l.channel(e);
    y.v[e] = static_cast<long double>(st.var[ch]) + eps == 0
                 ? std::numeric_limits<double>::quiet_NaN()
                 : static_cast<double>((static_cast<long double>(x.v[e]) - st.mean[ch]) * sistd.v[ch] * scale.v[ch] +
                                       b.v[ch]);
  }
  out.push_back(std::move(y));
  out.push_back(std::move(rmean));
  out.push_back(std::move(rvar));
  out.push_back(std::move(smean));
  out.push_back(std::move(sistd));
  return true;
}

}  // namespace gradops::oracle
