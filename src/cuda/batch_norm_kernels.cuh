// BatchNorm family, CUDA kernels: BatchNormalizationGrad and BatchNormInternal (training) and the
// halves of their split, launches on the context's stream, each launched while the one before
// drains:
//
//   reduce   every block sums its part of a channel (two sums per channel, in the compute type:
//            grad Σ dY and Σ dY·(x - mean); forward Σ (x - K0) and Σ (x - K0)², K0 the channel's
//            first value, so that the variance of data far from zero keeps its digits) and leaves
//            them in a partials buffer [2][groups][c]
//   sums     per channel, the groups' partials added in f64 in a fixed order (column_sum.cuh's: 32
//            lanes over the groups, then the lanes in order), as the split's sums: grad Σ dY and
//            Σ dY·x̂; forward Σ (x - K) and Σ (x - K)², K = input_mean (moved from K0 in f64)
//   finish   per channel, from the sums and their count: the op's per-channel outputs and the
//            elementwise coefficients [4][c] (a, b, c, mean); the fused op runs it in the sums
//            kernel on the values it has just formed, the apply half on the given sums
//   apply    grad dX = a·dY + (c·(x - mean) + b); forward Y = (x - mean)·a + b
//
// Where a channel of NCHW runs fits in a cluster's shared memory, the fused op is instead one held
// kernel (below) doing all four steps, X and dY read once; its sums are bitwise the reduce and sums
// kernels' over the same grid, which the reduce half then takes.
//
// The grid, and so every bit of every output, depends on the shape and the device alone: no
// atomics. No block waits for a block outside its cluster, so no launch can deadlock behind kernels
// that hold multiprocessors (an all-reduce on another stream, say); a cluster does wait for a GPC
// with room for it (docs/ops/batch_norm.md has the measurements). The apply walks the blocks in
// the reverse order of the reduction: what the reduction read last is still in L2, and a tensor
// pair that fits in L2 comes from memory once.
//
// Two walks (batch_norm_rows.cuh, BnView): runs, n contiguous runs of s values per channel (NCHW),
// a block per (channel, share of its runs' units); columns, rows of c channels (NHWC), a block per
// (tile of up to 32 units of channels, share of the rows), each thread one unit of channels down
// its rows. A unit is a 16-byte pack (the _vec rows) or one element.
#pragma once

#include <cmath>
#include <cstdlib>

#include "core/workspace.hpp"
#include "cuda/batch_norm_rows.cuh"
#include "cuda/common.cuh"
#include "cuda/reduce.cuh"

namespace gradops::cuda {

struct BnArgs {
  const void* x;
  const void* dy;  // grad
  void* out;       // dX or Y
  const void* scale;
  const void* bias;
  const void* mean;     // grad: the saved mean
  const void* inv_std;  // grad: the saved inverse std
  const void* input_mean;
  const void* input_var;
  void* dscale;
  void* dbias;
  void* running_mean;
  void* running_var;
  void* saved_mean;
  void* saved_inv_std;
  DType t1, t2;
  float epsilon, momentum;
  void* partial;  // compute type [2][groups][c]
  void* coef;     // compute type [4][c]
  double* sums_out;
  const double* sums_in;
  int64_t n, c, s, count;
  int64_t units, per_channel, groups, tiles, step_div, step_mod;
  int64_t slots;  // held: the packs of each input a thread holds
  int tw, rb;
};

// ---- per-channel values of the statistics' and parameters' types --------------------------------

template <class A>
__device__ __forceinline__ A load_dt(DType t, const void* p, int64_t i) {
  switch (t) {
    case DType::f64: return static_cast<A>(static_cast<const double*>(p)[i]);
    case DType::f16: return static_cast<A>(__half2float(static_cast<const __half*>(p)[i]));
    case DType::bf16: return static_cast<A>(__bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]));
    case DType::f32: break;
  }
  return static_cast<A>(static_cast<const float*>(p)[i]);
}
template <class A>
__device__ __forceinline__ void store_dt(DType t, void* p, int64_t i, A v) {
  if (!p) return;
  switch (t) {
    case DType::f64: static_cast<double*>(p)[i] = static_cast<double>(v); return;
    case DType::f16: static_cast<__half*>(p)[i] = __float2half_rn(static_cast<float>(v)); return;
    case DType::bf16: static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(static_cast<float>(v)); return;
    case DType::f32: break;
  }
  static_cast<float*>(p)[i] = static_cast<float>(v);
}

// The forward's shift K: the running mean, which every participant of a split call shares; a
// non-finite one would poison the batch's statistics, so 0 stands in (as on the CPU).
__device__ __forceinline__ double shift_of(const BnArgs& a, int64_t c) {
  const double k = load_dt<double>(a.t2, a.input_mean, c);
  return isfinite(k) ? k : 0.0;
}

// The channel's first value: the forward's shift K (the reduction and the finish read the same).
__device__ __forceinline__ int64_t first_of(const BnArgs& a, int64_t c, bool columns) { return columns ? c : c * a.s; }

// The channel's centre during the reduction: the saved mean (grad) or K (forward).
template <class T, bool kGrad, bool kColumns>
__device__ __forceinline__ compute_t<T> centre_of(const BnArgs& a, int64_t c) {
  using A = compute_t<T>;
  if constexpr (kGrad) return load_dt<A>(a.t2, a.mean, c);
  else return static_cast<A>(to_compute(static_cast<const T*>(a.x)[first_of(a, c, kColumns)]));
}

template <bool kGrad, class A>
__device__ __forceinline__ void accumulate(Sum2<A>& acc, A x, A g, A mu) {
  const A e = x - mu;
  if constexpr (kGrad) {
    acc.a += g;
    acc.b = dfma(g, e, acc.b);
  } else {
    acc.a += e;
    acc.b = dfma(e, e, acc.b);
  }
}

// The elementwise coefficients of a channel: grad dX = a·dY + (c·(x - mean) + b), forward
// Y = (x - mean)·a + b.
template <class A>
struct BnCoef {
  A a, b, c, mean;
};

// A pack of outputs from a pack of X (and dY) and the coefficients of its channel (N = 1) or of
// each of its elements' channels (N = VEC).
template <bool kGrad, class T, int VEC, class A, int N>
__device__ __forceinline__ Pack<T, VEC> apply_pack(const BnCoef<A> (&k)[N], const Pack<T, VEC>& xs,
                                                   const Pack<T, VEC>& gs) {
  static_assert(N == 1 || N == VEC);
  Pack<T, VEC> o;
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const BnCoef<A>& ke = k[N == 1 ? 0 : e];
    const A xe = static_cast<A>(unpack(xs, e)) - ke.mean;
    A v;
    if constexpr (kGrad) v = dfma(ke.a, static_cast<A>(unpack(gs, e)), dfma(ke.c, xe, ke.b));
    else v = dfma(xe, ke.a, ke.b);
    o.v[e] = from_compute<T>(v);
  }
  return o;
}

// ---- runs ---------------------------------------------------------------------------------------

// A thread's place in its block's share [begin, end) of a channel's n·units units: unit u is unit
// j of run i; the block's threads take every kBnThreads-th unit.
struct RunCursor {
  int64_t u, end, i, j;
  __device__ __forceinline__ RunCursor(const BnArgs& a, int64_t g) {
    const int64_t begin = g * a.per_channel / a.groups;
    end = (g + 1) * a.per_channel / a.groups;
    u = begin + threadIdx.x;
    i = u / a.units;
    j = u - i * a.units;
  }
  __device__ __forceinline__ int64_t index(const BnArgs& a, int64_t c) const { return (i * a.c + c) * a.units + j; }
  __device__ __forceinline__ void next(const BnArgs& a) {
    u += kBnThreads;
    i += a.step_div;
    j += a.step_mod;
    if (j >= a.units) j -= a.units, ++i;
  }
};

// This thread's sums over its units of block g's share of channel c, in unit order, kU loads of
// each input in flight. The reduce and held kernels both sum through it, so that their partials
// agree bit for bit. kHold: the thread's j-th pack is also kept at hx[j·kBnThreads + threadIdx.x]
// (and dY's at hg).
template <class T, int VEC, bool kGrad, int kU, bool kHold>
__device__ __forceinline__ Sum2<compute_t<T>> sum_share(const BnArgs& a, int64_t c, int64_t g, compute_t<T> mu,
                                                        Pack<T, VEC>* hx = nullptr, Pack<T, VEC>* hg = nullptr) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  const P* x = static_cast<const P*>(a.x);
  const P* dy = static_cast<const P*>(a.dy);
  Sum2<A> acc{A(0), A(0)};
  RunCursor cur(a, g);
  for (int64_t slot = threadIdx.x; cur.u < cur.end; slot += kU * kBnThreads) {
    P xs[kU], gs[kU];
    bool ok[kU];
#pragma unroll
    for (int k = 0; k < kU; ++k) {
      ok[k] = cur.u < cur.end;
      if (ok[k]) {
        const int64_t idx = cur.index(a, c);
        xs[k] = x[idx];
        if constexpr (kGrad) gs[k] = dy[idx];
      }
      cur.next(a);
    }
#pragma unroll
    for (int k = 0; k < kU; ++k)
      if (ok[k]) {
        if constexpr (kHold) {
          hx[slot + k * kBnThreads] = xs[k];
          if constexpr (kGrad) hg[slot + k * kBnThreads] = gs[k];
        }
#pragma unroll
        for (int e = 0; e < VEC; ++e)
          accumulate<kGrad>(acc, static_cast<A>(unpack(xs[k], e)), kGrad ? static_cast<A>(unpack(gs[k], e)) : A(0), mu);
      }
  }
  return acc;
}

template <class T, int VEC, bool kGrad>
__global__ void __launch_bounds__(kBnThreads) runs_reduce_kernel(BnArgs a) {
  using A = compute_t<T>;
  __shared__ ReduceSmem<Sum2<A>> sm;
  const int64_t c = blockIdx.x / a.groups, g = blockIdx.x % a.groups;
  const Sum2<A> acc = sum_share<T, VEC, kGrad, kBnUnroll, false>(a, c, g, centre_of<T, kGrad, false>(a, c));
  // The finish may launch once every block is here (it waits for this grid's end): earlier, its
  // blocks would hold multiprocessors that a second wave of this grid needs.
  griddep_launch_dependents();
  const Sum2<A> t = block_allreduce<Sum2Op<A>, 1>(acc, sm, 0);
  if (threadIdx.x == 0) {
    A* p = static_cast<A*>(a.partial);
    p[g * a.c + c] = t.a;
    p[(a.groups + g) * a.c + c] = t.b;
  }
}

template <class T, int VEC, bool kGrad>
__global__ void __launch_bounds__(kBnThreads) runs_apply_kernel(BnArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  const int64_t b = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;  // the reduction's last blocks first
  const int64_t c = b / a.groups, g = b % a.groups;
  const P* x = static_cast<const P*>(a.x);
  const P* dy = static_cast<const P*>(a.dy);
  P* out = static_cast<P*>(a.out);
  RunCursor cur(a, g);
  P xs[kBnUnroll], gs[kBnUnroll];
  int64_t at[kBnUnroll];
  bool ok[kBnUnroll];
  const auto load = [&] {
#pragma unroll
    for (int k = 0; k < kBnUnroll; ++k) {
      ok[k] = cur.u < cur.end;
      at[k] = cur.index(a, c);
      if (ok[k]) {
        xs[k] = load_pack<1>(x + at[k]);
        if constexpr (kGrad) gs[k] = load_pack<1>(dy + at[k]);
      }
      cur.next(a);
    }
  };
  // X and dY are the call's inputs, which the kernels before do not write: the first batch is
  // asked for before the wait; only the coefficients, and every store, wait.
  load();
  griddep_wait();
  const A* cf = static_cast<const A*>(a.coef);
  const BnCoef<A> co[1] = {{cf[c], cf[a.c + c], cf[2 * a.c + c], cf[3 * a.c + c]}};
  while (ok[0]) {
#pragma unroll
    for (int u = 0; u < kBnUnroll; ++u)
      if (ok[u]) store_pack<1>(out + at[u], apply_pack<kGrad>(co, xs[u], gs[u]));
    load();
  }
}

// ---- columns ------------------------------------------------------------------------------------

template <class T, int VEC, bool kGrad>
__global__ void __launch_bounds__(kBnThreads) columns_reduce_kernel(BnArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  __shared__ A s1[kBnThreads * VEC], s2[kBnThreads * VEC];
  const int64_t tile = blockIdx.x % a.tiles, g = blockIdx.x / a.tiles;
  const int tx = static_cast<int>(threadIdx.x) % a.tw, ty = static_cast<int>(threadIdx.x) / a.tw;
  const int64_t cu = tile * a.tw + tx;
  const bool live = ty < a.rb && cu < a.units;
  const int64_t r0 = g * a.n / a.groups, r1 = (g + 1) * a.n / a.groups;
  A mu[VEC];
  Sum2<A> acc[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    mu[e] = live ? centre_of<T, kGrad, true>(a, cu * VEC + e) : A(0);
    acc[e] = {A(0), A(0)};
  }
  const P* x = static_cast<const P*>(a.x);
  const P* dy = static_cast<const P*>(a.dy);
  const int64_t rb = a.rb;
  if (live)
    for (int64_t r = r0 + ty; r < r1; r += rb * kBnUnroll) {
      P xs[kBnUnroll], gs[kBnUnroll];
#pragma unroll
      for (int k = 0; k < kBnUnroll; ++k)
        if (r + k * rb < r1) {
          const int64_t idx = (r + k * rb) * a.units + cu;
          xs[k] = x[idx];
          if constexpr (kGrad) gs[k] = dy[idx];
        }
#pragma unroll
      for (int k = 0; k < kBnUnroll; ++k)
        if (r + k * rb < r1)
#pragma unroll
          for (int e = 0; e < VEC; ++e)
            accumulate<kGrad>(acc[e], static_cast<A>(unpack(xs[k], e)), kGrad ? static_cast<A>(unpack(gs[k], e)) : A(0),
                              mu[e]);
    }
  griddep_launch_dependents();
  // The block's rows of each column, pairwise in ty (a fixed tree), through shared memory.
  const int slot = static_cast<int>(threadIdx.x) * VEC;
#pragma unroll
  for (int e = 0; e < VEC; ++e) s1[slot + e] = acc[e].a, s2[slot + e] = acc[e].b;
  for (int h = 1; h < a.rb; h *= 2) {
    __syncthreads();
    if (ty % (2 * h) == 0 && ty + h < a.rb) {
      const int other = slot + h * a.tw * VEC;
#pragma unroll
      for (int e = 0; e < VEC; ++e) s1[slot + e] += s1[other + e], s2[slot + e] += s2[other + e];
    }
  }
  __syncthreads();
  if (ty == 0 && cu < a.units) {
    A* p = static_cast<A*>(a.partial);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      p[g * a.c + cu * VEC + e] = s1[slot + e];
      p[(a.groups + g) * a.c + cu * VEC + e] = s2[slot + e];
    }
  }
}

template <class T, int VEC, bool kGrad>
__global__ void __launch_bounds__(kBnThreads) columns_apply_kernel(BnArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  const int64_t b = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;
  const int64_t tile = b % a.tiles, g = b / a.tiles;
  const int tx = static_cast<int>(threadIdx.x) % a.tw, ty = static_cast<int>(threadIdx.x) / a.tw;
  const int64_t cu = tile * a.tw + tx;
  if (ty >= a.rb || cu >= a.units) return;
  const int64_t r0 = g * a.n / a.groups, r1 = (g + 1) * a.n / a.groups;
  const P* x = static_cast<const P*>(a.x);
  const P* dy = static_cast<const P*>(a.dy);
  P* out = static_cast<P*>(a.out);
  const int64_t rb = a.rb;
  P xs[kBnUnroll], gs[kBnUnroll];
  const auto load = [&](int64_t r) {
#pragma unroll
    for (int u = 0; u < kBnUnroll; ++u)
      if (r + u * rb < r1) {
        const int64_t idx = (r + u * rb) * a.units + cu;
        xs[u] = load_pack<1>(x + idx);
        if constexpr (kGrad) gs[u] = load_pack<1>(dy + idx);
      }
  };
  // X and dY are the call's inputs, which the kernels before do not write: the first batch is
  // asked for while the sums kernel still runs; only the coefficients, and every store, wait.
  load(r0 + ty);
  griddep_wait();
  const A* cf = static_cast<const A*>(a.coef);
  BnCoef<A> co[VEC];
#pragma unroll
  for (int e = 0; e < VEC; ++e) {
    const int64_t ch = cu * VEC + e;
    co[e] = {cf[ch], cf[a.c + ch], cf[2 * a.c + ch], cf[3 * a.c + ch]};
  }
  for (int64_t r = r0 + ty; r < r1; r += rb * kBnUnroll) {
#pragma unroll
    for (int u = 0; u < kBnUnroll; ++u)
      if (r + u * rb < r1) store_pack<1>(out + (r + u * rb) * a.units + cu, apply_pack<kGrad>(co, xs[u], gs[u]));
    if (r + rb * kBnUnroll < r1) load(r + rb * kBnUnroll);
  }
}

// ---- finish -------------------------------------------------------------------------------------

// A channel's per-channel inputs, read together: the held kernel asks for them as it starts the
// channel, so that their trips to memory overlap its reduction rather than follow it.
template <class A>
struct BnChannel {
  A scale, mean, inv_std;  // grad
  double shift, k0, input_mean, input_var, fscale;  // forward: K, the first value K0, the running
                                                    // statistics before the step, scale
  A bias;
};
template <class T, bool kGrad, bool kColumns>
__device__ __forceinline__ BnChannel<compute_t<T>> load_channel(const BnArgs& a, int64_t c, bool first = true) {
  using A = compute_t<T>;
  BnChannel<A> ch{};
  if constexpr (kGrad) {
    if (a.scale) ch.scale = load_dt<A>(a.t1, a.scale, c);  // the reduce half has none
    ch.mean = load_dt<A>(a.t2, a.mean, c);
    ch.inv_std = load_dt<A>(a.t2, a.inv_std, c);
  } else {
    ch.shift = shift_of(a, c);
    if (first && a.count > 0)
      ch.k0 = static_cast<double>(to_compute(static_cast<const T*>(a.x)[first_of(a, c, kColumns)]));
    ch.input_mean = load_dt<double>(a.t2, a.input_mean, c);
    if (a.input_var) ch.input_var = load_dt<double>(a.t2, a.input_var, c);
    if (a.scale) ch.fscale = load_dt<double>(a.t1, a.scale, c), ch.bias = load_dt<A>(a.t1, a.bias, c);
  }
  return ch;
}

// Channel c's coefficients from its two sums over `count` values (this call's, or every
// participant's for the split's apply half), and, where `store`, its per-channel outputs: the CPU's
// formulas (src/cpu/batch_norm.cpp).
template <class T, bool kGrad>
__device__ __forceinline__ BnCoef<compute_t<T>> finish_from(const BnArgs& a, int64_t c,
                                                           const BnChannel<compute_t<T>>& ch, double sum1, double sum2,
                                                           double count, bool store = true) {
  using A = compute_t<T>;
  if constexpr (kGrad) {
    // dX = k (dY - S1/Mc - xhat S2/Mc), k = scale·istd, as a·dY + b + c·(x - mean), so that
    // x - mean is formed before any scaling.
    const A inv_count = count > 0 ? A(1) / static_cast<A>(count) : A(0);
    const A s1 = static_cast<A>(sum1), s2 = static_cast<A>(sum2);
    if (store) {
      store_dt(a.t1, a.dbias, c, s1);
      store_dt(a.t1, a.dscale, c, s2);
    }
    const A k = ch.scale * ch.inv_std;
    return {k, -(k * (s1 * inv_count)), -(k * ch.inv_std) * (s2 * inv_count), ch.mean};
  } else {
    // The statistics in f64 (ops/batch_norm.hpp), as the CPU forms them.
    const double eps = a.epsilon;
    const auto st = ::gradops::detail::batch_norm_channel_stats(ch.shift, sum1, sum2, count, eps, a.momentum,
                                                                ch.input_mean, ch.input_var);
    if (store) {
      store_dt(a.t2, a.saved_mean, c, static_cast<A>(st.mean));
      store_dt(a.t2, a.saved_inv_std, c, static_cast<A>(st.inv_std));
      store_dt(a.t2, a.running_mean, c, static_cast<A>(st.running_mean));
      store_dt(a.t2, a.running_var, c, static_cast<A>(st.running_var));
    }
    return {static_cast<A>(st.y_scale(ch.fscale, eps)), ch.bias, A(0), static_cast<A>(st.mean)};
  }
}

template <class A>
__device__ __forceinline__ void store_coef(const BnArgs& a, int64_t c, const BnCoef<A>& k) {
  A* cf = static_cast<A*>(a.coef);
  cf[c] = k.a;
  cf[a.c + c] = k.b;
  cf[2 * a.c + c] = k.c;
  cf[3 * a.c + c] = k.mean;
}

// The split's sums of a channel from its reduction's totals t1, t2 (f64 sums of the groups'
// partials, in group order).
template <bool kGrad, class A>
__device__ __forceinline__ void sums_from(const BnArgs& a, const BnChannel<A>& ch, double t1, double t2, double* sum1,
                                          double* sum2) {
  if constexpr (kGrad) {
    // Σ dY·x̂ = inv_std·Σ dY·(x - mean), in the compute type as the CPU forms it.
    *sum1 = static_cast<double>(static_cast<A>(t1));
    *sum2 = static_cast<double>(ch.inv_std * static_cast<A>(t2));
  } else {
    // From K0 to K: Σ (x - K) = Σ (x - K0) + n·d, Σ (x - K)² = Σ (x - K0)² + 2d·Σ (x - K0) + n·d²,
    // d = K0 - K.
    const double count = static_cast<double>(a.count);
    // Non-finite values keep the sums from inf - inf: an infinite or NaN first value (or shift) makes
    // them its own (the deviations from it are not used), and one after the first, whose square is
    // then Σ (x - K0)², leaves out the cross term.
    const double d = ch.k0 - ch.shift;
    const bool finite_d = isfinite(d);
    *sum1 = (finite_d ? t1 : 0.0) + count * d;
    *sum2 = (finite_d ? t2 : 0.0) + (finite_d && isfinite(t2) ? 2 * d * t1 : 0.0) + count * d * d;
  }
}

inline constexpr int kBnFinishLanes = 32;

// 32 channels a block: lane ty of 32 adds groups ty, ty + 32, ... of its channel in f64, then the
// lane sums in lane order (column_sum.cuh's order), both sums at once; then the split's sums.
// kFinish: finish from them (the fused op); else store them (the reduce half).
template <class T, bool kGrad, bool kColumns, bool kFinish>
__global__ void __launch_bounds__(32 * kBnFinishLanes) sums_kernel(BnArgs a) {
  using A = compute_t<T>;
  __shared__ double l1[kBnFinishLanes][33], l2[kBnFinishLanes][33];
  const int tx = static_cast<int>(threadIdx.x) % 32, ty = static_cast<int>(threadIdx.x) / 32;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + tx;
  // The gradient's channel inputs are the call's, which the reduction does not write: the
  // finishing thread asks for them before waiting, so that their trip to memory overlaps the
  // reduction's tail. (Held that long, the forward's five and f64's three spilled registers.)
  constexpr bool kEarly = kGrad && std::is_same_v<A, float>;
  BnChannel<A> ch{};
  if (kEarly && ty == 0 && c < a.c) ch = load_channel<T, kGrad, kColumns>(a, c);
  griddep_wait();  // launched while the reduction drains: its partials are complete only now
  griddep_launch_dependents();  // the elementwise grid may take the multiprocessors this one leaves
  const A* p1 = static_cast<const A*>(a.partial);
  const A* p2 = p1 + a.groups * a.c;
  // The loads of kBatch groups at a time are issued together (each is a trip to L2).
  constexpr int kBatch = 8;
  double s1 = 0, s2 = 0;
  if (c < a.c)
    for (int64_t g0 = ty; g0 < a.groups; g0 += kBnFinishLanes * kBatch) {
      A v1[kBatch], v2[kBatch];
#pragma unroll
      for (int k = 0; k < kBatch; ++k) {
        const int64_t g = g0 + int64_t{k} * kBnFinishLanes;
        if (g < a.groups) v1[k] = __ldcg(p1 + g * a.c + c), v2[k] = __ldcg(p2 + g * a.c + c);
      }
#pragma unroll
      for (int k = 0; k < kBatch; ++k)
        if (g0 + int64_t{k} * kBnFinishLanes < a.groups) s1 += v1[k], s2 += v2[k];
    }
  l1[ty][tx] = s1;
  l2[ty][tx] = s2;
  __syncthreads();
  if (ty != 0 || c >= a.c) return;
  double t1 = l1[0][tx], t2 = l2[0][tx];
  for (int k = 1; k < kBnFinishLanes; ++k) t1 += l1[k][tx], t2 += l2[k][tx];
  if constexpr (!kEarly) ch = load_channel<T, kGrad, kColumns>(a, c);
  double sum1, sum2;
  sums_from<kGrad>(a, ch, t1, t2, &sum1, &sum2);
  if constexpr (kFinish) {
    store_coef(a, c, finish_from<T, kGrad>(a, c, ch, sum1, sum2, static_cast<double>(a.count)));
  } else {
    a.sums_out[c] = sum1;
    a.sums_out[a.c + c] = sum2;
    if (c == 0) a.sums_out[2 * a.c] = static_cast<double>(a.count);
  }
}

// The split's apply half: the outputs and coefficients of each channel from the given sums.
template <class T, bool kGrad>
__global__ void __launch_bounds__(kBnThreads) finish_kernel(BnArgs a) {
  griddep_wait();
  griddep_launch_dependents();
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kBnThreads + threadIdx.x;
  if (c < a.c)
    store_coef(a, c,
               finish_from<T, kGrad>(a, c, load_channel<T, kGrad, false>(a, c, false), a.sums_in[c], a.sums_in[a.c + c],
                                     a.sums_in[2 * a.c]));
}

// ---- held: one launch, the inputs read once -----------------------------------------------------

// Where a channel's X and dY fit in the shared memory of a cluster of `groups` blocks (NCHW runs),
// the fused op runs as one kernel: each block keeps its share as it reduces it (the reduce
// kernel's walk and order, so its partial is that kernel's bit for bit), the cluster's blocks add
// the partials through distributed shared memory in group order (the sums kernel's order), each
// finishes the channel, and the block applies from what it holds. The sums are then those of the
// reduce half of the split with the same grid, so the fused op is still the halves' composition.
// Clusters stay resident and loop over the channels: launched one channel each, a wave of large
// clusters waits for whole GPCs to drain (softmax_strided.cuh measured it). They do not ask L2 for
// the next channel ahead: on an H100 that made the large layers slower (lab/cuda/NOTES.md).
template <bool kCluster>
__device__ __forceinline__ void held_sync() {
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (kCluster) {
    cooperative_groups::this_cluster().sync();
    return;
  }
#endif
  __syncthreads();
}

// The value at p in the shared memory of block `rank` of this cluster (this block's without one).
template <bool kCluster, class V>
__device__ __forceinline__ V held_peer(V* p, int rank) {
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (kCluster) return *cooperative_groups::this_cluster().map_shared_rank(p, rank);
#endif
  return *p;
}

template <bool kCluster>
__device__ __forceinline__ int held_rank() {
#if defined(_CG_HAS_CLUSTER_GROUP)
  if constexpr (kCluster) return static_cast<int>(cooperative_groups::this_cluster().block_rank());
#endif
  return 0;
}

template <class T, int VEC, bool kGrad, bool kCluster>
__global__ void __launch_bounds__(kBnThreads) runs_held_kernel(BnArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  // Loads in flight a thread: 8 of each input for the gradient; the forward's one input ran faster
  // at 4 (more blocks fit the registers).
  constexpr int kUnroll = kGrad ? 8 : 4;
  extern __shared__ __align__(16) unsigned char held_raw[];
  P* hx = reinterpret_cast<P*>(held_raw);
  P* hg = hx + a.slots * kBnThreads;
  __shared__ ReduceSmem<Sum2<A>> sm;
  __shared__ Sum2<A> part[2];
  __shared__ BnCoef<A> coef;
  const int64_t g = held_rank<kCluster>();
  const int64_t step = gridDim.x / a.groups;
  P* out = static_cast<P*>(a.out);
  int parity = 0;
  for (int64_t c = blockIdx.x / a.groups; c < a.c; c += step, parity ^= 1) {
    const A mu = centre_of<T, kGrad, false>(a, c);
    BnChannel<A> ch;
    if (threadIdx.x == 0) ch = load_channel<T, kGrad, false>(a, c);
    const Sum2<A> acc = sum_share<T, VEC, kGrad, kUnroll, true>(a, c, g, mu, hx, hg);
    const Sum2<A> t = block_allreduce<Sum2Op<A>, 1>(acc, sm, parity);
    if (threadIdx.x == 0) part[parity] = t;
    held_sync<kCluster>();
    if (threadIdx.x == 0) {
      double t1 = 0, t2 = 0;
      for (int r = 0; r < a.groups; ++r) {
        const Sum2<A> p = held_peer<kCluster>(&part[parity], r);
        t1 += p.a, t2 += p.b;
      }
      double sum1, sum2;
      sums_from<kGrad>(a, ch, t1, t2, &sum1, &sum2);
      coef = finish_from<T, kGrad>(a, c, ch, sum1, sum2, static_cast<double>(a.count), g == 0);
    }
    __syncthreads();
    const BnCoef<A> co[1] = {coef};
    RunCursor at(a, g);
    for (int64_t slot = threadIdx.x; at.u < at.end; slot += kBnThreads) {
      P gs;
      if constexpr (kGrad) gs = hg[slot];
      store_pack<1>(out + at.index(a, c), apply_pack<kGrad>(co, hx[slot], gs));
      at.next(a);
    }
  }
  cluster_exit<kCluster ? 2 : 1>();  // the cluster's peers may still read this block's partials
}

// ---- launches -----------------------------------------------------------------------------------

// GRADOPS_CUDA_BN_HELD=k caps the held kernel's clusters at k blocks, for measuring and for callers
// beside kernels that fill half the GPU (1: plain blocks, which start wherever one fits; 0: never
// held, the three kernels).
inline int bn_held_cluster() {
  static const int k = [] {
    const char* v = std::getenv("GRADOPS_CUDA_BN_HELD");
    return v ? std::atoi(v) : kBnHeldCluster;
  }();
  return k;
}
// The held kernel for clusters of `groups` blocks (1: plain blocks).
template <class T, int VEC, bool kGrad>
auto held_kernel_of(int64_t groups) -> void (*)(BnArgs) {
  return groups > 1 ? runs_held_kernel<T, VEC, kGrad, true> : runs_held_kernel<T, VEC, kGrad, false>;
}

template <class T, int VEC, bool kGrad, bool kColumns>
Status run_bn(std::string_view op, const BnCall& d, const Context& ctx, const DeviceInfo& dev) {
  using A = compute_t<T>;
  constexpr auto reduce = kColumns ? columns_reduce_kernel<T, VEC, kGrad> : runs_reduce_kernel<T, VEC, kGrad>;
  constexpr auto apply = kColumns ? columns_apply_kernel<T, VEC, kGrad> : runs_apply_kernel<T, VEC, kGrad>;
  int per_sm = 1;
  if (Status s = blocks_per_sm<reduce>(op, dev, kBnThreads, &per_sm); !s) return s;
  const int64_t wave = int64_t{dev.sm_count} * per_sm;
  // The held kernel where its clusters fit on this device (Hopper and later); the reduce half takes
  // its grid too.
  BnGeom g;
  int resident = 0;
  if (!kColumns && d.mode != BnMode::apply) {
    g = bn_held_geometry(d, VEC, wave, bn_held_cluster());
    if (g.held) {
      const auto kernel = held_kernel_of<T, VEC, kGrad>(g.groups);
      const std::size_t smem = bn_held_smem(g, d);
      // Cached per kernel, size and shared memory (and the kernel then allowed that much); a cluster
      // of one counts resident blocks.
      if (Status s = resident_clusters(op, kernel, dev, static_cast<int>(g.groups), kBnThreads, &resident, smem); !s)
        return s;
      g.held = resident > 0;
    }
  }
  if (!g.held) g = bn_geometry(d, VEC, wave);
  BnArgs a{};
  a.x = d.x;
  a.dy = d.dy;
  a.out = d.out;
  a.scale = d.scale;
  a.bias = d.bias;
  a.mean = d.mean;
  a.inv_std = d.inv_std;
  a.input_mean = d.input_mean;
  a.input_var = d.input_var;
  a.dscale = d.dscale;
  a.dbias = d.dbias;
  a.running_mean = d.running_mean;
  a.running_var = d.running_var;
  a.saved_mean = d.saved_mean;
  a.saved_inv_std = d.saved_inv_std;
  a.t1 = d.t1;
  a.t2 = d.t2;
  a.epsilon = d.epsilon;
  a.momentum = d.momentum;
  a.sums_out = d.sums_out;
  a.sums_in = d.sums_in;
  a.n = g.v.n;
  a.c = g.v.c;
  a.s = g.v.s;
  a.count = g.v.count;
  a.units = g.units;
  a.per_channel = g.per_channel;
  a.groups = g.groups;
  a.tiles = g.tiles;
  a.step_div = g.step_div;
  a.step_mod = g.step_mod;
  a.tw = g.tw;
  a.rb = g.rb;
  a.slots = g.slots;
  const cudaStream_t stream = stream_of(ctx);
  if (g.held && d.mode == BnMode::fused) {
    const int64_t clusters = even_grid(g.v.c, resident);
    return launch_clustered(op, "the BatchNorm held launch", held_kernel_of<T, VEC, kGrad>(g.groups),
                            dim3(static_cast<unsigned>(clusters * g.groups)), dim3(kBnThreads),
                            static_cast<int>(g.groups), bn_held_smem(g, d), stream, a);
  }
  // Scratch: the partials (not the apply half), the coefficients (not the reduce half).
  const int64_t partials = d.mode == BnMode::apply ? 0 : 2 * g.groups * g.v.c;
  const int64_t coefs = d.mode == BnMode::reduce ? 0 : 4 * g.v.c;
  detail::Workspace ws;
  if (Status s = ws.allocate(ctx, Device::cuda(dev.ordinal), sizeof(A) * static_cast<std::size_t>(partials + coefs), op);
      !s)
    return s;
  a.partial = ws.as<A>();
  a.coef = ws.as<A>() + partials;
  if (d.mode != BnMode::apply) {
    if (g.blocks > 0)
      if (Status s = launch(op, "the BatchNorm reduction launch", reduce, dim3(static_cast<unsigned>(g.blocks)),
                            dim3(kBnThreads), stream, a);
          !s)
        return s;
    const unsigned blocks = static_cast<unsigned>((g.v.c + kBnFinishLanes - 1) / kBnFinishLanes);
    const Status s = d.mode == BnMode::fused
                         ? launch_dependent(op, "the BatchNorm sums launch", sums_kernel<T, kGrad, kColumns, true>,
                                            dim3(blocks), dim3(32 * kBnFinishLanes), stream, a)
                         : launch_dependent(op, "the BatchNorm sums launch", sums_kernel<T, kGrad, kColumns, false>,
                                            dim3(blocks), dim3(32 * kBnFinishLanes), stream, a);
    if (!s || d.mode == BnMode::reduce) return s;
  } else {
    const unsigned blocks = static_cast<unsigned>((g.v.c + kBnThreads - 1) / kBnThreads);
    if (Status s = launch_dependent(op, "the BatchNorm finish launch", finish_kernel<T, kGrad>, dim3(blocks),
                                    dim3(kBnThreads), stream, a);
        !s)
      return s;
  }
  if (g.blocks == 0) return {};
  return launch_dependent(op, "the BatchNorm elementwise launch", apply, dim3(static_cast<unsigned>(g.blocks)),
                          dim3(kBnThreads), stream, a);
}

template <class T>
Status batch_norm_run(std::string_view op, const BnCall& d, const Context& ctx, const DeviceInfo& dev, BnKernel k) {
  constexpr int PV = kPackElems<T>;
  auto go = [&](auto vec, auto columns) -> Status {
    constexpr int V = decltype(vec)::value;
    constexpr bool C = decltype(columns)::value;
    return d.grad ? run_bn<T, V, true, C>(op, d, ctx, dev) : run_bn<T, V, false, C>(op, d, ctx, dev);
  };
  using I1 = std::integral_constant<int, 1>;
  using IV = std::integral_constant<int, PV>;
  using IH = std::integral_constant<int, PV / 2 < 1 ? 1 : PV / 2>;  // 8-byte packs
  using Yes = std::true_type;
  using No = std::false_type;
  switch (k) {
    case BnKernel::runs_vec: return go(IV{}, No{});
    case BnKernel::runs_vec8: return go(IH{}, No{});
    case BnKernel::runs: return go(I1{}, No{});
    case BnKernel::columns_vec: return go(IV{}, Yes{});
    case BnKernel::columns: break;
  }
  return go(I1{}, Yes{});
}

}  // namespace gradops::cuda
