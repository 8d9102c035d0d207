// LayerNorm family, CUDA gradients: LayerNormalizationGrad, InvertibleLayerNormalizationGrad and
// SimplifiedLayerNormalizationGrad (cuda/layer_norm.cuh describes the launch shapes).
//
// Per row, with the given mean mu and inverse std r (never recomputed):
//   g = dy scale, xhat = (x - mu) r   [invertible: (y - bias) / scale; RMSNorm: x r]
//   S1 = sum g, S2 = sum g xhat, dx = r ((g - S1/cols) - xhat S2/cols)   [RMSNorm: no S1 term]
//   dscale = sum over rows of dy xhat, dbias = sum over rows of dy.
// The held kernels read x and dy once into registers, reduce S1 and S2 together over the row's
// lanes, and write dx from the registers; each thread adds its columns' dy xhat and dy into
// registers over all the rows it takes, the block's row groups are folded in group order through
// shared memory into one partial row per block (per cluster), and a column-sum kernel launched
// while the grid drains adds the partial rows in a fixed order. Small problems on the general path
// instead compute dscale and dbias in blocks of their own beside the row blocks, in one launch
// (general_grad_kernel). No float atomics; the grid, and so every bit of dscale and dbias, depends
// on the shape alone.
#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "core/workspace.hpp"
#include "cuda/column_sum.cuh"
#include "cuda/common.cuh"
#include "cuda/layer_norm.cuh"
#include "cuda/reduce.cuh"
#include "ops/dispatch.hpp"
#include "ops/layer_norm.hpp"

namespace gradops::cuda {
namespace {

template <LnKind K>
inline constexpr bool kHasDbias = K != LnKind::rms_grad;

template <LnKind K, class S>
using src_t = std::conditional_t<K == LnKind::inv_grad, typename S::V, typename S::T>;

template <class A, class U>
__device__ __forceinline__ A load_stat(const void* p, int64_t i) {
  return static_cast<A>(to_compute(static_cast<const U*>(p)[i]));
}

// ---- held: a row in registers ---------------------------------------------------------------------

// The invertible gradient in f32 also keeps 1/scale per column, correctly rounded as xhat's f32
// formula has it: once a thread, instead of a reciprocal per element and pass (f64 divides).
template <LnKind K, class S>
inline constexpr bool kOwnRcp = K == LnKind::inv_grad && std::is_same_v<typename S::A, float>;

// Shared memory of a held block: its threads' own per-column packs (scale, bias, 1/scale; see
// ln_column_bytes), then the fold of its row groups' column sums (several rows a block, with
// scale_grad or bias_grad asked).
template <LnKind K, class S, int N>
__host__ __device__ constexpr std::size_t held_column_bytes(unsigned threads) {
  return ln_column_bytes<S>(K == LnKind::inv_grad ? 2 : 1, N, threads) +
         (kOwnRcp<K, S> ? static_cast<std::size_t>(N) * threads * kLnVec<S> * sizeof(float) : 0);
}
template <LnKind K, class S, int N>
std::size_t held_grad_smem(const HeldShape& h, bool want) {
  const std::size_t fold = want && h.rows_per_block > 1
                               ? sizeof(typename S::A) * (kHasDbias<K> ? 2 : 1) * static_cast<std::size_t>(h.threads) * kLnVec<S>
                               : 0;
  return held_column_bytes<K, S, N>(static_cast<unsigned>(h.threads)) + fold;
}

// Thread t of a row's `lanes` holds packs k * lanes + t (k < N). kMinB: 2 resident 512-thread
// blocks (64 registers) for one pack a thread, else 1 (128).
template <LnKind K, class S, int VEC, int N>
__global__ void __launch_bounds__(kLnMaxBlockThreads, N == 1 ? 2 : 1) held_grad_kernel(LnArgs a) {
  using T = typename S::T;
  using U = typename S::U;
  using V = typename S::V;
  using A = typename S::A;
  using Src = src_t<K, S>;
  using PS = Pack<Src, VEC>;
  using PV = Pack<V, VEC>;
  using PT = Pack<T, VEC>;
  __shared__ LnSmem<Sum2<A>> sm;
  extern __shared__ unsigned char smem_raw[];
  griddep_launch_dependents();  // the column sum may launch now; it waits for this grid's end

  const int lanes = a.lanes, cluster = a.cluster;
  const int rank = cluster_rank(cluster);
  const int group = cluster > 1 ? 0 : static_cast<int>(threadIdx.x) / lanes;
  const int t = cluster > 1 ? rank * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)
                            : static_cast<int>(threadIdx.x) % lanes;
  const int64_t rows_per_block = cluster > 1 ? 1 : blockDim.x / lanes;
  const int64_t packs = a.cols / VEC;
  const int64_t grp = blockIdx.x / cluster;
  const int64_t step = static_cast<int64_t>(gridDim.x / cluster) * rows_per_block;
  const Src* src = static_cast<const Src*>(a.src);
  const V* dy = static_cast<const V*>(a.dy);
  const PV* scale = static_cast<const PV*>(a.scale);
  const PV* bias = static_cast<const PV*>(a.bias);
  T* dx = static_cast<T*>(a.out);
  const A inv_n = A(1) / static_cast<A>(a.cols);
  const bool want_partial = a.partial != nullptr;

  // The thread's scale (and bias) packs, the same in every row (ln_column_bytes), and with
  // kOwnRcp its 1/scale as [k][q][thread] 16-byte pieces after them.
  constexpr int kRcpPieces = kOwnRcp<K, S> ? VEC / 4 : 1;
  using PR = Pack<float, 4>;
  PV* own_scale = reinterpret_cast<PV*>(smem_raw);
  PV* own_bias = own_scale + N * blockDim.x;
  PR* own_rcp = reinterpret_cast<PR*>(own_bias + N * blockDim.x);
  keep_own<N>(own_scale, scale, lanes, t, packs);
  if constexpr (K == LnKind::inv_grad) keep_own<N>(own_bias, bias, lanes, t, packs);
  if constexpr (kOwnRcp<K, S>)
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (static_cast<int64_t>(k) * lanes + t < packs)
#pragma unroll
        for (int q = 0; q < kRcpPieces; ++q) {
          const PV sc = own_slot(own_scale, k);
          PR rc;
#pragma unroll
          for (int i = 0; i < 4; ++i) rc.v[i] = __frcp_rn(static_cast<float>(unpack(sc, q * 4 + i)));
          own_slot(own_rcp, k * kRcpPieces + q) = rc;
        }
  // Pack k's scale, bias (inv_grad) and 1/scale pieces (kOwnRcp), from the thread's own slots.
  struct Own {
    PV sc, bi;
    PR rc[kRcpPieces];
  };
  auto own_packs = [&](int k) {
    Own o{own_slot(own_scale, k), PV{}, {}};
    if constexpr (K == LnKind::inv_grad) o.bi = own_slot(own_bias, k);
    if constexpr (kOwnRcp<K, S>)
#pragma unroll
      for (int q = 0; q < kRcpPieces; ++q) o.rc[q] = own_slot(own_rcp, k * kRcpPieces + q);
    return o;
  };
  // xhat of element j of a pack whose own packs are `own`.
  auto xhat_of = [&](A src_j, A mu, A r, const Own& own, int j) -> A {
    const A bias_j = K == LnKind::inv_grad ? static_cast<A>(unpack(own.bi, j)) : A(0);
    if constexpr (kOwnRcp<K, S>) return (src_j - bias_j) * own.rc[j / 4].v[j % 4];
    else return xhat<K, A>(src_j, mu, r, static_cast<A>(unpack(own.sc, j)), bias_j);
  };

  A ps[N][VEC], pb[kHasDbias<K> ? N : 1][VEC];
#pragma unroll
  for (int k = 0; k < N; ++k)
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      ps[k][j] = A(0);
      pb[kHasDbias<K> ? k : 0][j] = A(0);
    }

  if (cluster > 1) mailbox_open(sm.box);
  int exchange = 0;
  for (int64_t first = grp * rows_per_block; first < a.rows; first += step) {
    const int64_t row = first + group;
    const bool live = row < a.rows;
    const int64_t base = row * a.cols;
    PS xs[N];
    PV gs[N];
    bool valid[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t p = static_cast<int64_t>(k) * lanes + t;
      valid[k] = live && p < packs;
      xs[k] = PS{};
      gs[k] = PV{};
      if (valid[k]) {
        xs[k] = load_pack<1>(reinterpret_cast<const PS*>(src + base) + p);
        gs[k] = load_pack<1>(reinterpret_cast<const PV*>(dy + base) + p);
      }
    }
    if (a.prefetch && row + step < a.rows) {
      const int64_t next = (row + step) * a.cols;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int64_t p = static_cast<int64_t>(k) * lanes + t;
        if (p < packs) {
          prefetch_line(reinterpret_cast<const PS*>(src + next), p);
          prefetch_line(reinterpret_cast<const PV*>(dy + next), p);
        }
      }
    }
    const A mu = K == LnKind::ln_grad && live ? load_stat<A, U>(a.mean, row) : A(0);
    const A r = live ? load_stat<A, U>(a.inv_std, row) : A(0);

    Sum2<A> s{A(0), A(0)};
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (valid[k]) {
        const Own own = own_packs(k);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A scj = unpack(own.sc, j);
          const A g = mul_rn(static_cast<A>(unpack(gs[k], j)), scj);
          const A xh = xhat_of(static_cast<A>(unpack(xs[k], j)), mu, r, own, j);
          s.a += g;
          s.b = dfma(g, xh, s.b);
        }
      }
    s = lanes_allreduce<Sum2Op<A>>(s, lanes, cluster, sm, exchange++);
    const A m1 = s.a * inv_n, m2 = s.b * inv_n;

#pragma unroll
    for (int k = 0; k < N; ++k)
      if (valid[k]) {
        const int64_t p = static_cast<int64_t>(k) * lanes + t;
        const Own own = own_packs(k);
        PT o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A scj = unpack(own.sc, j);
          const A gy = static_cast<A>(unpack(gs[k], j));
          const A g = mul_rn(gy, scj);
          const A xh = xhat_of(static_cast<A>(unpack(xs[k], j)), mu, r, own, j);
          o.v[j] = from_compute<T>(static_cast<compute_t<T>>(grad_out<K, A>(g, xh, m1, m2, r)));
          if (want_partial) {
            ps[k][j] = dfma(gy, xh, ps[k][j]);
            if constexpr (kHasDbias<K>) pb[k][j] += gy;
          }
        }
        store_pack<1>(reinterpret_cast<PT*>(dx + base) + p, o);
      }
  }

  if (want_partial) {
    A* part_s = static_cast<A*>(a.partial) + grp * a.cols;
    A* part_b = static_cast<A*>(a.partial) + (a.groups + grp) * a.cols;
    if (rows_per_block == 1) {
      // In 16-byte pieces: element by element, these stores, all at the grid's end, were most of
      // what dscale and dbias cost (bf16 4096x8192: 124 us with them against 76 us for dX alone).
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int64_t p = static_cast<int64_t>(k) * lanes + t;
        if (p < packs) {
          store_pieces<VEC>(part_s + p * VEC, ps[k]);
          if constexpr (kHasDbias<K>) store_pieces<VEC>(part_b + p * VEC, pb[k]);
        }
      }
    } else {
      // The block's row groups folded in group order, one pack index k at a time: every group
      // stores its pack-k sums to shared memory, [group][2][lanes * VEC] (thread t's at t * VEC, in
      // 16-byte pieces), then the whole block adds each column over the groups in order, (g0 + g1)
      // + g2 ..., and writes it. All warps work on every round: no group waits for another's fold.
      constexpr int outs = kHasDbias<K> ? 2 : 1;
      constexpr int CH = 16 / static_cast<int>(sizeof(A));
      static_assert(VEC % CH == 0, "a pack is whole 16-byte pieces of the compute type");
      using PA = Pack<A, CH>;
      const int width = lanes * VEC;
      A* fold = reinterpret_cast<A*>(smem_raw + held_column_bytes<K, S, N>(blockDim.x));
#pragma unroll
      for (int k = 0; k < N; ++k) {
        if (k > 0) __syncthreads();  // the last round's readers are done
#pragma unroll
        for (int o = 0; o < outs; ++o) {
          PA* mine = reinterpret_cast<PA*>(fold + (static_cast<int64_t>(group) * outs + o) * width + t * VEC);
#pragma unroll
          for (int q = 0; q < VEC / CH; ++q) {
            PA v;
#pragma unroll
            for (int i = 0; i < CH; ++i) v.v[i] = o == 0 ? ps[k][q * CH + i] : pb[kHasDbias<K> ? k : 0][q * CH + i];
            mine[q] = v;
          }
        }
        __syncthreads();
        const int64_t c0 = static_cast<int64_t>(k) * width;
        for (int i = threadIdx.x; i < outs * width; i += blockDim.x) {
          const int o = i / width, w = i % width;
          if (c0 + w >= a.cols) continue;
          A acc = fold[static_cast<int64_t>(o) * width + w];
          for (int g = 1; g < rows_per_block; ++g) acc += fold[(static_cast<int64_t>(g) * outs + o) * width + w];
          (o == 0 ? part_s : part_b)[c0 + w] = acc;
        }
      }
    }
  }
  cluster_sync(cluster);  // peers may still read this block's shared memory
}

// ---- general: any alignment, any length ------------------------------------------------------------

constexpr int kGeneralThreads = 256;
constexpr int64_t kGeneralBlocks = 2 * kLnSms;
constexpr int64_t kMaxPartialElems = int64_t{1} << 22;  // per output: 16 MiB of f32 partials
// Column blocks (below): 8 columns a block, 32 row lanes a column.
constexpr int kColumnTile = kGeneralThreads / kColumnSumLanes;
// Problems this small (about a megabyte) take the column blocks: their time is launches and
// latencies, which a second launch and the partial rows' round trip through L2 add to, where
// reading the inputs twice costs next to nothing. Up to 1,024 rows keeps a lane's chain at 32 rows.
constexpr int64_t kColumnBlocksMaxRows = 1024;
constexpr int64_t kColumnBlocksMaxElems = int64_t{1} << 18;

// GRADOPS_CUDA_LN_COLUMN_BLOCKS=0 sends small problems to the partial rows and the column-sum
// launch instead, for measuring.
inline bool ln_column_blocks() {
  static const bool on = [] {
    const char* v = std::getenv("GRADOPS_CUDA_LN_COLUMN_BLOCKS");
    return !(v && v[0] == '0');
  }();
  return on;
}

// Row blocks: a block per row (rows blockIdx.x, + a.groups, ...), its threads striding the
// columns; the first pass reduces S1 and S2, the second re-reads the row (from L1/L2) and writes
// dx. With partial rows, thread t owns columns t, t + blockDim.x, ... of the block's, which it
// updates in place row by row (a column-sum launch adds them up).
// Column blocks (blockIdx.x >= a.groups, small problems): dscale and dbias need no row sums, only
// dy, x-hat and the saved statistics, so blocks of their own compute them beside the row blocks:
// 8 columns a block, each summed over every row in the column sum's order (lane ty of 32 adds
// rows ty, ty + 32, ..., then the 32 lanes in order). The order depends on the shape only.
template <LnKind K, class S>
__global__ void __launch_bounds__(kGeneralThreads) general_grad_kernel(LnArgs a) {
  using T = typename S::T;
  using U = typename S::U;
  using V = typename S::V;
  using A = typename S::A;
  using Src = src_t<K, S>;
  __shared__ ReduceSmem<Sum2<A>> sm;
  griddep_launch_dependents();
  const Src* src = static_cast<const Src*>(a.src);
  const V* dy = static_cast<const V*>(a.dy);
  const V* scale = static_cast<const V*>(a.scale);
  const V* bias = static_cast<const V*>(a.bias);
  T* dx = static_cast<T*>(a.out);
  const int64_t n = a.cols;
  const A inv_n = A(1) / static_cast<A>(n);
  A* part_s = a.partial ? static_cast<A*>(a.partial) + static_cast<int64_t>(blockIdx.x) * n : nullptr;
  A* part_b = a.partial ? static_cast<A*>(a.partial) + (a.groups + blockIdx.x) * n : nullptr;
  if (part_s)
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      part_s[c] = A(0);
      if constexpr (kHasDbias<K>) part_b[c] = A(0);
    }
  auto elem = [&](int64_t base, int64_t c, A mu, A r, A& gy, A& g, A& xh) {
    const A scj = static_cast<A>(to_compute(scale[c]));
    gy = static_cast<A>(to_compute(dy[base + c]));
    g = mul_rn(gy, scj);
    xh = xhat<K, A>(static_cast<A>(to_compute(src[base + c])), mu, r, scj,
                    K == LnKind::inv_grad ? static_cast<A>(to_compute(bias[c])) : A(0));
  };
  if (blockIdx.x >= a.groups) {
    __shared__ A lanes[2][kColumnSumLanes][kColumnTile + 1];
    const int tx = static_cast<int>(threadIdx.x) % kColumnTile, ty = static_cast<int>(threadIdx.x) / kColumnTile;
    const int64_t c = (blockIdx.x - a.groups) * int64_t{kColumnTile} + tx;
    A ds = A(0), db = A(0);
    if (c < n) {
      // A lane's rows in batches of kBatch, all of a batch's loads in flight before its additions
      // (in row order): a chain of up to 32 rows would otherwise wait out a load each.
      constexpr int kBatch = 8;
      const A scj = static_cast<A>(to_compute(scale[c]));
      const A bj = K == LnKind::inv_grad ? static_cast<A>(to_compute(bias[c])) : A(0);
      for (int64_t r0 = ty; r0 < a.rows; r0 += kBatch * kColumnSumLanes) {
        A gy[kBatch], xs[kBatch], mu[kBatch], rs[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
          const int64_t row = r0 + int64_t{k} * kColumnSumLanes;
          const bool in = row < a.rows;
          gy[k] = in ? static_cast<A>(to_compute(dy[row * n + c])) : A(0);
          xs[k] = in ? static_cast<A>(to_compute(src[row * n + c])) : A(0);
          mu[k] = in && K == LnKind::ln_grad ? load_stat<A, U>(a.mean, row) : A(0);
          rs[k] = in ? load_stat<A, U>(a.inv_std, row) : A(0);
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k)
          if (r0 + int64_t{k} * kColumnSumLanes < a.rows) {
            ds = dfma(gy[k], xhat<K, A>(xs[k], mu[k], rs[k], scj, bj), ds);
            db += gy[k];
          }
      }
    }
    lanes[0][ty][tx] = ds;
    lanes[1][ty][tx] = db;
    __syncthreads();
    auto fold = [&](int o, void* out) {  // o and out constant per call: no stack copy of a.col_out
      A t = lanes[o][0][tx];
      for (int k = 1; k < kColumnSumLanes; ++k) t += lanes[o][k][tx];
      static_cast<V*>(out)[c] = from_compute<V>(static_cast<compute_t<V>>(t));
    };
    if (c < n && ty == 0 && a.col_out[0]) fold(0, a.col_out[0]);
    if (c < n && ty == 1 && a.col_out[1]) fold(1, a.col_out[1]);
    return;
  }
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += a.groups) {
    const int64_t base = row * n;
    const A mu = K == LnKind::ln_grad ? load_stat<A, U>(a.mean, row) : A(0);
    const A r = load_stat<A, U>(a.inv_std, row);
    Sum2<A> s{A(0), A(0)};
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      A gy, g, xh;
      elem(base, c, mu, r, gy, g, xh);
      s.a += g;
      s.b = dfma(g, xh, s.b);
    }
    s = block_allreduce<Sum2Op<A>, 1>(s, sm, parity);
    parity ^= 1;
    const A m1 = s.a * inv_n, m2 = s.b * inv_n;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      A gy, g, xh;
      elem(base, c, mu, r, gy, g, xh);
      dx[base + c] = from_compute<T>(static_cast<compute_t<T>>(grad_out<K, A>(g, xh, m1, m2, r)));
      if (part_s) {
        part_s[c] = dfma(gy, xh, part_s[c]);
        if constexpr (kHasDbias<K>) part_b[c] += gy;
      }
    }
  }
}

// ---- host side ------------------------------------------------------------------------------------

template <class G>
Status visit_grad_kind(OpId op, G&& g) {
  switch (op) {
    case OpId::LayerNormalizationGrad: return g(std::integral_constant<LnKind, LnKind::ln_grad>{});
    case OpId::InvertibleLayerNormalizationGrad: return g(std::integral_constant<LnKind, LnKind::inv_grad>{});
    default: break;
  }
  return g(std::integral_constant<LnKind, LnKind::rms_grad>{});
}

// The kernel for d and its launch shape (plan_held), with the gradient's packs per thread.
template <LnKind K, class S>
Status plan_grad(std::string_view op, const LayerNormDesc& d, const DeviceInfo* dev, LnPlan* p) {
  return plan_held<S>(
      d, kLnMaxPacks, dev,
      [&](const DeviceInfo& dv, HeldShape* h) {
        // A cluster holds one row a block: no fold, only the scale (and bias) packs.
        return fit_clusters(op, held_grad_kernel<K, S, kLnVec<S>, kLnMaxPacks>, dv, d.rows, h,
                            held_column_bytes<K, S, kLnMaxPacks>(static_cast<unsigned>(h->threads)));
      },
      p);
}

template <LnKind K, class S>
Status run_grad(std::string_view op, const LayerNormDesc& d, const Context& ctx, const DeviceInfo& dev, Path row) {
  using A = typename S::A;
  using V = typename S::V;
  constexpr int VEC = kLnVec<S>;
  LnArgs a{};
  a.dy = d.dy;
  a.src = K == LnKind::inv_grad ? d.y : d.x;
  a.scale = d.scale;
  a.bias = d.bias;
  a.mean = d.mean;
  a.inv_std = d.inv_std;
  a.out = d.dx;
  a.prefetch = ln_prefetch();
  a.rows = d.rows;
  a.cols = d.cols;
  const bool want = d.dscale || (kHasDbias<K> && d.dbias);
  LnPlan plan;
  if (row != Path::general) {
    if (Status s = plan_grad<K, S>(op, d, &dev, &plan); !s) return s;
    if (plan.path != row) return ln_not_planned(op);
  }
  const HeldShape& h = plan.h;
  // Column blocks beside the row blocks (general_grad_kernel) for small problems.
  const bool column_blocks = row == Path::general && want && ln_column_blocks() && d.rows <= kColumnBlocksMaxRows &&
                             d.cols <= kColumnBlocksMaxElems / d.rows;  // rows >= 1 here; no product to overflow
  int64_t extra = 0;
  if (column_blocks) {
    a.groups = std::min<int64_t>(d.rows, kGeneralBlocks);
    extra = (d.cols + kColumnTile - 1) / kColumnTile;
    a.col_out[0] = d.dscale;
    a.col_out[1] = kHasDbias<K> ? d.dbias : nullptr;
  } else if (row == Path::general) {
    a.groups = std::min<int64_t>({d.rows, kGeneralBlocks, std::max<int64_t>(1, kMaxPartialElems / d.cols)});
  } else {
    a.groups = h.groups;
    a.lanes = h.lanes;
    a.cluster = h.cluster;
  }
  const cudaStream_t stream = stream_of(ctx);
  detail::Workspace ws;
  if (want && !column_blocks) {
    const std::size_t bytes = sizeof(A) * static_cast<std::size_t>((kHasDbias<K> ? 2 : 1) * a.groups * d.cols);
    if (Status s = ws.allocate(ctx, Device::cuda(dev.ordinal), bytes, op); !s) return s;
    a.partial = ws.as<A>();
  }
  auto launch_main = [&]() -> Status {
    if (row == Path::general)
      return launch_ln(op, "the general gradient launch", general_grad_kernel<K, S>, a.groups + extra, kGeneralThreads,
                       1, 0, stream, a);
    auto go = [&](auto kernel, std::size_t smem) -> Status {
      if (Status s = allow_dynamic_smem(op, kernel, dev, smem); !s) return s;
      return launch_ln(op, "the held gradient launch", kernel, h.blocks, h.threads, h.cluster, smem, stream, a);
    };
    switch (h.n) {
      case 1: return go(held_grad_kernel<K, S, VEC, 1>, held_grad_smem<K, S, 1>(h, want));
      case 2: return go(held_grad_kernel<K, S, VEC, 2>, held_grad_smem<K, S, 2>(h, want));
      default: break;
    }
    return go(held_grad_kernel<K, S, VEC, kLnMaxPacks>, held_grad_smem<K, S, kLnMaxPacks>(h, want));
  };
  if (Status s = launch_main(); !s || !want || column_blocks) return s;
  ColumnSumArgs<V> cs{};
  int outs = 0;
  if (d.dscale) {
    cs.partial[outs] = a.partial ? static_cast<const A*>(a.partial) : nullptr;
    cs.out[outs++] = static_cast<V*>(d.dscale);
  }
  if (kHasDbias<K> && d.dbias) {
    cs.partial[outs] = static_cast<const A*>(a.partial) + a.groups * d.cols;
    cs.out[outs++] = static_cast<V*>(d.dbias);
  }
  cs.groups = a.groups;
  cs.cols = d.cols;
  return launch_column_sum<V>(op, stream, cs, outs, "the dscale/dbias column-sum launch");
}

// A row's run(): its own kernel only (the row's declines() has taken the call), after the empty cases,
// which launch nothing.
Status run(const LayerNormDesc& d, const Context& ctx, Path row) {
  const std::string_view op = op_schema(d.op).name;
  const bool rms = d.op == OpId::SimplifiedLayerNormalizationGrad;
  if (d.cols == 0) return {};
  if (d.rows == 0) {  // sums over no rows: +0.0, all-zero bits in every format
    const std::size_t bytes = static_cast<std::size_t>(d.cols) * dtype_size(d.v);
    for (void* p : {d.dscale, rms ? nullptr : d.dbias})
      if (p)
        if (Status s = status_of(cudaMemsetAsync(p, 0, bytes, stream_of(ctx)), op, "cudaMemsetAsync (an empty X)"); !s)
          return s;
    return {};
  }
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_sig(d, op, [&](auto sig) -> Status {
    using S = decltype(sig);
    return visit_grad_kind(d.op, [&](auto kind) -> Status {
      return run_grad<decltype(kind)::value, S>(op, d, ctx, dev, row);
    });
  });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

const char* cuda_layer_norm_grad_declines(const LayerNormDesc& d, LayerNormCudaKernel k) {
  return cuda::ln_row_declines(d, k, [&](const cuda::DeviceInfo* dev, cuda::LnPlan* p) -> Status {
    const std::string_view op = op_schema(d.op).name;
    return cuda::visit_sig(d, op, [&](auto sig) -> Status {
      return cuda::visit_grad_kind(d.op, [&](auto kind) -> Status {
        return cuda::plan_grad<decltype(kind)::value, decltype(sig)>(op, d, dev, p);
      });
    });
  });
}
Status cuda_layer_norm_grad(const LayerNormDesc& d, const Context& ctx, LayerNormCudaKernel k) {
  return cuda::run(d, ctx, k);
}

}  // namespace gradops::detail
