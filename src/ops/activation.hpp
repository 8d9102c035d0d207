// Activation family: the elementwise gradients (Gelu, FastGelu and their bias forms, Relu,
// Sigmoid, Tanh, QuickGelu, LeakyRelu) and their forwards.
#pragma once

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

struct ActivationDesc {
  OpId op;
  DType dtype;
  int64_t count;         // elements of dx (or y)
  int64_t cols;          // bias length = the last dim; 0 when there is no bias
  const void* dy;        // gradients only
  const void* x;         // the forward input (or output, for Sigmoid/Tanh/LeakyRelu grads)
  const void* bias;      // BiasGelu*, FastGelu with bias; else nullptr
  void* out;             // dx, or the forward output
  void* db;              // optional bias gradient; nullptr when not wanted
  float alpha;           // QuickGelu*, LeakyRelu*
};

Status cpu_activation(const ActivationDesc& d, const Context& ctx);

// CUDA (src/cuda/activation_rows.cu, built with the backend): one row per kernel, each declining
// what its kernel does not take (16-byte packs need every pointer at the same offset from a 16-byte
// boundary; every kernel needs pointers aligned to their element size).
const char* cuda_activation_flat_bias_vec16_declines(const ActivationDesc& d);
Status cuda_activation_flat_bias_vec16(const ActivationDesc& d, const Context& ctx);
const char* cuda_activation_bias_row_vec16_declines(const ActivationDesc& d);
Status cuda_activation_bias_row_vec16(const ActivationDesc& d, const Context& ctx);
const char* cuda_activation_bias_2d_vec16_declines(const ActivationDesc& d);
Status cuda_activation_bias_2d_vec16(const ActivationDesc& d, const Context& ctx);
const char* cuda_activation_flat_vec16_declines(const ActivationDesc& d);
Status cuda_activation_flat_vec16(const ActivationDesc& d, const Context& ctx);
const char* cuda_activation_bias_2d_scalar_declines(const ActivationDesc& d);
Status cuda_activation_bias_2d_scalar(const ActivationDesc& d, const Context& ctx);
const char* cuda_activation_flat_scalar_declines(const ActivationDesc& d);
Status cuda_activation_flat_scalar(const ActivationDesc& d, const Context& ctx);

}  // namespace gradops::detail
