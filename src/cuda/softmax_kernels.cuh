// Softmax family, CUDA kernels: one read of each input and one write of the output per group
// wherever the group fits on chip. Included once per storage type (softmax_<dtype>.cu), which
// compiles the rows' entries at the end of this file for that type; the rows themselves are in
// softmax_rows.cu.
//
// Contiguous rows (inner == 1), by row length:
//   cuda:warp_per_row   up to 256 packs (128 of f64): a group of G lanes (G = 1 .. 32, so 32/G
//                       rows per warp) holds a row in registers; shuffles reduce it.
//   cuda:block_per_row  up to one block's worth: the row is held in registers by one block.
//   cuda:cluster_per_row up to 16 blocks' worth: the row is held in registers by a cluster of 2 to
//                       16 blocks that exchange their partial results through distributed shared
//                       memory (Hopper).
//   cuda:two_pass       longer rows, rows it was measured faster for (f64 rows past 16,384
//                       elements, forwards past 4,096), or rows no cluster can hold here: the
//                       row is read twice, the second time from L2. For the gradients a row is
//                       split over a cluster of up to 8 blocks where that keeps what the open
//                       rows re-read within a quarter of L2 (one block a row would leave the
//                       second read to DRAM on long rows).
// Non-last axis (inner > 1): softmax_strided.cuh.
//
// A row whose pointers all sit at the same offset from a 16-byte boundary moves in 16-byte packs,
// with the elements before the first boundary and after the last whole pack done one per thread;
// otherwise one element per access. Reductions run in a fixed order (per-thread sums in index
// order, xor butterflies, warps and cluster ranks combined in order): the same bits on every run.
// Forwards held in registers reduce twice (the max, then the sum of exp(x - max), whose terms the
// softmax output reuses); streamed ones carry a running (max, sum). Compute in f32 (f64 for f64);
// each output rounded once (LogSoftmaxGrad's exp from the hardware's exp2 for f16/bf16 outputs).
#pragma once

#include <cooperative_groups.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>

#include "cuda/common.cuh"
#include "cuda/softmax.cuh"
#include "cuda/softmax_rows.cuh"
#include "ops/softmax.hpp"

namespace gradops::cuda {
namespace {

// ---- cuda:warp_per_row ------------------------------------------------------------------------

constexpr int kWarpThreads = 128;
template <class T>
inline constexpr int kWarpMaxPacksPerLane = warp_max_packs_per_lane(sizeof(T));

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

// ---- cuda:block_per_row ---------------------------------------------------------------------

// Packs of each input per thread: block_packs (softmax_rows.cuh).
template <SoftmaxKind K, class T>
inline constexpr int kBlockPacks = block_packs(K, sizeof(T));

// A row held by C blocks of blockDim.x threads: thread t of the cluster holds packs k*T + t of the
// row's aligned body (T threads in all), and at most one element before and one after it. kMinB:
// resident 512-thread blocks asked of the register allocator (2: 64 registers; the lab's tighter
// bound for 16-bit one-block rows spilled and measured 1.5 times slower).
template <SoftmaxKind K, class T, int VEC, int C, int kMinB = 2, int N = kBlockPacks<K, T>>
__global__ void __launch_bounds__(kBlockMaxThreads, kMinB) block_kernel(RowArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  __shared__ ReduceSmem<A> sm;
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  const int64_t t = cluster_thread<C>();
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
  cluster_exit<C>();
}

// ---- cuda:two_pass ----------------------------------------------------------------------------

constexpr int kTwoPassThreads = 512;
constexpr int kMaxTwoPassCluster = 8;
// Packs in flight per thread; f64 keeps fewer live across the calls its library functions make.
template <class T>
inline constexpr int kTwoPassUnroll = sizeof(T) == 8 ? 1 : 4;

// A row streamed twice by C blocks (a cluster; C = 1: one block): thread t of the cluster takes
// packs t, t + T, ... (T threads in all) in both passes, so that the second pass re-reads what the
// same thread read in the first, from L1 or L2. Splitting a row over a cluster keeps fewer rows
// open at once, so that what the second pass re-reads still sits in L2.
template <SoftmaxKind K, class T, int VEC, int C>
__global__ void __launch_bounds__(kTwoPassThreads) two_pass_kernel(RowArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  using R = StreamOp<K, A>;
  __shared__ ReduceSmem<typename R::V> sm;
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  const int64_t t = cluster_thread<C>();
  const int64_t nthreads = static_cast<int64_t>(C) * blockDim.x;
  int parity = 0;
  for (int64_t r = blockIdx.x / C; r < a.rows; r += gridDim.x / C, parity ^= 1) {
    const int64_t base = r * a.len;
    const int64_t head = row_head<T, VEC>(y + base, a.len);
    const int64_t packs = (a.len - head) / VEC;
    const int64_t tail_start = head + packs * VEC;
    const P* yp = reinterpret_cast<const P*>(y + base + head);
    const P* gp = is_grad(K) ? reinterpret_cast<const P*>(dy + base + head) : nullptr;
    P* op = reinterpret_cast<P*>(out + base + head);
    // Both passes walk this thread's part of the row alike: its packs of the aligned body, then its
    // elements before and after it, so that the second re-reads what this thread read (from L1 or
    // L2). A pack reaches on_pack as stored; a single element, on_element in the compute type.
    auto walk = [&](auto&& on_pack, auto&& on_element) {
#pragma unroll(kTwoPassUnroll<T>)
      for (int64_t p = t; p < packs; p += nthreads) {
        const P yv = yp[p];
        P gv = {};
        if constexpr (is_grad(K)) gv = gp[p];
        on_pack(p, yv, gv);
      }
      auto element = [&](int64_t i) {
        const A ye = to_compute(y[base + i]);
        A ge = A(0);
        if constexpr (is_grad(K)) ge = to_compute(dy[base + i]);
        on_element(i, ye, ge);
      };
      for (int64_t i = t; i < head; i += nthreads) element(i);
      for (int64_t i = tail_start + t; i < a.len; i += nthreads) element(i);
    };

    Stat<A> st{-INFINITY, A(0)};
    walk(
        [&](int64_t, const P& yv, const P& gv) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) push<K>(st, unpack(yv, j), is_grad(K) ? unpack(gv, j) : A(0));
        },
        [&](int64_t, A ye, A ge) { push<K>(st, ye, ge); });
    const Final<A> f = final_of<K, A>(block_allreduce<R, C>(stream_value<K>(st), sm, parity));
    walk(
        [&](int64_t p, const P& yv, const P& gv) {
          P o;
#pragma unroll
          for (int j = 0; j < VEC; ++j)
            o.v[j] = from_compute<T>(
                output<K, sizeof(T) == 2>(f, unpack(yv, j), is_grad(K) ? unpack(gv, j) : A(0)));
          op[p] = o;
        },
        [&](int64_t i, A ye, A ge) { out[base + i] = from_compute<T>(output<K, sizeof(T) == 2>(f, ye, ge)); });
  }
  cluster_exit<C>();
}

// ---- host side --------------------------------------------------------------------------------

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

// Rows of the descriptor as the row kernels take them.
RowArgs row_args(const SoftmaxDesc& d) { return {d.dy, d.y, d.out, d.outer, d.axis_len}; }

// Tuning of the warp and two-pass paths; run() uses the defaults.
struct RowTuning {
  int warp_packs_per_lane = 2;  // the warp path's G is chosen so that a lane holds about this many
  int two_pass_cluster = 0;     // blocks per row of the two-pass kernel (0: as run_two_pass picks)
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
  const RowArgs a = row_args(d);
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

// Launches kernel(row_args(d)) in clusters of C blocks of `threads` threads (C = 1: plain blocks),
// count(resident) clusters of them, where resident is how many fit on the device at once. *launched
// is false (and nothing runs) where this device or build cannot run such clusters or count() is 0.
template <int C, class Kernel, class Count>
Status launch_clusters(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                       Kernel kernel, int threads, const char* what, Count&& count, bool* launched) {
  *launched = false;
  int64_t resident = 0;
  if constexpr (C > 1) {
    int clusters = 0;
    if (Status s = resident_clusters(op, kernel, dev, C, threads, &clusters); !s) return s;
    if (clusters < 1) return {};  // cannot be co-scheduled here
    resident = clusters;
  } else {
    int per_sm = 0;
    if (Status s = status_of(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, 0), op,
                             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
        !s)
      return s;
    resident = int64_t{dev.sm_count} * std::max(per_sm, 1);  // plain blocks always launch
  }
  const int64_t n = resident > 0 ? count(resident) : 0;
  if (n <= 0) return {};
  *launched = true;
  return launch_clustered(op, what, kernel, dim3(static_cast<unsigned>(n * C)), dim3(threads), C, 0, stream_of(ctx),
                          row_args(d));
}

// The two-pass kernel with clusters of C blocks per row, resident ones only; declines (nothing runs)
// where more than max_open rows would be open at once and a larger cluster could take fewer.
template <SoftmaxKind K, class T, int VEC, int C>
Status launch_two_pass(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                       int64_t max_open, bool* launched) {
  auto count = [&](int64_t resident) -> int64_t {
    return C < kMaxTwoPassCluster && resident > max_open ? 0 : std::min<int64_t>(d.outer, resident);
  };
  return launch_clusters<C>(op, d, ctx, dev, two_pass_kernel<K, T, VEC, C>, kTwoPassThreads, "the two-pass launch",
                            count, launched);
}

// The second pass re-reads a row from L2 only if it is still there. Gradients: the fewest blocks
// per row (1 to 8, a cluster) that keep what the open rows re-read within a quarter of L2 (the rest
// holds the outputs being written and the other input passing through). Forwards: one block a row
// (split over clusters they ran at 0.55 to 0.85 times the speed on an H200; their first pass, an
// exp per element in a running max and sum, is the likelier limit there than the bytes).
// tune.two_pass_cluster: that many blocks, if the device can run them.
template <SoftmaxKind K, class T, int VEC>
Status run_two_pass(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                    const RowTuning& tune = {}) {
  // What the second pass reads again: dy (LogSoftmaxGrad), y and dy (SoftmaxGrad).
  const int64_t reread = d.axis_len * static_cast<int64_t>(sizeof(T)) * (K == SoftmaxKind::softmax_grad ? 2 : 1);
  const int64_t max_open = tune.two_pass_cluster || !is_grad(K)
                               ? INT64_MAX
                               : std::max<int64_t>(1, int64_t{dev.l2_bytes} / 4 / std::max<int64_t>(reread, 1));
  bool launched = false;
  auto attempt = [&](auto c) -> Status {
    constexpr int C = decltype(c)::value;
    // Clusters for rows in packs only (one element a thread spills at C > 1, and is rare).
    if constexpr (C > 1 && VEC == 1) {
      return Status{};
    } else {
      if (tune.two_pass_cluster && tune.two_pass_cluster != C) return Status{};
      return launch_two_pass<K, T, VEC, C>(op, d, ctx, dev, max_open, &launched);
    }
  };
  using std::integral_constant;
  if (Status s = attempt(integral_constant<int, 1>{}); !s || launched) return s;
  if (Status s = attempt(integral_constant<int, 2>{}); !s || launched) return s;
  if (Status s = attempt(integral_constant<int, 4>{}); !s || launched) return s;
  if (Status s = attempt(integral_constant<int, 8>{}); !s || launched) return s;
  return launch_two_pass<K, T, VEC, 1>(op, d, ctx, dev, INT64_MAX, &launched);  // no cluster runs here
}

// The register kernel with a cluster of C blocks per row, a row per cluster.
template <SoftmaxKind K, class T, int VEC, int C, int N>
Status launch_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev,
                      int threads, bool* launched) {
  auto count = [&](int64_t) { return std::min<int64_t>(d.outer, 0x7fffffff / C); };
  return launch_clusters<C>(op, d, ctx, dev, block_kernel<K, T, VEC, C, 2, N>, threads, "the cluster-per-row launch",
                            count, launched);
}

template <SoftmaxKind K, class T, int VEC, int N>
Status try_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev, int c,
                   int threads, bool* launched) {
  *launched = false;
  if constexpr (VEC > 1) {
    switch (c) {
      case 2: return launch_cluster<K, T, VEC, 2, N>(op, d, ctx, dev, threads, launched);
      case 4: return launch_cluster<K, T, VEC, 4, N>(op, d, ctx, dev, threads, launched);
      case 8: return launch_cluster<K, T, VEC, 8, N>(op, d, ctx, dev, threads, launched);
      case 16: return launch_cluster<K, T, VEC, 16, N>(op, d, ctx, dev, threads, launched);
      default: break;
    }
  }
  return {};
}

// One block per row (row_blocks(d, N) == 1).
template <SoftmaxKind K, class T, int VEC, int N = kBlockPacks<K, T>>
Status run_block(std::string_view op, const SoftmaxDesc& d, const Context& ctx) {
  const int64_t blocks = std::clamp<int64_t>(d.outer, 1, 0x7fffffff);
  return launch(op, "the block-per-row launch", block_kernel<K, T, VEC, 1, 2, N>, dim3(static_cast<unsigned>(blocks)),
                dim3(row_block_threads(d, 1, N)), stream_of(ctx), row_args(d));
}

// Whether clusters of C blocks of `threads` threads of block_kernel<K, T, VEC, C, 2, N> can be
// co-scheduled on this device (as launch_clusters asks before it launches them).
template <SoftmaxKind K, class T, int VEC, int C, int N>
Status cluster_fits(std::string_view op, const DeviceInfo& dev, int threads, bool* fits) {
  int clusters = 0;
  Status s = resident_clusters(op, block_kernel<K, T, VEC, C, 2, N>, dev, C, threads, &clusters);
  *fits = clusters >= 1;
  return s;
}

template <SoftmaxKind K, class T, int VEC, int N>
Status cluster_fits(std::string_view op, const DeviceInfo& dev, int c, int threads, bool* fits) {
  *fits = false;
  if constexpr (VEC > 1) {
    switch (c) {
      case 2: return cluster_fits<K, T, VEC, 2, N>(op, dev, threads, fits);
      case 4: return cluster_fits<K, T, VEC, 4, N>(op, dev, threads, fits);
      case 8: return cluster_fits<K, T, VEC, 8, N>(op, dev, threads, fits);
      case 16: return cluster_fits<K, T, VEC, 16, N>(op, dev, threads, fits);
      default: break;
    }
  }
  return {};
}

// The cluster cuda:cluster_per_row takes a row on: row_blocks(d) blocks or, where a cluster this
// large cannot be co-scheduled, half as many blocks twice the size, as long as they hold the row;
// 0 where none can (cuda:two_pass then reads the row twice).
template <SoftmaxKind K, class T, int VEC, int N = kBlockPacks<K, T>>
Status cluster_size(std::string_view op, const SoftmaxDesc& d, const DeviceInfo& dev, int* blocks) {
  *blocks = 0;
  for (int c = row_blocks(d, N); c >= 2 && row_block_threads(d, c, N) > 0; c /= 2) {
    bool fits = false;
    if (Status s = cluster_fits<K, T, VEC, N>(op, dev, c, row_block_threads(d, c, N), &fits); !s) return s;
    if (fits) {
      *blocks = c;
      return {};
    }
  }
  return {};
}

template <SoftmaxKind K, class T, int VEC, int N = kBlockPacks<K, T>>
Status run_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  int c = 0;
  if (Status s = cluster_size<K, T, VEC, N>(op, d, dev, &c); !s) return s;
  bool launched = false;
  if (c > 0)
    if (Status s = try_cluster<K, T, VEC, N>(op, d, ctx, dev, c, row_block_threads(d, c, N), &launched); !s) return s;
  if (!launched)
    return Status(StatusCode::internal,
                  std::string(op) + ": cuda:cluster_per_row found no cluster it can co-schedule, yet did not decline");
  return {};
}

}  // namespace

// ---- the rows' entries (softmax_rows.cuh) ---------------------------------------------------------

// About two packs a lane, one step per warp: on an H200, 16-bit rows of 128 ran 10% faster than at
// four (more, smaller groups), and nothing else moved by more than 1%; warps that prefetch their
// next rows were 1 to 15% slower (lab/cuda/NOTES.md).
template <class T>
Status softmax_warp(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr SoftmaxKind K = decltype(kind)::value;
    return rows_aligned(d) ? run_warp<K, T, kPackElems<T>>(op, d, ctx, dev) : run_warp<K, T, 1>(op, d, ctx, dev);
  });
}

template <class T>
Status softmax_block(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo&) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr SoftmaxKind K = decltype(kind)::value;
    return congruent(d) ? run_block<K, T, kPackElems<T>>(op, d, ctx) : run_block<K, T, 1>(op, d, ctx);
  });
}

template <class T>
Status softmax_cluster_size(std::string_view op, const SoftmaxDesc& d, const DeviceInfo& dev, int* blocks) {
  *blocks = 0;
  if (!congruent(d)) return {};  // clusters hold rows in packs only
  return visit_kind(d.kind, [&](auto kind) -> Status {
    return cluster_size<decltype(kind)::value, T, kPackElems<T>>(op, d, dev, blocks);
  });
}

template <class T>
Status softmax_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    return run_cluster<decltype(kind)::value, T, kPackElems<T>>(op, d, ctx, dev);
  });
}

template <class T>
Status softmax_two_pass(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr SoftmaxKind K = decltype(kind)::value;
    return congruent(d) ? run_two_pass<K, T, kPackElems<T>>(op, d, ctx, dev) : run_two_pass<K, T, 1>(op, d, ctx, dev);
  });
}


}  // namespace gradops::cuda
