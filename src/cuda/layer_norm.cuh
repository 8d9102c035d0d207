// LayerNorm family, CUDA: what the gradient (cuda/layer_norm_grad.cu) and forward
// (cuda/layer_norm_fwd.cu) translation units share: the signatures, the kernel arguments, the
// per-element math (the CPU implementation's formulas and compute type), the reduction over the
// lanes that hold a row, and the launch shape each row length gets.
//
// Launch shapes, chosen from the shape alone (never from the device's SM count, so that dscale
// and dbias, summed in an order that follows the grid, have the same bits on every device):
//   held     rows whose pointers and length allow 16-byte packs: a row is held in registers by
//            `lanes` threads, N packs each: a group of 1 to 32 lanes of a warp (several rows per
//            warp), a group of warps of a block, a whole block, or a cluster of 2 to 16 blocks.
//            One read of x and dy, one write of dx.
//   general  any row: a block per row reads it two (gradient) or three (LayerNorm forward) times,
//            the repeats from L1/L2; scalar accesses, any alignment, any length.
// Gradient column sums: each thread keeps its columns' dscale/dbias sums in registers (held) or
// in its block's partial row (general) over the rows it takes; a block's groups are folded in
// order; then column_sum.cuh adds the partial rows in a fixed order.
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/reduce.cuh"
#include "ops/layer_norm.hpp"

namespace gradops::cuda {

using detail::LayerNormDesc;

enum class LnKind { ln_grad, inv_grad, rms_grad, ln_fwd, rms_fwd };

__host__ __device__ constexpr bool is_grad(LnKind k) { return k == LnKind::ln_grad || k == LnKind::inv_grad || k == LnKind::rms_grad; }

// The (T, U, V) storage types of a signature, and the compute type: f64 where any is f64, else f32
// (as on the CPU).
template <class T_, class U_, class V_>
struct Sig {
  using T = T_;
  using U = U_;
  using V = V_;
  using A = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<U, double> || std::is_same_v<V, double>,
                               double, float>;
};

// Calls f(Sig<...>{}) for the descriptor's signature; unimplemented for one the op table lacks.
template <class F>
Status visit_sig(const LayerNormDesc& d, std::string_view op, F&& f) {
  const DType t = d.t, u = d.u, v = d.v;
  if (t == DType::f32 && u == DType::f32 && v == DType::f32) return f(Sig<float, float, float>{});
  if (t == DType::f64 && u == DType::f64 && v == DType::f64) return f(Sig<double, double, double>{});
  if (t == DType::f64 && u == DType::f32 && v == DType::f64) return f(Sig<double, float, double>{});
  if (t == DType::f16 && u == DType::f32 && v == DType::f16) return f(Sig<__half, float, __half>{});
  if (t == DType::bf16 && u == DType::f32 && v == DType::bf16) return f(Sig<__nv_bfloat16, float, __nv_bfloat16>{});
  if (t == DType::f32 && u == DType::f32 && v == DType::f16) return f(Sig<float, float, __half>{});
  if (t == DType::f16 && u == DType::f32 && v == DType::f32) return f(Sig<__half, float, float>{});
  return Status(StatusCode::unimplemented, std::string(op) + ": no CUDA kernel for this (T, U, V) signature");
}

// Everything a kernel of the family reads. `src` is X, or Y for the invertible gradient; `out` is
// dX or the forwards' Y.
struct LnArgs {
  const void* dy;
  const void* src;
  const void* scale;
  const void* bias;     // invertible gradient; LayerNormalization's optional B
  const void* mean;     // LayerNormalizationGrad
  const void* inv_std;  // gradients
  void* out;
  void* out_mean;       // forwards, optional
  void* out_inv_std;    // forwards, optional
  void* partial;        // gradients: [2][groups][cols] compute-type column sums (dscale, dbias), or nullptr
  void* col_out[2];     // general gradient's column blocks: dscale, dbias (either may be nullptr)
  int64_t rows, cols;
  int64_t groups;       // partial rows (one per block, or per cluster); the general kernel's row blocks
  int lanes;            // held: threads per row (a cluster's, for C > 1)
  int cluster;          // held: blocks per row (1: none)
  float epsilon;
  bool prefetch;        // held: the next row's lines are asked into L2 while this one is reduced
};

// Held kernels ask L2 for the lines of the row they take next as soon as they hold the current
// one, so that DRAM stays busy while the row's lanes reduce and write: no registers, one
// instruction per 128-byte line. GRADOPS_CUDA_LN_PREFETCH=0 turns it off, for measuring.
inline bool ln_prefetch() {
  static const bool on = [] {
    const char* v = std::getenv("GRADOPS_CUDA_LN_PREFETCH");
    return !(v && v[0] == '0');
  }();
  return on;
}

// ---- per-element math ---------------------------------------------------------------------------

// The gradients' per-row constants: mu (LayerNormalizationGrad), r (inverse std or RMS).
template <LnKind K, class A>
struct RowConst {
  A mu, r;
};

// xhat = (x - mu) r; RMSNorm: x r; invertible: (y - bias) / scale.
template <LnKind K, class A>
__device__ __forceinline__ A xhat(A src, A mu, A r, A scale, A bias) {
  // f32: times the correctly rounded reciprocal (two roundings, within 1 ulp of the quotient):
  // the division's slow path left the 16-bit invertible gradients issue-bound at 0.4-0.55 of copy.
  if constexpr (K == LnKind::inv_grad && std::is_same_v<A, float>) return (src - bias) * __frcp_rn(scale);
  else if constexpr (K == LnKind::inv_grad) return (src - bias) / scale;
  else if constexpr (K == LnKind::rms_grad || K == LnKind::rms_fwd) return mul_rn(src, r);
  else return mul_rn(src - mu, r);
}

// dx from g = dy scale, xhat and the row means m1 = S1/cols, m2 = S2/cols (RMSNorm: no m1 term):
// r ((g - m1) - xhat m2), the CPU's order.
template <LnKind K, class A>
__device__ __forceinline__ A grad_out(A g, A xh, A m1, A m2, A r) {
  const A a = K == LnKind::rms_grad ? g : g - m1;
  return r * dfma(-xh, m2, a);
}

// ---- reductions over a row's lanes ----------------------------------------------------------------

inline constexpr int kLnMaxCluster = 16;  // the most blocks that share a row (more than 8: non-portable)

template <class V>
struct LnSmem {
  V warps[2][32];                 // [parity][warp of the block]
  Mailbox<V, kLnMaxCluster> box;  // the cluster's block totals
};

__device__ __forceinline__ int cluster_rank(int cluster) {
#if defined(_CG_HAS_CLUSTER_GROUP)
  if (cluster > 1) return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#endif
  (void)cluster;
  return 0;
}

// The combined value over a row's `lanes` threads: a group of lanes of a warp (lanes <= 32: a
// butterfly), a group of lanes / 32 consecutive warps of the block, or every thread of a cluster of
// `cluster` blocks (each block posts its total into every block's mailbox; a cluster kernel opens
// sm.box first). The same fixed order as reduce.cuh's block_allreduce, so every thread ends with
// the same bits. Every thread of the block calls it (the barriers are the block's), `exchange`
// counting the calls.
template <class R>
__device__ __forceinline__ typename R::V lanes_allreduce(typename R::V v, int lanes, int cluster,
                                                        LnSmem<typename R::V>& sm, int exchange) {
  using V = typename R::V;
  const int parity = exchange & 1;
  if (lanes <= 32) return group_allreduce<R>(v, lanes);
  v = group_allreduce<R>(v, 32);
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  const int per_row = cluster > 1 ? static_cast<int>(blockDim.x / 32) : lanes / 32;
  if (lane == 0) sm.warps[parity][warp] = v;
  __syncthreads();
  const int first = warp / per_row * per_row;
  V t = lane < per_row ? sm.warps[parity][first + lane] : R::identity();
  t = group_allreduce<R>(t, 32);
  if (cluster > 1) {
#if defined(_CG_HAS_CLUSTER_GROUP)
    mailbox_send(sm.box, t, cluster_rank(cluster), cluster, exchange);
    const V* all = mailbox_receive(sm.box, exchange);
    t = lane < cluster ? all[lane] : R::identity();
    t = group_allreduce<R>(t, 32);
#else
    __trap();  // the host launches clusters only for code built for compute capability 9.0+
#endif
  }
  return t;
}

__device__ __forceinline__ void cluster_sync(int cluster) {
#if defined(_CG_HAS_CLUSTER_GROUP)
  if (cluster > 1) cooperative_groups::this_cluster().sync();
#endif
  (void)cluster;
}

// ---- launch shapes (host) -------------------------------------------------------------------------

// Elements a held thread moves per pack: 16 bytes of the widest of T and V (f32 with f16: 4).
template <class S>
inline constexpr int kLnVec = static_cast<int>(16 / std::max(sizeof(typename S::T), sizeof(typename S::V)));

// Packs a held thread holds at most, and threads a block.
inline constexpr int kLnMaxPacks = 4;
inline constexpr int kLnFwdMaxPacks = 8;
inline constexpr int kLnBlockThreads = 256;  // held blocks of several rows
inline constexpr int kLnMaxBlockThreads = 512;
// Threads per multiprocessor the grids are sized for, on 132 multiprocessors (an H100 SXM or an
// H200): one resident wave. A constant, not the device's count: the grid decides the order of
// the dscale/dbias sums, which must depend on the shape alone. Kernels holding 1 pack a thread are
// bounded to 64 registers (1024 threads a multiprocessor), the others to 128 (512).
inline constexpr int kLnSms = 132;
constexpr int ln_threads_per_sm(int n) { return n == 1 ? 1024 : 512; }

// Shared memory for a held block's own copy of its threads' per-column packs (scale, and bias
// where given): `tensors` of them, n packs a thread, [tensor][k][thread], each thread writing and
// reading only its own slots. Read each row from there instead of global memory: fewer global
// loads, off the row's critical path.
template <class S>
__host__ __device__ constexpr std::size_t ln_column_bytes(int tensors, int n, unsigned threads) {
  return static_cast<std::size_t>(tensors) * static_cast<std::size_t>(n) * threads * kLnVec<S> * sizeof(typename S::V);
}

// The calling thread's slot k of an own-slot array ([k][thread]).
template <class P>
__device__ __forceinline__ P& own_slot(P* slots, int k) {
  return slots[k * blockDim.x + threadIdx.x];
}

// Copies the thread's packs k * lanes + t (k < N, those before `packs`) of `from` into its own
// slots. Only the thread reads them back, so no barrier is needed.
template <int N, class P>
__device__ __forceinline__ void keep_own(P* slots, const P* from, int lanes, int t, int64_t packs) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const int64_t p = static_cast<int64_t>(k) * lanes + t;
    if (p < packs) own_slot(slots, k) = from[p];
  }
}

struct HeldShape {
  bool ok = false;
  int n = 0;        // packs per thread
  int lanes = 0;    // threads per row (over the whole cluster)
  int threads = 0;  // blockDim.x
  int cluster = 1;
  int64_t blocks = 0;  // gridDim.x (a multiple of cluster)
  int64_t groups = 0;  // partial rows: blocks / cluster
  int64_t rows_per_block = 0;
};

// The held launch shape of rows of `packs` packs.
// max_packs: 8 lets the forwards (which keep no column sums in registers) hold 8 packs a thread
// where 4 would need a cluster, halving the blocks that share a row and so its cluster barriers.
inline HeldShape held_shape(int64_t rows, int64_t packs, int max_packs = kLnMaxPacks) {
  HeldShape s;
  if (packs <= 0) return s;
  int64_t lanes;
  if (packs <= 32) {
    s.n = 1;
    lanes = 1;
    while (lanes < packs) lanes *= 2;
  } else if (packs <= 64) {
    s.n = 2;
    lanes = 32;
  } else {
    s.n = packs > int64_t{kLnMaxBlockThreads} * kLnMaxPacks ? max_packs : kLnMaxPacks;
    lanes = ceil_div(ceil_div(packs, s.n), 32) * 32;
    if (lanes <= 32) {
      lanes = 32;
    } else if (lanes > 32 && lanes < kLnBlockThreads) {
      // a group of warps: a power of 2, so that the block holds whole rows
      int64_t p = 64;
      while (p < lanes) p *= 2;
      lanes = p;
    }
  }
  if (lanes <= kLnBlockThreads) {
    s.threads = kLnBlockThreads;
    s.cluster = 1;
  } else {
    int c = 1;
    while (c < kLnMaxCluster && int64_t{c} * kLnMaxBlockThreads < lanes) c *= 2;
    if (int64_t{c} * kLnMaxBlockThreads < lanes) return s;  // longer than a cluster holds
    const int64_t per_block = ceil_div(ceil_div(packs, s.n), c);
    s.threads = static_cast<int>(ceil_div(per_block, 32) * 32);
    s.cluster = c;
    lanes = int64_t{s.threads} * c;
  }
  s.lanes = static_cast<int>(lanes);
  s.rows_per_block = s.cluster > 1 ? 1 : s.threads / s.lanes;
  const int64_t resident = std::max<int64_t>(1, int64_t{kLnSms} * ln_threads_per_sm(s.n) / s.threads / s.cluster);
  const int64_t needed = ceil_div(rows, s.rows_per_block);
  // Every group of blocks takes the same number of steps (a ragged last round idles the rest).
  const int64_t rounds = ceil_div(needed, resident);
  s.groups = std::max<int64_t>(1, ceil_div(needed, rounds));
  s.blocks = s.groups * s.cluster;
  s.ok = true;
  return s;
}

// Clusters of h->cluster blocks of `kernel`: at most as many as the device co-schedules at once
// (clusters of 8 fill whole GPCs, and an H100's GPCs do not all hold two), so that no cluster waits
// for a second wave; h->ok = false where none can run (no clusters, or too few registers).
template <class Kernel>
Status fit_clusters(std::string_view op, Kernel kernel, const DeviceInfo& dev, int64_t rows, HeldShape* h,
                    std::size_t smem = 0) {
  int clusters = 0;
  if (Status s = resident_clusters(op, kernel, dev, h->cluster, h->threads, &clusters, smem); !s) return s;
  if (clusters < 1) {
    h->ok = false;
    return {};
  }
  if (h->groups > clusters) {  // a cluster takes one row a step; every cluster the same number of steps
    const int64_t rounds = ceil_div(rows, clusters);
    h->groups = ceil_div(rows, rounds);
    h->blocks = h->groups * h->cluster;
  }
  return {};
}

// Every main tensor and every per-column tensor starts on a 16-byte boundary... of its own pack
// (a pack of f16 beside f32 is 8 bytes), and a row is a whole number of packs.
template <class S>
bool held_aligned(const LayerNormDesc& d) {
  constexpr int vec = kLnVec<S>;
  if (d.cols % vec) return false;
  const std::size_t tb = sizeof(typename S::T) * vec, vb = sizeof(typename S::V) * vec;
  const std::size_t srcb = d.op == OpId::InvertibleLayerNormalizationGrad ? vb : tb;
  const bool fwd = d.out_y != nullptr;
  if (d.x && !aligned_to(d.x, tb)) return false;
  if (d.y && !aligned_to(d.y, srcb)) return false;
  if (d.dy && !aligned_to(d.dy, vb)) return false;
  if (d.dx && !aligned_to(d.dx, tb)) return false;
  if (fwd && !aligned_to(d.out_y, vb)) return false;
  if (d.scale && !aligned_to(d.scale, vb)) return false;
  if (d.bias && !aligned_to(d.bias, vb)) return false;
  return true;
}

// ---- the implementation rows (host): what both directions share ----------------------------------

// The kernel choices, one implementation row each (src/ops/layer_norm.cpp): the held kernel at its
// three launch-shape classes, and the general kernel.
using Path = detail::LayerNormCudaKernel;

// Every kernel loads and stores whole elements: no row takes a pointer not aligned to its size.
inline const char* ln_unaligned(const LayerNormDesc& d) {
  const std::pair<const void*, DType> tensors[] = {
      {d.x, d.t},          {d.y, d.v},           {d.dy, d.v},           {d.dx, d.t},      {d.scale, d.v},
      {d.bias, d.v},       {d.mean, d.u},        {d.inv_std, d.u},      {d.dscale, d.v},  {d.dbias, d.v},
      {d.out_y, d.v},      {d.out_mean, d.u},    {d.out_inv_std, d.u}};
  for (const auto& [p, dt] : tensors)
    if (p && !aligned_to(p, dtype_size(dt))) return "declines: a pointer is not aligned to its element size";
  return nullptr;
}

// The kernel that runs d, and its launch shape: the held kernel where the rows are of whole packs
// and fit (held_shape with the direction's packs per thread), classed by its launch shape; else
// the general one. A cluster must also be one the device can run: `fit(dev, &h)` is the
// direction's fit_clusters for its held kernel, asked only with a device (dev = nullptr leaves a
// cluster's rows to the cluster row, which is how the warp and block rows' declines() ask).
struct LnPlan {
  Path path = Path::general;
  HeldShape h;
};
template <class S, class Fit>
Status plan_held(const LayerNormDesc& d, int max_packs, const DeviceInfo* dev, Fit&& fit, LnPlan* p) {
  *p = {};
  if (d.cols == 0 || !held_aligned<S>(d)) return {};
  p->h = held_shape(d.rows, d.cols / kLnVec<S>, max_packs);
  if (p->h.ok && p->h.cluster > 1 && dev)
    if (Status s = fit(*dev, &p->h); !s) return s;
  if (!p->h.ok) return {};
  p->path = p->h.cluster > 1 ? Path::cluster_per_row : p->h.lanes <= 32 ? Path::rows_per_warp : Path::block_per_row;
  return {};
}

// A row's declines(), given the direction's plan(d, dev, &plan): the general row takes whatever
// reaches it (every row before it has declined); a held row takes exactly the calls planned onto
// its launch shape. Only the cluster row asks the device; where the device or the cluster query
// fails, the row accepts, and its run() reports that failure.
template <class Plan>
const char* ln_row_declines(const LayerNormDesc& d, Path row, Plan&& plan) {
  if (const char* why = ln_unaligned(d)) return why;
  if (row == Path::general) return nullptr;
  DeviceInfo dev;
  const bool asked = row == Path::cluster_per_row;
  if (asked && !current_device(op_schema(d.op).name, &dev)) {
    (void)cudaGetLastError();
    return nullptr;
  }
  LnPlan p;
  if (!plan(asked ? &dev : nullptr, &p)) {
    (void)cudaGetLastError();
    return nullptr;
  }
  if (p.path == row) return nullptr;
  switch (row) {
    case Path::rows_per_warp: return "declines: rows not of whole 16-byte packs, or longer than a warp holds";
    case Path::block_per_row:
      return "declines: rows not of whole 16-byte packs, or not longer than a warp holds and no longer than a block";
    default:
      return "declines: rows not of whole 16-byte packs, not longer than a block holds and no longer than a cluster, "
             "or a cluster this device cannot run";
  }
}

// run() of a held row whose plan chose another kernel: declines() and run() disagree.
inline Status ln_not_planned(std::string_view op) {
  return Status(StatusCode::internal, std::string(op) + ": the LayerNorm kernel planned differs from its row's");
}

// Launches kernel with `blocks` blocks of `threads`, `cluster` blocks a cluster and `smem` bytes of
// dynamic shared memory.
template <class Kernel>
Status launch_ln(std::string_view op, const char* what, Kernel kernel, int64_t blocks, int threads, int cluster,
                 std::size_t smem, cudaStream_t stream, const LnArgs& a) {
  return launch_clustered(op, what, kernel, dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(threads)),
                          cluster, smem, stream, a);
}

}  // namespace gradops::cuda
