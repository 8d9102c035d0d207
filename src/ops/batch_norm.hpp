// BatchNorm family: BatchNormalizationGrad and its forward, BatchNormInternal in training mode, and
// gradops' own split of each at its per-channel sums (BatchNormStatsReduce + BatchNormStatsApply =
// BatchNormInternal, BatchNormGradReduce + BatchNormGradApply = BatchNormalizationGrad), so that a
// data-parallel caller can add every participant's sums with one all-reduce between the halves.
// Statistics are per channel over N·spatial values, in either layout. The op layer
// (src/ops/batch_norm.cpp) parses shapes and attributes; backends see only these descriptors.
#pragma once

#include <array>
#include <cmath>

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

// The family's (T, T1, T2) signatures: ORT's CUDA combinations, plus T = T1 with T2 = f32. The op
// table lists exactly these.
inline constexpr std::array<TypeSignature, 7> kBatchNormSignatures = {{
    {{DType::f32, DType::f32, DType::f32}},
    {{DType::f64, DType::f64, DType::f64}},
    {{DType::f64, DType::f64, DType::f32}},
    {{DType::f16, DType::f16, DType::f16}},
    {{DType::f16, DType::f16, DType::f32}},
    {{DType::f16, DType::f32, DType::f32}},
    {{DType::bf16, DType::bf16, DType::f32}},
}};
// The split's apply halves, (T, T1, T2, S): the same, with the sums in f64 (S) for every T.
inline constexpr std::array<TypeSignature, 7> kBatchNormApplySignatures = {{
    {{DType::f32, DType::f32, DType::f32, DType::f64}},
    {{DType::f64, DType::f64, DType::f64, DType::f64}},
    {{DType::f64, DType::f64, DType::f32, DType::f64}},
    {{DType::f16, DType::f16, DType::f16, DType::f64}},
    {{DType::f16, DType::f16, DType::f32, DType::f64}},
    {{DType::f16, DType::f32, DType::f32, DType::f64}},
    {{DType::bf16, DType::bf16, DType::f32, DType::f64}},
}};
// The reduce halves, (T, T2, S): they read no T1 tensor, so (f16, f16, f32) and (f16, f32, f32)
// are one signature here.
inline constexpr std::array<TypeSignature, 6> kBatchNormReduceSignatures = {{
    {{DType::f32, DType::f32, DType::f64}},
    {{DType::f64, DType::f64, DType::f64}},
    {{DType::f64, DType::f32, DType::f64}},
    {{DType::f16, DType::f16, DType::f64}},
    {{DType::f16, DType::f32, DType::f64}},
    {{DType::bf16, DType::f32, DType::f64}},
}};

// The part every BatchNorm op shares: X's geometry and the dtypes. X is [n, c, spatial] (NCHW,
// ORT's layout) or [n, spatial, c] (channels_last), row-major; each channel reduces over
// n·spatial values. t1 is meaningless for the reduce halves (they have no T1 tensor).
struct BatchNormShape {
  DType t, t1, t2;  // X, Y, dY, X_grad | scale, B, scale_grad, bias_grad | statistics
  int64_t n, c, spatial;
  bool channels_last;
};

// The split's sums: one f64 tensor of 2·c + 1 values, [first sum per channel, second sum per
// channel, count], so that participants add them with one all-reduce. count is n·spatial summed
// over the participants.
//   stats: Σ (x − K) and Σ (x − K)² per channel, K = input_mean (every participant's the same)
//   grad:  Σ dY and Σ dY·x̂ per channel, x̂ = (x − mean)·inv_std
inline constexpr int64_t batch_norm_sums_size(int64_t c) { return 2 * c + 1; }

// BatchNormalizationGrad.
struct BatchNormGradDesc {
  BatchNormShape shape;
  const void* dy;
  const void* x;
  const void* scale;    // c values
  const void* mean;     // saved batch mean, c values
  const void* inv_std;  // saved 1/sqrt(var + epsilon), c values (ORT's input "variance")
  void* dx;
  void* dscale;         // optional: nullptr when not wanted
  void* dbias;          // optional
};

// BatchNormInternal (training).
struct BatchNormForwardDesc {
  BatchNormShape shape;
  const void* x;
  const void* scale;       // c values
  const void* bias;        // B, c values
  const void* input_mean;  // running statistics before the step, c values
  const void* input_var;
  void* y;
  void* running_mean;      // optional; may be the very same buffer as input_mean
  void* running_var;       // optional; may be the very same buffer as input_var
  void* saved_mean;        // optional
  void* saved_inv_std;     // optional
  float epsilon;
  float momentum;          // weight of the old running value
};

// BatchNormStatsReduce: BatchNormInternal's sums.
struct BatchNormStatsReduceDesc {
  BatchNormShape shape;
  const void* x;
  const void* input_mean;  // the shift K, c values
  double* sums;            // batch_norm_sums_size(c) values
};

// BatchNormStatsApply: BatchNormInternal from the (summed) sums; `fwd` as BatchNormInternal's.
struct BatchNormStatsApplyDesc {
  BatchNormForwardDesc fwd;
  const double* sums;  // batch_norm_sums_size(c) values
};

// BatchNormGradReduce: BatchNormalizationGrad's sums.
struct BatchNormGradReduceDesc {
  BatchNormShape shape;
  const void* dy;
  const void* x;
  const void* mean;
  const void* inv_std;
  double* sums;  // batch_norm_sums_size(c) values
};

// BatchNormGradApply: BatchNormalizationGrad from the (summed) sums; `grad` as its descriptor.
struct BatchNormGradApplyDesc {
  BatchNormGradDesc grad;
  const double* sums;  // batch_norm_sums_size(c) values
};

Status cpu_batch_norm_grad(const BatchNormGradDesc& d, const Context& ctx);
Status cpu_batch_norm_forward(const BatchNormForwardDesc& d, const Context& ctx);
Status cpu_batch_norm_stats_reduce(const BatchNormStatsReduceDesc& d, const Context& ctx);
Status cpu_batch_norm_stats_apply(const BatchNormStatsApplyDesc& d, const Context& ctx);
Status cpu_batch_norm_grad_reduce(const BatchNormGradReduceDesc& d, const Context& ctx);
Status cpu_batch_norm_grad_apply(const BatchNormGradApplyDesc& d, const Context& ctx);

// CUDA (src/cuda/batch_norm_rows.cu, built with the backend): one row per kernel, each taking every
// op of the family; instantiated there for the six descriptors.
enum class CudaBatchNormKernel { runs_vec16, runs_vec8, runs, columns_vec16, columns };
template <class Desc, CudaBatchNormKernel K>
const char* cuda_batch_norm_declines(const Desc& d);
template <class Desc, CudaBatchNormKernel K>
Status cuda_batch_norm_run(const Desc& d, const Context& ctx);

// ---- the training statistics of one channel, for both backends -----------------------------------

#if defined(__CUDACC__)
#define GRADOPS_HOST_DEVICE __host__ __device__
#else
#define GRADOPS_HOST_DEVICE
#endif

struct BatchNormChannelStats {
  double mean = 0, var = 0, inv_std = 0;  // saved_mean, the biased variance, saved_inv_std
  double running_mean = 0, running_var = 0;
  // Y's coefficient of (x − mean): inv_std·scale, except that epsilon 0 and a channel without
  // spread make every (x − mean)/0 a 0/0, NaN as the oracle says; rounding in mean = K + dev would
  // otherwise leave ±inf where x − mean is not exactly 0.
  GRADOPS_HOST_DEVICE double y_scale(double scale, double epsilon) const {
    return var + epsilon == 0 ? NAN : inv_std * scale;
  }
};

// A channel's statistics from its sums about a shift K, sum1 = Σ(x − K) and sum2 = Σ(x − K)² over
// `count` values (this call's, or every participant's of a split), and its running statistics as
// they were before the call. The one definition of these rules: the CPU backend and the CUDA
// kernels both call it, in f64.
//  - count = 0: no batch; the running statistics pass through (PyTorch skips the update too), the
//    saved ones are those of an empty sum (mean 0, variance 0).
//  - count = 1: the unbiased variance is undefined and running_var becomes NaN, as cuDNN's and
//    PyTorch's formulas give.
//  - M2 = S2 − S1·d, d = S1/count: one value has no spread (exactly 0, whatever rounding left),
//    rounding may take it just below 0, NaN stays NaN, and a count that is not a whole number is
//    taken as given. var = M2/count cancels in proportion to d²/var, which f64 absorbs for any
//    storage type (docs/ops/batch_norm.md).
GRADOPS_HOST_DEVICE inline BatchNormChannelStats batch_norm_channel_stats(double shift, double sum1, double sum2,
                                                                         double count, double epsilon,
                                                                         double momentum, double old_mean,
                                                                         double old_var) {
  BatchNormChannelStats s;
  s.running_mean = old_mean;
  s.running_var = old_var;
  if (count > 0) {
    const double dev = sum1 / count;
    const double raw = sum2 - sum1 * dev, m2 = count == 1 || raw < 0 ? 0.0 : raw;
    const double unbiased = count > 1 ? m2 / (count - 1) : NAN, keep = 1 - momentum;
    s.mean = shift + dev;
    s.var = m2 / count;
    s.running_mean = momentum * old_mean + keep * s.mean;
    s.running_var = momentum * old_var + keep * unbiased;
  }
  s.inv_std = 1 / ::sqrt(s.var + epsilon);
  return s;
}

}  // namespace gradops::detail
