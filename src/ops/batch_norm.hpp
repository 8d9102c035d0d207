// BatchNorm family: BatchNormalizationGrad and its forward, BatchNormInternal in training mode.
// Statistics are per channel over N·spatial values, in either layout.
#pragma once

#include <array>

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

struct BatchNormDesc {
  OpId op;                // BatchNormalizationGrad or BatchNormInternal
  DType t, t1, t2;        // X, Y, dY, X_grad | scale, B, scale_grad, bias_grad | statistics
  // X is [n, c, spatial] (NCHW, ORT's layout) or [n, spatial, c] (channels_last), row-major;
  // each channel reduces over n·spatial values.
  int64_t n, c, spatial;
  bool channels_last;

  const void* x;          // both ops
  const void* scale;      // both ops, c values

  // BatchNormalizationGrad
  const void* dy;
  const void* mean;       // saved batch mean, c values
  const void* inv_std;    // saved 1/sqrt(var + epsilon), c values (ORT's input "variance")
  void* dx;
  void* dscale;           // optional: nullptr when not wanted
  void* dbias;            // optional

  // BatchNormInternal
  const void* bias;       // B, c values
  const void* input_mean; // running statistics before the step, c values
  const void* input_var;
  void* y;
  void* running_mean;     // optional; may be the very same buffer as input_mean
  void* running_var;      // optional; may be the very same buffer as input_var
  void* saved_mean;       // optional
  void* saved_inv_std;    // optional
  float epsilon;
  float momentum;         // weight of the old running value
};

Status cpu_batch_norm(const BatchNormDesc& d, const Context& ctx);

// CUDA (src/cuda/batch_norm_rows.cu, built with the backend): one row per kernel.
const char* cuda_batch_norm_runs_vec16_declines(const BatchNormDesc& d);
Status cuda_batch_norm_runs_vec16(const BatchNormDesc& d, const Context& ctx);
const char* cuda_batch_norm_runs_vec8_declines(const BatchNormDesc& d);
Status cuda_batch_norm_runs_vec8(const BatchNormDesc& d, const Context& ctx);
const char* cuda_batch_norm_runs_declines(const BatchNormDesc& d);
Status cuda_batch_norm_runs(const BatchNormDesc& d, const Context& ctx);
const char* cuda_batch_norm_columns_vec16_declines(const BatchNormDesc& d);
Status cuda_batch_norm_columns_vec16(const BatchNormDesc& d, const Context& ctx);
const char* cuda_batch_norm_columns_declines(const BatchNormDesc& d);
Status cuda_batch_norm_columns(const BatchNormDesc& d, const Context& ctx);

}  // namespace gradops::detail
