// Softmax family, op layer: shape rules, the [outer, axis_len, inner] descriptor, the
// implementation list.
#include "ops/softmax.hpp"

#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {
namespace {

constexpr Impl<SoftmaxDesc> kImpls[] = {
    {"cpu:simd", DeviceType::cpu, nullptr, cpu_softmax, nullptr, cpu_simd_target},
#if GRADOPS_HAVE_CUDA
    // One row per kernel, in the order tried (src/cuda/softmax_rows.cu says what each takes).
    {"cuda:warp_per_row", DeviceType::cuda, cuda_softmax_warp_declines, cuda_softmax_warp},
    {"cuda:block_per_row", DeviceType::cuda, cuda_softmax_block_declines, cuda_softmax_block},
    {"cuda:cluster_per_row", DeviceType::cuda, cuda_softmax_cluster_declines, cuda_softmax_cluster},
    {"cuda:two_pass", DeviceType::cuda, cuda_softmax_two_pass_declines, cuda_softmax_two_pass},
    {"cuda:strided_held", DeviceType::cuda, cuda_softmax_strided_held_declines, cuda_softmax_strided_held},
    {"cuda:strided", DeviceType::cuda, cuda_softmax_strided_declines, cuda_softmax_strided},
#endif
};
constexpr auto kRows = row_infos(kImpls);

}  // namespace

std::span<const RowInfo> softmax_rows() { return kRows; }

Status run_softmax(const OpCall& c, const Context& ctx) {
  const OpSchema& op = *c.op;
  // Grads: (dY, Y) -> dX (LogSoftmaxGrad's ORT name for Y is "X"). Forwards: (input) -> output.
  const TensorView& first = c.input(0);
  if (op.gradient)
    if (Status s = require_same_shape(c, c.in_name(1), c.input(1), c.in_name(0), first); !s) return s;
  if (Status s = require_same_shape(c, c.out_name(0), c.output(0), c.in_name(0), first); !s) return s;
  // A rank-0 tensor has no axis: the range [0, -1] is empty, so normalize_axis rejects it.
  int axis = 0;
  if (Status s = normalize_axis(c, static_cast<int64_t>(c.attribute("axis", 0)), first.rank, &axis); !s) return s;

  SoftmaxDesc d{};
  d.op = op.id;
  d.kind = softmax_kind(op.id);
  d.dtype = c.types[0];
  if (first.numel() == 0) {
    // Nothing to compute; the other dims of an empty tensor may multiply past int64.
    d.outer = d.axis_len = d.inner = 0;
  } else if (softmax_single_axis(op.id)) {
    d.outer = dims_product(first, 0, axis);
    d.axis_len = first.dims[axis];
    d.inner = dims_product(first, axis + 1, first.rank);
  } else {
    d.outer = dims_product(first, 0, axis);
    d.axis_len = dims_product(first, axis, first.rank);
    d.inner = 1;
  }
  d.dy = op.gradient ? first.data : nullptr;
  d.y = op.gradient ? c.input(1).data : first.data;
  d.out = c.output(0).data;
  return dispatch<SoftmaxDesc>(kImpls, c, d, ctx);
}

}  // namespace gradops::detail
