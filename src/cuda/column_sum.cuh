// The deterministic column sum shared by the CUDA kernels that produce per-column gradients (dB of
// the bias activations, dscale and dbias of the LayerNorm family): a kernel leaves one row of
// compute-type partial sums per block or row group, [groups][cols], and out[c] = the sum over g of
// partial[g][c] in a fixed order. The order depends on (groups, cols) only, so with a grid fixed
// by the shape the result has the same bits on every run and every device; no atomics.
//
// launch_column_sum runs it as a separate kernel, launched while the producer drains
// (programmatic dependent launch: it waits for the producer's end before it reads); column_sum_block
// is the same sums for any block of a multiple of 32 threads. Lane ty of 32 adds groups ty, ty + 32,
// ... of its column; the 32 lane sums are then added in lane order.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "cuda/common.cuh"

namespace gradops::cuda {

inline constexpr int kColumnSumLanes = 32;

// Up to two column sums in one launch (blockIdx.y picks one): dscale and dbias.
template <class T>
struct ColumnSumArgs {
  const compute_t<T>* partial[2];
  T* out[2];
  int64_t groups, cols;
};

// Columns [c_begin, cols) step c_step, 32 at a time, by one block of a multiple of 32 threads (warp
// w computes lanes w, w + warps, ...: the same sums, in the same order, for any block size). The
// partials are read through L2 (ld.cg): a producer's last block reads what other multiprocessors
// wrote.
template <class T>
__device__ __forceinline__ void column_sum_block(const compute_t<T>* partial, T* out, int64_t groups, int64_t cols,
                                                 int64_t c_begin, int64_t c_step) {
  using A = compute_t<T>;
  __shared__ A lanes[kColumnSumLanes][33];
  const int tx = threadIdx.x % 32, warps = static_cast<int>(blockDim.x / 32);
  for (int64_t c0 = c_begin; c0 < cols; c0 += c_step) {
    const int64_t c = c0 + tx;
    for (int ty = static_cast<int>(threadIdx.x / 32); ty < kColumnSumLanes; ty += warps) {
      A s = A(0);
      if (c < cols)
        for (int64_t g = ty; g < groups; g += kColumnSumLanes) s += __ldcg(partial + g * cols + c);
      lanes[ty][tx] = s;
    }
    __syncthreads();
    const int ty = static_cast<int>(threadIdx.x / 32);
    if (ty == 0 && c < cols) {
      A t = lanes[0][tx];
      for (int k = 1; k < kColumnSumLanes; ++k) t += lanes[k][tx];
      out[c] = from_compute<T>(t);
    }
    __syncthreads();
  }
}

template <class T>
__global__ void __launch_bounds__(32 * kColumnSumLanes) column_sum_kernel(ColumnSumArgs<T> a) {
  griddep_wait();  // launched while the producer drains: its partials are complete only now
  // Select with constants, not a run-time index into the parameter arrays, which would copy them
  // to a stack frame.
  const bool second = blockIdx.y != 0;
  column_sum_block<T>(second ? a.partial[1] : a.partial[0], second ? a.out[1] : a.out[0], a.groups, a.cols,
                      static_cast<int64_t>(blockIdx.x) * 32, static_cast<int64_t>(gridDim.x) * 32);
}

// out[i][c] = sum over g of partial[i][g * cols + c], for the `n` (1 or 2) pairs given. Launched as
// the producer's last blocks start (the producer calls griddep_launch_dependents()), so that the
// gap between the two kernels (a few microseconds, several percent of a 16384 x 4096 call)
// overlaps its tail.
template <class T>
Status launch_column_sum(std::string_view op, cudaStream_t stream, const ColumnSumArgs<T>& a, int n,
                         const char* what = "the column-sum launch") {
  const int64_t blocks = std::min<int64_t>((a.cols + 31) / 32, 65535);
  return launch_dependent(op, what, column_sum_kernel<T>,
                          dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(n)), dim3(32 * kColumnSumLanes),
                          stream, a);
}
template <class T>
Status launch_column_sum(std::string_view op, cudaStream_t stream, const compute_t<T>* partial, T* out, int64_t groups,
                         int64_t cols, const char* what = "the column-sum launch") {
  return launch_column_sum<T>(op, stream, ColumnSumArgs<T>{{partial, nullptr}, {out, nullptr}, groups, cols}, 1, what);
}

}  // namespace gradops::cuda
