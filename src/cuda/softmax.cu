// Softmax family, CUDA kernels: one read of each input and one write of the output per group
// wherever the group fits on chip.
//
// Contiguous rows (inner == 1), by row length:
//   cuda:warp_per_row   up to 256 packs (128 of f64): a group of G lanes (G = 1 .. 32, so 32/G
//                       rows per warp) holds a row in registers; shuffles reduce it.
//   cuda:block_per_row  up to 16 blocks' worth: the row is held in registers by one block, or by
//                       a cluster of 2 to 16 blocks that exchange their partial results through
//                       distributed shared memory (Hopper). 16-bit SoftmaxGrad rows that need a
//                       cluster are staged through shared memory instead, each thread copying its
//                       packs of the cluster's next two rows with cp.async while it reduces the
//                       current one (staged_kernel).
//   cuda:two_pass       longer rows, rows it was measured faster for (the forwards and 16-bit
//                       LogSoftmaxGrad where a row needs a cluster), or no clusters: a block per
//                       row reads the row twice; the second read mostly hits L2.
// Non-last axis (inner > 1):
//   cuda:strided        threads along inner (coalesced), lanes along the axis, two passes.
//
// A row whose pointers all sit at the same offset from a 16-byte boundary moves in 16-byte packs,
// with the elements before the first boundary and after the last whole pack done one per thread;
// otherwise one element per access. Reductions run in a fixed order (per-thread sums in index
// order, xor butterflies, warps and cluster ranks combined in order): the same bits on every run.
// Forwards held in registers reduce twice (the max, then the sum of exp(x - max), whose terms the
// softmax output reuses); streamed ones carry a running (max, sum). Compute in f32 (f64 for f64);
// each output rounded once (LogSoftmaxGrad's exp from the hardware's exp2 for f16/bf16 outputs).
#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>

#include "cuda/common.cuh"
#include "ops/dispatch.hpp"
#include "ops/softmax.hpp"

namespace gradops::cuda {
namespace {

using detail::SoftmaxDesc;
using detail::SoftmaxKind;

__host__ __device__ constexpr bool is_grad(SoftmaxKind k) {
  return k == SoftmaxKind::softmax_grad || k == SoftmaxKind::log_softmax_grad;
}

// ---- reductions ---------------------------------------------------------------------------------

// Max that keeps a NaN: a row holding one has a NaN softmax.
template <class A>
__device__ __forceinline__ A max_nan(A a, A b) {
  return (b > a || b != b) ? b : a;
}

// Forwards in one streamed pass (two-pass and strided kernels): m = max(x), s = sum(exp(x - m)),
// combined as (M, s1 e^(m1-M) + s2 e^(m2-M)).
template <class A>
struct Stat {
  A m, s;
};

// Combines are commutative bit for bit (no fma contraction), so that every lane of a butterfly
// ends with the same value.
template <class A>
struct SumOp {
  using V = A;
  static __device__ __forceinline__ V identity() { return A(0); }
  static __device__ __forceinline__ V combine(V a, V b) { return add_rn(a, b); }
};
template <class A>
struct MaxOp {
  using V = A;
  static __device__ __forceinline__ V identity() { return -INFINITY; }
  static __device__ __forceinline__ V combine(V a, V b) { return max_nan(a, b); }
};
template <class A>
struct MaxSumOp {
  using V = Stat<A>;
  static __device__ __forceinline__ V identity() { return {-INFINITY, A(0)}; }
  static __device__ __forceinline__ V combine(V a, V b) {
    const A m = max_nan(a.m, b.m);
    if (m == -INFINITY) return {m, A(0)};
    return {m, add_rn(mul_rn(a.s, dexp(a.m - m)), mul_rn(b.s, dexp(b.m - m)))};
  }
};

template <class A>
__device__ __forceinline__ A shuffle_xor(A v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
template <class A>
__device__ __forceinline__ Stat<A> shuffle_xor(Stat<A> v, int mask) {
  return {__shfl_xor_sync(0xffffffffu, v.m, mask), __shfl_xor_sync(0xffffffffu, v.s, mask)};
}

// Every lane of each aligned group of `width` lanes gets the group's combined value.
template <class R>
__device__ __forceinline__ typename R::V group_allreduce(typename R::V v, int width) {
  for (int mask = width / 2; mask > 0; mask /= 2) v = R::combine(v, shuffle_xor(v, mask));
  return v;
}

// Streaming accumulation of one element (two-pass and strided kernels). Gradients: s = sum(y dy)
// (softmax) or sum(dy) (log-softmax), m unused; forwards: the running (max, sum of exp).
template <SoftmaxKind K, class A>
__device__ __forceinline__ void push(Stat<A>& st, A y, A g) {
  if constexpr (K == SoftmaxKind::softmax_grad) {
    st.s = dfma(y, g, st.s);
  } else if constexpr (K == SoftmaxKind::log_softmax_grad) {
    st.s += g;
  } else {
    if (y > st.m) {  // from -inf too: exp(-inf) = 0
      st.s = dfma(st.s, dexp(st.m - y), A(1));
      st.m = y;
    } else if (y != -INFINITY) {  // a NaN lands here and poisons s, as it should
      st.s += dexp(y - st.m);
    }
  }
}

template <SoftmaxKind K, class A>
using StreamOp = std::conditional_t<is_grad(K), SumOp<A>, MaxSumOp<A>>;
template <SoftmaxKind K, class A>
__device__ __forceinline__ typename StreamOp<K, A>::V stream_value(const Stat<A>& st) {
  if constexpr (is_grad(K)) return st.s;
  else return st;
}

// What a group's statistics turn into once, before the elementwise pass.
template <class A>
struct Final {
  A a, b;  // gradients: a = s; softmax: a = max, b = 1/sum; log-softmax: a = max, b = log(sum)
};

template <SoftmaxKind K, class A>
__device__ __forceinline__ Final<A> final_of(A m_or_s, A s) {
  if constexpr (K == SoftmaxKind::softmax) return {m_or_s, A(1) / s};
  if constexpr (K == SoftmaxKind::log_softmax) return {m_or_s, dlog(s)};
  return {m_or_s, A(0)};
}
template <SoftmaxKind K, class A>
__device__ __forceinline__ Final<A> final_of(typename StreamOp<K, A>::V v) {
  if constexpr (is_grad(K)) return final_of<K, A>(v, A(0));
  else return final_of<K, A>(v.m, v.s);
}

// One output element. `e` is exp(y - max) where the caller has it (softmax forward), else unused.
// kFast (f16/bf16 storage): LogSoftmaxGrad's exp(y) from the hardware's exp2, within a few ulp of
// f32 and far below half an ulp of the output; the accurate expf made the 16-bit kernels
// issue-bound on long rows.
template <SoftmaxKind K, bool kFast = false, class A>
__device__ __forceinline__ A output(const Final<A>& f, A y, A g, A e) {
  if constexpr (K == SoftmaxKind::softmax_grad) return y * (g - f.a);
  if constexpr (K == SoftmaxKind::log_softmax_grad) {
    if constexpr (kFast && std::is_same_v<A, float>) return g - ex2_approx(y * 1.44269504088896341f) * f.a;
    else return g - dexp(y) * f.a;
  }
  if constexpr (K == SoftmaxKind::softmax) return e * f.b;
  return (y - f.a) - f.b;
}
template <SoftmaxKind K, bool kFast = false, class A>
__device__ __forceinline__ A output(const Final<A>& f, A y, A g) {
  if constexpr (K == SoftmaxKind::softmax) return output<K, kFast>(f, y, g, dexp(y - f.a));
  else return output<K, kFast>(f, y, g, A(0));
}

// A row's values held in registers, N packs of VEC, reduced with `reduce` (a callable taking the
// op type and a value, returning the combined value over the row). Gradients: one sum. Forwards:
// the max, then the sum of exp(x - max), whose terms are kept for the output pass (softmax).
template <SoftmaxKind K, class T, int VEC, int N>
struct Held {
  using A = compute_t<T>;
  Pack<T, VEC> y[N], g[N];
  bool valid[N];
  A e[N][VEC];  // softmax forward: exp(y - max)

  template <class Reduce>
  __device__ __forceinline__ Final<A> finish(Reduce reduce, int n_extra, const A* ey, const A* eg, A* ee) {
    if constexpr (is_grad(K)) {
      A s = A(0);
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (valid[k])
#pragma unroll
          for (int j = 0; j < VEC; ++j) s = term(s, to_compute(y[k].v[j]), to_compute(g[k].v[j]));
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (i < n_extra) s = term(s, ey[i], eg[i]);
      return final_of<K, A>(reduce(SumOp<A>{}, s), A(0));
    } else {
      A m = -INFINITY;
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (valid[k])
#pragma unroll
          for (int j = 0; j < VEC; ++j) m = max_nan(m, to_compute(y[k].v[j]));
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (i < n_extra) m = max_nan(m, ey[i]);
      m = reduce(MaxOp<A>{}, m);
      A s = A(0);
      if (m != -INFINITY) {  // else every element is -inf (or the lane holds none)
#pragma unroll
        for (int k = 0; k < N; ++k)
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            e[k][j] = valid[k] ? dexp(to_compute(y[k].v[j]) - m) : A(0);
            s += e[k][j];
          }
#pragma unroll
        for (int i = 0; i < 2; ++i)
          if (i < n_extra) {
            ee[i] = dexp(ey[i] - m);
            s += ee[i];
          }
      }
      return final_of<K, A>(m, reduce(SumOp<A>{}, s));
    }
  }

  static __device__ __forceinline__ A term(A s, A yv, A gv) {
    if constexpr (K == SoftmaxKind::softmax_grad) return dfma(yv, gv, s);
    else return s + gv;
  }

  __device__ __forceinline__ Pack<T, VEC> out(const Final<A>& f, int k) const {
    const Pack<T, VEC> yk = opaque(y[k]), gk = opaque(g[k]);
    Pack<T, VEC> o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const A gj = is_grad(K) ? to_compute(gk.v[j]) : A(0);
      const A ej = K == SoftmaxKind::softmax ? e[k][j] : A(0);
      o.v[j] = from_compute<T>(output<K, sizeof(T) == 2>(f, to_compute(yk.v[j]), gj, ej));
    }
    return o;
  }

  // 16-bit packs, as values the compiler cannot prove equal to what the reduction converted: it
  // then converts them again (one instruction an element) rather than keeping twice as many f32
  // registers live across the reduction, which spilled once the next row's packs were in flight.
  static __device__ __forceinline__ Pack<T, VEC> opaque(Pack<T, VEC> p) {
    if constexpr (sizeof(T) == 2 && sizeof(p) % 4 == 0) {
      uint32_t w[sizeof(p) / 4];
      memcpy(w, &p, sizeof(p));
#pragma unroll
      for (unsigned i = 0; i < sizeof(p) / 4; ++i) asm volatile("" : "+r"(w[i]));
      memcpy(&p, w, sizeof(p));
    }
    return p;
  }
};

struct RowArgs {
  const void* dy;  // gradients only
  const void* y;   // the forward output (gradients) or the input (forwards)
  void* out;
  int64_t rows, len;
};

// Elements of a row before its first 16-byte boundary (all tensors share the offset).
template <class T, int VEC>
__device__ __forceinline__ int64_t row_head(const T* row, int64_t len) {
  if constexpr (VEC == 1) {
    return 0;
  } else {
    const unsigned m = static_cast<unsigned>(reinterpret_cast<uintptr_t>(row) % 16);
    return min(len, static_cast<int64_t>((16 - m) % 16 / sizeof(T)));
  }
}

// ---- cuda:warp_per_row ------------------------------------------------------------------------

constexpr int kWarpThreads = 128;
// Packs per lane at most: 8, or 4 of f64 (whose exp needs more registers).
template <class T>
inline constexpr int kWarpMaxPacksPerLane = sizeof(T) == 8 ? 4 : 8;

// Rows of `len` elements; G = 1 << log2_lanes lanes per row, each holding packs k*G + lane; 32/G
// rows per warp step. kPrefetch: the warp loads its next step's rows before it reduces the current
// ones, so that a grid of resident warps keeps loads in flight through every reduction and store
// (without it, each warp takes one step and the grid is as large as the rows need).
template <SoftmaxKind K, class T, int VEC, int N, bool kPrefetch>
__global__ void __launch_bounds__(kWarpThreads) warp_kernel(RowArgs a, int log2_lanes) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  using H = Held<K, T, VEC, N>;
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  const int lanes = 1 << log2_lanes;
  const int lane = threadIdx.x % 32;
  const int group = lane >> log2_lanes, gl = lane & (lanes - 1);
  const int rows_per_warp = 32 >> log2_lanes;
  const int64_t warp = static_cast<int64_t>(blockIdx.x) * (kWarpThreads / 32) + threadIdx.x / 32;
  const int64_t step = static_cast<int64_t>(gridDim.x) * (kWarpThreads / 32) * rows_per_warp;
  auto reduce = [lanes](auto op, auto v) { return group_allreduce<decltype(op)>(v, lanes); };
  auto load = [&](H& h, int64_t first) {
    const int64_t r = first + group;
    const int64_t base = r * a.len;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t e = static_cast<int64_t>(k * lanes + gl) * VEC;
      h.valid[k] = r < a.rows && e < a.len;
      h.y[k] = P{};
      h.g[k] = P{};
      if (h.valid[k]) {
        h.y[k] = *reinterpret_cast<const P*>(y + base + e);
        if constexpr (is_grad(K)) h.g[k] = *reinterpret_cast<const P*>(dy + base + e);
      }
    }
  };

  // The loop test is the warp's first row, so that whole warps stay together for the shuffles.
  int64_t first = warp * rows_per_warp;
  H h;
  if (first < a.rows) load(h, first);
  for (; first < a.rows; first += step) {
    H next;
    if constexpr (kPrefetch) load(next, first + step);  // rows past the end load nothing
    const Final<A> f = h.finish(reduce, 0, nullptr, nullptr, nullptr);
    const int64_t base = (first + group) * a.len;
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (h.valid[k]) *reinterpret_cast<P*>(out + base + static_cast<int64_t>(k * lanes + gl) * VEC) = h.out(f, k);
    if constexpr (kPrefetch) {
      h = next;
    } else if (first + step < a.rows) {
      load(h, first + step);
    }
  }
}

// ---- block-wide reduction (and across a cluster) ---------------------------------------------

template <class V>
struct ReduceSmem {
  V warps[2][32];  // [parity][warp]: double-buffered so one barrier per level suffices
  V block[2];      // [parity]: this block's total, read by the cluster's other blocks
};

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

// ---- cuda:block_per_row ---------------------------------------------------------------------

// Packs of each input per thread: 16 elements of f32 or f16/bf16, 2 of f64. With at most 512
// threads and two blocks per multiprocessor (64 registers each), that is what fits without
// spilling once the compiler keeps the converted values for the output pass.
template <class T>
inline constexpr int kBlockPacks = sizeof(T) == 4 ? 4 : sizeof(T) == 2 ? 2 : 1;
constexpr int kBlockMaxThreads = 512;
constexpr int kMaxCluster = 16;  // 16 is beyond the portable 8: allowed per kernel at launch

// A row held by C blocks of blockDim.x threads: thread t of the cluster holds packs k*T + t of the
// row's aligned body (T threads in all), and at most one element before and one after it. kMinB:
// resident 512-thread blocks asked of the register allocator (2: 64 registers; the lab's tighter
// bound for 16-bit one-block rows spilled and measured 1.5 times slower).
template <SoftmaxKind K, class T, int VEC, int C, int kMinB = 2>
__global__ void __launch_bounds__(kBlockMaxThreads, kMinB) block_kernel(RowArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  constexpr int N = kBlockPacks<T>;
  __shared__ ReduceSmem<A> sm;
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  int rank = 0;
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (C > 1) rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
#endif
  const int64_t t = static_cast<int64_t>(rank) * blockDim.x + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(C) * blockDim.x;
  int parity = 0;
  auto reduce = [&](auto op, auto v) {
    const auto r = block_allreduce<decltype(op), C>(v, sm, parity);
    parity ^= 1;
    return r;
  };

  for (int64_t r = blockIdx.x / C; r < a.rows; r += gridDim.x / C) {
    const int64_t base = r * a.len;
    const int64_t head = row_head<T, VEC>(y + base, a.len);
    const int64_t packs = (a.len - head) / VEC;
    const int64_t tail_start = head + packs * VEC;
    const P* yp = reinterpret_cast<const P*>(y + base + head);
    const P* gp = is_grad(K) ? reinterpret_cast<const P*>(dy + base + head) : nullptr;
    Held<K, T, VEC, N> h;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t p = k * nthreads + t;
      h.valid[k] = p < packs;
      h.y[k] = P{};
      h.g[k] = P{};
      if (h.valid[k]) {
        h.y[k] = yp[p];
        if constexpr (is_grad(K)) h.g[k] = gp[p];
      }
    }
    // The ragged ends: element t before the body, element t after it.
    A ey[2] = {A(0), A(0)}, eg[2] = {A(0), A(0)}, ee[2] = {A(0), A(0)};
    int64_t at[2];
    int n_extra = 0;
    if (t < head) at[n_extra++] = base + t;
    if (t < a.len - tail_start) at[n_extra++] = base + tail_start + t;
    for (int i = 0; i < n_extra; ++i) {
      ey[i] = to_compute(y[at[i]]);
      if constexpr (is_grad(K)) eg[i] = to_compute(dy[at[i]]);
    }

    const Final<A> f = h.finish(reduce, n_extra, ey, eg, ee);

    P* op = reinterpret_cast<P*>(out + base + head);
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (h.valid[k]) op[k * nthreads + t] = h.out(f, k);
    for (int i = 0; i < n_extra; ++i)
      out[at[i]] = from_compute<T>(output<K, sizeof(T) == 2>(f, ey[i], eg[i], ee[i]));
  }
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (C > 1) cooperative_groups::this_cluster().sync();  // peers may still read our totals
#endif
}

// ---- cuda:block_per_row, staged through shared memory (gradients) ----------------------------

// cp.async: 16 bytes global -> shared without registers, completed per thread by group.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

constexpr int kStagedMaxThreads = 512;
// Rows in shared memory at once: the one being reduced and kStages - 1 loading behind it.
constexpr int kStages = 3;

// Shared memory of the staged kernel: kStages x {y, dy} x N packs per thread.
constexpr std::size_t staged_smem(int n, int threads) {
  return static_cast<std::size_t>(kStages) * 2 * n * threads * 16;
}

// A row held by C blocks (a cluster) as in block_kernel, for the gradients of rows whose pointers
// share their offset from a 16-byte boundary. Each thread copies its packs of the cluster's next
// kStages - 1 rows into its own slots of shared memory with cp.async while it reduces the current
// row: the loads of whole rows stay in flight through every barrier, with no registers held for
// them, and since a thread reads back only what it copied itself, no barrier guards the slots. A
// slot is refilled in the iteration after the one that read it. The ragged ends of a row (at most
// one element per thread on each side) are loaded directly.
template <SoftmaxKind K, class T, int VEC, int C, int N>
__global__ void __launch_bounds__(kStagedMaxThreads, 1) staged_kernel(RowArgs a) {
  static_assert(is_grad(K) && VEC * sizeof(T) == 16, "the staged kernel takes gradients in 16-byte packs");
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  extern __shared__ uint4 slots[];  // [stage][tensor][k][thread]
  __shared__ ReduceSmem<A> sm;
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  int rank = 0;
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (C > 1) rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
#endif
  const int threads = static_cast<int>(blockDim.x);
  const int64_t t = static_cast<int64_t>(rank) * threads + threadIdx.x;
  const int64_t nthreads = static_cast<int64_t>(C) * threads;
  int parity = 0;
  auto reduce = [&](auto op, auto v) {
    const auto r = block_allreduce<decltype(op), C>(v, sm, parity);
    parity ^= 1;
    return r;
  };
  auto slot = [&](int stage, int tensor, int k) -> uint4* {
    return slots + ((stage * 2 + tensor) * N + k) * threads + threadIdx.x;
  };
  auto issue = [&](int stage, int64_t r) {
    if (r < a.rows) {
      const int64_t base = r * a.len;
      const int64_t head = row_head<T, VEC>(y + base, a.len);
      const int64_t packs = (a.len - head) / VEC;
      const P* yp = reinterpret_cast<const P*>(y + base + head);
      const P* gp = reinterpret_cast<const P*>(dy + base + head);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int64_t p = k * nthreads + t;
        if (p < packs) {
          cp_async16(slot(stage, 0, k), yp + p);
          cp_async16(slot(stage, 1, k), gp + p);
        }
      }
    }
    cp_async_commit();  // empty past the last row: every iteration then waits for the same count
  };

  const int64_t step = gridDim.x / C;
  int64_t r = blockIdx.x / C;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) issue(s, r + s * step);
  for (int stage = 0; r < a.rows; r += step, stage = stage == kStages - 1 ? 0 : stage + 1) {
    issue(stage == 0 ? kStages - 1 : stage - 1, r + (kStages - 1) * step);
    const int64_t base = r * a.len;
    const int64_t head = row_head<T, VEC>(y + base, a.len);
    const int64_t packs = (a.len - head) / VEC;
    const int64_t tail_start = head + packs * VEC;
    // The ragged ends, from global memory, while this row's copies complete.
    const bool before = t < head, after = t < a.len - tail_start;
    const int n_extra = before + after;
    const int64_t at[2] = {before ? base + t : base + tail_start + t, base + tail_start + t};
    A ey[2] = {A(0), A(0)}, eg[2] = {A(0), A(0)}, ee[2] = {A(0), A(0)};
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (i < n_extra) {
        ey[i] = to_compute(y[at[i]]);
        eg[i] = to_compute(dy[at[i]]);
      }
    cp_async_wait<kStages - 1>();  // this row's group is complete; the later rows' may not be
    Held<K, T, VEC, N> h;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      h.valid[k] = k * nthreads + t < packs;
      h.y[k] = P{};
      h.g[k] = P{};
      if (h.valid[k]) {
        *reinterpret_cast<uint4*>(&h.y[k]) = *slot(stage, 0, k);
        *reinterpret_cast<uint4*>(&h.g[k]) = *slot(stage, 1, k);
      }
    }
    const Final<A> f = h.finish(reduce, n_extra, ey, eg, ee);
    P* op = reinterpret_cast<P*>(out + base + head);
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (h.valid[k]) op[k * nthreads + t] = h.out(f, k);
#pragma unroll
    for (int i = 0; i < 2; ++i)
      if (i < n_extra) out[at[i]] = from_compute<T>(output<K, sizeof(T) == 2>(f, ey[i], eg[i], ee[i]));
  }
  cp_async_wait<0>();
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (C > 1) cooperative_groups::this_cluster().sync();  // peers may still read our totals
#endif
}

// ---- cuda:two_pass ----------------------------------------------------------------------------

constexpr int kTwoPassThreads = 512;
// Packs in flight per thread; f64 keeps fewer live across the calls its library functions make.
template <class T>
inline constexpr int kTwoPassUnroll = sizeof(T) == 8 ? 1 : 4;

template <SoftmaxKind K, class T, int VEC>
__global__ void __launch_bounds__(kTwoPassThreads) two_pass_kernel(RowArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  using R = StreamOp<K, A>;
  __shared__ ReduceSmem<typename R::V> sm;
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  const int64_t t = threadIdx.x, nthreads = blockDim.x;
  int parity = 0;
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x, parity ^= 1) {
    const int64_t base = r * a.len;
    const int64_t head = row_head<T, VEC>(y + base, a.len);
    const int64_t packs = (a.len - head) / VEC;
    const int64_t tail_start = head + packs * VEC;
    const P* yp = reinterpret_cast<const P*>(y + base + head);
    const P* gp = is_grad(K) ? reinterpret_cast<const P*>(dy + base + head) : nullptr;
    P* op = reinterpret_cast<P*>(out + base + head);
    auto elem = [&](int64_t i, A& ye, A& ge) {
      ye = to_compute(y[base + i]);
      ge = A(0);
      if constexpr (is_grad(K)) ge = to_compute(dy[base + i]);
    };

    Stat<A> st{-INFINITY, A(0)};
#pragma unroll(kTwoPassUnroll<T>)
    for (int64_t p = t; p < packs; p += nthreads) {
      const P yv = yp[p];
      P gv = {};
      if constexpr (is_grad(K)) gv = gp[p];
#pragma unroll
      for (int j = 0; j < VEC; ++j) push<K>(st, to_compute(yv.v[j]), is_grad(K) ? to_compute(gv.v[j]) : A(0));
    }
    for (int64_t i = t; i < head; i += nthreads) {
      A ye, ge;
      elem(i, ye, ge);
      push<K>(st, ye, ge);
    }
    for (int64_t i = tail_start + t; i < a.len; i += nthreads) {
      A ye, ge;
      elem(i, ye, ge);
      push<K>(st, ye, ge);
    }
    const Final<A> f = final_of<K, A>(block_allreduce<R, 1>(stream_value<K>(st), sm, parity));

#pragma unroll(kTwoPassUnroll<T>)
    for (int64_t p = t; p < packs; p += nthreads) {
      const P yv = yp[p];
      P gv = {};
      if constexpr (is_grad(K)) gv = gp[p];
      P o;
#pragma unroll
      for (int j = 0; j < VEC; ++j)
        o.v[j] = from_compute<T>(
            output<K, sizeof(T) == 2>(f, to_compute(yv.v[j]), is_grad(K) ? to_compute(gv.v[j]) : A(0)));
      op[p] = o;
    }
    for (int64_t i = t; i < head; i += nthreads) {
      A ye, ge;
      elem(i, ye, ge);
      out[base + i] = from_compute<T>(output<K, sizeof(T) == 2>(f, ye, ge));
    }
    for (int64_t i = tail_start + t; i < a.len; i += nthreads) {
      A ye, ge;
      elem(i, ye, ge);
      out[base + i] = from_compute<T>(output<K, sizeof(T) == 2>(f, ye, ge));
    }
  }
}

// ---- cuda:strided (inner > 1) ---------------------------------------------------------------

constexpr int kStridedThreads = 256;

struct StridedArgs {
  const void* dy;
  const void* y;
  void* out;
  int64_t outer, len, inner;
};

// blockDim = (TX, TY): threadIdx.x walks TX consecutive groups (o, i) of the flattened outer x
// inner space, so a warp reads TX consecutive i (or, for small inner, a few axis steps of them);
// threadIdx.y takes axis positions ty, ty + TY, ...; the TY partial statistics of a group are
// combined in order.
template <SoftmaxKind K, class T>
__global__ void __launch_bounds__(kStridedThreads) strided_kernel(StridedArgs a) {
  using A = compute_t<T>;
  using R = StreamOp<K, A>;
  using V = typename R::V;
  __shared__ V part[kStridedThreads];
  __shared__ V total[32];
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int64_t groups = a.outer * a.inner;
  const int64_t step = a.inner;
  for (int64_t tile = blockIdx.x; tile * TX < groups; tile += gridDim.x) {
    const int64_t c = tile * TX + tx;
    const bool live = c < groups;
    const int64_t base = live ? (c / a.inner) * a.len * a.inner + c % a.inner : 0;
    auto elem = [&](int64_t ax, A& ye, A& ge) {
      ye = to_compute(y[base + ax * step]);
      ge = A(0);
      if constexpr (is_grad(K)) ge = to_compute(dy[base + ax * step]);
    };
    Stat<A> st{-INFINITY, A(0)};
    if (live)
      for (int64_t ax = ty; ax < a.len; ax += TY) {
        A ye, ge;
        elem(ax, ye, ge);
        push<K>(st, ye, ge);
      }
    part[ty * TX + tx] = stream_value<K>(st);
    __syncthreads();
    if (ty == 0) {
      V v = part[tx];
      for (int k = 1; k < TY; ++k) v = R::combine(v, part[k * TX + tx]);
      total[tx] = v;
    }
    __syncthreads();
    const Final<A> f = final_of<K, A>(total[tx]);
    if (live)
      for (int64_t ax = ty; ax < a.len; ax += TY) {
        A ye, ge;
        elem(ax, ye, ge);
        out[base + ax * step] = from_compute<T>(output<K, sizeof(T) == 2>(f, ye, ge));
      }
    __syncthreads();  // part and total are rewritten by the next tile
  }
}

// ---- host side --------------------------------------------------------------------------------

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int log2_ceil(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

template <class G>
Status visit_kind(SoftmaxKind k, G&& g) {
  switch (k) {
    case SoftmaxKind::softmax_grad: return g(std::integral_constant<SoftmaxKind, SoftmaxKind::softmax_grad>{});
    case SoftmaxKind::log_softmax_grad:
      return g(std::integral_constant<SoftmaxKind, SoftmaxKind::log_softmax_grad>{});
    case SoftmaxKind::softmax: return g(std::integral_constant<SoftmaxKind, SoftmaxKind::softmax>{});
    case SoftmaxKind::log_softmax: break;
  }
  return g(std::integral_constant<SoftmaxKind, SoftmaxKind::log_softmax>{});
}

std::size_t elem_size(const SoftmaxDesc& d) { return dtype_size(d.dtype); }

// Every pointer at one offset from a 16-byte boundary (then every row's packs line up).
bool congruent(const SoftmaxDesc& d) {
  const unsigned m = misalignment16(d.y);
  return m % elem_size(d) == 0 && misalignment16(d.out) == m && (!d.dy || misalignment16(d.dy) == m);
}
// Every row starts on a 16-byte boundary.
bool rows_aligned(const SoftmaxDesc& d) {
  return congruent(d) && misalignment16(d.y) == 0 && d.axis_len * static_cast<int64_t>(elem_size(d)) % 16 == 0;
}
int64_t pack_elems(const SoftmaxDesc& d) { return static_cast<int64_t>(16 / elem_size(d)); }

// Packs (or single elements) of a row on the warp path.
int64_t warp_units(const SoftmaxDesc& d) { return rows_aligned(d) ? d.axis_len / pack_elems(d) : d.axis_len; }
// Elements one block holds, and how many blocks may share a row.
int64_t block_capacity(const SoftmaxDesc& d) {
  const int n = elem_size(d) == 4 ? 4 : elem_size(d) == 2 ? 2 : 1;  // kBlockPacks
  return (congruent(d) ? pack_elems(d) : 1) * n * kBlockMaxThreads;
}
int max_cluster(const SoftmaxDesc& d) { return congruent(d) ? kMaxCluster : 1; }

// Blocks per row on the block path (as run_block picks them).
int blocks_per_row(const SoftmaxDesc& d) {
  const int64_t per_block = block_capacity(d);
  int c = 1;
  while (c < max_cluster(d) && int64_t{c} * per_block < d.axis_len) c *= 2;
  return c;
}

// Where a row needs a cluster, streaming it twice (the second read mostly from L2, with no
// cluster barriers and full occupancy) was measured faster on an H100 for: the forwards in
// f16/bf16 (2048 to 8192 rows of 32K to 131K: 1.4 to 2.1 times faster) and in f32 and f64 from
// eight blocks a row on (1.1 to 1.3 times), and LogSoftmaxGrad in f16/bf16 (1.05 to 1.25 times;
// on an H200 also faster than the staged kernel, by 3 to 30%). SoftmaxGrad, and LogSoftmaxGrad in
// f32, stay on chip (two passes were 1.3 to 1.6 times slower there).
bool two_passes_faster(const SoftmaxDesc& d) {
  const int c = blocks_per_row(d);
  if (c == 1) return false;
  const bool half = elem_size(d) == 2;
  switch (d.kind) {
    case SoftmaxKind::softmax:
    case SoftmaxKind::log_softmax: return half || c >= 8;
    case SoftmaxKind::log_softmax_grad: return half;
    case SoftmaxKind::softmax_grad: break;
  }
  return false;
}

// Checks shared by every implementation; `done` when there is nothing to launch.
Status prologue(const SoftmaxDesc& d, std::string_view op, DeviceInfo* dev, bool* done) {
  const std::size_t es = elem_size(d);
  for (const void* p : {d.dy, d.y, static_cast<const void*>(d.out)})
    if (p && !aligned_to(p, es))
      return Status(StatusCode::unimplemented, std::string(op) +
                                                   ": the CUDA kernels need every pointer aligned to its element size (" +
                                                   std::to_string(es) + " bytes)");
  *done = d.outer == 0 || d.axis_len == 0 || d.inner == 0;
  if (*done) return {};
  return current_device(op, dev);
}

// A grid of `units` independent pieces of work for kernels whose blocks loop over them, at most
// what is resident at once, and sized so that every block takes the same number of pieces (a
// ragged last round would leave most of the machine idle while a few blocks finish).
int64_t even_grid(int64_t units, int64_t resident) {
  resident = std::max<int64_t>(resident, 1);
  const int64_t rounds = ceil_div(units, resident);
  return std::clamp<int64_t>(ceil_div(units, rounds), 1, 0x7fffffff);
}

// Tuning of the warp and staged paths; run() uses the defaults (staged_packs: 4).
struct RowTuning {
  int warp_packs_per_lane = 2;  // the warp path's G is chosen so that a lane holds about this many
  int staged_packs = 0;  // packs a thread of the staged kernel (0: 2, or 4 where 2 need over 16 blocks)
  int staged_max_threads = kStagedMaxThreads;
};

template <SoftmaxKind K, class T, int VEC, int N, bool kPrefetch>
Status launch_warp(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                   int log2_lanes) {
  constexpr auto kernel = warp_kernel<K, T, VEC, N, kPrefetch>;
  const int64_t rows_per_block = (kWarpThreads / 32) * (32 >> log2_lanes);
  const int64_t steps = ceil_div(d.outer, rows_per_block);
  int64_t blocks = std::clamp<int64_t>(steps, 1, 0x7fffffff);
  if constexpr (kPrefetch) {
    int per_sm = 0;
    if (Status s = blocks_per_sm<kernel>(op, dev, kWarpThreads, &per_sm); !s) return s;
    blocks = even_grid(steps, int64_t{dev.sm_count} * per_sm);
  }
  const RowArgs a{d.dy, d.y, d.out, d.outer, d.axis_len};
  return launch(op, "the warp-per-row launch", kernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarpThreads),
                stream_of(ctx), a, log2_lanes);
}

template <SoftmaxKind K, class T, int VEC, bool kPrefetch = false>
Status run_warp(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                const RowTuning& tune = {}) {
  const int64_t units = VEC > 1 ? d.axis_len / VEC : d.axis_len;
  // G lanes per row holding about warp_packs_per_lane packs each (more where a row needs it).
  const int log2_lanes = std::min(5, log2_ceil(ceil_div(units, tune.warp_packs_per_lane)));
  const int64_t per_lane = ceil_div(units, int64_t{1} << log2_lanes);
  if (per_lane <= 1) return launch_warp<K, T, VEC, 1, kPrefetch>(op, d, ctx, dev, log2_lanes);
  if (per_lane <= 2) return launch_warp<K, T, VEC, 2, kPrefetch>(op, d, ctx, dev, log2_lanes);
  if (per_lane <= 4 || kWarpMaxPacksPerLane<T> == 4)
    return launch_warp<K, T, VEC, 4, kPrefetch>(op, d, ctx, dev, log2_lanes);
  return launch_warp<K, T, VEC, kWarpMaxPacksPerLane<T>, kPrefetch>(op, d, ctx, dev, log2_lanes);
}

template <SoftmaxKind K, class T, int VEC>
Status run_two_pass(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  constexpr auto kernel = two_pass_kernel<K, T, VEC>;
  int per_sm = 0;
  if (Status s = blocks_per_sm<kernel>(op, dev, kTwoPassThreads, &per_sm); !s) return s;
  // Resident blocks only: fewer rows open at once, so that the second read finds them in L2.
  const int64_t blocks = std::clamp<int64_t>(d.outer, 1, int64_t{dev.sm_count} * per_sm);
  const RowArgs a{d.dy, d.y, d.out, d.outer, d.axis_len};
  return launch(op, "the two-pass launch", kernel, dim3(static_cast<unsigned>(blocks)), dim3(kTwoPassThreads),
                stream_of(ctx), a);
}

// Launches a cluster of C blocks per row; *launched is false (and nothing runs) where this device
// or build cannot run clusters of that size and block.
template <SoftmaxKind K, class T, int VEC, int C>
Status launch_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                      int threads, bool* launched) {
  constexpr auto kernel = block_kernel<K, T, VEC, C>;
  *launched = false;
  cudaFuncAttributes attr{};
  if (Status s = status_of(cudaFuncGetAttributes(&attr, kernel), op, "cudaFuncGetAttributes"); !s) return s;
  if (!dev.cluster_launch || attr.binaryVersion < 90) return {};
  if constexpr (C > 8) {
    if (Status s = status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), op,
                             "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
        !s)
      return s;
  }
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = C;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(C);
  cfg.blockDim = dim3(threads);
  cfg.stream = stream_of(ctx);
  cfg.attrs = &cluster;
  cfg.numAttrs = 1;
  int clusters = 0;
  const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
  if (e == cudaErrorInvalidClusterSize || (e == cudaSuccess && clusters < 1)) {
    (void)cudaGetLastError();
    return {};  // cannot be co-scheduled here
  }
  if (Status s = status_of(e, op, "cudaOccupancyMaxActiveClusters"); !s) return s;
  cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(d.outer, 0x7fffffff / C) * C));
  const RowArgs a{d.dy, d.y, d.out, d.outer, d.axis_len};
  *launched = true;
  return status_of(cudaLaunchKernelEx(&cfg, kernel, a), op, "the cluster-per-row launch");
}

template <SoftmaxKind K, class T, int VEC>
Status try_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev, int c,
                   int threads, bool* launched) {
  *launched = false;
  if constexpr (VEC > 1) {
    switch (c) {
      case 2: return launch_cluster<K, T, VEC, 2>(op, d, ctx, dev, threads, launched);
      case 4: return launch_cluster<K, T, VEC, 4>(op, d, ctx, dev, threads, launched);
      case 8: return launch_cluster<K, T, VEC, 8>(op, d, ctx, dev, threads, launched);
      case 16: return launch_cluster<K, T, VEC, 16>(op, d, ctx, dev, threads, launched);
      default: break;
    }
  }
  return {};
}

template <SoftmaxKind K, class T, int VEC>
Status run_block(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  constexpr int N = kBlockPacks<T>;
  const int64_t units = VEC > 1 ? d.axis_len / VEC : d.axis_len;  // whole packs in a row, at most
  const int max_c = VEC > 1 ? kMaxCluster : 1;
  // Threads for c blocks per row, or 0 if c blocks of the largest size cannot hold the row.
  auto threads_for = [&](int c) -> int {
    const int64_t t = ceil_div(ceil_div(units, int64_t{c} * N), 32) * 32;
    return t <= kBlockMaxThreads ? static_cast<int>(std::max<int64_t>(t, 32)) : 0;
  };
  // The fewest blocks that hold the row: each block's share of a row then carries the most data
  // per barrier (two blocks share a multiprocessor, so one's reduction overlaps the other's loads).
  int c = 1;
  while (c < max_c && threads_for(c) == 0) c *= 2;
  const RowArgs a{d.dy, d.y, d.out, d.outer, d.axis_len};
  if (c == 1) {
    const int threads = threads_for(1);
    const int64_t blocks = std::clamp<int64_t>(d.outer, 1, 0x7fffffff);
    return launch(op, "the block-per-row launch", block_kernel<K, T, VEC, 1>, dim3(static_cast<unsigned>(blocks)),
                  dim3(threads), stream_of(ctx), a);
  }
  // Where a cluster this large cannot be co-scheduled, half as many blocks twice the size may be.
  for (; c >= 2 && threads_for(c) > 0; c /= 2) {
    bool launched = false;
    if (Status s = try_cluster<K, T, VEC>(op, d, ctx, dev, c, threads_for(c), &launched); !s || launched) return s;
  }
  if (detail::verbose_dispatch())
    detail::log_dispatch(op, "cuda:block_per_row", "found no cluster it can co-schedule here: cuda:two_pass runs");
  return run_two_pass<K, T, VEC>(op, d, ctx, dev);  // read the row twice
}

// Launches the staged kernel with a cluster of C blocks per row (C = 1: one block); *launched is
// false (and nothing runs) where this device or build cannot run that cluster.
template <SoftmaxKind K, class T, int VEC, int C, int N>
Status launch_staged(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                     int threads, bool* launched) {
  constexpr auto kernel = staged_kernel<K, T, VEC, C, N>;
  *launched = false;
  cudaFuncAttributes attr{};
  if (Status s = status_of(cudaFuncGetAttributes(&attr, kernel), op, "cudaFuncGetAttributes"); !s) return s;
  if (attr.binaryVersion < 80) return {};  // cp.async needs compute capability 8.0
  if (C > 1 && (!dev.cluster_launch || attr.binaryVersion < 90)) return {};
  const std::size_t smem = staged_smem(N, threads);
  if (Status s = status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(staged_smem(N, kStagedMaxThreads))),
                           op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
      !s) {
    return {};  // more shared memory than this device has: another path runs
  }
  if constexpr (C > 8) {
    if (Status s = status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), op,
                             "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
        !s)
      return s;
  }
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = C;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(C);
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream_of(ctx);
  cfg.attrs = C > 1 ? &cluster : nullptr;
  cfg.numAttrs = C > 1 ? 1 : 0;
  int64_t resident = 0;
  if constexpr (C > 1) {
    int clusters = 0;
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &cfg);
    if (e == cudaErrorInvalidClusterSize || (e == cudaSuccess && clusters < 1)) {
      (void)cudaGetLastError();
      return {};  // cannot be co-scheduled here
    }
    if (Status s = status_of(e, op, "cudaOccupancyMaxActiveClusters"); !s) return s;
    resident = clusters;
  } else {
    int per_sm = 0;
    if (Status s = status_of(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), op,
                             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        !s)
      return s;
    if (per_sm < 1) return {};
    resident = int64_t{dev.sm_count} * per_sm;
  }
  // Resident clusters only, each taking every step-th row: the copies of a cluster's next rows
  // are what keeps the memory system busy, so no cluster may wait for a slot.
  cfg.gridDim = dim3(static_cast<unsigned>(std::min<int64_t>(even_grid(d.outer, resident), 0x7fffffff / C) * C));
  const RowArgs a{d.dy, d.y, d.out, d.outer, d.axis_len};
  *launched = true;
  return status_of(cudaLaunchKernelEx(&cfg, kernel, a), op, "the staged row launch");
}

template <SoftmaxKind K, class T, int VEC, int N>
Status try_staged(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev, int c,
                  int threads, bool* launched) {
  *launched = false;
  switch (c) {
    case 1: return launch_staged<K, T, VEC, 1, N>(op, d, ctx, dev, threads, launched);
    case 2: return launch_staged<K, T, VEC, 2, N>(op, d, ctx, dev, threads, launched);
    case 4: return launch_staged<K, T, VEC, 4, N>(op, d, ctx, dev, threads, launched);
    case 8: return launch_staged<K, T, VEC, 8, N>(op, d, ctx, dev, threads, launched);
    case 16: return launch_staged<K, T, VEC, 16, N>(op, d, ctx, dev, threads, launched);
    default: break;
  }
  return {};
}

// The gradients' block path: the fewest blocks of at most staged_max_threads threads, N packs
// each, that hold the row (then each block's share of a row carries the most data per barrier).
template <SoftmaxKind K, class T, int VEC>
Status run_staged(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                  const RowTuning& tune, bool* launched) {
  *launched = false;
  const int64_t units = d.axis_len / VEC;
  auto threads_for = [&](int c, int n) -> int {
    const int64_t t = ceil_div(ceil_div(units, int64_t{c} * n), 32) * 32;
    return t <= tune.staged_max_threads ? static_cast<int>(std::max<int64_t>(t, 32)) : 0;
  };
  int n = tune.staged_packs ? tune.staged_packs : threads_for(kMaxCluster, 2) ? 2 : 4;
  int c = 1;
  while (c < kMaxCluster && threads_for(c, n) == 0) c *= 2;
  for (; c >= 1 && threads_for(c, n) > 0; c /= 2) {
    const int threads = threads_for(c, n);
    Status s = n == 4 ? try_staged<K, T, VEC, 4>(op, d, ctx, dev, c, threads, launched)
                      : try_staged<K, T, VEC, 2>(op, d, ctx, dev, c, threads, launched);
    if (!s || *launched) return s;
    if (c == 1) break;
  }
  return {};
}

template <SoftmaxKind K, class T>
Status run_strided(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  constexpr auto kernel = strided_kernel<K, T>;
  const int tx = 1 << std::min(5, log2_ceil(d.inner));
  const int ty = std::min(kStridedThreads / tx, 1 << std::min(8, log2_ceil(d.axis_len)));
  int per_sm = 0;
  if (Status s = blocks_per_sm<kernel>(op, dev, kStridedThreads, &per_sm); !s) return s;
  const int64_t tiles = ceil_div(d.outer * d.inner, tx);
  const int64_t blocks = std::clamp<int64_t>(tiles, 1, int64_t{dev.sm_count} * per_sm * (kStridedThreads / (tx * ty)));
  const StridedArgs a{d.dy, d.y, d.out, d.outer, d.axis_len, d.inner};
  return launch(op, "the strided launch", kernel, dim3(static_cast<unsigned>(std::min<int64_t>(blocks, 0x7fffffff))),
                dim3(tx, ty), stream_of(ctx), a);
}

enum class Path { warp, block, two_pass, strided };

Status run(const SoftmaxDesc& d, const Context& ctx, Path path) {
  const std::string_view op = op_schema(d.op).name;
  DeviceInfo dev;
  bool done = false;
  if (Status s = prologue(d, op, &dev, &done); !s || done) return s;
  return visit_storage(d.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int V = kPackElems<T>;
    return visit_kind(d.kind, [&](auto kind) -> Status {
      constexpr SoftmaxKind K = decltype(kind)::value;
      switch (path) {
        case Path::warp:
          // About two packs a lane, one step per warp: on an H200, 16-bit rows of 128 ran 10% faster
          // than at four (more, smaller groups), and nothing else moved by more than 1%; warps that
          // prefetch their next rows were 1 to 15% slower (lab/cuda/NOTES.md).
          return rows_aligned(d) ? run_warp<K, T, V>(op, d, ctx, dev) : run_warp<K, T, 1>(op, d, ctx, dev);
        case Path::block:
          if (!congruent(d)) return run_block<K, T, 1>(op, d, ctx, dev);
          // 16-bit SoftmaxGrad rows that need more than one register block: staged through shared
          // memory, 4 packs a thread (on an H200: 0.73 / 0.64 / 0.66 of copy at 32768 / 131072 /
          // 50257 against 0.67 / 0.48 / 0.54-0.68 in registers). In f32, and at 4096, the register
          // kernel was faster (0.90 against 0.75 at 32768 in f32).
          if constexpr (K == SoftmaxKind::softmax_grad && sizeof(T) == 2) {
            if (blocks_per_row(d) > 1) {
              RowTuning tune;
              tune.staged_packs = 4;
              bool launched = false;
              if (Status s = run_staged<K, T, V>(op, d, ctx, dev, tune, &launched); !s || launched) return s;
            }
          }
          return run_block<K, T, V>(op, d, ctx, dev);
        case Path::two_pass:
          return congruent(d) ? run_two_pass<K, T, V>(op, d, ctx, dev) : run_two_pass<K, T, 1>(op, d, ctx, dev);
        case Path::strided: break;
      }
      return run_strided<K, T>(op, d, ctx, dev);
    });
  });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

const char* cuda_softmax_warp_declines(const SoftmaxDesc& d) {
  if (d.inner != 1) return "declines: the axis is not the last one";
  if (cuda::warp_units(d) > 32 * (cuda::elem_size(d) == 8 ? 4 : 8)) return "declines: the row is longer than a warp holds";
  return nullptr;
}
const char* cuda_softmax_block_declines(const SoftmaxDesc& d) {
  if (d.inner != 1) return "declines: the axis is not the last one";
  if (d.axis_len > cuda::block_capacity(d) * cuda::max_cluster(d))
    return "declines: the row is longer than a cluster of blocks holds";
  if (cuda::two_passes_faster(d)) return "declines: two passes were measured faster for such rows";
  return nullptr;
}
const char* cuda_softmax_two_pass_declines(const SoftmaxDesc& d) {
  return d.inner != 1 ? "declines: the axis is not the last one" : nullptr;
}

Status cuda_softmax_warp(const SoftmaxDesc& d, const Context& ctx) { return cuda::run(d, ctx, cuda::Path::warp); }
Status cuda_softmax_block(const SoftmaxDesc& d, const Context& ctx) { return cuda::run(d, ctx, cuda::Path::block); }
Status cuda_softmax_two_pass(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run(d, ctx, cuda::Path::two_pass);
}
Status cuda_softmax_strided(const SoftmaxDesc& d, const Context& ctx) {
  return cuda::run(d, ctx, cuda::Path::strided);
}

}  // namespace gradops::detail
