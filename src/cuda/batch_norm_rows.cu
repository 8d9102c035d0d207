// BatchNorm family, CUDA: the implementation rows, one per kernel, in the order the op layer tries
// them (src/ops/batch_norm.cpp). Each row's declines() says everything its kernels need, the
// alignment included, so that the row named by GRADOPS_VERBOSE=dispatch and implementation_name is
// the kernel that runs. By the walk a tensor takes (batch_norm_rows.cuh):
//
//   cuda:runs_vec16     NCHW runs of whole 16-byte packs, X, dY and the output 16-byte aligned
//   cuda:runs_vec8      else runs of whole 8-byte packs of 16-bit values (or f32 pairs), 8-byte
//                       aligned (bf16 14x14: 196 values, 392 bytes)
//   cuda:runs           NCHW runs, one element per access
//   cuda:columns_vec16  NHWC rows of whole 16-byte packs, X, dY and the output 16-byte aligned
//   cuda:columns        NHWC rows, one element per access
//
// (NCHW with one spatial position is NHWC memory and takes the columns rows; a single channel in
// either layout is one run.) The kernels are in batch_norm_kernels.cuh, compiled per storage type
// (batch_norm_<dtype>.cu).
#include "cuda/batch_norm_rows.cuh"

namespace gradops::cuda {
namespace {

using detail::BatchNormDesc;

BnCall call_of(const BatchNormDesc& d) {
  BnCall k;
  k.grad = d.op == OpId::BatchNormalizationGrad;
  k.t = d.t, k.t1 = d.t1, k.t2 = d.t2;
  k.n = d.n, k.c = d.c, k.spatial = d.spatial, k.channels_last = d.channels_last;
  k.x = d.x;
  k.scale = d.scale;
  if (k.grad) {
    k.dy = d.dy, k.mean = d.mean, k.inv_std = d.inv_std;
    k.out = d.dx, k.dscale = d.dscale, k.dbias = d.dbias;
  } else {
    k.bias = d.bias, k.input_mean = d.input_mean, k.input_var = d.input_var;
    k.out = d.y, k.running_mean = d.running_mean, k.running_var = d.running_var;
    k.saved_mean = d.saved_mean, k.saved_inv_std = d.saved_inv_std;
    k.epsilon = d.epsilon, k.momentum = d.momentum;
  }
  return k;
}

// Every row: aligned elements, and a grid that one launch can hold.
const char* unusable(const BnCall& d) {
  if (const char* why = bn_unaligned(d)) return why;
  if (d.c > (int64_t{1} << 30)) return "declines: more than 2^30 channels";
  return nullptr;
}

const char* not_runs(const BnCall& d) {
  if (const char* why = unusable(d)) return why;
  if (view_of(d).columns) return "declines: the channels are the fast axis (NHWC, or one spatial position)";
  return nullptr;
}
const char* not_columns(const BnCall& d) {
  if (const char* why = unusable(d)) return why;
  if (!view_of(d).columns) return "declines: the channels are not the fast axis (NCHW, or a single channel)";
  return nullptr;
}
constexpr const char* kNoPacks =
    "declines: X, dY or the output not on a 16-byte boundary, or runs (rows) not of whole 16-byte packs";
constexpr const char* kNoPacks8 =
    "declines: 16-byte packs fit, or X, dY or the output not on an 8-byte boundary, or runs not of whole 8-byte packs "
    "of at least two elements";

const char* declines(const BnCall& d, BnKernel k) {
  switch (k) {
    case BnKernel::runs_vec:
      if (const char* why = not_runs(d)) return why;
      return bn_packs(d) ? nullptr : kNoPacks;
    case BnKernel::runs_vec8:
      if (const char* why = not_runs(d)) return why;
      return !bn_packs(d) && bn_packs(d, 8) ? nullptr : kNoPacks8;
    case BnKernel::runs: return not_runs(d);
    case BnKernel::columns_vec:
      if (const char* why = not_columns(d)) return why;
      return bn_packs(d) ? nullptr : kNoPacks;
    case BnKernel::columns: break;
  }
  return not_columns(d);
}

Status run_kernel(const BnCall& d, std::string_view op, const Context& ctx, BnKernel k) {
  if (d.c == 0) return {};  // no channels: every output is empty
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_storage(d.t, [&](auto tag) -> Status { return batch_norm_run<decltype(tag)>(op, d, ctx, dev, k); });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

using cuda::BnKernel;

const char* cuda_batch_norm_runs_vec16_declines(const BatchNormDesc& d) {
  return cuda::declines(cuda::call_of(d), BnKernel::runs_vec);
}
Status cuda_batch_norm_runs_vec16(const BatchNormDesc& d, const Context& ctx) {
  return cuda::run_kernel(cuda::call_of(d), op_schema(d.op).name, ctx, BnKernel::runs_vec);
}
const char* cuda_batch_norm_runs_vec8_declines(const BatchNormDesc& d) {
  return cuda::declines(cuda::call_of(d), BnKernel::runs_vec8);
}
Status cuda_batch_norm_runs_vec8(const BatchNormDesc& d, const Context& ctx) {
  return cuda::run_kernel(cuda::call_of(d), op_schema(d.op).name, ctx, BnKernel::runs_vec8);
}
const char* cuda_batch_norm_runs_declines(const BatchNormDesc& d) { return cuda::declines(cuda::call_of(d), BnKernel::runs); }
Status cuda_batch_norm_runs(const BatchNormDesc& d, const Context& ctx) {
  return cuda::run_kernel(cuda::call_of(d), op_schema(d.op).name, ctx, BnKernel::runs);
}
const char* cuda_batch_norm_columns_vec16_declines(const BatchNormDesc& d) {
  return cuda::declines(cuda::call_of(d), BnKernel::columns_vec);
}
Status cuda_batch_norm_columns_vec16(const BatchNormDesc& d, const Context& ctx) {
  return cuda::run_kernel(cuda::call_of(d), op_schema(d.op).name, ctx, BnKernel::columns_vec);
}
const char* cuda_batch_norm_columns_declines(const BatchNormDesc& d) {
  return cuda::declines(cuda::call_of(d), BnKernel::columns);
}
Status cuda_batch_norm_columns(const BatchNormDesc& d, const Context& ctx) {
  return cuda::run_kernel(cuda::call_of(d), op_schema(d.op).name, ctx, BnKernel::columns);
}

}  // namespace gradops::detail
