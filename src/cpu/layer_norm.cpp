// LayerNorm family, CPU kernels: one source compiled for AVX-512, AVX2, SSE4 and a portable target
// (Highway), chosen at run time.
//
// Compute type: f64 when any of T, U, V is f64, else f32. The (f64, f32, f64) signature therefore
// computes in f64 from f32 statistics, so an f64 model loses nothing but the statistics' own
// rounding; f16/bf16 storage is widened to f32 on load, and each output is rounded once.
//
// Gradients, per row with the given mean mu and inverse std r (taken as given, never recomputed):
//   g = dy * scale, xhat = (x - mu) r   [Invertible: (y - bias) / scale; Simplified: x r]
//   S1 = sum g, S2 = sum g xhat, dx = r (g - S1/cols - xhat S2/cols)   [Simplified: no S1 term]
// Each row of x and dy comes from memory once: a reduction pass forms S1 and S2 (four vector
// accumulators per sum, in an order fixed by cols and the lane count), then the write pass re-reads
// the row from L1/L2. Within a thread's rows, row i's write pass runs in one loop with row i+1's
// reduction, so the reads from memory never pause for a write pass.
// dscale/dbias are accumulated in the compute type, by the write pass while the row is in cache,
// into one partial row per fixed chunk of rows; then the chunk partials are summed per column in
// chunk order. The chunking depends only on (rows, cols), so results are bitwise the same for any
// thread count.
//
// Forwards, per row: two-pass mean and biased variance (never E[x^2] - E[x]^2), inv_std =
// 1/sqrt(var + epsilon); RMSNorm: inv_std_var = 1/sqrt(mean(x^2) + epsilon). Y uses the statistics
// in the compute type; the saved statistics are rounded to U once. The first pass over row i+2
// (from memory) runs in one loop with row i+1's variance pass and row i's write, both from cache.
//
// Partial vectors (a row's tail, or the head that aligns non-temporal stores) go through
// zero-padded copies and the same lane-wise code as whole vectors, their padded lanes kept out of
// every sum, so an element's value does not depend on which of them it fell in. Outputs at least
// stream_min_bytes() large are written with non-temporal stores (see cpu/simd.hpp).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/layer_norm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "core/workspace.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/simd.hpp"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/layer_norm.hpp"

HWY_BEFORE_NAMESPACE();
namespace gradops::cpu::HWY_NAMESPACE {
namespace {

using ::gradops::detail::LayerNormDesc;

// dscale/dbias chunks: about sqrt(rows) rows each, so that a column sum is a chain of sqrt(rows)
// rows within a chunk and then one of sqrt(rows) chunk partials (its rounding error grows like
// rows^(3/4) instead of rows). At least kMinChunkRows rows each: a chunk's two partial rows go to
// memory once and are read back once by the column sums, which costs 2 * 2 sizeof(A) / kMinChunkRows
// of the rows' own traffic (under 2% at 64). At most kMaxPartialElems partial values per output.
constexpr int64_t kMinChunkRows = 64;
constexpr int64_t kMaxPartialElems = int64_t{1} << 22;
constexpr int64_t kFinishCols = 512;  // columns per block of the partials' column sums

using Kind = ::gradops::detail::LayerNormKind;

template <class T, class U, class V>
using acc_t = std::conditional_t<std::is_same_v<T, double> || std::is_same_v<U, double> ||
                                     std::is_same_v<V, double>,
                                 double, float>;

template <class D> using Vec = hn::Vec<D>;

// ---- the row driver ---------------------------------------------------------------------------

// FoldBlocksWriting (cpu/simd-inl.h) with two sums folded side by side: vector block b of [0, n)
// goes into accumulator pair b mod 4 as step(s1, s2, b L, valid), the pairs combined as
// (p0 + p1) + (p2 + p3); meanwhile out[0, n_out) is written from value(j, valid), each element
// exactly once and in increasing order (value() may update per-column state at j as it goes), with
// the same aligning head, paired non-temporal stores and tail as FoldBlocksWriting.
//
// Inlined into a row loop with one call site, so that the lambdas' captures (by value) live in
// registers: an out-of-line call per row copied them through the stack, and reading back pointers
// stored one by one as wide vectors stalled on store forwarding, a fifth of the time at 1024 columns.
template <bool kStream, class D, class Step, class T, class Value>
HWY_INLINE void FoldPairWriting(D d, int64_t n, const Step& step, T* HWY_RESTRICT out, int64_t n_out,
                                const Value& value, Vec<D>& sum1, Vec<D>& sum2) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t w = 0;
  bool stream = false;
  if constexpr (kStream) stream = WriteStreamHead(d, out, n_out, value, w);
  auto write_whole = [&](int64_t count) HWY_ATTR { WriteWhole<kStream>(d, out, n_out, value, stream, w, count); };
  // Four whole vectors at w, the common case, with one bound check.
  auto write_four = [&]() HWY_ATTR {
    if (w + 4 * L > n_out) return write_whole(4);
    if (kStream && stream) {
      if constexpr (kStreamVectors<D, T> == 2) {
        for (int64_t k = 0; k < 4; k += 2) {
          const auto lo = value(w + k * L, L);
          const auto hi = value(w + (k + 1) * L, L);
          StreamNarrow(d, lo, hi, out + w + k * L);
        }
      } else {
        for (int64_t k = 0; k < 4; ++k) StreamNarrow(d, value(w + k * L, L), hn::Zero(d), out + w + k * L);
      }
    } else {
      for (int64_t k = 0; k < 4; ++k) StoreNarrow(d, value(w + k * L, L), out + w + k * L);
    }
    w += 4 * L;
  };
  auto a0 = hn::Zero(d), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    step(a0, b0, j, L);
    step(a1, b1, j + L, L);
    step(a2, b2, j + 2 * L, L);
    step(a3, b3, j + 3 * L, L);
    write_four();
  }
  if (j < n) step(a0, b0, j, std::min(L, n - j)), j += L;
  if (j < n) step(a1, b1, j, std::min(L, n - j)), j += L;
  if (j < n) step(a2, b2, j, std::min(L, n - j)), j += L;
  if (j < n) step(a3, b3, j, std::min(L, n - j));
  while (w + 4 * L <= n_out) write_four();
  write_whole(n_out);
  if (w < n_out) StoreNarrowN(d, value(w, n_out - w), out + w, n_out - w);
  sum1 = hn::Add(hn::Add(a0, a1), hn::Add(a2, a3));
  sum2 = hn::Add(hn::Add(b0, b1), hn::Add(b2, b3));
}

// a * b rounded once, written as an FMA with a zero addend. GCC implements the x86 Mul/Add/Sub
// intrinsics as plain vector arithmetic and in C++ contracts a product that feeds an add into an FMA
// where it sees fit (-ffp-contract=fast), which may differ between two inlined copies of the same
// lambda: g would then have different bits in a row's reduction and in its write pass, or in a row
// whose write pass overlaps the next row's reduction and in one whose does not. An FMA's result is
// never contracted further. (The sign of a zero product is lost, which no output can tell.)
template <class D>
HWY_INLINE Vec<D> Product(D d, Vec<D> a, Vec<D> b) {
  return hn::MulAdd(a, b, hn::Zero(d));
}

// Zeroes the lanes of v from `valid` on (a partial vector's padding), so that they add nothing.
template <class D>
HWY_INLINE Vec<D> KeepValid(D d, Vec<D> v, int64_t valid) {
  return valid == static_cast<int64_t>(hn::Lanes(d)) ? v : hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), v);
}

// ---- per-call scratch ----------------------------------------------------------------------------

// Elements per scratch row: kLead before the row, cols, and a whole vector of slack after it (a
// partial vector is loaded and stored whole there), a multiple of 16 so that every row stays
// 64-byte aligned. The lead is room for a vector that starts up to a vector before column 0: a
// gradient row joined to the one before it (GradRange) computes its first lanes there.
constexpr int64_t kLead = 16;
int64_t ScratchStride(int64_t cols) { return (cols + 16 + 15) / 16 * 16 + kLead; }

// One workspace for a call: per-column rows (scale and bias widened to the compute type, zero before
// and past cols, so that every vector load of them is a whole one), dscale/dbias partials, and each
// thread's ring of parked rows. Every row starts kLead elements into its stride.
template <class A>
struct Scratch {
  ::gradops::detail::Workspace ws;
  A* scale = nullptr;
  A* bias = nullptr;
  A* partials = nullptr;
  A* rings = nullptr;
  int64_t ring_len = 0;  // elements per thread

  template <class V>
  Status Allocate(const Context& ctx, std::string_view op, int64_t cols, int64_t stride, const V* scale_in,
                  const V* bias_in, int64_t partial_len, int64_t threads, int64_t ring) {
    const int64_t cols_rows = bias_in ? 2 : 1;
    const int64_t total = cols_rows * stride + partial_len + threads * ring + kLead;  // every row shifted by kLead
    if (Status s = ws.allocate(ctx, Device::cpu(), sizeof(A) * static_cast<std::size_t>(total), op); !s) return s;
    A* p = ws.as<A>();
    std::fill(p, p + cols_rows * stride, A(0));
    scale = p + kLead;
    bias = bias_in ? scale + stride : nullptr;
    partials = scale + cols_rows * stride;
    rings = partials + partial_len;
    ring_len = ring;
    for (int64_t r = 0; r < cols_rows; ++r) {
      const V* in = r == 0 ? scale_in : bias_in;
      for (int64_t j = 0; j < cols; ++j) scale[r * stride + j] = load<A>(in, j);
    }
    return {};
  }
};

// ---- gradients ---------------------------------------------------------------------------------

// `count` chunks of rows / count rows, the first rows % count of them one row more. A count that is
// a multiple of 8 (or of 2) splits evenly over 2, 4 or 8 threads.
struct Chunks {
  int64_t rows, count;
  int64_t begin(int64_t c) const { return c * (rows / count) + std::min(c, rows % count); }
};

Chunks ChunksFor(int64_t rows, int64_t cols) {
  int64_t count = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(rows))));
  count = std::min(count, std::max<int64_t>(1, rows / kMinChunkRows));
  count = std::min(count, std::max<int64_t>(1, kMaxPartialElems / std::max<int64_t>(cols, 1)));
  if (count >= 8) count = count / 8 * 8;
  else if (count >= 2) count = count / 2 * 2;
  return {rows, std::max<int64_t>(count, 1)};
}

template <Kind K, class T, class U, class V>
struct GradArgs {
  using A = acc_t<T, U, V>;
  using Src = std::conditional_t<K == Kind::invertible_grad, V, T>;  // x, or y for the invertible grad
  const V* dy;
  const Src* src;
  const U* mean;
  const U* inv_std;
  T* dx;
  const A* scale;  // widened, zero past cols
  const A* bias;
  int64_t rows, cols, stride;
  Chunks chunks;
  A* partials;  // per chunk: the dscale partial row, then the dbias one; nullptr when neither is wanted
};

// The invertible grad parks xhat = (y - bias) / scale from its reduction pass for the write pass,
// which would otherwise divide again; the others recompute xhat from x, which costs less than
// moving it through the caches.
template <Kind K>
constexpr bool kParkXhat = K == Kind::invertible_grad;

// One thread's chunks [c0, c1) of a gradient: dx, and the chunks' partial rows when kPartials.
//
// Row i's reduction pass reads dy and x from memory and forms S1 and S2; its write pass re-reads
// them from cache, writes dx and adds dy xhat and dy to the chunk's partial rows. Row i + 1's
// reduction runs in one loop with row i's write pass, so that reads from memory never pause for a
// write pass. (Reducing two rows ahead, to keep the lane sums' latency off the loop, measured no
// faster: out-of-order execution hides it.)
template <Kind K, bool kPartials, bool kStream, class T, class U, class V>
HWY_FLATTEN void GradRange(const GradArgs<K, T, U, V>& a, int64_t c0, int64_t c1, acc_t<T, U, V>* ring) {
  using A = acc_t<T, U, V>;
  const hn::ScalableTag<A> d;
  using VA = Vec<decltype(d)>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t n = a.cols, stride = a.stride;
  const A* HWY_RESTRICT scale = a.scale;
  const A* HWY_RESTRICT bias = a.bias;
  constexpr bool kS1 = K != Kind::rms_grad;  // RMSNorm has no S1 term
  constexpr bool kDbias = kPartials && K != Kind::rms_grad;

  // xhat at [j, j + valid) of row i (src, sc and bi at the same column of the row, scale and bias).
  auto xhat = [=](const auto* HWY_RESTRICT src, const A* HWY_RESTRICT sc, const A* HWY_RESTRICT bi, int64_t j,
                  int64_t valid, VA mu, VA r) HWY_ATTR {
    const VA v = LoadWideN(d, src + j, valid);
    if constexpr (K == Kind::invertible_grad)
      return hn::Div(hn::Sub(v, hn::LoadU(d, bi + j)), hn::LoadU(d, sc + j));
    else if constexpr (K == Kind::rms_grad)
      return hn::Mul(v, r);
    else
      return hn::Mul(hn::Sub(v, mu), r);
  };
  // The reduction of row i, from memory. Padding: dy, x and scale load as 0, xhat is zeroed.
  auto fold = [&](int64_t i, A* parked) {
    const V* HWY_RESTRICT dy = a.dy + i * n;
    const auto* HWY_RESTRICT src = a.src + i * n;
    const VA mu = hn::Set(d, K == Kind::ln_grad ? load<A>(a.mean, i) : A(0));
    const VA r = hn::Set(d, load<A>(a.inv_std, i));
    return [=](VA& s1, VA& s2, int64_t j, int64_t valid) HWY_ATTR {
      PrefetchAhead(dy + j);
      PrefetchAhead(src + j);
      const VA g = Product(d, LoadWideN(d, dy + j, valid), hn::Load(d, scale + j));
      const VA xh = KeepValid(d, xhat(src, scale, bias, j, valid, mu, r), valid);
      if constexpr (kParkXhat<K>) hn::Store(xh, d, parked + j);
      if constexpr (kS1) s1 = hn::Add(s1, g);
      s2 = hn::MulAdd(g, xh, s2);
    };
  };
  // The write pass of row i from column k0 on (value(j) is column k0 + j), from cache, into the
  // partial rows ps and pb.
  auto write = [&](int64_t i, const A* parked, A sum1, A sum2, A* ps, A* pb, int64_t k0) {
    const V* HWY_RESTRICT dy = a.dy + i * n + k0;
    const auto* HWY_RESTRICT src = a.src + i * n + k0;
    const A* HWY_RESTRICT sc = scale + k0;
    const A* HWY_RESTRICT bi = K == Kind::invertible_grad ? bias + k0 : nullptr;
    if (kParkXhat<K>) parked += k0;
    if (kPartials) ps += k0, pb += k0;
    const VA mu = hn::Set(d, K == Kind::ln_grad ? load<A>(a.mean, i) : A(0));
    const VA r = hn::Set(d, load<A>(a.inv_std, i));
    const VA m1 = hn::Set(d, sum1 / A(n)), m2 = hn::Set(d, sum2 / A(n));
    return [=](int64_t j, int64_t valid) HWY_ATTR {
      const VA gy = LoadWideN(d, dy + j, valid);
      const VA xh = kParkXhat<K> ? hn::LoadU(d, parked + j) : xhat(src, sc, bi, j, valid, mu, r);
      if constexpr (kPartials) {
        // A partial vector's other lanes belong to other columns (or none): they stay as they are.
        const VA old_s = hn::LoadU(d, ps + j);
        VA new_s = hn::MulAdd(gy, xh, old_s);
        if (valid < L) new_s = hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(valid)), new_s, old_s);
        hn::StoreU(new_s, d, ps + j);
        if constexpr (kDbias) {
          const VA old_b = hn::LoadU(d, pb + j);
          VA new_b = hn::Add(old_b, gy);
          if (valid < L) new_b = hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(valid)), new_b, old_b);
          hn::StoreU(new_b, d, pb + j);
        }
      }
      const VA g = Product(d, gy, hn::LoadU(d, sc + j));
      return hn::Mul(r, hn::NegMulAdd(xh, m2, kS1 ? hn::Sub(g, m1) : g));
    };
  };

  const int64_t r0 = a.chunks.begin(c0), r1 = a.chunks.begin(c1);
  if (r0 >= r1) return;
  // The partial rows of row t's chunk, zeroed (with their leads) as the write passes (in row order)
  // enter it.
  int64_t c = c0 - 1, next_chunk = r0;
  A *ps = nullptr, *pb = nullptr;
  auto enter = [&](int64_t t) {
    if (!kPartials || t != next_chunk) return;
    ++c;
    next_chunk = a.chunks.begin(c + 1);
    ps = a.partials + 2 * c * stride;
    pb = ps + stride;
    std::fill(ps - kLead, ps - kLead + (kDbias ? 2 : 1) * stride, A(0));
  };
  if constexpr (kParkXhat<K>) std::fill(ring - kLead, ring + stride, A(0));  // read, unused, by a joined row's lead
  // Joined rows (as in softmax.cpp): where streamed dx rows do not start on a stream unit, row t's
  // write stops at the last unit boundary before row t + 1, and the unit the two rows share goes
  // out once, after row t + 1's reduction (the same loop step), its lanes from either row's write
  // pass; row t + 1's write then starts past it. Otherwise both rows would write the shared line
  // with normal stores, each reading it from memory first: 128-column f32 rows on a base 16 bytes
  // past a line ran at 0.52 of copy against 0.89 aligned (lab/cpu/NOTES.md section 17). Every
  // element and every partial-row column gets the same values, in the same row order, either way.
  const int64_t unit = L * kStreamVectors<decltype(d), T>;  // elements a stream store writes
  const uintptr_t unit_bytes = static_cast<uintptr_t>(unit) * sizeof(T);
  const bool join = kStream && n >= 2 * unit && reinterpret_cast<uintptr_t>(a.dx) % sizeof(T) == 0;
  int64_t skip = 0;  // row t's first columns, written with row t - 1's last unit
  // Row t's sums and parked xhat at slot (t - r0) mod 2.
  A sums[2][2] = {};
  const auto plus = [](A p, A q) { return p + q; };
  VA s1, s2;
  for (int64_t t = r0 - 1; t < r1; ++t) {
    const int64_t f = t + 1, fs = (f - r0) & 1, ws = fs ^ 1, w = std::max(t, r0);
    const bool more = f < r1, writing = t >= r0;
    if (writing) enter(t);
    const int64_t k0 = writing ? skip : 0;
    int64_t end = n;  // row t's write stops here
    if (join && writing && more) end = n - static_cast<int64_t>(reinterpret_cast<uintptr_t>(a.dx + f * n) % unit_bytes / sizeof(T));
    FoldPairWriting<kStream>(d, more ? n : 0, fold(more ? f : w, kParkXhat<K> ? ring + fs * stride : nullptr),
                             a.dx + w * n + k0, writing ? end - k0 : 0,
                             write(w, kParkXhat<K> ? ring + ws * stride : nullptr, sums[ws][0], sums[ws][1], ps, pb, k0),
                             s1, s2);
    if (more) {
      sums[fs][0] = kS1 ? ReduceLanes(d, s1, plus) : A(0);
      sums[fs][1] = ReduceLanes(d, s2, plus);
    }
    skip = 0;
    if (end < n) {  // the unit rows t and t + 1 share: lanes [0, mine) of each vector are row t's
      // Their own copies of the write passes: FoldPairWriting's keeps its captures in registers.
      const auto value = write(w, kParkXhat<K> ? ring + ws * stride : nullptr, sums[ws][0], sums[ws][1], ps, pb, k0);
      enter(f);
      const auto next = write(f, kParkXhat<K> ? ring + fs * stride : nullptr, sums[fs][0], sums[fs][1], ps, pb, 0);
      VA part[2] = {hn::Zero(d), hn::Zero(d)};
      for (int64_t v = 0; v < kStreamVectors<decltype(d), T>; ++v) {
        const int64_t o = v * L, mine = std::clamp<int64_t>(n - end - o, 0, L);
        // Row t + 1's lanes start at its column end + o - n, negative where the vector starts in
        // row t: those lanes read row t's inputs and the leads of the per-column rows, and are
        // discarded.
        if (mine == L) part[v] = value(end - k0 + o, L);
        else if (mine == 0) part[v] = next(end + o - n, L);
        else part[v] = hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(mine)), value(end - k0 + o, mine), next(end + o - n, L));
      }
      StreamNarrow(d, part[0], part[1], a.dx + w * n + end);
      skip = unit - (n - end);
    }
  }
}

// out[j] = sum over chunks c, in chunk order, of part[c][j], rounded once to V.
template <class A, class V>
void SumChunks(const A* part, int64_t count, int64_t stride, int64_t cols, V* out, const Context& ctx) {
  const hn::ScalableTag<A> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const int64_t blocks = chunk_count(cols, kFinishCols);
  parallel_for(blocks, std::max<int64_t>(1, kGrain / (kFinishCols * count)), ctx, [&](int64_t b0, int64_t b1) {
    HWY_ALIGN A acc[kFinishCols];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t k0 = b * kFinishCols, w = std::min(kFinishCols, cols - k0);
      for (int64_t j = 0; j < w; j += L) hn::Store(hn::Load(d, part + k0 + j), d, acc + j);
      for (int64_t c = 1; c < count; ++c) {
        const A* p = part + 2 * c * stride + k0;
        for (int64_t j = 0; j < w; j += L) hn::Store(hn::Add(hn::Load(d, acc + j), hn::Load(d, p + j)), d, acc + j);
      }
      for (int64_t j = 0; j < w; j += L) StoreNarrowN(d, hn::Load(d, acc + j), out + k0 + j, std::min(L, w - j));
    }
  });
}

// Threads for `units` units of `unit_elems` elements each, at least kGrain elements per thread.
int64_t ThreadsFor(int64_t units, int64_t unit_elems, const Context& ctx) {
  return slot_count(units, chunk_count(kGrain, std::max<int64_t>(unit_elems, 1)), ctx);
}

template <Kind K, class T, class U, class V>
Status RunGrad(const LayerNormDesc& desc, const Context& ctx) {
  using A = acc_t<T, U, V>;
  using Args = GradArgs<K, T, U, V>;
  V* dscale = static_cast<V*>(desc.dscale);
  V* dbias = static_cast<V*>(desc.dbias);
  const int64_t rows = desc.rows, cols = desc.cols;
  if (cols == 0) return {};  // dx, dscale and dbias are all empty
  if (rows == 0) {           // sums over no rows
    for (V* out : {dscale, dbias})
      if (out)
        for (int64_t j = 0; j < cols; ++j) store(out, j, A(0));
    return {};
  }
  Args a{};
  a.dy = static_cast<const V*>(desc.dy);
  a.src = static_cast<const typename Args::Src*>(K == Kind::invertible_grad ? desc.y : desc.x);
  a.mean = static_cast<const U*>(desc.mean);
  a.inv_std = static_cast<const U*>(desc.inv_std);
  a.dx = static_cast<T*>(desc.dx);
  a.rows = rows;
  a.cols = cols;
  a.stride = ScratchStride(cols);
  a.chunks = ChunksFor(rows, cols);
  // Both partial rows whenever either output is wanted: the unwanted one costs a little cache
  // traffic, and halves the kernels to compile.
  const bool partials = dscale || dbias;
  const int64_t threads = ThreadsFor(a.chunks.count, rows / a.chunks.count * cols, ctx);
  Scratch<A> sc;
  const V* bias_in = K == Kind::invertible_grad ? static_cast<const V*>(desc.bias) : nullptr;
  if (Status s = sc.Allocate(ctx, op_schema(desc.op).name, cols, a.stride, static_cast<const V*>(desc.scale), bias_in,
                             partials ? 2 * a.chunks.count * a.stride : 0, threads,
                             kParkXhat<K> ? 2 * a.stride : 0);
      !s)
    return s;
  a.scale = sc.scale;
  a.bias = sc.bias;
  a.partials = partials ? sc.partials : nullptr;
  // dx goes out through non-temporal stores once the rows the call streams through (dy, x and dx)
  // reach the threshold: dx then would not stay in cache for its reader anyway, and a normal store
  // reads each line first, a third more traffic for 16-bit types.
  const int64_t row_bytes = static_cast<int64_t>(sizeof(V) + sizeof(typename Args::Src) + sizeof(T));
  const bool stream = rows * cols * row_bytes >= stream_min_bytes();
  auto run = [&](auto kernel) {
    ForEachSlot(a.chunks.count, threads, ctx, [&](int64_t c0, int64_t c1, int64_t s) {
      kernel(a, c0, c1, sc.rings + s * sc.ring_len);
    });
  };
  if (partials)
    run(stream ? GradRange<K, true, true, T, U, V> : GradRange<K, true, false, T, U, V>);
  else
    run(stream ? GradRange<K, false, true, T, U, V> : GradRange<K, false, false, T, U, V>);
  if (dscale) SumChunks(a.partials, a.chunks.count, a.stride, cols, dscale, ctx);
  if (dbias) SumChunks(a.partials + a.stride, a.chunks.count, a.stride, cols, dbias, ctx);
  return {};
}

// ---- forwards ----------------------------------------------------------------------------------

// Rows [r0, r1) of a forward, in a pipeline of three passes per row, one loop per row: the sum
// (LayerNorm: sum x; RMSNorm: sum x^2) of row i + 2 from memory, LayerNorm's variance pass over
// row i + 1 (its mean known by then) and the write pass of row i, both from cache. No pass waits
// for a reduction that just finished. Where T is a 16-bit type, the first pass parks x widened in a
// ring of three rows, so that the later passes do not convert it again. Near the end of the range
// the first two passes repeat the last row (from cache, with the same results).
template <Kind K, bool kBias, bool kStream, class T, class U, class V>
HWY_FLATTEN void ForwardRange(const LayerNormDesc& desc, const acc_t<T, U, V>* scale, const acc_t<T, U, V>* bias,
                  int64_t stride, int64_t r0, int64_t r1, acc_t<T, U, V>* ring) {
  using A = acc_t<T, U, V>;
  const hn::ScalableTag<A> d;
  using VA = Vec<decltype(d)>;
  constexpr bool kPark = !std::is_same_v<T, A>;
  constexpr bool kLN = K == Kind::ln_fwd;
  const T* x = static_cast<const T*>(desc.x);
  V* y = static_cast<V*>(desc.out_y);
  U* mean_out = static_cast<U*>(desc.out_mean);
  U* inv_std_out = static_cast<U*>(desc.out_inv_std);
  const int64_t n = desc.cols;
  const A eps = static_cast<A>(desc.epsilon);
  const auto plus = [](A p, A q) { return p + q; };
  // Row i's parked values and statistics sit at slot (i - r0) mod 3.
  auto slot = [&](int64_t i) { return static_cast<int64_t>(static_cast<uint64_t>(i - r0) % 3); };
  auto parked = [&](int64_t i) { return ring + slot(i) * stride; };
  A mu[3] = {}, rs[3] = {};

  // One loop step: the first pass over row fa (into s1) and LayerNorm's variance pass over row fb
  // (into s2). The variance pass reads before the first pass parks: fa == fb only where both
  // repeat the last row, and then the parked values are the same.
  auto passes = [&](int64_t fa, int64_t fb) {
    const T* HWY_RESTRICT xa = x + fa * n;
    const T* HWY_RESTRICT xb = x + fb * n;
    A* HWY_RESTRICT pa = parked(fa);
    const A* HWY_RESTRICT pbr = parked(fb);
    const VA m = hn::Set(d, mu[slot(fb)]);
    return [=](VA& s1, VA& s2, int64_t j, int64_t valid) HWY_ATTR {
      if constexpr (kLN) {
        const VA c = KeepValid(d, hn::Sub(kPark ? hn::Load(d, pbr + j) : LoadWideN(d, xb + j, valid), m), valid);
        s2 = hn::MulAdd(c, c, s2);
      }
      PrefetchAhead(xa + j);
      const VA v = LoadWideN(d, xa + j, valid);  // padding: 0
      if constexpr (kPark) hn::Store(v, d, pa + j);
      s1 = kLN ? hn::Add(s1, v) : hn::MulAdd(v, v, s1);
    };
  };
  auto value = [&](int64_t i) {
    const T* HWY_RESTRICT xr = x + i * n;
    const A* HWY_RESTRICT pr = parked(i);
    const VA m = hn::Set(d, mu[slot(i)]), r = hn::Set(d, rs[slot(i)]);
    return [=](int64_t j, int64_t valid) HWY_ATTR {
      const VA v = kPark ? hn::LoadU(d, pr + j) : LoadWideN(d, xr + j, valid);
      const VA xh = kLN ? hn::Mul(hn::Sub(v, m), r) : hn::Mul(v, r);
      if constexpr (kBias)
        return hn::MulAdd(xh, hn::LoadU(d, scale + j), hn::LoadU(d, bias + j));
      else
        return hn::Mul(xh, hn::LoadU(d, scale + j));
    };
  };

  if constexpr (kPark) std::fill(ring, ring + 3 * stride, A(0));  // read, unused, by the first step
  VA s1, s2;
  // Step t writes row t, takes the variance of row t + 1 and the sum of row t + 2, each clamped to
  // the range. The first two steps write nothing, and the variance the first takes (of row r0, its
  // mean not known yet) is discarded.
  for (int64_t t = r0 - 2; t < r1; ++t) {
    const int64_t fa = std::min(t + 2, r1 - 1), fb = std::clamp(t + 1, r0, r1 - 1), w = std::max(t, r0);
    const bool more = t + 1 < r1;
    FoldPairWriting<kStream>(d, more ? n : 0, passes(fa, fb), y + w * n, t >= r0 ? n : 0, value(w), s1, s2);
    if (!more) continue;
    const A sum = ReduceLanes(d, s1, plus) / A(n);
    if constexpr (kLN) {
      mu[slot(fa)] = sum;
      if (t + 1 >= r0) {
        const int64_t k = slot(fb);
        rs[k] = A(1) / std::sqrt(ReduceLanes(d, s2, plus) / A(n) + eps);
        if (mean_out) store(mean_out, fb, mu[k]);
        if (inv_std_out) store(inv_std_out, fb, rs[k]);
      }
    } else {
      rs[slot(fa)] = A(1) / std::sqrt(sum + eps);
      if (inv_std_out) store(inv_std_out, fa, rs[slot(fa)]);
    }
  }
}

template <Kind K, class T, class U, class V>
Status RunForward(const LayerNormDesc& desc, const Context& ctx) {
  using A = acc_t<T, U, V>;
  const int64_t rows = desc.rows, cols = desc.cols;
  if (cols == 0) {
    // A mean over zero columns is taken as 0 (the sum over no elements), so that every row still
    // gets finite statistics: mean 0, var 0, inv_std 1/sqrt(epsilon).
    const A r = A(1) / std::sqrt(static_cast<A>(desc.epsilon));
    if (!desc.out_mean && !desc.out_inv_std) return {};  // rows may be astronomically many
    for (int64_t i = 0; i < rows; ++i) {
      if (desc.out_mean && K == Kind::ln_fwd) store(static_cast<U*>(desc.out_mean), i, A(0));
      if (desc.out_inv_std) store(static_cast<U*>(desc.out_inv_std), i, r);
    }
    return {};
  }
  if (rows == 0) return {};
  const int64_t stride = ScratchStride(cols);
  const int64_t threads = ThreadsFor(rows, cols, ctx);
  const V* bias_in = K == Kind::ln_fwd ? static_cast<const V*>(desc.bias) : nullptr;
  Scratch<A> sc;
  if (Status s = sc.Allocate(ctx, op_schema(desc.op).name, cols, stride, static_cast<const V*>(desc.scale), bias_in, 0,
                             threads, std::is_same_v<T, A> ? 0 : 3 * stride);
      !s)
    return s;
  // As for the gradients: non-temporal stores once x and y together reach the threshold.
  const bool stream = rows * cols * static_cast<int64_t>(sizeof(T) + sizeof(V)) >= stream_min_bytes();
  auto run = [&](auto kernel) {
    ForEachSlot(rows, threads, ctx, [&](int64_t r0, int64_t r1, int64_t s) {
      if (r0 < r1) kernel(desc, sc.scale, sc.bias, stride, r0, r1, sc.rings + s * sc.ring_len);
    });
  };
  if (bias_in)
    run(stream ? ForwardRange<K, true, true, T, U, V> : ForwardRange<K, true, false, T, U, V>);
  else
    run(stream ? ForwardRange<K, false, true, T, U, V> : ForwardRange<K, false, false, T, U, V>);
  return {};
}

// ---- the signatures -----------------------------------------------------------------------------

template <class T, class U, class V>
Status RunTyped(const LayerNormDesc& d, const Context& ctx) {
  switch (d.kind) {
    case Kind::ln_grad: return RunGrad<Kind::ln_grad, T, U, V>(d, ctx);
    case Kind::invertible_grad: return RunGrad<Kind::invertible_grad, T, U, V>(d, ctx);
    case Kind::rms_grad: return RunGrad<Kind::rms_grad, T, U, V>(d, ctx);
    case Kind::ln_fwd: return RunForward<Kind::ln_fwd, T, U, V>(d, ctx);
    case Kind::rms_fwd: return RunForward<Kind::rms_fwd, T, U, V>(d, ctx);
  }
  return Status(StatusCode::internal, std::string(op_schema(d.op).name) + ": unknown LayerNorm kind");
}

// The family's signatures (kLayerNormSignatures), each instantiated once.
template <DType D>
using storage_t = std::conditional_t<D == DType::f32, float,
                                     std::conditional_t<D == DType::f64, double,
                                                        std::conditional_t<D == DType::f16, half, bfloat16>>>;

template <std::size_t I>
bool TrySig(const LayerNormDesc& d, const Context& ctx, Status* s) {
  constexpr TypeSignature sig = ::gradops::detail::kLayerNormSignatures[I];
  if (d.t != sig.types[0] || d.u != sig.types[1] || d.v != sig.types[2]) return false;
  *s = RunTyped<storage_t<sig.types[0]>, storage_t<sig.types[1]>, storage_t<sig.types[2]>>(d, ctx);
  return true;
}

template <std::size_t... I>
Status RunSignature(std::index_sequence<I...>, const LayerNormDesc& d, const Context& ctx) {
  Status s;
  if ((TrySig<I>(d, ctx, &s) || ...)) return s;
  // The op layer matched the call against the same list: unreachable.
  return Status(StatusCode::internal, std::string(op_schema(d.op).name) + ": no CPU kernel for (" +
                                          dtype_name(d.t) + ", " + dtype_name(d.u) + ", " + dtype_name(d.v) + ")");
}

}  // namespace

Status LayerNorm(const LayerNormDesc& d, const Context& ctx) {
  return RunSignature(std::make_index_sequence<::gradops::detail::kLayerNormSignatures.size()>{}, d, ctx);
}

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradops::cpu {
HWY_EXPORT(LayerNorm);
}  // namespace gradops::cpu

namespace gradops::detail {
Status cpu_layer_norm(const LayerNormDesc& d, const Context& ctx) {
  cpu::apply_simd_target_from_environment();
  return HWY_DYNAMIC_DISPATCH(cpu::LayerNorm)(d, ctx);
}
}  // namespace gradops::detail
#endif
