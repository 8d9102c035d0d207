// Activation family, CUDA: the implementation rows, one per kernel, in the order the op layer tries
// them (src/ops/activation.cpp). Each row's declines() says everything its kernel needs, the
// alignment included, so that the row named by GRADOPS_VERBOSE=dispatch and implementation_name is
// the kernel that runs, and a row's run() never picks another kernel nor declines late. The
// choice, as measured on an H100 and an H200 (lab/cuda/NOTES.md):
//
//   every pointer at one offset from a 16-byte boundary, and for the bias forms rows of whole packs:
//     cuda:flat_bias_vec16  bias gradients without dB, not f64, rows from a 16-byte boundary
//     cuda:bias_row_vec16   16-bit bias gradients with dB, rows from a 16-byte boundary
//     cuda:bias_2d_vec16    the other bias calls (f32/f64 with dB, the forwards, rows off the boundary)
//     cuda:flat_vec16       no bias
//   otherwise, one element per access:
//     cuda:bias_2d_scalar   with a bias
//     cuda:flat_scalar      no bias
//
// The kernels are in activation_kernels.cuh, compiled per storage type (activation_<dtype>.cu).
#include <string>

#include "cuda/activation_rows.cuh"
#include "ops/activation.hpp"

namespace gradops::cuda {
namespace {

using detail::ActivationDesc;

int64_t pack_elems(const ActivationDesc& d) { return static_cast<int64_t>(16 / dtype_size(d.dtype)); }

// Every row: hardware loads of an element type need pointers aligned to its size.
const char* unaligned(const ActivationDesc& d) {
  const std::size_t es = dtype_size(d.dtype);
  for (const void* p : {d.dy, d.x, d.bias, static_cast<const void*>(d.out), static_cast<const void*>(d.db)})
    if (p && !aligned_to(p, es)) return "declines: a pointer is not aligned to its element size";
  return nullptr;
}

// The 16-byte rows: every pointer at the same offset from a 16-byte boundary (then every row's
// packs line up), and for the bias forms rows of whole packs (one bias pack per pack).
const char* not_vec16(const ActivationDesc& d) {
  if (const char* why = unaligned(d)) return why;
  const unsigned m = misalignment16(d.x);
  if ((d.dy && misalignment16(d.dy) != m) || misalignment16(d.out) != m)
    return "declines: the tensors sit at different offsets from a 16-byte boundary";
  if (d.bias) {
    if (misalignment16(d.bias) != m) return "declines: the bias sits at another offset from a 16-byte boundary";
    if (d.cols * static_cast<int64_t>(dtype_size(d.dtype)) % 16) return "declines: a row is not a whole number of 16-byte packs";
  }
  return nullptr;
}

// What every row does before its kernel: an empty tensor launches nothing (its dB, over zero rows,
// is zero: +0.0 has all-zero bits in every format); then the current device's properties.
template <class Run>
Status run_row(const ActivationDesc& d, const Context& ctx, Run&& run) {
  const std::string_view op = op_schema(d.op).name;
  if (d.count == 0) {
    if (d.db && d.cols > 0)
      return status_of(cudaMemsetAsync(d.db, 0, static_cast<std::size_t>(d.cols) * dtype_size(d.dtype), stream_of(ctx)),
                       op, "cudaMemsetAsync (dB of an empty tensor)");
    return {};
  }
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_storage(d.dtype, [&](auto tag) -> Status { return run(tag, op, dev); });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

using cuda::misalignment16;

const char* cuda_activation_flat_bias_vec16_declines(const ActivationDesc& d) {
  if (const char* why = cuda::not_vec16(d)) return why;
  if (!d.bias) return "declines: no bias";
  if (!detail::activation_is_grad(d.kind)) return "declines: not a bias gradient";
  if (d.dtype == DType::f64) return "declines: f64 (the 2-D kernel takes it)";
  if (d.db) return "declines: dB is wanted";
  if (misalignment16(d.x) != 0) return "declines: the rows do not start on a 16-byte boundary";
  if (d.cols % cuda::pack_elems(d)) return "declines: a row is not a whole number of 16-byte packs";
  if (d.count / cuda::pack_elems(d) >= (int64_t{1} << 32)) return "declines: 2^32 packs or more (32-bit pack indices)";
  return nullptr;
}
Status cuda_activation_flat_bias_vec16(const ActivationDesc& d, const Context& ctx) {
  return cuda::run_row(d, ctx, [&](auto tag, std::string_view op, const cuda::DeviceInfo&) {
    return cuda::activation_flat_bias<decltype(tag)>(op, d, ctx);
  });
}

const char* cuda_activation_bias_row_vec16_declines(const ActivationDesc& d) {
  if (const char* why = cuda::not_vec16(d)) return why;
  if (!d.bias) return "declines: no bias";
  if (!detail::activation_is_grad(d.kind)) return "declines: not a bias gradient";
  if (dtype_size(d.dtype) != 2) return "declines: not f16 or bf16 (f32 and f64 take the 2-D kernel)";
  if (!d.db) return "declines: dB is not wanted";
  if (misalignment16(d.x) != 0) return "declines: the rows do not start on a 16-byte boundary";
  if (d.cols % cuda::pack_elems(d)) return "declines: a row is not a whole number of 16-byte packs";
  return nullptr;
}
Status cuda_activation_bias_row_vec16(const ActivationDesc& d, const Context& ctx) {
  return cuda::run_row(d, ctx, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::activation_bias_row<decltype(tag)>(op, d, ctx, dev);
  });
}

const char* cuda_activation_bias_2d_vec16_declines(const ActivationDesc& d) {
  if (const char* why = cuda::not_vec16(d)) return why;
  return d.bias ? nullptr : "declines: no bias";
}
Status cuda_activation_bias_2d_vec16(const ActivationDesc& d, const Context& ctx) {
  return cuda::run_row(d, ctx, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::activation_bias_2d<decltype(tag)>(op, d, ctx, dev, true);
  });
}

const char* cuda_activation_flat_vec16_declines(const ActivationDesc& d) {
  if (const char* why = cuda::not_vec16(d)) return why;
  return d.bias ? "declines: a bias (the bias kernels take it)" : nullptr;
}
Status cuda_activation_flat_vec16(const ActivationDesc& d, const Context& ctx) {
  return cuda::run_row(d, ctx, [&](auto tag, std::string_view op, const cuda::DeviceInfo&) {
    return cuda::activation_flat<decltype(tag)>(op, d, ctx, true);
  });
}

const char* cuda_activation_bias_2d_scalar_declines(const ActivationDesc& d) {
  if (const char* why = cuda::unaligned(d)) return why;
  return d.bias ? nullptr : "declines: no bias";
}
Status cuda_activation_bias_2d_scalar(const ActivationDesc& d, const Context& ctx) {
  return cuda::run_row(d, ctx, [&](auto tag, std::string_view op, const cuda::DeviceInfo& dev) {
    return cuda::activation_bias_2d<decltype(tag)>(op, d, ctx, dev, false);
  });
}

const char* cuda_activation_flat_scalar_declines(const ActivationDesc& d) {
  if (const char* why = cuda::unaligned(d)) return why;
  return d.bias ? "declines: a bias (the bias kernels take it)" : nullptr;
}
Status cuda_activation_flat_scalar(const ActivationDesc& d, const Context& ctx) {
  return cuda::run_row(d, ctx, [&](auto tag, std::string_view op, const cuda::DeviceInfo&) {
    return cuda::activation_flat<decltype(tag)>(op, d, ctx, false);
  });
}

}  // namespace gradops::detail
