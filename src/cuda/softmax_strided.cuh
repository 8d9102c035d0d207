// Softmax family, CUDA kernels for a non-last axis (inner > 1), included after softmax_kernels.cuh
// by each storage type's unit (softmax_<dtype>.cu), whose helpers they use:
//   cuda:strided_held   each column group's share of the axis held in registers by a block, or a
//                       cluster of up to 16 blocks, so the tensor is read once (strided_plan in
//                       softmax_rows.cuh says how a shape is laid out)
//   cuda:strided        the rest: threads along inner (in packs where they fit), lanes along the
//                       axis, two passes (a long axis over few columns split into chunks, two
//                       launches)
#pragma once

#include "core/workspace.hpp"
#include "cuda/softmax_kernels.cuh"

namespace gradops::cuda {
namespace {

// ---- cuda:strided (inner > 1) ---------------------------------------------------------------

constexpr int kStridedThreads = 256;
// A long axis over few columns is split into chunks, a block each (a grid of column tiles x
// chunks), so that every SM has work: 8x32768x128 ran its 1,024 columns on 32 blocks, at 0.02-0.04
// of copy. The first launch writes each chunk's statistics of each column; the second combines
// them in a fixed order (lane ty takes chunks ty, ty + TY, ..., then the lanes in order) and writes
// the outputs of its share of the axis. When to split, the chunk length and TY follow from the
// shape alone, so the bits do not depend on the device (the second launch's shares do).
constexpr int64_t kStridedSplitBlocks = 2048;  // blocks the split aims at: about an H100's 132 SMs x 8, twice
constexpr int64_t kStridedMinChunk = 256;      // axis positions a block takes at least

enum class StridedPhase {
  whole,    // one launch: each block reduces its columns over the whole axis, then writes them
  partial,  // split, first launch: a chunk's statistics of each column into the buffer
  apply     // split, second launch: the chunks' statistics combined in order, then the outputs
};

struct StridedArgs {
  const void* dy;
  const void* y;
  void* out;
  void* part;  // split: chunks x (outer * inner) statistics, chunk-major
  int64_t outer, len, inner;
  int64_t chunk;  // axis positions of block row blockIdx.y: a chunk's, len when whole, fewer in apply
  int chunks;     // split: the chunks whose statistics are in the buffer
};

// blockDim = (TX, TY): threadIdx.x walks TX consecutive runs of VW groups (o, i) of the flattened
// outer x inner space, so a warp reads TX·VW consecutive i (or, for small inner, a few axis steps
// of them), VW at a time where inner is whole VW-element packs and the tensors aligned to one;
// threadIdx.y takes axis positions ty, ty + TY, ... of the block's chunk; the TY partial statistics
// of a group are combined in order, and the chunks' (split) in chunk order. A group's statistic
// takes the same steps in the same order whatever VW is: VW changes how many groups a thread
// carries, not the bits.
template <SoftmaxKind K, class T, StridedPhase P, int VW>
__global__ void __launch_bounds__(kStridedThreads) strided_kernel(StridedArgs a) {
  using A = compute_t<T>;
  using R = StreamOp<K, A>;
  using V = typename R::V;
  using PT = Pack<T, VW>;
  // [VW][TY][TX]: a warp's stores and the combining lanes' loads fall in distinct banks.
  __shared__ V part[kStridedThreads * VW];
  __shared__ V total[32 * VW];
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* out = static_cast<T*>(a.out);
  V* parts = static_cast<V*>(a.part);
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int64_t groups = a.outer * a.inner;
  const int64_t step = a.inner;
  const int64_t a0 = static_cast<int64_t>(blockIdx.y) * a.chunk, a1 = min(a.len, a0 + a.chunk);
  auto slot = [&](int j, int k) -> V& { return part[(j * TY + k) * TX + tx]; };
  for (int64_t tile = blockIdx.x; tile * TX * VW < groups; tile += gridDim.x) {
    const int64_t c = (tile * TX + tx) * VW;  // the thread's first group; inner % VW == 0
    const bool live = c < groups;
    const int64_t base = live ? (c / a.inner) * a.len * a.inner + c % a.inner : 0;
    auto packs = [&](int64_t ax, PT& yp, PT& gp) {
      yp = *reinterpret_cast<const PT*>(y + base + ax * step);
      if constexpr (is_grad(K)) gp = *reinterpret_cast<const PT*>(dy + base + ax * step);
    };
    if constexpr (P == StridedPhase::apply) {
      // The chunks' statistics k = ty, ty + TY, ... combined in order by each lane along the axis,
      // then the lanes' in order: one dependent chain of chunks / TY loads, not of chunks.
      V v[VW];
#pragma unroll
      for (int j = 0; j < VW; ++j) v[j] = R::identity();
      if (live)
        for (int k = ty; k < a.chunks; k += TY)
#pragma unroll
          for (int j = 0; j < VW; ++j) v[j] = R::combine(v[j], parts[k * groups + c + j]);
#pragma unroll
      for (int j = 0; j < VW; ++j) slot(j, ty) = v[j];
    } else {
      Stat<A> st[VW];
#pragma unroll
      for (int j = 0; j < VW; ++j) st[j] = Stat<A>{-INFINITY, A(0)};
      if (live)
#pragma unroll 4
        for (int64_t ax = a0 + ty; ax < a1; ax += TY) {
          PT yp, gp{};
          packs(ax, yp, gp);
#pragma unroll
          for (int j = 0; j < VW; ++j) push<K>(st[j], unpack(yp, j), is_grad(K) ? unpack(gp, j) : A(0));
        }
#pragma unroll
      for (int j = 0; j < VW; ++j) slot(j, ty) = stream_value<K>(st[j]);
    }
    __syncthreads();
    if (ty == 0) {
#pragma unroll
      for (int j = 0; j < VW; ++j) {
        V v = slot(j, 0);
        for (int k = 1; k < TY; ++k) v = R::combine(v, slot(j, k));
        if constexpr (P == StridedPhase::partial) {
          if (live) parts[blockIdx.y * groups + c + j] = v;
        } else {
          total[j * TX + tx] = v;
        }
      }
    }
    __syncthreads();
    if constexpr (P != StridedPhase::partial) {
      Final<A> f[VW];
#pragma unroll
      for (int j = 0; j < VW; ++j) f[j] = final_of<K, A>(total[j * TX + tx]);
      if (live)
#pragma unroll 4
        for (int64_t ax = a0 + ty; ax < a1; ax += TY) {
          PT yp, gp{}, o;
          packs(ax, yp, gp);
#pragma unroll
          for (int j = 0; j < VW; ++j)
            o.v[j] = from_compute<T>(output<K, sizeof(T) == 2>(f[j], unpack(yp, j), is_grad(K) ? unpack(gp, j) : A(0)));
          *reinterpret_cast<PT*>(out + base + ax * step) = o;
        }
      __syncthreads();  // part and total are rewritten by the next tile
    }
  }
}

// ---- cuda:strided_held (inner > 1, the axis held on chip) ---------------------------------------

struct HeldArgs {
  const void* dy;
  const void* y;
  void* out;
  // tiles is ceil(outer·units / tx), passed rather than derived: a loop bound read from the
  // parameter space takes no register, and the kernel's 64-bit division cost the held kernels up
  // to 32 registers (spills in some) and 10-45% of their speed on an H100.
  int64_t outer, len, units, tiles;
  int tx, ty, fold;
};

template <class T, int VEC>
inline constexpr int kHeldUnits = strided_held_units(VEC * static_cast<int>(sizeof(T)));
// Blocks a multiprocessor is to hold, which bounds the registers a thread may take: 4 for plain
// blocks of 16-byte units (64 registers, what they take anyway), 3 for clusters (at 96 registers
// and 2 blocks, the 16-bit cluster gradients ran 0.08-0.12 of copy slower on an H100), 2 for f64
// and single elements, which need more. Stated even where it is what the compiler would pick: a
// bound of 1 made it take 8 more registers and lose a block.
template <class T, int VEC, bool kCluster, int N>
inline constexpr int kHeldMinBlocks = VEC == 1 || sizeof(T) == 8 || N > kHeldUnits<T, VEC> ? 2 : kCluster ? 3 : 4;

// Where the cluster's ranks post their block totals to each other (reduce.cuh's mailbox).
template <class A>
struct HeldMailbox {
  uint64_t bar[2];                                     // [parity]
  A inbox[2][kMaxCluster][kStridedHeldClusterGroups];  // [parity][sender rank][tx * VEC + j]
  A total[kStridedHeldClusterGroups];                  // [tx * VEC + j]: over the ranks
};
struct NoMailbox {};
// The shared memory the held kernel's reductions go through, and where a thread sits.
template <int VEC, class A, bool kCluster>
struct HeldSmem {
  A part[VEC][kStridedHeldThreads];  // [element of the unit][thread]
  std::conditional_t<kCluster, HeldMailbox<A>, NoMailbox> box;
};
struct HeldPos {
  int t, tx, ty, TX, TY, rank, C, fold, units;
  bool shuffle;  // TX a power of two and the block whole warps
  int exchange;  // cluster exchanges so far: the mailbox's parity and its barrier's phase
};

// Each thread's VEC values v[j] combined over the tile's lanes along the axis, then over the
// cluster's ranks in rank order (each block posts its totals into every block's mailbox, then
// combines what landed in its own), then, where folded, over the elements of one group: every thread
// of column tx gets its groups' totals in v, the same bits on every run. Over the lanes: where TX
// is a power of two and the block whole warps, an xor butterfly over the lanes of a column within
// each warp, then the warps' partials (at most 8) in order; otherwise a pairwise tree over ty in
// shared memory, a barrier a level (eight levels for TY = 256 took longer than the tile's loads).
// Either way the block's totals end in part[j][tx] (the cluster's in box.total[tx * VEC + j]).
template <bool kCluster, int VEC, class A, class Op>
__device__ __forceinline__ void held_allreduce(HeldSmem<VEC, A, kCluster>& sm, HeldPos& h, A (&v)[VEC], Op op) {
  if (h.shuffle) {
    for (int mask = h.TX; mask < 32; mask *= 2)
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = op(v[j], __shfl_xor_sync(0xffffffffu, v[j], mask));
    const int s = h.TX < 32 ? 32 / h.TX : 1, groups = h.TY / s;
    if (h.ty % s == 0)
#pragma unroll
      for (int j = 0; j < VEC; ++j) sm.part[j][(h.ty / s) * h.TX + h.tx] = v[j];
    __syncthreads();
    // Lane ty = j of each column combines element j over the groups: every thread doing so cost
    // more in shared-memory reads than a second barrier, and lane ty = 0 doing all VEC elements
    // made a chain of VEC x groups loads that every tile waited on (on an H100, gradients on
    // clusters up to 11% slower, 16-bit forwards held by one block, two reductions a tile, 31%).
    for (int j = h.ty; j < VEC; j += h.TY) {
      A x = sm.part[j][h.tx];
      for (int g = 1; g < groups; ++g) x = op(x, sm.part[j][g * h.TX + h.tx]);
      sm.part[j][h.tx] = x;
    }
    __syncthreads();
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) sm.part[j][h.t] = v[j];
    __syncthreads();
    for (int step = 1; step < h.TY; step *= 2) {
      if (h.ty % (2 * step) == 0 && h.ty + step < h.TY)
#pragma unroll
        for (int j = 0; j < VEC; ++j) sm.part[j][h.t] = op(sm.part[j][h.t], sm.part[j][h.t + step * h.TX]);
      __syncthreads();
    }
  }
#pragma unroll
  for (int j = 0; j < VEC; ++j) v[j] = sm.part[j][h.tx];  // the block's totals, in part[j][tx] both ways
  if constexpr (kCluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Lanes ty = r, r + TY, ... post column tx's totals to rank r; lane ty = j of each column
    // then combines element j over the ranks in rank order, from its own shared memory.
    const int parity = h.exchange & 1;
    for (int r = h.ty; r < h.C; r += h.TY) {
      const uint32_t slot = peer_addr(shared_addr(&sm.box.inbox[parity][h.rank][h.tx * VEC]), r),
                     peer_bar = peer_addr(shared_addr(&sm.box.bar[parity]), r);
#pragma unroll
      for (int j = 0; j < VEC; ++j) mailbox_post(slot + j * static_cast<uint32_t>(sizeof(A)), v[j], peer_bar);
    }
    if (h.t == 0) mailbox_arm(sm.box, h.exchange, static_cast<uint32_t>(h.C * h.TX * VEC * sizeof(A)));
    if (h.ty < VEC) {
      mailbox_wait(sm.box, h.exchange);
      const A* in = &sm.box.inbox[parity][0][h.tx * VEC + h.ty];
      A total = in[0];
      for (int r = 1; r < h.C; ++r) total = op(total, in[r * kStridedHeldClusterGroups]);
      sm.box.total[h.tx * VEC + h.ty] = total;
    }
    ++h.exchange;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < VEC; ++j) v[j] = sm.box.total[h.tx * VEC + j];
#else
    __trap();  // the host launches clusters only for code built for compute capability 9.0+
#endif
  }
  if (VEC > 1 && h.fold > 1) {
    // Folded: this unit is element u * VEC .. of its row, whose units are threads tx - u ..
    const int u = h.tx % h.units, first = h.tx - u, row = h.units * VEC;
    auto total = [&](int e) {  // element e of the row's totals
      if constexpr (kCluster) return sm.box.total[first * VEC + e];
      return sm.part[e % VEC][first + e / VEC];
    };
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const int i = (u * VEC + j) % h.fold;
      v[j] = total(i);
      for (int e = i + h.fold; e < row; e += h.fold) v[j] = op(v[j], total(e));
    }
  }
  __syncthreads();  // part is written again by the next reduction
}

// Thread (tx, ty) of rank r in its cluster holds the units at axis positions (r N + k) TY + ty,
// k < N, of unit column tile * TX + tx (strided_plan); element j of a unit belongs to column group
// j of it (folded: element e of a row, group e mod inner), so each thread keeps VEC statistics.
// Gradients reduce once (the sum); forwards twice, the max and then the sum of exp(x - max) (a
// combine of running (max, sum) pairs costs two exps, and a tree of them took longer than the
// tile's loads). Every tile is read from memory once.
template <SoftmaxKind K, class T, int VEC, bool kCluster, int N>
__global__ void __launch_bounds__(kStridedHeldThreads, kHeldMinBlocks<T, VEC, kCluster, N>) strided_held_kernel(HeldArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  __shared__ HeldSmem<VEC, A, kCluster> sm;
  const int t = static_cast<int>(threadIdx.x);
  const int tx = t % a.tx, ty = t / a.tx;
  int rank = 0, C = 1;
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (kCluster) {
    rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
    C = static_cast<int>(cooperative_groups::this_cluster().num_blocks());
    mailbox_open(sm.box);
  }
#endif
  HeldPos h{t, tx, ty, a.tx, a.ty, rank, C, a.fold, static_cast<int>(a.units),
            (a.tx & (a.tx - 1)) == 0 && a.tx * a.ty % 32 == 0, 0};
  const P* yp = static_cast<const P*>(a.y);
  const P* gp = static_cast<const P*>(a.dy);
  P* outp = static_cast<P*>(a.out);
  const int64_t columns = a.outer * a.units;
  // The axis position of this thread's unit k (units beyond the axis are neither loaded nor stored).
  const int64_t ax0 = (int64_t{rank} * N) * a.ty + ty;
  const auto axis_at = [&](int k) { return ax0 + int64_t{k} * a.ty; };
  // Where this thread's column of tile `tile` starts, or -1 where it has none.
  const auto start = [&](int64_t tile) -> int64_t {
    const int64_t c = tile * a.tx + tx;
    return tile < a.tiles && c < columns ? (c / a.units) * a.len * a.units + c % a.units : -1;
  };
  P y[N], g[N];
  // L2 fills whole lines for these loads: a 16-bit tile of 64 bytes reads half of each line, and
  // the tile beside it, run at about the same time, the other half (on one H100, 341x1000x96 and
  // 64x8192x64 16-bit gradients 2-6% faster, 64x8192x64 f32 -1% to +4%, whole-line tiles within 1%;
  // on another, 341x1000x96 2-4% slower alone and level with the evict-first stores below, and
  // 64x8192x64 16-bit 1-7% faster with them).
  const auto load = [&](int64_t at) {
#pragma unroll
    for (int k = 0; k < N; ++k) {
      // A unit past the axis (or of a thread with no column) reads the tensor's first unit, never
      // used: the loads issue unconditionally, none behind a branch (on an H100, f64 Softmax_13 on
      // 11000x1000x3 1.3x faster, bf16 forwards on 2048x2048x8 1.13x, no case over 2.5% slower).
      const int64_t ax = axis_at(k);
      const int64_t i = at >= 0 && ax < a.len ? at + ax * a.units : 0;
      y[k] = load_pack<2>(yp + i);
      if constexpr (is_grad(K)) g[k] = load_pack<2>(gp + i);
    }
  };
  // Clusters issue their next tile's loads in the iteration that stores this one, ahead of the
  // loop's back edge (on an H100, 16-bit gradients on clusters in 1-5% less time, the same bits);
  // plain blocks load at the loop's top, as their registers allow (loading early cost them
  // 2-11%, and the 16-bit ones spilled at 64 registers).
  const int64_t stride = gridDim.x / C;
  int64_t base = -1;
  if constexpr (kCluster) load(base = start(blockIdx.x / C));
  for (int64_t tile = blockIdx.x / C; tile < a.tiles; tile += stride) {
    if constexpr (!kCluster) load(base = start(tile));
    bool valid[N];
#pragma unroll
    for (int k = 0; k < N; ++k) valid[k] = base >= 0 && axis_at(k) < a.len;
    // Each group's Final as (a[j], b[j]); written in place of the reductions' values.
    A a_[VEC], b_[VEC];
    A (&v)[VEC] = b_;
    if constexpr (is_grad(K)) {
      // Unit by unit, in the order of the loads, so that the sums of the first units run while the
      // last ones are in flight (each group's terms still in k order); element by element, the
      // first sum waited on every load (LogSoftmaxGrad_13 on 16-block clusters ran 6% slower).
#pragma unroll
      for (int j = 0; j < VEC; ++j) v[j] = A(0);
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (valid[k])
#pragma unroll
          for (int j = 0; j < VEC; ++j) v[j] = Held<K, T, VEC, N>::term(v[j], unpack(y[k], j), unpack(g[k], j));
      held_allreduce<kCluster>(sm, h, v, [](A x, A z) { return add_rn(x, z); });
#pragma unroll
      for (int j = 0; j < VEC; ++j) a_[j] = v[j];
    } else {
      A (&m)[VEC] = a_;
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        m[j] = -INFINITY;
#pragma unroll
        for (int k = 0; k < N; ++k)
          if (valid[k]) m[j] = max_nan(m[j], unpack(y[k], j));
      }
      held_allreduce<kCluster>(sm, h, m, [](A x, A z) { return max_nan(x, z); });
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        v[j] = A(0);
        if (m[j] != -INFINITY)  // else every element of the group is -inf
#pragma unroll
          for (int k = 0; k < N; ++k)
            if (valid[k]) v[j] += dexp(unpack(y[k], j) - m[j]);
      }
      held_allreduce<kCluster>(sm, h, v, [](A x, A z) { return add_rn(x, z); });
#pragma unroll
      for (int j = 0; j < VEC; ++j) b_[j] = final_of<K, A>(m[j], v[j]).b;
    }
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (valid[k]) {
        P o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          A gj = A(0);
          if constexpr (is_grad(K)) gj = unpack(g[k], j);
          o.v[j] = from_compute<T>(output<K, sizeof(T) == 2>(Final<A>{a_[j], b_[j]}, unpack(y[k], j), gj));
        }
        // Written once: evict-first, leaving L2 to the lines the loads fill for the tile beside
        // (341x1000x96 16-bit gradients another 1-3%).
        store_pack<1>(outp + base + axis_at(k) * a.units, o);
      }
    if constexpr (kCluster) load(base = start(tile + stride));
  }
  cluster_exit<kCluster ? 2 : 1>();
}

// ---- host side --------------------------------------------------------------------------------

template <SoftmaxKind K, class T, int VW>
Status run_strided_as(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  using V = typename StreamOp<K, compute_t<T>>::V;
  const int tx = 1 << std::min(5, log2_ceil(d.inner));
  // The chunks, and so the bits, come from the one-group-a-thread tiling whatever VW is.
  const int64_t tiles = ceil_div(d.outer * d.inner, tx);
  // Chunks for about kStridedSplitBlocks blocks, each of at least kStridedMinChunk positions (so
  // at most kStridedSplitBlocks of them, well within gridDim.y).
  const int64_t want = std::clamp<int64_t>(ceil_div(kStridedSplitBlocks, tiles), 1,
                                           std::max<int64_t>(1, d.axis_len / kStridedMinChunk));
  const int64_t chunk = std::max<int64_t>(1, ceil_div(d.axis_len, want));
  const int chunks = static_cast<int>(ceil_div(d.axis_len, chunk));
  const bool split = chunks > 1;
  const int ty = std::min(kStridedThreads / tx, 1 << std::min(8, log2_ceil(chunk)));
  int per_sm = 0;
  if (Status s = blocks_per_sm<strided_kernel<K, T, StridedPhase::whole, VW>>(op, dev, kStridedThreads, &per_sm); !s)
    return s;
  const int64_t most = std::max<int64_t>(1, int64_t{dev.sm_count} * per_sm * (kStridedThreads / (tx * ty)) / chunks);
  const dim3 grid(static_cast<unsigned>(std::clamp<int64_t>(ceil_div(tiles, VW), 1, std::min<int64_t>(most, 0x7fffffff))),
                  static_cast<unsigned>(chunks));
  const cudaStream_t stream = stream_of(ctx);
  StridedArgs a{d.dy, d.y, d.out, nullptr, d.outer, d.axis_len, d.inner, chunk, chunks};
  if (!split)
    return launch(op, "the strided launch", strided_kernel<K, T, StridedPhase::whole, VW>, grid, dim3(tx, ty), stream, a);
  detail::Workspace ws;
  const auto bytes = sizeof(V) * static_cast<std::size_t>(chunks) * static_cast<std::size_t>(d.outer * d.inner);
  if (Status s = ws.allocate(ctx, Device::cuda(dev.ordinal), bytes, op); !s) return s;
  a.part = ws.as<V>();
  if (Status s = launch(op, "the strided statistics launch", strided_kernel<K, T, StridedPhase::partial, VW>, grid,
                        dim3(tx, ty), stream, a);
      !s)
    return s;
  // The output launch reads every chunk's statistics from the buffer, so its blocks may split the
  // axis more finely than the statistics launch did without changing a bit: into as many blocks
  // as the device holds at once. A block a chunk left that launch at half occupancy and waiting on
  // loads (16-bit 8x32768x128 gradients on an H100: 2.5 TB/s against f32's 2.85); so split, those
  // take 3-5% less time, f32 and the forwards within 1%.
  int apply_per_sm = 0;
  if (Status s = blocks_per_sm<strided_kernel<K, T, StridedPhase::apply, VW>>(op, dev, kStridedThreads, &apply_per_sm);
      !s)
    return s;
  const int64_t rows = std::max<int64_t>(chunks, int64_t{dev.sm_count} * apply_per_sm / grid.x);
  a.chunk = ceil_div(d.axis_len, rows);
  const dim3 agrid(grid.x, static_cast<unsigned>(ceil_div(d.axis_len, a.chunk)));
  return launch(op, "the strided output launch", strided_kernel<K, T, StridedPhase::apply, VW>, agrid, dim3(tx, ty),
                stream, a);
}

// Packs along inner where inner is whole packs and every tensor is aligned to one: 16 bytes of
// f32 or f64 and four elements of f16 or bf16, else pairs of f32 where inner is even. One element
// a load, the 16-bit kernels ran no faster than f32 (8x32768x128 on an H100: 0.37 of copy
// against 0.49), and the forwards' running max and sum were one dependent chain a thread. Packs
// of four 16-bit elements gained more than packs of eight, which left the 16-bit forwards of
// 2048x2048x8 a quarter of the blocks and slower than single elements; 16-bit pairs made the
// forwards of 512x32768x2 slower too (192 -> 240 us), f32 pairs faster (354 -> 284 us; all on an
// H100, lab/cuda/NOTES-softmax-axis.md).
template <SoftmaxKind K, class T>
Status run_strided(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  constexpr int P = sizeof(T) == 2 ? 4 : kPackElems<T>;
  auto packs_of = [&](int vw) {
    const std::size_t bytes = static_cast<std::size_t>(vw) * sizeof(T);
    return d.inner % vw == 0 && aligned_to(d.y, bytes) && aligned_to(d.out, bytes) &&
           (!is_grad(K) || aligned_to(d.dy, bytes));
  };
  if (packs_of(P)) return run_strided_as<K, T, P>(op, d, ctx, dev);
  if constexpr (sizeof(T) == 4)
    if (packs_of(2)) return run_strided_as<K, T, 2>(op, d, ctx, dev);
  return run_strided_as<K, T, 1>(op, d, ctx, dev);
}

// The held kernel for plan p: *fits says whether its clusters (plan.blocks > 1) can be co-scheduled
// on this device, asked at the largest block (fewer threads fit wherever that does); with ctx, it
// also launches.
template <SoftmaxKind K, class T, int VEC, bool kCluster, int N = kHeldUnits<T, VEC>>
Status held_launch(std::string_view op, const SoftmaxDesc& d, const StridedPlan& p, const DeviceInfo& dev,
                   const Context* ctx, bool* fits) {
  constexpr auto kernel = strided_held_kernel<K, T, VEC, kCluster, N>;
  *fits = true;
  if constexpr (kCluster) {
    int clusters = 0;
    if (Status s = resident_clusters(op, kernel, dev, p.blocks, kStridedHeldThreads, &clusters); !s) return s;
    *fits = clusters >= 1;
  }
  if (!ctx || !*fits) return {};
  const int threads = p.tx * p.ty;
  // Plain blocks take a tile each. Clusters stay resident and loop over the tiles: launched one
  // tile each, clusters of 8 to 16 ran at 0.24 to 0.71 of copy on an H100 (each must wait for that
  // many free multiprocessors of one GPC).
  int64_t clusters = std::min<int64_t>(p.tiles, 0x7fffffff / p.blocks);
  if constexpr (kCluster) {
    int resident = 0;
    if (Status s = resident_clusters(op, kernel, dev, p.blocks, threads, &resident); !s) return s;
    clusters = even_grid(p.tiles, resident);
  }
  const HeldArgs a{d.dy, d.y, d.out, d.outer, p.len, p.units, p.tiles, p.tx, p.ty, p.fold};
  return launch_clustered(op, "the strided held launch", kernel, dim3(static_cast<unsigned>(clusters * p.blocks)),
                          dim3(static_cast<unsigned>(threads)), kCluster ? p.blocks : 1, 0, stream_of(*ctx), a);
}

// Forwards too are held by clusters: they exchange across one twice a tile (the max, then the sum
// of exponentials), and since the exchanges go through mailboxes that costs less than reading the
// tensor twice (on an H100, 1.2-1.9x faster than split on 341x1000x96, 512x32768x2 and
// 2048x2048x8, 1.02-1.06x on 64x8192x64; lab/cuda/NOTES-softmax-axis.md).
template <SoftmaxKind K, class T>
Status run_strided_held(std::string_view op, const SoftmaxDesc& d, const StridedPlan& p, const DeviceInfo& dev,
                        const Context* ctx, bool* fits) {
  constexpr int V = kPackElems<T>;
  if (p.vec > 1 && p.n == kStridedHeldWideUnits)
    return p.blocks > 1 ? held_launch<K, T, V, true, kStridedHeldWideUnits>(op, d, p, dev, ctx, fits)
                        : held_launch<K, T, V, false, kStridedHeldWideUnits>(op, d, p, dev, ctx, fits);
  if (p.blocks > 1)
    return p.vec > 1 ? held_launch<K, T, V, true>(op, d, p, dev, ctx, fits)
                     : held_launch<K, T, 1, true>(op, d, p, dev, ctx, fits);
  return p.vec > 1 ? held_launch<K, T, V, false>(op, d, p, dev, ctx, fits)
                   : held_launch<K, T, 1, false>(op, d, p, dev, ctx, fits);
}

}  // namespace

// ---- the rows' entries (softmax_rows.cuh) ---------------------------------------------------------

template <class T>
Status softmax_strided_held_fits(std::string_view op, const SoftmaxDesc& d, const StridedPlan& plan,
                                 const DeviceInfo& dev, bool* fits) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    return run_strided_held<decltype(kind)::value, T>(op, d, plan, dev, nullptr, fits);
  });
}

template <class T>
Status softmax_strided_held(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  const StridedPlan plan = strided_plan(d);
  bool fits = false;
  if (Status s = visit_kind(d.kind, [&](auto kind) -> Status {
        return run_strided_held<decltype(kind)::value, T>(op, d, plan, dev, &ctx, &fits);
      });
      !s)
    return s;
  if (!fits)
    return Status(StatusCode::internal,
                  std::string(op) + ": cuda:strided_held found no cluster it can co-schedule, yet did not decline");
  return {};
}

template <class T>
Status softmax_strided(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev) {
  return visit_kind(d.kind, [&](auto kind) -> Status { return run_strided<decltype(kind)::value, T>(op, d, ctx, dev); });
}

}  // namespace gradops::cuda
