// LayerNorm family: LayerNormalizationGrad, InvertibleLayerNormalizationGrad,
// SimplifiedLayerNormalizationGrad (RMSNorm) and the forwards LayerNormalization and
// SimplifiedLayerNormalization.
//
// Every op of the family sees its main tensor as `rows` contiguous rows of `cols` elements (rows =
// the product of the dims before axis, cols = the product of the dims from axis on). Statistics hold
// one value per row; scale, bias and their gradients hold one value per column. Kernels never see
// an axis or an op: the op layer gives them rows x cols, a Kind and the matched (T, U, V).
#pragma once

#include <array>
#include <cstdint>

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

// What a kernel computes, per row, in the compute type (f64 when any of T, U, V is f64, else f32):
//   ln_grad:          LayerNormalizationGrad, x-hat = (x - mean) * inv_std
//   invertible_grad:  InvertibleLayerNormalizationGrad, x-hat = (y - bias) / scale
//   rms_grad:         SimplifiedLayerNormalizationGrad, x-hat = x * inv_rms, no mean term, no dbias
//   ln_fwd:           LayerNormalization
//   rms_fwd:          SimplifiedLayerNormalization (RMSNorm)
enum class LayerNormKind : uint8_t { ln_grad, invertible_grad, rms_grad, ln_fwd, rms_fwd };

constexpr LayerNormKind layer_norm_kind(OpId op) noexcept {
  switch (op) {
    case OpId::LayerNormalizationGrad: return LayerNormKind::ln_grad;
    case OpId::InvertibleLayerNormalizationGrad: return LayerNormKind::invertible_grad;
    case OpId::SimplifiedLayerNormalizationGrad: return LayerNormKind::rms_grad;
    case OpId::LayerNormalization: return LayerNormKind::ln_fwd;
    default: return LayerNormKind::rms_fwd;
  }
}

// The family's (T, U, V) signatures: ORT's CUDA combinations, plus T = V with U = f32 (and U = f64
// for T = f64). The op table lists exactly these, and every backend instantiates its kernels from
// this list (a signature added here is compiled everywhere, never a run-time `internal`).
inline constexpr std::array<TypeSignature, 7> kLayerNormSignatures = {{
    {{DType::f32, DType::f32, DType::f32}},
    {{DType::f64, DType::f64, DType::f64}},
    {{DType::f64, DType::f32, DType::f64}},
    {{DType::f16, DType::f32, DType::f16}},
    {{DType::bf16, DType::f32, DType::bf16}},
    {{DType::f32, DType::f32, DType::f16}},
    {{DType::f16, DType::f32, DType::f32}},
}};

struct LayerNormDesc {
  OpId op;  // for messages; kernels switch on kind
  LayerNormKind kind;
  // The matched signature: t for X and X_grad, u for the statistics, v for Y_grad, Y, scale, bias
  // and the parameter gradients (ORT's type variables).
  DType t, u, v;
  int64_t rows;
  int64_t cols;

  // Inputs. nullptr where the op has no such input.
  const void* dy;       // Y_grad (v), rows x cols; gradients
  const void* x;        // X (t), rows x cols; every op but InvertibleLayerNormalizationGrad
  const void* y;        // Y (v), rows x cols; InvertibleLayerNormalizationGrad (the forward output)
  const void* scale;    // (v) cols
  const void* bias;     // (v) cols; InvertibleLayerNormalizationGrad, LayerNormalization's optional B
  const void* mean;     // (u) rows; LayerNormalizationGrad
  const void* inv_std;  // (u) rows; every gradient: inv_std_dev, or inv_std_var (1/RMS for RMSNorm)

  // Outputs. Optional ones are nullptr when not wanted.
  void* dx;           // X_grad (t), rows x cols; gradients
  void* dscale;       // scale_grad (v), cols; optional
  void* dbias;        // bias_grad (v), cols; optional; not for SimplifiedLayerNormalizationGrad
  void* out_y;        // Y (v), rows x cols; forwards
  void* out_mean;     // Mean (u), rows; LayerNormalization, optional
  void* out_inv_std;  // InvStdDev or inv_std_var (u), rows; forwards, optional

  float epsilon;  // forwards: added to the variance (or to the mean square for RMSNorm)
};

Status cpu_layer_norm(const LayerNormDesc& d, const Context& ctx);

// CUDA (src/cuda/layer_norm_grad.cu and layer_norm_fwd.cu, built with the backend): one
// implementation row per kernel choice. Rows of whole 16-byte packs are held in registers by a
// group of a warp's lanes (several rows a warp), by warps of a block, or by a cluster of blocks, as
// the row grows; any other row (not of whole packs, longer than a cluster of 16 blocks holds, or
// whose cluster the device cannot run) goes to the general kernel. A row's declines() takes exactly
// the calls its run() launches its own kernel for, and declines pointers not aligned to their
// element size (no kernel takes those).
enum class LayerNormCudaKernel : uint8_t { rows_per_warp, block_per_row, cluster_per_row, general };
const char* cuda_layer_norm_grad_declines(const LayerNormDesc& d, LayerNormCudaKernel k);
Status cuda_layer_norm_grad(const LayerNormDesc& d, const Context& ctx, LayerNormCudaKernel k);
const char* cuda_layer_norm_fwd_declines(const LayerNormDesc& d, LayerNormCudaKernel k);
Status cuda_layer_norm_fwd(const LayerNormDesc& d, const Context& ctx, LayerNormCudaKernel k);

}  // namespace gradops::detail
