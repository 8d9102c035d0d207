// Softmax family: SoftmaxGrad, LogSoftmaxGrad and their forwards, in both axis conventions
// (opset 1-12: the tensor coerced to 2-D at axis; opset 13, the _13 names: one axis).
//
// Every op of the family reduces over groups laid out as a dense [outer, axis_len, inner] array:
// element (o, a, i) sits at index (o * axis_len + a) * inner + i, and group (o, i) is the
// axis_len elements a = 0 .. axis_len - 1, `inner` elements apart. Both axis conventions map onto
// this one descriptor, so kernels never see an axis:
//   opset 1-12 (SoftmaxGrad, LogSoftmaxGrad, Softmax, LogSoftmax):
//     outer = prod(dims[:axis]), axis_len = prod(dims[axis:]), inner = 1
//   opset 13 (the _13 names):
//     outer = prod(dims[:axis]), axis_len = dims[axis],        inner = prod(dims[axis+1:])
// inner == 1 means contiguous rows; inner > 1 is a non-last axis, which kernels read in place on
// the strided data (never through transposed copies).
//
// An empty tensor (any dim 0) has outer = axis_len = inner = 0: nothing to write, and no count
// that could overflow from its other dims. All counts are 64-bit. The op layer has checked shapes, dtypes and aliasing: kernels may assume every tensor
// has outer * axis_len * inner elements of `dtype`, dense, at any alignment, and that no output
// overlaps an input.
#pragma once

#include <cstdint>

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

// What a kernel computes. Per group, in the compute type (f32 for f16/bf16/f32, f64 for f64),
// each output rounded to the storage type once:
//   softmax_grad:      dx = y * (dy - sum(y * dy))
//   log_softmax_grad:  dx = dy - exp(y) * sum(dy)          (y is the forward log-softmax output)
//   softmax:           y = exp(x - max(x)) / sum(exp(x - max(x)))
//   log_softmax:       y = (x - max(x)) - log(sum(exp(x - max(x))))
enum class SoftmaxKind : uint8_t { softmax_grad, log_softmax_grad, softmax, log_softmax };

constexpr SoftmaxKind softmax_kind(OpId op) noexcept {
  switch (op) {
    case OpId::SoftmaxGrad: case OpId::SoftmaxGrad_13: return SoftmaxKind::softmax_grad;
    case OpId::LogSoftmaxGrad: case OpId::LogSoftmaxGrad_13: return SoftmaxKind::log_softmax_grad;
    case OpId::LogSoftmax: case OpId::LogSoftmax_13: return SoftmaxKind::log_softmax;
    default: return SoftmaxKind::softmax;
  }
}

// True for the opset-13 names, whose group is the single dimension at axis.
constexpr bool softmax_single_axis(OpId op) noexcept {
  return op == OpId::SoftmaxGrad_13 || op == OpId::LogSoftmaxGrad_13 || op == OpId::Softmax_13 ||
         op == OpId::LogSoftmax_13;
}

struct SoftmaxDesc {
  OpId op;            // for messages; kernels switch on kind
  SoftmaxKind kind;
  DType dtype;        // of every tensor
  int64_t outer;      // groups along the dims before the axis
  int64_t axis_len;   // elements per group (the reduction length)
  int64_t inner;      // distance between a group's consecutive elements; 1 = contiguous rows
  const void* dy;     // gradients: the incoming gradient dY; forwards: nullptr
  const void* y;      // gradients: the forward output (ORT's "Y", or "X" for LogSoftmaxGrad);
                      // forwards: the input
  void* out;          // gradients: dX; forwards: the output
};

Status cpu_softmax(const SoftmaxDesc& d, const Context& ctx);

// CUDA (src/cuda/softmax_rows.cu, built with the backend), one row per kernel, by row length: a
// warp (or part of one) per row, a block per row, a cluster of blocks per row, the row held in
// registers; two passes over longer rows; a non-last axis strided in place. Each declines what
// its kernel does not take, pointers not aligned to their element size included.
const char* cuda_softmax_warp_declines(const SoftmaxDesc& d);
Status cuda_softmax_warp(const SoftmaxDesc& d, const Context& ctx);
const char* cuda_softmax_block_declines(const SoftmaxDesc& d);
Status cuda_softmax_block(const SoftmaxDesc& d, const Context& ctx);
const char* cuda_softmax_cluster_declines(const SoftmaxDesc& d);
Status cuda_softmax_cluster(const SoftmaxDesc& d, const Context& ctx);
const char* cuda_softmax_two_pass_declines(const SoftmaxDesc& d);
Status cuda_softmax_two_pass(const SoftmaxDesc& d, const Context& ctx);
const char* cuda_softmax_strided_held_declines(const SoftmaxDesc& d);
Status cuda_softmax_strided_held(const SoftmaxDesc& d, const Context& ctx);
const char* cuda_softmax_strided_declines(const SoftmaxDesc& d);
Status cuda_softmax_strided(const SoftmaxDesc& d, const Context& ctx);

}  // namespace gradops::detail
