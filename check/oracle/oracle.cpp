#include "oracle/oracle.hpp"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace gradops::oracle {

double round_to(DType t, double v) {
  if (t == DType::f64 || !std::isfinite(v) || v == 0) return v;
  int mant_bits = 24, min_exp = -125, max_exp = 128;  // frexp convention: v = m * 2^e, m in [0.5, 1)
  if (t == DType::f16) mant_bits = 11, min_exp = -13, max_exp = 16;
  if (t == DType::bf16) mant_bits = 8;
  int e;
  std::frexp(v, &e);
  const int q = std::max(e, min_exp) - mant_bits;  // exponent of one unit in the last place
  const double r = std::ldexp(std::nearbyint(std::ldexp(v, -q)), q);  // nearbyint: ties to even
  int er;
  std::frexp(r, &er);
  if (r != 0 && er > max_exp) return std::copysign(std::numeric_limits<double>::infinity(), v);
  return r;
}

void fill_uniform(Tensor& x, DType t, double lo, double hi, Rng& rng) {
  std::uniform_real_distribution<double> u(lo, hi);
  for (double& v : x.v) v = round_to(t, u(rng));
}

Tensors make_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                    std::span<const DType> dt, Rng& rng) {
  Tensors out;
  if (make_activation_inputs(op, shape, attrs, dt, rng, out) || make_softmax_inputs(op, shape, attrs, dt, rng, out) ||
      make_layer_norm_inputs(op, shape, attrs, dt, rng, out) || make_batch_norm_inputs(op, shape, attrs, dt, rng, out))
    return out;
  throw std::invalid_argument("oracle: no input maker for " + std::string(op));
}

Tensors reference(std::string_view op, const Tensors& in, const Attrs& attrs) {
  Tensors out;
  if (activation_reference(op, in, attrs, out) || softmax_reference(op, in, attrs, out) ||
      layer_norm_reference(op, in, attrs, out) || batch_norm_reference(op, in, attrs, out))
    return out;
  throw std::invalid_argument("oracle: no reference for " + std::string(op));
}

}  // namespace gradops::oracle
