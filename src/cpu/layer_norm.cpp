// LayerNorm family, CPU kernels (portable scalar code, multithreaded).
//
// Compute type: f64 when any of T, U, V is f64, else f32. The (f64, f32, f64) signature therefore
// computes in f64 from f32 statistics, so an f64 model loses nothing but the statistics' own
// rounding; f16/bf16 storage is widened to f32 on load, and each output is rounded once.
//
// Gradients, per row with the given mean mu and inverse std r (taken as given, never recomputed):
//   g = dy * scale, xhat = (x - mu) r   [Invertible: (y - bias) / scale; Simplified: x r]
//   S1 = sum g, S2 = sum g xhat, dx = r (g - S1/cols - xhat S2/cols)   [Simplified: no S1 term]
// Each row of x and dy comes from memory once: the second pass over a row re-reads it from cache.
// dscale/dbias are accumulated in the compute type into one partial row per fixed chunk of rows,
// then the chunk partials are summed per column in chunk order. The chunking depends only on
// (rows, cols), so results are bitwise the same for any thread count.
//
// Forwards, per row: two-pass mean and biased variance (never E[x^2] - E[x]^2), inv_std =
// 1/sqrt(var + epsilon); RMSNorm: inv_std_var = 1/sqrt(mean(x^2) + epsilon). Y uses the statistics
// in the compute type; the saved statistics are rounded to U once.
#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <type_traits>

#include "core/workspace.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "ops/layer_norm.hpp"

namespace gradops::cpu {
namespace {

using detail::LayerNormDesc;

// Row sums: kLanes independent accumulators over blocks of kBlock elements, lanes folded pairwise,
// blocks added in order. The error grows like (kBlock/kLanes + cols/kBlock) roundings rather than
// cols, and the order depends only on cols.
constexpr int kLanes = 16;
constexpr int64_t kBlock = 512;
// Row chunks for dscale/dbias: about sqrt(rows) rows each, so that a column sum is a chain of
// sqrt(rows) rows within a chunk and then one of sqrt(rows) chunk partials (its rounding error
// grows like rows^(3/4) instead of rows), with at most kMaxPartialElems partial values per output.
constexpr int64_t kMaxPartialElems = int64_t{1} << 22;
constexpr int64_t kGrain = int64_t{1} << 15;  // elements below which a forward stays on one thread

enum class Kind { ln_grad, invertible_grad, rms_grad, ln_fwd, rms_fwd };

// The sums sum_j f(j)[k], k < N, over j in [0, n), in the fixed order described above.
template <int N, class A, class F>
std::array<A, N> row_sums(int64_t n, F&& f) {
  std::array<A, N> total{};
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    A lane[N][kLanes] = {};
    int64_t j = b;
    for (; j + kLanes <= e; j += kLanes)
#pragma omp simd
      for (int l = 0; l < kLanes; ++l) {
        const std::array<A, N> t = f(j + l);
        for (int k = 0; k < N; ++k) lane[k][l] += t[k];
      }
    for (int l = 0; j < e; ++j, ++l) {
      const std::array<A, N> t = f(j);
      for (int k = 0; k < N; ++k) lane[k][l] += t[k];
    }
    for (int k = 0; k < N; ++k) {
      for (int w = kLanes / 2; w > 0; w /= 2)
        for (int l = 0; l < w; ++l) lane[k][l] += lane[k][l + w];
      total[k] += lane[k][0];
    }
  }
  return total;
}

struct Chunks {
  int64_t rows_per_chunk;
  int64_t count;  // at least 1, so that zero rows still give zeroed partials
};

Chunks chunks_for(int64_t rows, int64_t cols) {
  int64_t per = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(rows)))));
  const int64_t limit = std::max<int64_t>(1, kMaxPartialElems / std::max<int64_t>(cols, 1));
  if (chunk_count(rows, per) > limit) per = chunk_count(rows, limit);
  return {per, std::max<int64_t>(1, chunk_count(rows, per))};
}

template <class T, class U, class V>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<U, double> ||
                                     std::is_same_v<V, double>,
                                 double, float>;

// Calls f(j) for j in [0, n): groups of kLanes independent calls (f must not carry a dependence
// from one j to the next), which the compiler vectorizes at -O2 without run-time alias checks, then
// the tail.
template <class F>
inline void for_lanes(int64_t n, F&& f) {
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) f(j + l);
  for (; j < n; ++j) f(j);
}

// One row of a gradient (pointers at the row; src is X, or Y for the invertible grad). Pass 1 forms
// the row sums; pass 2 re-reads the row, now in cache, for dx and the dscale/dbias partials, whose
// presence is fixed at compile time.
template <Kind K, bool kScale, bool kBias, class A, class V, class S, class T>
void grad_row(int64_t cols, const V* __restrict dy, const S* __restrict src, const V* __restrict scale,
              const V* __restrict bias, A mu, A r, T* __restrict dx, A* __restrict ps, A* __restrict pb) {
  auto xhat = [&](int64_t j) -> A {
    if constexpr (K == Kind::invertible_grad)
      return (load<A>(src, j) - load<A>(bias, j)) / load<A>(scale, j);
    else if constexpr (K == Kind::rms_grad)
      return load<A>(src, j) * r;
    else
      return (load<A>(src, j) - mu) * r;
  };
  A m1 = 0, m2 = 0;  // RMSNorm has no S1 term: m1 stays 0, and g - 0 is exact
  if constexpr (K == Kind::rms_grad) {
    m2 = row_sums<1, A>(cols, [&](int64_t j) {
           return std::array<A, 1>{load<A>(dy, j) * load<A>(scale, j) * xhat(j)};
         })[0] /
         A(cols);
  } else {
    const auto s = row_sums<2, A>(cols, [&](int64_t j) {
      const A g = load<A>(dy, j) * load<A>(scale, j);
      return std::array<A, 2>{g, g * xhat(j)};
    });
    m1 = s[0] / A(cols);
    m2 = s[1] / A(cols);
  }
  for_lanes(cols, [&](int64_t j) {
    const A gy = load<A>(dy, j), xh = xhat(j);
    store(dx, j, r * (gy * load<A>(scale, j) - m1 - xh * m2));
    if constexpr (kScale) ps[j] += gy * xh;
    if constexpr (kBias) pb[j] += gy;
  });
}

template <Kind K, class T, class U, class V>
Status run_grad(const LayerNormDesc& d, const Context& ctx) {
  using A = acc_t<T, U, V>;
  const V* dy = static_cast<const V*>(d.dy);
  const V* scale = static_cast<const V*>(d.scale);
  const V* bias = static_cast<const V*>(d.bias);
  const U* mean = static_cast<const U*>(d.mean);
  const U* inv_std = static_cast<const U*>(d.inv_std);
  T* dx = static_cast<T*>(d.dx);
  V* dscale = static_cast<V*>(d.dscale);
  V* dbias = static_cast<V*>(d.dbias);
  const int64_t rows = d.rows, cols = d.cols;
  if (cols == 0) return {};  // dx, dscale and dbias are all empty
  const auto* src = [&] {
    if constexpr (K == Kind::invertible_grad)
      return static_cast<const V*>(d.y);
    else
      return static_cast<const T*>(d.x);
  }();

  // Partial rows: [chunk][col] for dscale, then the same for dbias.
  const Chunks ch = chunks_for(rows, cols);
  const int64_t per_output = ch.count * cols;
  const int64_t outputs = (dscale ? 1 : 0) + (dbias ? 1 : 0);
  detail::Workspace ws;
  if (outputs > 0)
    if (Status s = ws.allocate(ctx, Device::cpu(), sizeof(A) * static_cast<std::size_t>(outputs * per_output),
                               op_schema(d.op).name);
        !s)
      return s;
  A* const part_scale = dscale ? ws.as<A>() : nullptr;
  A* const part_bias = dbias ? ws.as<A>() + (dscale ? per_output : 0) : nullptr;

  auto chunk_rows = [&](auto has_scale, auto has_bias, int64_t i0, int64_t i1, A* ps, A* pb) {
    for (int64_t i = i0; i < i1; ++i) {
      const A mu = K == Kind::ln_grad ? load<A>(mean, i) : A(0);
      grad_row<K, decltype(has_scale)::value, decltype(has_bias)::value>(
          cols, dy + i * cols, src + i * cols, scale, bias, mu, load<A>(inv_std, i), dx + i * cols, ps, pb);
    }
  };
  parallel_for(ch.count, 1, ctx, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      A* ps = part_scale ? part_scale + c * cols : nullptr;
      A* pb = part_bias ? part_bias + c * cols : nullptr;
      if (ps) std::fill(ps, ps + cols, A(0));
      if (pb) std::fill(pb, pb + cols, A(0));
      const int64_t i0 = c * ch.rows_per_chunk, i1 = std::min(rows, i0 + ch.rows_per_chunk);
      using yes = std::true_type;
      using no = std::false_type;
      if (ps && pb) chunk_rows(yes{}, yes{}, i0, i1, ps, pb);
      else if (ps) chunk_rows(yes{}, no{}, i0, i1, ps, pb);
      else if (pb) chunk_rows(no{}, yes{}, i0, i1, ps, pb);
      else chunk_rows(no{}, no{}, i0, i1, ps, pb);
    }
  });

  // Column sums of the partials, in chunk order, into chunk 0's row.
  auto finish = [&](A* part, V* out) {
    if (!part) return;
    parallel_for(cols, 1024, ctx, [&](int64_t j0, int64_t j1) {
      for (int64_t c = 1; c < ch.count; ++c) {
        const A* p = part + c * cols;
        for (int64_t j = j0; j < j1; ++j) part[j] += p[j];
      }
      for (int64_t j = j0; j < j1; ++j) store(out, j, part[j]);
    });
  };
  finish(part_scale, dscale);
  finish(part_bias, dbias);
  return {};
}

template <Kind K, class T, class U, class V>
Status run_forward(const LayerNormDesc& d, const Context& ctx) {
  using A = acc_t<T, U, V>;
  const T* x = static_cast<const T*>(d.x);
  const V* scale = static_cast<const V*>(d.scale);
  const V* bias = static_cast<const V*>(d.bias);
  V* y = static_cast<V*>(d.out_y);
  U* mean_out = static_cast<U*>(d.out_mean);
  U* inv_std_out = static_cast<U*>(d.out_inv_std);
  const int64_t cols = d.cols;
  const A eps = static_cast<A>(d.epsilon);
  if (cols == 0 && !mean_out && !inv_std_out) return {};  // every output is empty

  // A mean over zero columns is taken as 0 (the sum over no elements), so that every row still gets
  // finite statistics: mean 0, var 0, inv_std 1/sqrt(epsilon).
  auto row_mean = [&](auto&& f) {
    const A s = row_sums<1, A>(cols, f)[0];
    return cols > 0 ? s / A(cols) : A(0);
  };
  auto row = [&](int64_t i) {
    const int64_t base = i * cols;
    A mu = 0, r;
    if constexpr (K == Kind::rms_fwd) {
      r = A(1) / std::sqrt(row_mean([&](int64_t j) {
                             const A v = load<A>(x, base + j);
                             return std::array<A, 1>{v * v};
                           }) +
                           eps);
      for_lanes(cols, [&](int64_t j) { store(y, base + j, load<A>(x, base + j) * r * load<A>(scale, j)); });
    } else {
      mu = row_mean([&](int64_t j) { return std::array<A, 1>{load<A>(x, base + j)}; });
      const A var = row_mean([&](int64_t j) {
        const A c = load<A>(x, base + j) - mu;
        return std::array<A, 1>{c * c};
      });
      r = A(1) / std::sqrt(var + eps);
      if (bias)
        for_lanes(cols, [&](int64_t j) {
          store(y, base + j, (load<A>(x, base + j) - mu) * r * load<A>(scale, j) + load<A>(bias, j));
        });
      else
        for_lanes(cols, [&](int64_t j) { store(y, base + j, (load<A>(x, base + j) - mu) * r * load<A>(scale, j)); });
      if (mean_out) store(mean_out, i, mu);
    }
    if (inv_std_out) store(inv_std_out, i, r);
  };
  parallel_for(d.rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), ctx,
               [&](int64_t i0, int64_t i1) {
                 for (int64_t i = i0; i < i1; ++i) row(i);
               });
  return {};
}

template <class T, class U, class V>
Status run_typed(const LayerNormDesc& d, const Context& ctx) {
  switch (d.op) {
    case OpId::LayerNormalizationGrad: return run_grad<Kind::ln_grad, T, U, V>(d, ctx);
    case OpId::InvertibleLayerNormalizationGrad: return run_grad<Kind::invertible_grad, T, U, V>(d, ctx);
    case OpId::SimplifiedLayerNormalizationGrad: return run_grad<Kind::rms_grad, T, U, V>(d, ctx);
    case OpId::LayerNormalization: return run_forward<Kind::ln_fwd, T, U, V>(d, ctx);
    case OpId::SimplifiedLayerNormalization: return run_forward<Kind::rms_fwd, T, U, V>(d, ctx);
    default: break;
  }
  return Status(StatusCode::internal, std::string(op_schema(d.op).name) + ": not a LayerNorm-family op");
}

// The (T, U, V) signatures of the op table; only these are instantiated.
template <class T, class U, class V>
struct Sig {};
template <class... S>
struct SigList {};
using Signatures = SigList<Sig<float, float, float>, Sig<double, double, double>, Sig<double, float, double>,
                           Sig<half, float, half>, Sig<bfloat16, float, bfloat16>, Sig<float, float, half>,
                           Sig<half, float, float>>;

template <class T, class U, class V>
bool try_sig(Sig<T, U, V>, const LayerNormDesc& d, const Context& ctx, Status* s) {
  if (d.t != dtype_of<T>::value || d.u != dtype_of<U>::value || d.v != dtype_of<V>::value) return false;
  *s = run_typed<T, U, V>(d, ctx);
  return true;
}

template <class... S>
Status run_signature(SigList<S...>, const LayerNormDesc& d, const Context& ctx) {
  Status s;
  if ((try_sig(S{}, d, ctx, &s) || ...)) return s;
  return Status(StatusCode::internal, std::string(op_schema(d.op).name) + ": no CPU kernel for (" +
                                          dtype_name(d.t) + ", " + dtype_name(d.u) + ", " + dtype_name(d.v) + ")");
}

}  // namespace
}  // namespace gradops::cpu

namespace gradops::detail {

Status cpu_layer_norm(const LayerNormDesc& d, const Context& ctx) {
  return cpu::run_signature(cpu::Signatures{}, d, ctx);
}

}  // namespace gradops::detail
