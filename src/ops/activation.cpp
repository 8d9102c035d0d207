// Activation family, op layer: shape rules and the implementation list.
#include "ops/activation.hpp"

#include <array>
#include <string>

#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {
namespace {

constexpr Impl<ActivationDesc> kImpls[] = {
    {"cpu:simd", DeviceType::cpu, nullptr, cpu_activation, nullptr, cpu_simd_target},
#if GRADOPS_HAVE_CUDA
    {"cuda:vec16", DeviceType::cuda, cuda_activation_vec16_declines, cuda_activation_vec16},
    {"cuda:scalar", DeviceType::cuda, nullptr, cuda_activation_scalar},
#endif
};

constexpr auto kRows = row_infos(kImpls);

// Every op of the family maps to a Kind, and only Kinds that take a bias come with one.
constexpr bool contract_holds() {
  for (int i = 0; i < kNumOps; ++i) {
    const auto op = static_cast<OpId>(i);
    if (activation_bias_input(op) >= 0 && !activation_kind_takes_bias(activation_kind(op))) return false;
  }
  return true;
}
static_assert(contract_holds());

}  // namespace

std::span<const RowInfo> activation_rows() { return kRows; }

Status run_activation(const OpCall& c, const Context& ctx) {
  const OpSchema& op = *c.op;
  ActivationDesc d{};
  d.op = op.id;
  d.kind = activation_kind(op.id);
  d.dtype = c.types[0];
  d.alpha = static_cast<float>(c.attribute("alpha", 0.0));

  // Grads: (dY, X|Y[, B]) -> dX[, dB]. Forwards: (X[, bias]) -> Y.
  const int main_in = op.gradient ? 1 : 0;
  const TensorView& x = c.input(main_in);
  const TensorView& out = c.output(0);
  if (op.gradient)
    if (Status s = require_same_shape(c, c.in_name(1), x, c.in_name(0), c.input(0)); !s) return s;
  if (Status s = require_same_shape(c, c.out_name(0), out, c.in_name(0), c.input(0)); !s) return s;
  if (op.id == OpId::LeakyReluGrad && d.alpha < 0)
    return invalid(c, "attribute 'alpha' is " + std::to_string(d.alpha) +
                          ", expected >= 0 (the mask on Y is only a correct gradient for alpha >= 0)");

  const int bias_in = activation_bias_input(op.id);
  if (bias_in >= 0 && c.has_input(bias_in)) {
    const TensorView& b = c.input(bias_in);
    if (x.rank < 1)
      return invalid(c, "'" + std::string(c.in_name(main_in)) + "' has rank 0; a bias needs rank >= 1");
    const int64_t last = x.dims[x.rank - 1];
    if (b.rank != 1 || b.dims[0] != last)
      return invalid(c, "'" + std::string(c.in_name(bias_in)) + "' has shape " + shape_string(b.shape()) +
                            ", expected [" + std::to_string(last) + "] (1-D, the last dim of '" +
                            std::string(c.in_name(main_in)) + "')");
    d.cols = last;
    d.bias = b.data;
  }
  if (op.outputs.size() > 1 && c.has_output(1)) {  // dB
    const TensorView& db = c.output(1);
    const std::array<int64_t, 1> want{d.cols};
    if (db.rank != 1 || db.dims[0] != d.cols)
      return invalid(c, "'dB' has shape " + shape_string(db.shape()) + ", expected " + shape_string(want) +
                            " (the last dim of 'X')");
    d.db = db.data;
  }
  d.count = out.numel();
  d.dy = op.gradient ? c.input(0).data : nullptr;
  d.x = x.data;
  d.out = out.data;
  return dispatch<ActivationDesc>(kImpls, c, d, ctx);
}

}  // namespace gradops::detail
