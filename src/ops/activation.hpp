// Activation family: the elementwise gradients (Gelu, FastGelu and their bias forms, Relu,
// Sigmoid, Tanh, QuickGelu, LeakyRelu) and their forwards.
//
// The family's contract: the op layer maps each op to a Kind (the formula) and to whether it has a
// bias input, here and nowhere else; kernels never see an op. A bias form is its Kind applied at
// X + B, B broadcast along the last axis (desc.bias set, desc.cols its length). Every op of the
// family takes every dtype (T = f32, f64, f16, bf16).
#pragma once

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

// What a kernel computes per element, in the compute type, rounded to the storage type once. g is
// dY (gradients only), v the op's main input: X, or the forward output Y where the op reads it
// (SigmoidGrad, TanhGrad, LeakyReluGrad); X + B for the bias forms.
enum class ActivationKind : uint8_t {
  // gradients (read dY)
  gelu_grad,        // g * (Phi(v) + v phi(v))
  fast_gelu_grad,   // g * d/dv [v sigmoid(2u)], u = sqrt(2/pi) (v + 0.044715 v^3)
  relu_grad,        // v > 0 ? g : 0
  sigmoid_grad,     // g * v * (1 - v)
  tanh_grad,        // g * (1 - v^2)
  quick_gelu_grad,  // g * s * (1 + alpha v (1 - s)), s = sigmoid(alpha v)
  leaky_relu_grad,  // v > 0 ? g : alpha g
  // forwards
  gelu, fast_gelu, quick_gelu, relu, sigmoid, tanh, leaky_relu,
};

constexpr bool activation_is_grad(ActivationKind k) noexcept { return k < ActivationKind::gelu; }
// How many Kinds there are, for backends that instantiate a kernel per Kind: the last one plus one
// (a Kind added after leaky_relu moves this too).
inline constexpr int kActivationKinds = static_cast<int>(ActivationKind::leaky_relu) + 1;

constexpr ActivationKind activation_kind(OpId op) noexcept {
  switch (op) {
    case OpId::GeluGrad: case OpId::BiasGeluGrad_dX: return ActivationKind::gelu_grad;
    case OpId::FastGeluGrad: case OpId::BiasFastGeluGrad_dX: return ActivationKind::fast_gelu_grad;
    case OpId::ReluGrad: return ActivationKind::relu_grad;
    case OpId::SigmoidGrad: return ActivationKind::sigmoid_grad;
    case OpId::TanhGrad: return ActivationKind::tanh_grad;
    case OpId::QuickGeluGrad: return ActivationKind::quick_gelu_grad;
    case OpId::LeakyReluGrad: return ActivationKind::leaky_relu_grad;
    case OpId::Gelu: case OpId::BiasGelu: return ActivationKind::gelu;
    case OpId::FastGelu: return ActivationKind::fast_gelu;
    case OpId::QuickGelu: return ActivationKind::quick_gelu;
    case OpId::Relu: return ActivationKind::relu;
    case OpId::Sigmoid: return ActivationKind::sigmoid;
    case OpId::Tanh: return ActivationKind::tanh;
    default: return ActivationKind::leaky_relu;
  }
}

// The input holding the bias B, or -1 for ops without one (FastGelu's is optional; the others' required).
constexpr int activation_bias_input(OpId op) noexcept {
  switch (op) {
    case OpId::BiasGeluGrad_dX: case OpId::BiasFastGeluGrad_dX: return 2;
    case OpId::BiasGelu: case OpId::FastGelu: return 1;
    default: return -1;
  }
}

// Whether a Kind may come with a bias (a kernel needs the bias path only for these).
constexpr bool activation_kind_takes_bias(ActivationKind k) noexcept {
  return k == ActivationKind::gelu_grad || k == ActivationKind::fast_gelu_grad || k == ActivationKind::gelu ||
         k == ActivationKind::fast_gelu;
}

struct ActivationDesc {
  OpId op;               // for messages; kernels switch on kind
  ActivationKind kind;
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
