// Softmax family, CPU kernels (portable C++ written for the auto-vectorizer, multithreaded).
//
// The descriptor's two layouts (see ops/softmax.hpp):
//   inner == 1, contiguous rows: per row, the reduction pass, then the write pass while the row is
//     still in cache. Row sums go through kLanes interleaved partial sums combined by a fixed
//     pairwise tree: independent accumulators the compiler can keep in one vector register, and
//     a rounding error that grows with n / kLanes rather than n.
//   inner > 1, a non-last axis: per outer slice and block of inner positions, one accumulator per
//     inner position, all updated by a contiguous loop over the block while walking down the
//     axis; then the write pass over the same block, still in cache. Nothing is transposed.
// Each group is reduced by one thread in an order that depends only on the shape, so results are
// bitwise the same for any thread count and any partition.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "ops/softmax.hpp"

namespace gradops::cpu {
namespace {

using detail::SoftmaxDesc;
using detail::SoftmaxKind;

constexpr int64_t kGrain = 1 << 15;      // elements per thread below which we stay on one thread
constexpr int kLanes = 16;               // partial sums per row: one 512-bit register of f32
constexpr int64_t kBlockBytes = 1 << 17; // a strided block's inputs, re-read by its write pass from L2
constexpr int64_t kMaxBlock = 1024;      // inner positions per strided block (accumulators on the stack)

// Sum of term(j) over j in [0, n): lane l adds the terms j = l (mod kLanes) in order, then the
// lanes are added pairwise.
template <class A, class F>
A lane_sum(int64_t n, F&& term) {
  A acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  for (int l = 0; j + l < n; ++l) acc[l] += term(j + l);
  for (int w = kLanes / 2; w > 0; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// Max over a row. NaN never wins a comparison; it still reaches every output through exp(x - m).
template <class A, class T>
A row_max(const T* x, int64_t n) {
  A acc[kLanes];
  std::fill(acc, acc + kLanes, -std::numeric_limits<A>::infinity());
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) {
      const A v = load<A>(x, j + l);
      acc[l] = v > acc[l] ? v : acc[l];
    }
  for (int l = 0; j + l < n; ++l) acc[l] = std::max(acc[l], load<A>(x, j + l));
  return *std::max_element(acc, acc + kLanes);
}

// ---- inner == 1: contiguous rows ------------------------------------------------------------

template <class T, SoftmaxKind kKind>
void run_rows(const SoftmaxDesc& d, const Context& ctx) {
  using A = compute_t<T>;
  const T* dy = static_cast<const T*>(d.dy);
  const T* y = static_cast<const T*>(d.y);
  T* out = static_cast<T*>(d.out);
  const int64_t n = d.axis_len;
  parallel_for(d.outer, std::max<int64_t>(1, kGrain / n), ctx, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* v = y + r * n;
      T* o = out + r * n;
      if constexpr (kKind == SoftmaxKind::softmax_grad) {
        const T* g = dy + r * n;
        const A s = lane_sum<A>(n, [&](int64_t j) { return load<A>(v, j) * load<A>(g, j); });
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) store(o, j, load<A>(v, j) * (load<A>(g, j) - s));
      } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
        const T* g = dy + r * n;
        const A s = lane_sum<A>(n, [&](int64_t j) { return load<A>(g, j); });
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) store(o, j, load<A>(g, j) - std::exp(load<A>(v, j)) * s);
      } else if constexpr (kKind == SoftmaxKind::log_softmax) {
        const A m = row_max<A>(v, n);
        const A lse = std::log(lane_sum<A>(n, [&](int64_t j) { return std::exp(load<A>(v, j) - m); }));
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) store(o, j, (load<A>(v, j) - m) - lse);
      } else if constexpr (std::is_same_v<T, A>) {
        // The output holds exp(x - m) until the sum is known: one exp per element, and the very
        // value a recomputation would give.
        const A m = row_max<A>(v, n);
        const A inv = A(1) / lane_sum<A>(n, [&](int64_t j) {
          const A e = std::exp(v[j] - m);
          o[j] = e;
          return e;
        });
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) o[j] *= inv;
      } else {
        const A m = row_max<A>(v, n);
        const A inv = A(1) / lane_sum<A>(n, [&](int64_t j) { return std::exp(load<A>(v, j) - m); });
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) store(o, j, std::exp(load<A>(v, j) - m) * inv);
      }
    }
  });
}

// ---- inner > 1: a non-last axis, in place on the strided data --------------------------------

// Calls body(base, width) for every (outer slice, block of `width` inner positions): element a of
// the block's groups starts at base + a * inner. Blocks are the unit of parallel work, so a small
// outer still spreads over threads.
template <class Body>
void for_each_block(const SoftmaxDesc& d, int64_t in_bytes, const Context& ctx, Body&& body) {
  // Wide enough for whole vectors, narrow enough that the block's inputs stay in L2 between the
  // reduction and the write pass.
  int64_t block = kBlockBytes / in_bytes / d.axis_len;
  block = std::clamp<int64_t>(block / kLanes * kLanes, kLanes, kMaxBlock);
  block = std::min(block, d.inner);
  const int64_t per_slice = chunk_count(d.inner, block);
  const int64_t grain = std::max<int64_t>(1, kGrain / (block * d.axis_len));
  parallel_for(d.outer * per_slice, grain, ctx, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o = b / per_slice, i0 = (b % per_slice) * block;
      body(o * d.axis_len * d.inner + i0, std::min(block, d.inner - i0));
    }
  });
}

template <class T, SoftmaxKind kKind>
void run_strided(const SoftmaxDesc& d, const Context& ctx) {
  using A = compute_t<T>;
  const T* dy = static_cast<const T*>(d.dy);
  const T* y = static_cast<const T*>(d.y);
  T* out = static_cast<T*>(d.out);
  const int64_t n = d.axis_len, inner = d.inner;
  constexpr bool kGrad = kKind == SoftmaxKind::softmax_grad || kKind == SoftmaxKind::log_softmax_grad;
  const int64_t in_bytes = static_cast<int64_t>(sizeof(T)) * (kGrad ? 2 : 1);

  for_each_block(d, in_bytes, ctx, [&](int64_t base, int64_t w) {
    A s[kMaxBlock];  // per inner position: the sum, then what the write pass needs from it
    std::fill(s, s + w, A(0));
    if constexpr (kGrad) {
      for (int64_t a = 0; a < n; ++a) {
        const T* v = y + base + a * inner;
        const T* g = dy + base + a * inner;
        if constexpr (kKind == SoftmaxKind::softmax_grad)
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) s[i] += load<A>(v, i) * load<A>(g, i);
        else
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) s[i] += load<A>(g, i);
      }
      for (int64_t a = 0; a < n; ++a) {
        const T* v = y + base + a * inner;
        const T* g = dy + base + a * inner;
        T* o = out + base + a * inner;
        if constexpr (kKind == SoftmaxKind::softmax_grad)
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) store(o, i, load<A>(v, i) * (load<A>(g, i) - s[i]));
        else
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) store(o, i, load<A>(g, i) - std::exp(load<A>(v, i)) * s[i]);
      }
    } else {
      A m[kMaxBlock];
      std::fill(m, m + w, -std::numeric_limits<A>::infinity());
      for (int64_t a = 0; a < n; ++a) {
        const T* x = y + base + a * inner;
#pragma omp simd
        for (int64_t i = 0; i < w; ++i) {
          const A v = load<A>(x, i);
          m[i] = v > m[i] ? v : m[i];
        }
      }
      for (int64_t a = 0; a < n; ++a) {
        const T* x = y + base + a * inner;
#pragma omp simd
        for (int64_t i = 0; i < w; ++i) s[i] += std::exp(load<A>(x, i) - m[i]);
      }
      if constexpr (kKind == SoftmaxKind::log_softmax) {
#pragma omp simd
        for (int64_t i = 0; i < w; ++i) s[i] = std::log(s[i]);
        for (int64_t a = 0; a < n; ++a) {
          const T* x = y + base + a * inner;
          T* o = out + base + a * inner;
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) store(o, i, (load<A>(x, i) - m[i]) - s[i]);
        }
      } else {
#pragma omp simd
        for (int64_t i = 0; i < w; ++i) s[i] = A(1) / s[i];
        for (int64_t a = 0; a < n; ++a) {
          const T* x = y + base + a * inner;
          T* o = out + base + a * inner;
#pragma omp simd
          for (int64_t i = 0; i < w; ++i) store(o, i, std::exp(load<A>(x, i) - m[i]) * s[i]);
        }
      }
    }
  });
}

template <class T, SoftmaxKind kKind>
void run_kind(const SoftmaxDesc& d, const Context& ctx) {
  if (d.outer == 0 || d.axis_len == 0 || d.inner == 0) return;
  if (d.inner == 1)
    run_rows<T, kKind>(d, ctx);
  else
    run_strided<T, kKind>(d, ctx);
}

}  // namespace
}  // namespace gradops::cpu

namespace gradops::detail {

Status cpu_softmax(const SoftmaxDesc& d, const Context& ctx) {
  cpu::visit_dtype(d.dtype, [&](auto tag) {
    using T = decltype(tag);
    switch (d.kind) {
      case SoftmaxKind::softmax_grad: return cpu::run_kind<T, SoftmaxKind::softmax_grad>(d, ctx);
      case SoftmaxKind::log_softmax_grad: return cpu::run_kind<T, SoftmaxKind::log_softmax_grad>(d, ctx);
      case SoftmaxKind::softmax: return cpu::run_kind<T, SoftmaxKind::softmax>(d, ctx);
      case SoftmaxKind::log_softmax: return cpu::run_kind<T, SoftmaxKind::log_softmax>(d, ctx);
    }
  });
  return {};
}

}  // namespace gradops::detail
