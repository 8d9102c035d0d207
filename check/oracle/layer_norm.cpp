// Oracle for the LayerNorm family: the formulas of docs/semantics.md B5 in float64,
// with long double accumulators for every sum.
//
// Test data (the tolerance model in check/harness/tolerance.cpp relies on these bounds):
//   X row i   = o_i + s_i * z, o_i ~ U(-4, 4) (so the mean matters), s_i ~ U(0.5, 2), and z drawn from
//               U(-1, 1) then shifted and scaled to mean 0 and (biased) std 1 when cols >= 2 (z = 0
//               for cols = 1), so 1/std stays below about 2.2 after rounding X.
//   Y_grad    ~ U(-1, 1); scale: |scale| ~ U(0.5, 1.5) with a random sign; bias ~ U(-1, 1).
//   Statistics are computed from the rounded X in double (epsilon from the attributes, else 1e-5)
//   and rounded to U, in the shape the forward saves: [d0..d(axis-1), 1, ..., 1].
//   InvertibleLayerNormalizationGrad's Y is the forward of such an X (X itself is not an input),
//   computed in double and rounded to V; the reference rebuilds x-hat from that Y as the op does.
#include <cmath>

#include "oracle/oracle.hpp"

namespace gradops::oracle {
namespace {

using Real = long double;

enum class Op { ln_grad, invertible_grad, rms_grad, ln, rms, unknown };

Op op_of(std::string_view name) {
  if (name == "LayerNormalizationGrad") return Op::ln_grad;
  if (name == "InvertibleLayerNormalizationGrad") return Op::invertible_grad;
  if (name == "SimplifiedLayerNormalizationGrad") return Op::rms_grad;
  if (name == "LayerNormalization") return Op::ln;
  if (name == "SimplifiedLayerNormalization") return Op::rms;
  return Op::unknown;
}

double attr_or(const Attrs& a, const char* name, double fallback) {
  auto it = a.find(name);
  return it == a.end() ? fallback : it->second;
}

// rows x cols view of `shape` at the attribute axis, and the shapes of the per-row and per-column
// tensors.
struct Layout {
  int64_t rows = 1, cols = 1;
  std::vector<int64_t> stats_shape, scale_shape;
};

Layout layout(const std::vector<int64_t>& shape, const Attrs& attrs) {
  const int rank = static_cast<int>(shape.size());
  int64_t axis = static_cast<int64_t>(attr_or(attrs, "axis", -1));
  if (axis < 0) axis += rank;
  Layout l;
  for (int d = 0; d < rank; ++d) {
    if (d < axis) {
      l.rows *= shape[d];
      l.stats_shape.push_back(shape[d]);
    } else {
      l.cols *= shape[d];
      l.stats_shape.push_back(1);
      l.scale_shape.push_back(shape[d]);
    }
  }
  return l;
}

struct RowStats {
  double mean, inv_std;
};

// Two-pass mean and biased variance; mean 0 and variance 0 over zero columns.
RowStats ln_stats(const double* x, int64_t cols, double eps) {
  Real s = 0;
  for (int64_t j = 0; j < cols; ++j) s += x[j];
  const Real mean = cols ? s / cols : 0;
  Real q = 0;
  for (int64_t j = 0; j < cols; ++j) q += (x[j] - mean) * (x[j] - mean);
  const Real var = cols ? q / cols : 0;
  return {static_cast<double>(mean), static_cast<double>(1 / std::sqrt(var + static_cast<Real>(eps)))};
}

double rms_inv(const double* x, int64_t cols, double eps) {
  Real q = 0;
  for (int64_t j = 0; j < cols; ++j) q += static_cast<Real>(x[j]) * x[j];
  const Real ms = cols ? q / cols : 0;
  return static_cast<double>(1 / std::sqrt(ms + static_cast<Real>(eps)));
}

// X as described at the top of this file, rounded to t.
Tensor make_x(const std::vector<int64_t>& shape, const Layout& l, DType t, Rng& rng) {
  Tensor x(shape);
  std::uniform_real_distribution<double> offset(-4, 4), spread(0.5, 2), unit(-1, 1);
  std::vector<double> z(static_cast<std::size_t>(l.cols));
  for (int64_t i = 0; i < l.rows; ++i) {
    const double o = offset(rng), s = spread(rng);
    for (double& v : z) v = l.cols >= 2 ? unit(rng) : 0.0;
    if (l.cols >= 2) {
      Real m = 0, q = 0;
      for (double v : z) m += v;
      m /= l.cols;
      for (double v : z) q += (v - m) * (v - m);
      const Real sd = std::sqrt(q / l.cols);
      for (double& v : z) v = static_cast<double>((v - m) / sd);
    }
    for (int64_t j = 0; j < l.cols; ++j) x.v[i * l.cols + j] = round_to(t, o + s * z[j]);
  }
  return x;
}

Tensor make_scale(const Layout& l, DType t, Rng& rng) {
  Tensor s(l.scale_shape);
  std::uniform_real_distribution<double> mag(0.5, 1.5);
  std::bernoulli_distribution negative(0.5);
  for (double& v : s.v) v = round_to(t, negative(rng) ? -mag(rng) : mag(rng));
  return s;
}

}  // namespace

bool make_layer_norm_inputs(std::string_view name, std::span<const int64_t> shape_span, const Attrs& attrs,
                            std::span<const DType> dt, Rng& rng, Tensors& out) {
  const Op op = op_of(name);
  if (op == Op::unknown) return false;
  const std::vector<int64_t> shape(shape_span.begin(), shape_span.end());
  const Layout l = layout(shape, attrs);
  const double eps = attr_or(attrs, "epsilon", static_cast<float>(1e-5));

  if (op == Op::ln || op == Op::rms) {
    out.push_back(make_x(shape, l, dt[0], rng));
    out.push_back(make_scale(l, dt[1], rng));
    if (op == Op::ln) {
      Tensor b(l.scale_shape);
      fill_uniform(b, dt[2], -1, 1, rng);
      out.push_back(std::move(b));
    }
    return true;
  }

  Tensor dy(shape);
  fill_uniform(dy, dt[0], -1, 1, rng);
  // X in its storage type; for the invertible grad X is hidden, kept in double.
  const Tensor x = make_x(shape, l, op == Op::invertible_grad ? DType::f64 : dt[1], rng);
  Tensor scale = make_scale(l, dt[2], rng);
  const DType u = dt[op == Op::rms_grad ? 3 : 4];
  Tensor mean(l.stats_shape), inv(l.stats_shape);
  for (int64_t i = 0; i < l.rows; ++i) {
    const double* row = x.v.data() + i * l.cols;
    if (op == Op::rms_grad) {
      inv.v[i] = round_to(u, rms_inv(row, l.cols, eps));
    } else {
      const RowStats st = ln_stats(row, l.cols, eps);
      mean.v[i] = round_to(u, st.mean);
      inv.v[i] = round_to(u, st.inv_std);
    }
  }
  out.push_back(std::move(dy));
  if (op == Op::invertible_grad) {
    Tensor bias(l.scale_shape);
    fill_uniform(bias, dt[3], -1, 1, rng);
    Tensor y(shape);
    for (int64_t i = 0; i < l.rows; ++i) {
      const RowStats st = ln_stats(x.v.data() + i * l.cols, l.cols, eps);
      for (int64_t j = 0; j < l.cols; ++j) {
        const int64_t k = i * l.cols + j;
        const Real v = (static_cast<Real>(x.v[k]) - st.mean) * st.inv_std * scale.v[j] + bias.v[j];
        y.v[k] = round_to(dt[1], static_cast<double>(v));
      }
    }
    out.push_back(std::move(y));
    out.push_back(std::move(scale));
    out.push_back(std::move(bias));
    out.push_back(std::move(inv));
  } else {
    out.push_back(x);
    out.push_back(std::move(scale));
    if (op == Op::ln_grad) out.push_back(std::move(mean));
    out.push_back(std::move(inv));
  }
  return true;
}

bool layer_norm_reference(std::string_view name, const Tensors& in, const Attrs& attrs, Tensors& out) {
  const Op op = op_of(name);
  if (op == Op::unknown) return false;
  const bool forward = op == Op::ln || op == Op::rms;
  // The row structure comes from X, or from Y_grad for the invertible grad (as in ORT).
  const Tensor& main = *in[forward || op == Op::invertible_grad ? 0 : 1];
  const Layout l = layout(main.shape, attrs);
  const int64_t rows = l.rows, cols = l.cols;

  if (forward) {
    const double eps = attr_or(attrs, "epsilon", static_cast<float>(1e-5));
    const Tensor& x = *in[0];
    const Tensor& scale = *in[1];
    const Tensor* bias = op == Op::ln && in.size() > 2 && in[2] ? &*in[2] : nullptr;
    Tensor y(x.shape), mean(l.stats_shape), inv(l.stats_shape);
    for (int64_t i = 0; i < rows; ++i) {
      const double* row = x.v.data() + i * cols;
      const RowStats st = op == Op::rms ? RowStats{0.0, rms_inv(row, cols, eps)} : ln_stats(row, cols, eps);
      mean.v[i] = st.mean;
      inv.v[i] = st.inv_std;
      for (int64_t j = 0; j < cols; ++j) {
        const Real v = (static_cast<Real>(row[j]) - st.mean) * st.inv_std * scale.v[j];
        y.v[i * cols + j] = static_cast<double>(bias ? v + bias->v[j] : v);
      }
    }
    out.push_back(std::move(y));
    if (op == Op::ln) out.push_back(std::move(mean));
    out.push_back(std::move(inv));
    return true;
  }

  const Tensor& dy = *in[0];
  const Tensor& src = *in[1];  // X, or Y for the invertible grad
  const Tensor& scale = *in[2];
  const Tensor* mean = op == Op::ln_grad ? &*in[3] : nullptr;
  const Tensor& inv = *in[op == Op::rms_grad ? 3 : 4];
  const Tensor* bias = op == Op::invertible_grad ? &*in[3] : nullptr;
  Tensor dx(main.shape), dscale(scale.shape), dbias(scale.shape);
  std::vector<Real> ds(static_cast<std::size_t>(cols), 0), db(static_cast<std::size_t>(cols), 0);
  std::vector<Real> g(static_cast<std::size_t>(cols)), xh(static_cast<std::size_t>(cols));
  for (int64_t i = 0; i < rows; ++i) {
    const Real r = inv.v[i];
    Real s1 = 0, s2 = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t k = i * cols + j;
      if (op == Op::invertible_grad)
        xh[j] = (static_cast<Real>(src.v[k]) - bias->v[j]) / scale.v[j];
      else if (op == Op::rms_grad)
        xh[j] = src.v[k] * r;
      else
        xh[j] = (static_cast<Real>(src.v[k]) - mean->v[i]) * r;
      g[j] = static_cast<Real>(dy.v[k]) * scale.v[j];
      s1 += g[j];
      s2 += g[j] * xh[j];
      ds[j] += dy.v[k] * xh[j];
      db[j] += dy.v[k];
    }
    const Real m1 = op == Op::rms_grad ? 0 : s1 / cols, m2 = s2 / cols;
    for (int64_t j = 0; j < cols; ++j) dx.v[i * cols + j] = static_cast<double>(r * (g[j] - m1 - xh[j] * m2));
  }
  for (int64_t j = 0; j < cols; ++j) {
    dscale.v[j] = static_cast<double>(ds[j]);
    dbias.v[j] = static_cast<double>(db[j]);
  }
  out.push_back(std::move(dx));
  out.push_back(std::move(dscale));
  if (op != Op::rms_grad) out.push_back(std::move(dbias));
  return true;
}

}  // namespace gradops::oracle
