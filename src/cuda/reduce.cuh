// Reductions shared by the CUDA row kernels, named by the scope they combine over, as CUB names
// its own: a group of lanes within a warp (group_allreduce), a block, or a cluster of blocks
// (block_allreduce<R, C>, C > 1 through distributed shared memory on Hopper). A reduction R names
// its value type V, an identity and a combine; every combine here is commutative bit for bit (no
// fma contraction), so that every lane of a butterfly ends with the same value and the result
// depends only on which threads took part, never on timing.
#pragma once

#include <cooperative_groups.h>

#include <cstdint>

#include "cuda/common.cuh"

namespace gradops::cuda {

// ---- reductions ---------------------------------------------------------------------------------

template <class A>
struct SumOp {
  using V = A;
  static __device__ __forceinline__ V identity() { return A(0); }
  static __device__ __forceinline__ V combine(V a, V b) { return add_rn(a, b); }
};
// Two sums side by side (one butterfly and one barrier for both).
template <class A>
struct Sum2 {
  A a, b;
};
template <class A>
struct Sum2Op {
  using V = Sum2<A>;
  static __device__ __forceinline__ V identity() { return {A(0), A(0)}; }
  static __device__ __forceinline__ V combine(V x, V y) { return {add_rn(x.a, y.a), add_rn(x.b, y.b)}; }
};

template <class A>
__device__ __forceinline__ A shuffle_xor(A v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
template <class A>
__device__ __forceinline__ Sum2<A> shuffle_xor(Sum2<A> v, int mask) {
  return {__shfl_xor_sync(0xffffffffu, v.a, mask), __shfl_xor_sync(0xffffffffu, v.b, mask)};
}

// ---- within a warp ------------------------------------------------------------------------------

// Every lane of each aligned group of `width` lanes gets the group's combined value.
template <class R>
__device__ __forceinline__ typename R::V group_allreduce(typename R::V v, int width) {
  for (int mask = width / 2; mask > 0; mask /= 2) v = R::combine(v, shuffle_xor(v, mask));
  return v;
}

// ---- block-wide reduction (and across a cluster) ---------------------------------------------

template <class V>
struct ReduceSmem {
  V warps[2][32];  // [parity][warp]: double-buffered so one barrier per level suffices
  V block[2];      // [parity]: this block's total, read by the cluster's other blocks
};

// This thread's index among the C * blockDim.x threads of its cluster (C = 1: its block).
template <int C>
__device__ __forceinline__ int64_t cluster_thread() {
  int rank = 0;
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (C > 1) rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
#endif
  return static_cast<int64_t>(rank) * blockDim.x + threadIdx.x;
}

// A block of a cluster exits only after its peers: they may still read its totals
// (block_allreduce's distributed shared memory).
template <int C>
__device__ __forceinline__ void cluster_exit() {
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (C > 1) cooperative_groups::this_cluster().sync();
#endif
}

// The combined value of every thread of the block (and of the cluster's C blocks). Each warp
// leaves its value in shared memory; after a barrier every warp combines them (lane w takes warp
// w's, then a butterfly), so all threads compute the same bits; across a cluster, each block's
// total goes through distributed shared memory the same way, one value per lane, after a cluster
// barrier. Calls alternate `parity`: a buffer is written again only after the next barrier of its
// level, which no thread passes before it has read this one.
template <class R, int C>
__device__ __forceinline__ typename R::V block_allreduce(typename R::V v, ReduceSmem<typename R::V>& sm,
                                                         int parity) {
  using V = typename R::V;
  v = group_allreduce<R>(v, 32);
  const int lane = static_cast<int>(threadIdx.x % 32), nwarps = static_cast<int>(blockDim.x / 32);
  if (lane == 0) sm.warps[parity][threadIdx.x / 32] = v;
  __syncthreads();
  V t = lane < nwarps ? sm.warps[parity][lane] : R::identity();
  t = group_allreduce<R>(t, 32);
  if constexpr (C > 1) {
#if defined(_CG_HAS_CLUSTER_GROUP)
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    if (threadIdx.x == 0) sm.block[parity] = t;
    cluster.sync();
    t = lane < C ? *cluster.map_shared_rank(&sm.block[parity], lane) : R::identity();
    t = group_allreduce<R>(t, 32);
#else
    __trap();  // the host launches clusters only for code built for compute capability 9.0+
#endif
  }
  return t;
}

}  // namespace gradops::cuda
