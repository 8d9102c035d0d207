// Softmax family, CUDA: the device-side pieces every row kernel of cuda/softmax_kernels.cuh shares: the
// softmax reductions (max, running max-and-sum; the sum and the warp, block and cluster
// all-reduces are cuda/reduce.cuh's), the per-element output of each kind, and a row's packs held
// in registers.
#pragma once

#include <cooperative_groups.h>

#include <cmath>
#include <cstring>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/reduce.cuh"
#include "ops/softmax.hpp"

namespace gradops::cuda {

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
__device__ __forceinline__ Stat<A> shuffle_xor(Stat<A> v, int mask) {
  return {__shfl_xor_sync(0xffffffffu, v.m, mask), __shfl_xor_sync(0xffffffffu, v.s, mask)};
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
// the max, then the sum of exp(x - max). Softmax keeps those terms for the output pass where a
// thread holds at most 2 packs (the warp path; computing them again cost 16-bit short rows 0.04-0.05
// of copy) and computes them again (the same bits) where it holds more: kept, they took twice the
// packs' registers in 16-bit, and a block held half the row.
template <SoftmaxKind K, class T, int VEC, int N>
struct Held {
  using A = compute_t<T>;
  static constexpr bool kKeepTerms = K == SoftmaxKind::softmax && N <= 2;
  Pack<T, VEC> y[N], g[N];
  bool valid[N];
  A e[kKeepTerms ? N : 1][VEC];  // softmax forward, kKeepTerms: exp(y - max)

  template <class Reduce>
  __device__ __forceinline__ Final<A> finish(Reduce reduce, int n_extra, const A* ey, const A* eg, A* ee) {
    if constexpr (is_grad(K)) {
      A s = A(0);
#pragma unroll
      for (int k = 0; k < N; ++k)
        if (valid[k])
#pragma unroll
          for (int j = 0; j < VEC; ++j) s = term(s, unpack(y[k], j), unpack(g[k], j));
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
          for (int j = 0; j < VEC; ++j) m = max_nan(m, unpack(y[k], j));
#pragma unroll
      for (int i = 0; i < 2; ++i)
        if (i < n_extra) m = max_nan(m, ey[i]);
      m = reduce(MaxOp<A>{}, m);
      A s = A(0);
      if (m != -INFINITY) {  // else every element is -inf (or the lane holds none)
#pragma unroll
        for (int k = 0; k < N; ++k)
          if (valid[k]) {
            const Pack<T, VEC> yk = opaque(y[k]);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              const A t = dexp(unpack(yk, j) - m);
              if constexpr (kKeepTerms) e[k][j] = t;
              s += t;
            }
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
      const A gj = is_grad(K) ? unpack(gk, j) : A(0);
      if constexpr (kKeepTerms) o.v[j] = from_compute<T>(output<K, sizeof(T) == 2>(f, unpack(yk, j), gj, e[k][j]));
      else o.v[j] = from_compute<T>(output<K, sizeof(T) == 2>(f, unpack(yk, j), gj));
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

}  // namespace gradops::cuda
