// Reductions shared by the CUDA row kernels, named by the scope they combine over, as CUB names
// its own: a group of lanes within a warp (group_allreduce), a block, or a cluster of blocks
// (block_allreduce<R, C>, C > 1 through distributed shared memory on Hopper), and the mailbox through
// which a cluster's blocks post their totals to each other without a cluster barrier. A reduction R names
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

// ---- a cluster's blocks posting values into each other's shared memory (Hopper) ---------------

// A block sends each peer its values with st.async into the peer's shared memory, and the peer's
// mbarrier counts the bytes as they land: the receiver waits for its own barrier only. A cluster
// barrier instead (barrier.cluster.arrive has release semantics) first waits until the block's
// earlier global stores are acknowledged: on an H100 the held softmax kernels spent 2-4 cycles an
// issued instruction in 'membar' stalls behind the previous tile's output writes, and the
// LayerNorm cluster rows ran at 0.76-0.82 of copy against 0.85-0.90 with posts (lab/cuda/NOTES.md).
// Per exchange every sender posts, one thread of each receiver arms its barrier with the bytes it
// will receive (before or after they land: the transaction count may run ahead), and the readers
// wait for the phase. Two barriers and buffers alternate: a block posts into a buffer again only
// after it has received every peer's next exchange, which each peer posts after it has read this
// one. Mailbox below is the one-value-a-block form; the held softmax kernels post a tile's columns.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ uint32_t shared_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// The address of the same shared-memory location in block `rank` of the cluster.
__device__ __forceinline__ uint32_t peer_addr(uint32_t addr, int rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(out) : "r"(addr), "r"(rank));
  return out;
}
__device__ __forceinline__ void mailbox_init(uint64_t* bars, int count) {
  for (int i = 0; i < count; ++i)
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_addr(bars + i)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mailbox_post(uint32_t peer_slot, float v, uint32_t peer_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(peer_slot),
               "r"(__float_as_uint(v)), "r"(peer_bar)
               : "memory");
}
__device__ __forceinline__ void mailbox_post(uint32_t peer_slot, double v, uint32_t peer_bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];" ::"r"(peer_slot),
               "l"(__double_as_longlong(v)), "r"(peer_bar)
               : "memory");
}
__device__ __forceinline__ void mailbox_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_addr(bar)), "r"(bytes)
               : "memory");
}
// Until the barrier's phase `phase` (0 or 1) has completed: every expected byte has landed.
__device__ __forceinline__ void mailbox_wait_phase(uint64_t* bar, uint32_t phase) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "mailbox_wait_again:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra mailbox_wait_again;\n"
      "}\n" ::"r"(shared_addr(bar)),
      "r"(phase)
      : "memory");
}
// Posts every 32-bit word of v (a float, a double or a pair of them) into a peer's slot.
template <class V>
__device__ __forceinline__ void post_words(uint32_t slot, const V& v, uint32_t peer_bar) {
  static_assert(sizeof(V) % 4 == 0);
  float w[sizeof(V) / 4];
  memcpy(w, &v, sizeof(V));
#pragma unroll
  for (int i = 0; i < static_cast<int>(sizeof(V) / 4); ++i) mailbox_post(slot + 4 * i, w[i], peer_bar);
}
#endif

// Any mailbox (a struct with `uint64_t bar[2]`): exchange n uses bar[n & 1], whose phase n >> 1
// it completes.
// Before the first exchange, by every thread of every block of the cluster (a cluster barrier).
template <class Box>
__device__ __forceinline__ void mailbox_open(Box& box) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x == 0) mailbox_init(box.bar, 2);
  cooperative_groups::this_cluster().sync();
#else
  (void)box;
  __trap();  // the host launches clusters only for code built for compute capability 9.0+
#endif
}
// By one thread of the block: this exchange will bring `bytes` into the block's inbox.
template <class Box>
__device__ __forceinline__ void mailbox_arm(Box& box, int exchange, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mailbox_expect(&box.bar[exchange & 1], bytes);
#else
  (void)box, (void)exchange, (void)bytes;
  __trap();
#endif
}
// By each thread that reads the inbox: until every byte of this exchange has landed.
template <class Box>
__device__ __forceinline__ void mailbox_wait(Box& box, int exchange) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  mailbox_wait_phase(&box.bar[exchange & 1], static_cast<uint32_t>((exchange >> 1) & 1));
#else
  (void)box, (void)exchange;
  __trap();
#endif
}

// One value a block, exchanged among a cluster's blocks `ranks` <= kRanks: after exchange n, every
// block holds every rank's value in inbox[n & 1], in rank order.
template <class V, int kRanks>
struct Mailbox {
  uint64_t bar[2];
  V inbox[2][kRanks];
};
// Thread r < ranks posts v, this block's value (the same in every such thread), to rank r; thread
// 0 arms this block's barrier for the ranks' values.
template <class V, int M>
__device__ __forceinline__ void mailbox_send(Mailbox<V, M>& box, const V& v, int rank, int ranks, int exchange) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int p = exchange & 1, r = static_cast<int>(threadIdx.x);
  if (r < ranks) post_words(peer_addr(shared_addr(&box.inbox[p][rank]), r), v, peer_addr(shared_addr(&box.bar[p]), r));
#else
  (void)v, (void)rank;
#endif
  if (threadIdx.x == 0) mailbox_arm(box, exchange, static_cast<uint32_t>(ranks * sizeof(V)));
}
// The ranks' values of this exchange, once they have all landed (by each thread that reads them).
template <class V, int M>
__device__ __forceinline__ const V* mailbox_receive(Mailbox<V, M>& box, int exchange) {
  mailbox_wait(box, exchange);
  return box.inbox[exchange & 1];
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

// A block of a cluster exits only after its peers: a block's shared memory must not be read or
// posted into once it has exited, and its own posts may still be in flight when it finishes.
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
// level, which no thread passes before it has read this one. (The row kernels measured no faster
// with the blocks' totals posted to mailboxes instead: within 4% either way on an H100.)
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
