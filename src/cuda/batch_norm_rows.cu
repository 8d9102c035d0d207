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
// either layout is one run.) Every row takes all six ops of the family: each op's descriptor
// becomes one BnCall (call_of), and the split's halves run the fused op's kernels up to or from
// the sums. The kernels are in batch_norm_kernels.cuh, compiled per storage type
// (batch_norm_<dtype>.cu).
#include "cuda/batch_norm_rows.cuh"

namespace gradops::cuda {
namespace {

using namespace detail;

void set_shape(BnCall& k, const BatchNormShape& s) {
  k.t = s.t, k.t1 = s.t1, k.t2 = s.t2;
  k.n = s.n, k.c = s.c, k.spatial = s.spatial, k.channels_last = s.channels_last;
}
BnCall call_of(const BatchNormGradDesc& d) {
  BnCall k;
  set_shape(k, d.shape);
  k.grad = true;
  k.x = d.x, k.dy = d.dy, k.scale = d.scale, k.mean = d.mean, k.inv_std = d.inv_std;
  k.out = d.dx, k.dscale = d.dscale, k.dbias = d.dbias;
  return k;
}
BnCall call_of(const BatchNormForwardDesc& d) {
  BnCall k;
  set_shape(k, d.shape);
  k.x = d.x, k.scale = d.scale, k.bias = d.bias, k.input_mean = d.input_mean, k.input_var = d.input_var;
  k.out = d.y, k.running_mean = d.running_mean, k.running_var = d.running_var;
  k.saved_mean = d.saved_mean, k.saved_inv_std = d.saved_inv_std;
  k.epsilon = d.epsilon, k.momentum = d.momentum;
  return k;
}
BnCall call_of(const BatchNormGradReduceDesc& d) {
  BnCall k;
  set_shape(k, d.shape);
  k.grad = true, k.mode = BnMode::reduce;
  k.x = d.x, k.dy = d.dy, k.mean = d.mean, k.inv_std = d.inv_std, k.sums_out = d.sums;
  return k;
}
BnCall call_of(const BatchNormGradApplyDesc& d) {
  BnCall k = call_of(d.grad);
  k.mode = BnMode::apply, k.sums_in = d.sums;
  return k;
}
BnCall call_of(const BatchNormStatsReduceDesc& d) {
  BnCall k;
  set_shape(k, d.shape);
  k.mode = BnMode::reduce;
  k.x = d.x, k.input_mean = d.input_mean, k.sums_out = d.sums;
  return k;
}
BnCall call_of(const BatchNormStatsApplyDesc& d) {
  BnCall k = call_of(d.fwd);
  k.mode = BnMode::apply, k.sums_in = d.sums;
  return k;
}

template <class Desc> constexpr const char* kOpName = "";
template <> constexpr const char* kOpName<BatchNormGradDesc> = "BatchNormalizationGrad";
template <> constexpr const char* kOpName<BatchNormForwardDesc> = "BatchNormInternal";
template <> constexpr const char* kOpName<BatchNormGradReduceDesc> = "BatchNormGradReduce";
template <> constexpr const char* kOpName<BatchNormGradApplyDesc> = "BatchNormGradApply";
template <> constexpr const char* kOpName<BatchNormStatsReduceDesc> = "BatchNormStatsReduce";
template <> constexpr const char* kOpName<BatchNormStatsApplyDesc> = "BatchNormStatsApply";

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
  if (d.c == 0) {  // no channels: every output is empty but the sums' count
    if (d.mode != BnMode::reduce) return {};
    // n·spatial in f64: with no channels the other dims may multiply past int64. The runtime
    // stages a pageable source before the call returns.
    const double count = static_cast<double>(d.n) * static_cast<double>(d.spatial);
    return status_of(cudaMemcpyAsync(d.sums_out, &count, sizeof count, cudaMemcpyHostToDevice, stream_of(ctx)), op,
                     "cudaMemcpyAsync (the count of a call without channels)");
  }
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_storage(d.t, [&](auto tag) -> Status { return batch_norm_run<decltype(tag)>(op, d, ctx, dev, k); });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

template <class Desc, CudaBatchNormKernel K>
const char* cuda_batch_norm_declines(const Desc& d) {
  return cuda::declines(cuda::call_of(d), static_cast<cuda::BnKernel>(K));
}
template <class Desc, CudaBatchNormKernel K>
Status cuda_batch_norm_run(const Desc& d, const Context& ctx) {
  return cuda::run_kernel(cuda::call_of(d), cuda::kOpName<Desc>, ctx, static_cast<cuda::BnKernel>(K));
}

// Every row for every op.
using K = CudaBatchNormKernel;
template const char* cuda_batch_norm_declines<BatchNormGradDesc, K::runs_vec16>(const BatchNormGradDesc&);
template Status cuda_batch_norm_run<BatchNormGradDesc, K::runs_vec16>(const BatchNormGradDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradDesc, K::runs_vec8>(const BatchNormGradDesc&);
template Status cuda_batch_norm_run<BatchNormGradDesc, K::runs_vec8>(const BatchNormGradDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradDesc, K::runs>(const BatchNormGradDesc&);
template Status cuda_batch_norm_run<BatchNormGradDesc, K::runs>(const BatchNormGradDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradDesc, K::columns_vec16>(const BatchNormGradDesc&);
template Status cuda_batch_norm_run<BatchNormGradDesc, K::columns_vec16>(const BatchNormGradDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradDesc, K::columns>(const BatchNormGradDesc&);
template Status cuda_batch_norm_run<BatchNormGradDesc, K::columns>(const BatchNormGradDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormForwardDesc, K::runs_vec16>(const BatchNormForwardDesc&);
template Status cuda_batch_norm_run<BatchNormForwardDesc, K::runs_vec16>(const BatchNormForwardDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormForwardDesc, K::runs_vec8>(const BatchNormForwardDesc&);
template Status cuda_batch_norm_run<BatchNormForwardDesc, K::runs_vec8>(const BatchNormForwardDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormForwardDesc, K::runs>(const BatchNormForwardDesc&);
template Status cuda_batch_norm_run<BatchNormForwardDesc, K::runs>(const BatchNormForwardDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormForwardDesc, K::columns_vec16>(const BatchNormForwardDesc&);
template Status cuda_batch_norm_run<BatchNormForwardDesc, K::columns_vec16>(const BatchNormForwardDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormForwardDesc, K::columns>(const BatchNormForwardDesc&);
template Status cuda_batch_norm_run<BatchNormForwardDesc, K::columns>(const BatchNormForwardDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradReduceDesc, K::runs_vec16>(const BatchNormGradReduceDesc&);
template Status cuda_batch_norm_run<BatchNormGradReduceDesc, K::runs_vec16>(const BatchNormGradReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradReduceDesc, K::runs_vec8>(const BatchNormGradReduceDesc&);
template Status cuda_batch_norm_run<BatchNormGradReduceDesc, K::runs_vec8>(const BatchNormGradReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradReduceDesc, K::runs>(const BatchNormGradReduceDesc&);
template Status cuda_batch_norm_run<BatchNormGradReduceDesc, K::runs>(const BatchNormGradReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradReduceDesc, K::columns_vec16>(const BatchNormGradReduceDesc&);
template Status cuda_batch_norm_run<BatchNormGradReduceDesc, K::columns_vec16>(const BatchNormGradReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradReduceDesc, K::columns>(const BatchNormGradReduceDesc&);
template Status cuda_batch_norm_run<BatchNormGradReduceDesc, K::columns>(const BatchNormGradReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradApplyDesc, K::runs_vec16>(const BatchNormGradApplyDesc&);
template Status cuda_batch_norm_run<BatchNormGradApplyDesc, K::runs_vec16>(const BatchNormGradApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradApplyDesc, K::runs_vec8>(const BatchNormGradApplyDesc&);
template Status cuda_batch_norm_run<BatchNormGradApplyDesc, K::runs_vec8>(const BatchNormGradApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradApplyDesc, K::runs>(const BatchNormGradApplyDesc&);
template Status cuda_batch_norm_run<BatchNormGradApplyDesc, K::runs>(const BatchNormGradApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradApplyDesc, K::columns_vec16>(const BatchNormGradApplyDesc&);
template Status cuda_batch_norm_run<BatchNormGradApplyDesc, K::columns_vec16>(const BatchNormGradApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormGradApplyDesc, K::columns>(const BatchNormGradApplyDesc&);
template Status cuda_batch_norm_run<BatchNormGradApplyDesc, K::columns>(const BatchNormGradApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsReduceDesc, K::runs_vec16>(const BatchNormStatsReduceDesc&);
template Status cuda_batch_norm_run<BatchNormStatsReduceDesc, K::runs_vec16>(const BatchNormStatsReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsReduceDesc, K::runs_vec8>(const BatchNormStatsReduceDesc&);
template Status cuda_batch_norm_run<BatchNormStatsReduceDesc, K::runs_vec8>(const BatchNormStatsReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsReduceDesc, K::runs>(const BatchNormStatsReduceDesc&);
template Status cuda_batch_norm_run<BatchNormStatsReduceDesc, K::runs>(const BatchNormStatsReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsReduceDesc, K::columns_vec16>(const BatchNormStatsReduceDesc&);
template Status cuda_batch_norm_run<BatchNormStatsReduceDesc, K::columns_vec16>(const BatchNormStatsReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsReduceDesc, K::columns>(const BatchNormStatsReduceDesc&);
template Status cuda_batch_norm_run<BatchNormStatsReduceDesc, K::columns>(const BatchNormStatsReduceDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsApplyDesc, K::runs_vec16>(const BatchNormStatsApplyDesc&);
template Status cuda_batch_norm_run<BatchNormStatsApplyDesc, K::runs_vec16>(const BatchNormStatsApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsApplyDesc, K::runs_vec8>(const BatchNormStatsApplyDesc&);
template Status cuda_batch_norm_run<BatchNormStatsApplyDesc, K::runs_vec8>(const BatchNormStatsApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsApplyDesc, K::runs>(const BatchNormStatsApplyDesc&);
template Status cuda_batch_norm_run<BatchNormStatsApplyDesc, K::runs>(const BatchNormStatsApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsApplyDesc, K::columns_vec16>(const BatchNormStatsApplyDesc&);
template Status cuda_batch_norm_run<BatchNormStatsApplyDesc, K::columns_vec16>(const BatchNormStatsApplyDesc&, const Context&);
template const char* cuda_batch_norm_declines<BatchNormStatsApplyDesc, K::columns>(const BatchNormStatsApplyDesc&);
template Status cuda_batch_norm_run<BatchNormStatsApplyDesc, K::columns>(const BatchNormStatsApplyDesc&, const Context&);

}  // namespace gradops::detail
