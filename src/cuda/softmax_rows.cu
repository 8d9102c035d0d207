// Softmax family, CUDA: the implementation rows, one per kernel, in the order the op layer tries
// them (src/ops/softmax.cpp). Each row's declines() says everything its kernel needs, the alignment
// included, so that the row named by GRADOPS_VERBOSE=dispatch and implementation_name is the kernel
// that runs, and a row's run() never picks another kernel nor declines late. Contiguous rows
// (inner == 1), by row length (the shape arithmetic is in softmax_rows.cuh):
//
//   cuda:warp_per_row     up to 256 packs (128 of f64): part of a warp per row
//   cuda:block_per_row    up to one block's worth: the row in one block's registers
//   cuda:cluster_per_row  up to 16 blocks' worth: the row in a cluster's registers, where a
//                         cluster that holds it can be co-scheduled on this device (Hopper)
//   cuda:two_pass         the rest: the row streamed twice
// A non-last axis (inner > 1):
//   cuda:strided_held     the axis held in registers: threads along inner, lanes along the axis,
//                         a cluster of up to 16 blocks where one block cannot hold it
//   cuda:strided          the rest (axes longer than 16 blocks hold): two passes, a long axis over
//                         few columns split into chunks
//
// The kernels are in softmax_kernels.cuh (rows) and softmax_strided.cuh (a non-last axis), compiled
// per storage type (softmax_<dtype>.cu).
#include "cuda/softmax_rows.cuh"

namespace gradops::cuda {
namespace {

const char* not_rows(const SoftmaxDesc& d) {
  if (!element_aligned(d)) return "declines: a pointer is not aligned to its element size";
  if (d.inner != 1) return "declines: the axis is not the last one";
  return nullptr;
}

// The block and cluster rows: the row held on chip.
const char* not_held(const SoftmaxDesc& d) {
  if (const char* why = not_rows(d)) return why;
  if (d.axis_len > block_capacity(d) * max_cluster(d)) return "declines: the row is longer than a cluster of blocks holds";
  if (two_passes_faster(d)) return "declines: two passes were measured faster for such rows";
  return nullptr;
}

// What every row does before its kernel: an empty tensor launches nothing; then the current
// device's properties.
template <class Run>
Status run_row(const SoftmaxDesc& d, Run&& run) {
  const std::string_view op = op_schema(d.op).name;
  if (d.outer == 0 || d.axis_len == 0 || d.inner == 0) return {};
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_storage(d.dtype, [&](auto tag) -> Status { return run(tag, op, dev); });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

const char* cuda_softmax_warp_declines(const SoftmaxDesc& d) {
  if (const char* why = cuda::not_rows(d)) return why;
  if (cuda::warp_units(d) > 32 * cuda::warp_max_packs_per_lane(cuda::elem_size(d)))
    return "declines: the row is longer than a warp holds";
  return nullptr;
}
Status cuda_softmax_warp(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run_row(d, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::softmax_warp<decltype(tag)>(op, d, ctx, dev);
  });
}

const char* cuda_softmax_block_declines(const SoftmaxDesc& d) {
  if (const char* why = cuda::not_held(d)) return why;
  return cuda::row_blocks(d) > 1 ? "declines: the row is longer than one block holds" : nullptr;
}
Status cuda_softmax_block(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run_row(d, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::softmax_block<decltype(tag)>(op, d, ctx, dev);
  });
}

// Asks the device whether a cluster that holds the row can be co-scheduled. Where the question
// itself fails (no device, say), the row accepts, and its run() reports the error.
const char* cuda_softmax_cluster_declines(const SoftmaxDesc& d) {
  if (const char* why = cuda::not_held(d)) return why;
  if (cuda::row_blocks(d) == 1) return "declines: one block holds the row";
  if (d.outer == 0) return nullptr;  // nothing to launch
  const std::string_view op = op_schema(d.op).name;
  cuda::DeviceInfo dev;
  if (!cuda::current_device(op, &dev)) return nullptr;
  int blocks = 0;
  const Status s = cuda::visit_storage(d.dtype, [&](auto tag) -> Status {
    return cuda::softmax_cluster_size<decltype(tag)>(op, d, dev, &blocks);
  });
  if (s && blocks == 0) return "declines: no cluster of blocks that holds the row can be co-scheduled on this device";
  return nullptr;
}
Status cuda_softmax_cluster(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run_row(d, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::softmax_cluster<decltype(tag)>(op, d, ctx, dev);
  });
}

const char* cuda_softmax_two_pass_declines(const SoftmaxDesc& d) { return cuda::not_rows(d); }
Status cuda_softmax_two_pass(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run_row(d, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::softmax_two_pass<decltype(tag)>(op, d, ctx, dev);
  });
}

// Like the cluster row, asks the device whether the plan's clusters can be co-scheduled.
const char* cuda_softmax_strided_held_declines(const SoftmaxDesc& d) {
  if (!cuda::element_aligned(d)) return "declines: a pointer is not aligned to its element size";
  if (d.inner == 1) return "declines: the axis is the last one";
  if (d.outer == 0 || d.axis_len == 0 || d.inner == 0) return nullptr;  // nothing to launch
  const cuda::StridedPlan plan = cuda::strided_plan(d);
  if (plan.blocks == 0) return "declines: the axis is longer than a cluster of 16 blocks holds";
  if (plan.blocks == 1) return nullptr;
  const std::string_view op = op_schema(d.op).name;
  cuda::DeviceInfo dev;
  if (!cuda::current_device(op, &dev)) return nullptr;
  bool fits = false;
  const Status s = cuda::visit_storage(d.dtype, [&](auto tag) -> Status {
    return cuda::softmax_strided_held_fits<decltype(tag)>(op, d, plan, dev, &fits);
  });
  if (s && !fits) return "declines: no cluster of blocks that holds the axis can be co-scheduled on this device";
  return nullptr;
}
Status cuda_softmax_strided_held(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run_row(d, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::softmax_strided_held<decltype(tag)>(op, d, ctx, dev);
  });
}

const char* cuda_softmax_strided_declines(const SoftmaxDesc& d) {
  return cuda::element_aligned(d) ? nullptr : "declines: a pointer is not aligned to its element size";
}
Status cuda_softmax_strided(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run_row(d, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::softmax_strided<decltype(tag)>(op, d, ctx, dev);
  });
}

}  // namespace gradops::detail
