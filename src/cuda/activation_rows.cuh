// Activation family, CUDA: the entry of each implementation row's kernel, defined in
// activation_kernels.cuh and compiled once per storage type (activation_f32.cu, activation_f16.cu,
// activation_bf16.cu, activation_f64.cu), so that the four compile in parallel and the rows
// (activation_rows.cu) compile without the kernels. T is the device storage type (float, double,
// __half, __nv_bfloat16); each entry runs only the kernel its row names, on what that row's
// declines() accepted.
#pragma once

#include <string_view>

#include "cuda/common.cuh"
#include "ops/activation.hpp"

namespace gradops::cuda {

// The flat kernel without a bias: 16-byte packs (vec) or one element per access.
template <class T>
Status activation_flat(std::string_view op, const detail::ActivationDesc& d, const Context& ctx, bool vec);
// The flat kernel adding a bias pack to each pack (bias gradients without dB, not f64).
template <class T>
Status activation_flat_bias(std::string_view op, const detail::ActivationDesc& d, const Context& ctx);
// The row kernel and dB's column sum (16-bit bias gradients with dB).
template <class T>
Status activation_bias_row(std::string_view op, const detail::ActivationDesc& d, const Context& ctx,
                           const DeviceInfo& dev);
// The 2-D bias kernel (and dB's column sum where dB is wanted): 16-byte packs (vec) or one element
// per access.
template <class T>
Status activation_bias_2d(std::string_view op, const detail::ActivationDesc& d, const Context& ctx,
                          const DeviceInfo& dev, bool vec);

}  // namespace gradops::cuda
