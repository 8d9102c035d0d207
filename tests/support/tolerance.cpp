// Tolerances: one table, per op family and dtype; docs/tolerances.md shows the same numbers.
//
// Model: |actual - expected| <= abs + rel * |expected|, with
//   u_out  = unit roundoff of the output's storage type (2^-24 f32, 2^-53 f64, 2^-11 f16, 2^-8 bf16)
//   u_c    = unit roundoff of the compute type (2^-24, or 2^-53 for f64)
// An output is rounded once, so rel starts at 2 u_out (one ulp); the computation adds k u_c, where
// k counts the roundings and the amplification of the formula; sums over n terms add n-dependent
// terms to abs, scaled by the magnitude of the terms the test data produces.
#include <cmath>

#include "support/checker.hpp"

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
  // k: roundings times amplification. The GELU family's erfc argument error is amplified by x^2
  // (inputs reach |x| = 7 with the bias); sigmoid/tanh forms by a few.
  double k = 8;
  switch (p.op) {
    case OpId::GeluGrad: case OpId::BiasGeluGrad_dX: case OpId::Gelu: case OpId::BiasGelu:
    case OpId::FastGeluGrad: case OpId::BiasFastGeluGrad_dX: case OpId::FastGelu:
      k = 128;
      break;
    case OpId::QuickGeluGrad: case OpId::QuickGelu: case OpId::Sigmoid: case OpId::Tanh:
      k = 32;
      break;
    default:
      break;
  }
  Tolerance tol{underflow_floor(t) + k * uc * 2.0 /* |dY| <= 2 */, 2 * uo + k * uc};
  if (op.outputs[output].name == "dB") {
    // A column sum over rows of dX: each term carries the dX tolerance, plus summation error.
    const int64_t cols = p.shape.empty() ? 1 : p.shape.back();
    const double rows = cols ? static_cast<double>(numel(p.shape) / std::max<int64_t>(cols, 1)) : 0;
    tol.abs += rows * (2 * uo + k * uc) * 2.0 + 2 * rows * uc * 2.0;
  }
  return tol;
}

Tolerance softmax(const Problem& p, int output) {
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t), uc = compute_roundoff(t);
  const double n = static_cast<double>(std::max<int64_t>(numel(p.shape), 1));
  return {underflow_floor(t) + 16 * uc * std::sqrt(n), 2 * uo + 16 * uc};
}

Tolerance layer_norm(const Problem& p, int output) {
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t), uc = compute_roundoff(t);
  const double n = static_cast<double>(std::max<int64_t>(numel(p.shape), 1));
  return {underflow_floor(t) + 16 * uc * std::sqrt(n), 2 * uo + 16 * uc};
}

Tolerance batch_norm(const Problem& p, int output) {
  const DType t = output_dtype(p, output);
  const double uo = unit_roundoff(t), uc = compute_roundoff(t);
  const double n = static_cast<double>(std::max<int64_t>(numel(p.shape), 1));
  return {underflow_floor(t) + 16 * uc * std::sqrt(n), 2 * uo + 16 * uc};
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
