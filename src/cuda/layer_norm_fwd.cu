// LayerNorm family, CUDA forwards: LayerNormalization (Y, Mean, InvStdDev) and
// SimplifiedLayerNormalization (Y, inv_std_var), with the CPU implementation's formulas:
//   LayerNorm: mean = sum x / cols, var = sum (x - mean)^2 / cols (two passes, never
//   E[x^2] - E[x]^2), r = 1 / sqrt(var + epsilon), y = (x - mean) r scale + bias;
//   RMSNorm: r = 1 / sqrt(sum x^2 / cols + epsilon), y = x r scale.
// The statistics are used in the compute type and rounded to U once when saved. The held kernel
// keeps the row in registers (one read of x, one write of y; both passes over the registers); the
// general kernel reads it from memory once and again from L1/L2 (cuda/layer_norm.cuh).
#include <cooperative_groups.h>

#include <algorithm>
#include <string>

#include "cuda/common.cuh"
#include "cuda/layer_norm.cuh"
#include "cuda/reduce.cuh"
#include "ops/dispatch.hpp"
#include "ops/layer_norm.hpp"

namespace gradops::cuda {
namespace {

template <class A>
__device__ __forceinline__ A rsqrt_acc(A v) {
  return A(1) / sqrt(v);
}

template <class A, class U>
__device__ __forceinline__ void store_stat(void* p, int64_t i, A v) {
  if (p) static_cast<U*>(p)[i] = from_compute<U>(static_cast<compute_t<U>>(v));
}

template <LnKind K, class A>
__device__ __forceinline__ A fwd_out(A x, A mu, A r, A scale, A bias, bool has_bias) {
  const A xh = xhat<K, A>(x, mu, r, A(0), A(0));
  return has_bias ? dfma(xh, scale, bias) : xh * scale;
}

// ---- held --------------------------------------------------------------------------------------

template <LnKind K, class S, int VEC, int N>
__global__ void __launch_bounds__(kLnMaxBlockThreads, N == 1 ? 2 : 1) held_fwd_kernel(LnArgs a) {
  using T = typename S::T;
  using U = typename S::U;
  using V = typename S::V;
  using A = typename S::A;
  using PT = Pack<T, VEC>;
  using PV = Pack<V, VEC>;
  __shared__ LnSmem<A> sm;
  extern __shared__ unsigned char smem_raw[];
  const int lanes = a.lanes, cluster = a.cluster;
  const int rank = cluster_rank(cluster);
  const int group = cluster > 1 ? 0 : static_cast<int>(threadIdx.x) / lanes;
  const int t = cluster > 1 ? rank * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x)
                            : static_cast<int>(threadIdx.x) % lanes;
  const int64_t rows_per_block = cluster > 1 ? 1 : blockDim.x / lanes;
  const int64_t packs = a.cols / VEC;
  const int64_t step = static_cast<int64_t>(gridDim.x / cluster) * rows_per_block;
  const T* x = static_cast<const T*>(a.src);
  const PV* scale = static_cast<const PV*>(a.scale);
  const PV* bias = static_cast<const PV*>(a.bias);
  V* y = static_cast<V*>(a.out);
  const A inv_n = A(1) / static_cast<A>(a.cols);
  const A eps = static_cast<A>(a.epsilon);
  const bool has_bias = bias != nullptr;
  // The thread's scale (and bias) packs, the same in every row (ln_column_bytes).
  PV* own_scale = reinterpret_cast<PV*>(smem_raw);
  PV* own_bias = own_scale + N * blockDim.x;
  keep_own<N>(own_scale, scale, lanes, t, packs);
  if (has_bias) keep_own<N>(own_bias, bias, lanes, t, packs);
  if (cluster > 1) mailbox_open(sm.box);
  int exchange = 0;
  for (int64_t first = blockIdx.x / cluster * rows_per_block; first < a.rows; first += step) {
    const int64_t row = first + group;
    const bool live = row < a.rows;
    const int64_t base = row * a.cols;
    PT xs[N];
    bool valid[N];
#pragma unroll
    for (int k = 0; k < N; ++k) {
      const int64_t p = static_cast<int64_t>(k) * lanes + t;
      valid[k] = live && p < packs;
      xs[k] = PT{};
      if (valid[k]) xs[k] = load_pack<1>(reinterpret_cast<const PT*>(x + base) + p);
    }
    if (a.prefetch && row + step < a.rows) {
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const int64_t p = static_cast<int64_t>(k) * lanes + t;
        if (p < packs) prefetch_line(reinterpret_cast<const PT*>(x + (row + step) * a.cols), p);
      }
    }
    A s = A(0);
#pragma unroll
    for (int k = 0; k < N; ++k)
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const A v = static_cast<A>(unpack(xs[k], j));
        s = K == LnKind::ln_fwd ? s + v : dfma(v, v, s);
      }
    s = lanes_allreduce<SumOp<A>>(s, lanes, cluster, sm, exchange++);
    A mu = A(0), r;
    if constexpr (K == LnKind::ln_fwd) {
      mu = s * inv_n;
      A q = A(0);
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (valid[k])
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const A c = static_cast<A>(unpack(xs[k], j)) - mu;
            q = dfma(c, c, q);
          }
      q = lanes_allreduce<SumOp<A>>(q, lanes, cluster, sm, exchange++);
      r = rsqrt_acc(q * inv_n + eps);
    } else {
      r = rsqrt_acc(s * inv_n + eps);
    }
    if (live && t == 0) {
      if constexpr (K == LnKind::ln_fwd) store_stat<A, U>(a.out_mean, row, mu);
      store_stat<A, U>(a.out_inv_std, row, r);
    }
#pragma unroll
    for (int k = 0; k < N; ++k)
      if (valid[k]) {
        const int64_t p = static_cast<int64_t>(k) * lanes + t;
        const PV sc = own_slot(own_scale, k);
        const PV bi = has_bias ? own_slot(own_bias, k) : PV{};
        PV o;
#pragma unroll
        for (int j = 0; j < VEC; ++j)
          o.v[j] = from_compute<V>(static_cast<compute_t<V>>(fwd_out<K, A>(
              static_cast<A>(unpack(xs[k], j)), mu, r, static_cast<A>(unpack(sc, j)),
              has_bias ? static_cast<A>(unpack(bi, j)) : A(0), has_bias)));
        store_pack<1>(reinterpret_cast<PV*>(y + base) + p, o);
      }
  }
  cluster_sync(cluster);
}

// ---- general --------------------------------------------------------------------------------------

constexpr int kGeneralThreads = 256;
constexpr int64_t kGeneralBlocks = 4 * kLnSms;

template <LnKind K, class S>
__global__ void __launch_bounds__(kGeneralThreads) general_fwd_kernel(LnArgs a) {
  using T = typename S::T;
  using U = typename S::U;
  using V = typename S::V;
  using A = typename S::A;
  __shared__ ReduceSmem<A> sm;
  const T* x = static_cast<const T*>(a.src);
  const V* scale = static_cast<const V*>(a.scale);
  const V* bias = static_cast<const V*>(a.bias);
  V* y = static_cast<V*>(a.out);
  const int64_t n = a.cols;
  // A mean over no columns is taken as 0 (as on the CPU): mean 0, var 0, inv_std 1/sqrt(epsilon).
  const A inv_n = n > 0 ? A(1) / static_cast<A>(n) : A(0);
  const A eps = static_cast<A>(a.epsilon);
  int parity = 0;
  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const int64_t base = row * n;
    A s = A(0);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
      const A v = static_cast<A>(to_compute(x[base + c]));
      s = K == LnKind::ln_fwd ? s + v : dfma(v, v, s);
    }
    s = block_allreduce<SumOp<A>, 1>(s, sm, parity);
    parity ^= 1;
    A mu = A(0), r;
    if constexpr (K == LnKind::ln_fwd) {
      mu = s * inv_n;
      A q = A(0);
      for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
        const A v = static_cast<A>(to_compute(x[base + c])) - mu;
        q = dfma(v, v, q);
      }
      q = block_allreduce<SumOp<A>, 1>(q, sm, parity);
      parity ^= 1;
      r = rsqrt_acc(q * inv_n + eps);
    } else {
      r = rsqrt_acc(s * inv_n + eps);
    }
    if (threadIdx.x == 0) {
      if constexpr (K == LnKind::ln_fwd) store_stat<A, U>(a.out_mean, row, mu);
      store_stat<A, U>(a.out_inv_std, row, r);
    }
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x)
      y[base + c] = from_compute<V>(static_cast<compute_t<V>>(
          fwd_out<K, A>(static_cast<A>(to_compute(x[base + c])), mu, r, static_cast<A>(to_compute(scale[c])),
                        bias ? static_cast<A>(to_compute(bias[c])) : A(0), bias != nullptr)));
  }
}

// ---- host side ------------------------------------------------------------------------------------

// The held kernel a forward launches for rows of `n` packs a thread.
template <LnKind K, class S>
auto held_fwd_for(int n) {
  return n == kLnFwdMaxPacks ? held_fwd_kernel<K, S, kLnVec<S>, kLnFwdMaxPacks> : held_fwd_kernel<K, S, kLnVec<S>, kLnMaxPacks>;
}

// The per-column tensors a held forward keeps a copy of: scale, and LayerNormalization's bias.
template <LnKind K>
int fwd_columns(const LayerNormDesc& d) {
  return K == LnKind::ln_fwd && d.bias ? 2 : 1;
}

// The kernel for d and its launch shape (plan_held), with the forward's packs per thread (it keeps
// no column sums in registers, so it holds up to kLnFwdMaxPacks).
template <LnKind K, class S>
Status plan_fwd(std::string_view op, const LayerNormDesc& d, const DeviceInfo* dev, LnPlan* p) {
  return plan_held<S>(
      d, kLnFwdMaxPacks, dev,
      [&](const DeviceInfo& dv, HeldShape* h) {
        return fit_clusters(op, held_fwd_for<K, S>(h->n), dv, d.rows, h,
                            ln_column_bytes<S>(fwd_columns<K>(d), h->n, static_cast<unsigned>(h->threads)));
      },
      p);
}

template <LnKind K, class S>
Status run_fwd(std::string_view op, const LayerNormDesc& d, const Context& ctx, const DeviceInfo& dev, Path row) {
  constexpr int VEC = kLnVec<S>;
  LnArgs a{};
  a.src = d.x;
  a.scale = d.scale;
  a.bias = K == LnKind::ln_fwd ? d.bias : nullptr;
  a.out = d.out_y;
  a.prefetch = ln_prefetch();
  a.out_mean = K == LnKind::ln_fwd ? d.out_mean : nullptr;
  a.out_inv_std = d.out_inv_std;
  a.rows = d.rows;
  a.cols = d.cols;
  a.epsilon = d.epsilon;
  const cudaStream_t stream = stream_of(ctx);
  if (row == Path::general)
    return launch_ln(op, "the general forward launch", general_fwd_kernel<K, S>,
                     std::min<int64_t>(d.rows, kGeneralBlocks), kGeneralThreads, 1, 0, stream, a);
  LnPlan plan;
  if (Status s = plan_fwd<K, S>(op, d, &dev, &plan); !s) return s;
  if (plan.path != row) return ln_not_planned(op);
  const HeldShape& h = plan.h;
  a.lanes = h.lanes;
  a.cluster = h.cluster;
  a.groups = h.groups;
  const std::size_t smem = ln_column_bytes<S>(fwd_columns<K>(d), h.n, static_cast<unsigned>(h.threads));
  auto go = [&](auto kernel) -> Status {
    if (Status s = allow_dynamic_smem(op, kernel, dev, smem); !s) return s;
    return launch_ln(op, "the held forward launch", kernel, h.blocks, h.threads, h.cluster, smem, stream, a);
  };
  switch (h.n) {
    case 1: return go(held_fwd_kernel<K, S, VEC, 1>);
    case 2: return go(held_fwd_kernel<K, S, VEC, 2>);
    case kLnFwdMaxPacks: return go(held_fwd_kernel<K, S, VEC, kLnFwdMaxPacks>);
    default: break;
  }
  return go(held_fwd_kernel<K, S, VEC, kLnMaxPacks>);
}

// A row's run(): its own kernel only (the row's declines() has taken the call), after the empty cases,
// which launch nothing.
Status run(const LayerNormDesc& d, const Context& ctx, Path row) {
  const std::string_view op = op_schema(d.op).name;
  if (d.rows == 0) return {};
  if (d.cols == 0 && !d.out_mean && !d.out_inv_std) return {};
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_sig(d, op, [&](auto sig) -> Status {
    using S = decltype(sig);
    if (d.op == OpId::LayerNormalization) return run_fwd<LnKind::ln_fwd, S>(op, d, ctx, dev, row);
    return run_fwd<LnKind::rms_fwd, S>(op, d, ctx, dev, row);
  });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

const char* cuda_layer_norm_fwd_declines(const LayerNormDesc& d, LayerNormCudaKernel k) {
  return cuda::ln_row_declines(d, k, [&](const cuda::DeviceInfo* dev, cuda::LnPlan* p) -> Status {
    const std::string_view op = op_schema(d.op).name;
    return cuda::visit_sig(d, op, [&](auto sig) -> Status {
      using S = decltype(sig);
      if (d.op == OpId::LayerNormalization) return cuda::plan_fwd<cuda::LnKind::ln_fwd, S>(op, d, dev, p);
      return cuda::plan_fwd<cuda::LnKind::rms_fwd, S>(op, d, dev, p);
    });
  });
}
Status cuda_layer_norm_fwd(const LayerNormDesc& d, const Context& ctx, LayerNormCudaKernel k) {
  return cuda::run(d, ctx, k);
}

}  // namespace gradops::detail
