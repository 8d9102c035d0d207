// Activation family, CPU kernels: one source compiled for SSE4, AVX2, AVX-512 and a portable
// target (Highway), chosen at run time.
//
// Accuracy: every output is rounded once. Functions with transcendentals run in f32 lanes for
// f16/bf16 storage and in f64 lanes for f32 and f64 storage, except the GELUs (GeluGrad,
// BiasGeluGrad_dX, Gelu, BiasGelu), which run in f32 lanes for f32 storage too and take Phi from one
// exp and a fitted erfcx in either lane type (GeluDerivativeSplit, GeluSplit: in f32 lanes a
// relative error of a few 1e-7, GeluGrad's zero near x = -0.75 included; in f64 lanes a few ulp),
// at a fraction of the cost of erfc. Forms without cancellation throughout: Phi(-|x|) = e h,
// 0.5(1 + tanh u) = sigmoid(2u), 1 - y^2 = (1 - y)(1 + y), 1 - sigmoid(v) = sigmoid(-v). f16/bf16
// outputs take the shorter exp (VExpFor16Bit, a few f32 ulp), which their rounding swamps.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/activation.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <type_traits>

#include "core/workspace.hpp"
#include "gradops/schema.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/simd.hpp"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/activation.hpp"

HWY_BEFORE_NAMESPACE();
namespace gradops::cpu::HWY_NAMESPACE {
namespace {

using ::gradops::detail::ActivationDesc;

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kFastGeluGamma = 0.044715;

// Lanes: f64 for f32 storage where kWide (transcendental work without a dedicated f32 form),
// otherwise the storage type's compute type.
template <class T, bool kWide>
using LaneTag = std::conditional_t<kWide && std::is_same_v<T, float>, hn::ScalableTag<double>, ComputeTag<T>>;

template <class D> using V = hn::Vec<D>;

// GELU'(z) for z = hi + lo exactly (lo: the rounding error of a bias add, else 0), from one exp
// and no erfc (the figures below are for f32 lanes; f64 lanes take a degree-24 P and no Taylor
// band): with a = |hi|, e = exp(-a^2/2) and h = erfcx(a/sqrt2)/2, Phi(-a) = e h, so that, with no
// cancellation in either tail,
//   GELU'(hi) = e (h + hi/sqrt(2 pi))          for hi < 0,
//   GELU'(hi) = 1 - e (h - hi/sqrt(2 pi))      for hi >= 0.
// erfcx(t) = exp(t^2) erfc(t) is smooth and decays like 1/(t sqrt(pi)): (1 + P(u)) / (1 + 2t) with
// u = (t - 3) / (t + 3) in [-1, 1) and P of degree 11 (relative error below 4e-9; the CUDA kernel
// uses the same fit). The remaining error sources and their remedies:
// - exp(-a^2/2) from a rounded a^2 (relative error a^2 2^-24, 5e-6 at a = 13): a^2 is split
//   exactly (ExactSquare) and the low part applied as a first-order factor.
// - the rounding of z itself (a bias add): the first-order correction GELU''(hi) lo, with
//   GELU'' = phi (2 - z^2).
// - cancellation between h and hi/sqrt(2 pi) around the zero z0 = -0.75179...: within 0.25 of it,
//   a degree-7 Taylor polynomial in t = z - z0 (t computed exactly from hi, lo and z0 split in
//   two floats). Coefficients c_k = GELU^(k+1)(z0) / k!.
// a is clamped at 64 (e is 0 long before), which keeps +-inf from forming inf - inf: GELU'(-inf)
// = 0, GELU'(inf) = 1; NaN stays NaN.
constexpr float kErfcxPoly[12] = {2.530080676e-01f,  -1.356210709e-01f, -4.756214842e-02f, 1.296440512e-01f,
                                  -1.192753389e-01f, 6.831692904e-02f,  -2.376340702e-02f, 2.498203656e-03f,
                                  1.874892274e-03f,  -7.254716475e-04f, -9.247317212e-05f, 7.693195948e-05f};
// f64 lanes: the same form at degree 24 (a Chebyshev interpolant of (1 + 2t) erfcx(t) - 1 in u,
// computed in long double; relative error of h below 4.2e-16 over t in [0, 3e4] in f64).
constexpr double kErfcxPoly64[25] = {
    0.25300805826972966, -0.13562110612458117, -0.047562294353449115,
    0.12964515870275933, -0.11927366341539046, 0.068308027344011576,
    -0.023770514917095115, 0.0025293918156765365, 0.0018886903442736896,
    -0.00077983226956865792, -0.00010515971555031257, 0.0001250993422612827,
    4.9491825279739217e-06, -2.0100542176928388e-05, -7.3079576641879061e-07,
    3.4723715129961755e-06, 3.5571151277460478e-07, -6.1660255812725221e-07,
    -1.4042697647185382e-07, 1.0183770731233589e-07, 4.1032493882497272e-08,
    -1.331370812981264e-08, -8.2060910435582938e-09, 9.8642026186146483e-10,
    8.3753726232149715e-10};
constexpr float kGeluZeroHi = -0.75179154f, kGeluZeroLo = 1.211445e-08f;
constexpr float kGeluZeroBand = 0.25f;
constexpr float kGeluZeroTaylor[7] = {0.43149399231404695f,  0.3882849829905521f,  -0.018199676398671084f,
                                      -0.1140082332972217f,  -0.014771522148244336f, 0.019421679838189067f,
                                      0.004539228379125416f};
// a^2 = sq + sq_lo exactly: one FMA where the target has it, else Dekker's product of a split in
// two halves of its significand (SSE4 and the portable target).
template <class D> void ExactSquare(D d, V<D> a, V<D>& sq, V<D>& sq_lo) {
  sq = hn::Mul(a, a);
#if HWY_NATIVE_FMA
  (void)d;
  sq_lo = hn::MulSub(a, a, sq);
#else
  if constexpr (std::is_same_v<hn::TFromD<D>, double>) {  // Veltkamp's split into 26 + 27 bits
    const auto c = hn::Mul(a, hn::Set(d, 134217729.0));
    const auto ah = hn::Sub(c, hn::Sub(c, a));
    const auto al = hn::Sub(a, ah);
    sq_lo = hn::Add(hn::Add(hn::Sub(hn::Mul(ah, ah), sq), hn::Mul(hn::Add(ah, ah), al)), hn::Mul(al, al));
    return;
  }
  const hn::RebindToUnsigned<D> du;
  const auto ah = hn::BitCast(d, hn::And(hn::BitCast(du, a), hn::Set(du, 0xFFFFF000u)));
  const auto al = hn::Sub(a, ah);
  sq_lo = hn::Add(hn::Add(hn::Sub(hn::Mul(ah, ah), sq), hn::Mul(hn::Add(ah, ah), al)), hn::Mul(al, al));
#endif
}

// The tail both GELU forms share, at a = |hi| clamped at 64 (e is 0 long before): e = exp(-a^2/2)
// (a^2 split exactly, sq its rounded part) and h = erfcx(a/sqrt2)/2, so that Phi(-a) = e h.
template <class TOut, class D> void GeluTail(D d, V<D> hi, V<D>& a, V<D>& e, V<D>& h, V<D>& sq) {
  using L = hn::TFromD<D>;
  const auto half = hn::Set(d, L(0.5)), one = hn::Set(d, L(1)), k = hn::Set(d, L(3));
  a = hn::Min(hn::Abs(hi), hn::Set(d, L(64)));
  // h = erfcx(t) / 2 with one division: 1 / ((t + K)(1 + 2t)) gives both u and 1 / (1 + 2t).
  const auto t = hn::Mul(a, hn::Set(d, static_cast<L>(kSqrtHalf)));
  const auto q = hn::Add(t, k), den = hn::MulAdd(hn::Set(d, L(2)), t, one);
  const auto r = hn::Div(one, hn::Mul(q, den));
  const auto u = hn::Mul(hn::Mul(hn::Sub(t, k), den), r);
  const auto inv_den = hn::Mul(q, r);
  constexpr bool kF32 = std::is_same_v<L, float>;
  constexpr int kDegree = kF32 ? 11 : 24;
  auto coef = [](int i) { if constexpr (kF32) return kErfcxPoly[i]; else return kErfcxPoly64[i]; };
  auto p = hn::Set(d, coef(kDegree));
  for (int i = kDegree - 1; i >= 0; --i) p = hn::MulAdd(p, u, hn::Set(d, coef(i)));
  h = hn::Mul(half, hn::MulAdd(p, inv_den, inv_den));
  V<D> sq_lo;
  ExactSquare(d, a, sq, sq_lo);
  const auto ex = VExpFor<TOut>(d, hn::Mul(hn::Neg(half), sq));
  e = hn::NegMulAdd(hn::Mul(half, sq_lo), ex, ex);
}

// GELU'(hi) from its tail: e (h + x/sqrt(2 pi)) below 0, 1 - e (h - x/sqrt(2 pi)) from 0 up.
template <class D> V<D> GeluDerivativeMain(D d, V<D> hi, V<D> a, V<D> e, V<D> h) {
  using L = hn::TFromD<D>;
  const auto w = hn::Mul(hn::CopySignToAbs(a, hi), hn::Set(d, static_cast<L>(kInvSqrt2Pi)));
  const auto below = hn::Mul(e, hn::Add(h, w)), above = hn::NegMulAdd(e, hn::Sub(h, w), hn::Set(d, L(1)));
  return hn::IfThenElse(hn::Lt(hi, hn::Zero(d)), below, above);
}

// GELU'(z) for z = hi + lo exactly, on either lane type; kSplit: lo is the rounding error of a bias
// add (else lo is 0, and its terms are not computed). In f32 lanes, within kGeluZeroBand of
// the zero near -0.75 the Taylor polynomial.
template <bool kSplit, class TOut, class D> V<D> GeluDerivativeSplit(D d, V<D> hi, V<D> lo) {
  using L = hn::TFromD<D>;
  V<D> a, e, h, sq;
  GeluTail<TOut>(d, hi, a, e, h, sq);
  auto result = GeluDerivativeMain(d, hi, a, e, h);
  if constexpr (kSplit) {
    const auto second = hn::Mul(hn::Mul(e, hn::Set(d, static_cast<L>(kInvSqrt2Pi))), hn::Sub(hn::Set(d, L(2)), sq));
    result = hn::MulAdd(second, lo, result);
  }
  if constexpr (std::is_same_v<L, float>) {
    const auto x = hn::CopySignToAbs(a, hi);
    auto tz = hn::Sub(hn::Sub(x, hn::Set(d, kGeluZeroHi)), hn::Set(d, kGeluZeroLo));
    if constexpr (kSplit) tz = hn::Add(tz, lo);
    auto poly = hn::Set(d, kGeluZeroTaylor[6]);
    for (int i = 5; i >= 0; --i) poly = hn::MulAdd(poly, tz, hn::Set(d, kGeluZeroTaylor[i]));
    result = hn::IfThenElse(hn::Lt(hn::Abs(tz), hn::Set(d, kGeluZeroBand)), hn::Mul(poly, tz), result);
  }
  return hn::IfThenElse(hn::IsNaN(hi), hi, result);
}

// GELU(z) for z = hi + lo exactly, on either lane type: z Phi(z) is hi (e h) below 0 and
// hi (1 - e h) from 0 up (1 - e h lies in [1/2, 1]: no cancellation); kSplit (lo the rounding error
// of a bias add): plus the first-order correction GELU'(hi) lo, which the tail's conditioning
// (about z^2) would otherwise magnify to 1e-5 relative by z = -13 in f32. The tail's relative
// error (a few 1e-7 in f32 lanes, a few ulp in f64) carries over; -inf gives NaN (-inf times a
// tail of 0), as z Phi(z) does in the oracle.
template <bool kSplit, class TOut, class D> V<D> GeluSplit(D d, V<D> hi, V<D> lo) {
  using L = hn::TFromD<D>;
  V<D> a, e, h, sq;
  GeluTail<TOut>(d, hi, a, e, h, sq);
  const auto tail = hn::Mul(e, h);  // Phi(-|hi|)
  auto result = hn::Mul(hi, hn::IfThenElse(hn::Lt(hi, hn::Zero(d)), tail, hn::Sub(hn::Set(d, L(1)), tail)));
  if constexpr (kSplit) {
    // Where lo is 0, the product alone: adding a zero term would turn GELU(-0) = -0 into +0.
    const auto corrected = hn::MulAdd(GeluDerivativeMain(d, hi, a, e, h), lo, result);
    result = hn::IfThenElse(hn::Eq(lo, hn::Zero(d)), result, corrected);
  }
  return hn::IfThenElse(hn::IsNaN(hi), hi, result);
}

// x + b as hi + lo exactly (Knuth's TwoSum); lo is 0 where hi is not finite (inf - inf).
template <class D> void TwoSum(V<D> x, V<D> b, V<D>& hi, V<D>& lo) {
  hi = hn::Add(x, b);
  const auto bb = hn::Sub(hi, x);
  lo = hn::Add(hn::Sub(x, hn::Sub(hi, bb)), hn::Sub(b, bb));
  lo = hn::IfThenElseZero(hn::IsFinite(hi), lo);
}

// FastGelu: y = z * s with s = sigmoid(2u), u = sqrt(2/pi) (z + gamma z^3).
template <class D> V<D> FastGeluTwoU(D d, V<D> z) {
  const auto z3 = hn::Mul(hn::Mul(z, z), z);
  return hn::Mul(hn::Set(d, 2 * kSqrt2OverPi), hn::MulAdd(hn::Set(d, kFastGeluGamma), z3, z));
}
template <class TOut, class D> V<D> FastGelu(D d, V<D> z) { return hn::Mul(z, Sigmoid<TOut>(d, FastGeluTwoU(d, z))); }
template <class TOut, class D> V<D> FastGeluDerivative(D d, V<D> z) {
  const auto u2 = FastGeluTwoU(d, z);
  const auto s = Sigmoid<TOut>(d, u2);
  const auto w = hn::Mul(s, Sigmoid<TOut>(d, hn::Neg(u2)));  // s (1 - s) = (1 - tanh^2 u) / 4
  const auto poly = hn::MulAdd(hn::Set(d, 3 * kFastGeluGamma), hn::Mul(z, z), hn::Set(d, 1));
  const auto r = hn::MulAdd(hn::Mul(hn::Mul(hn::Set(d, 2 * kSqrt2OverPi), z), poly), w, s);
  return hn::IfThenElse(hn::Eq(w, hn::Zero(d)), s, r);  // saturated: avoids inf * 0 for huge |z|
}

template <class TOut, class D> V<D> QuickGeluDerivative(D d, V<D> x, V<D> alpha) {
  const auto v = hn::Mul(alpha, x);
  return hn::Mul(Sigmoid<TOut>(d, v), hn::MulAdd(v, Sigmoid<TOut>(d, hn::Neg(v)), hn::Set(d, 1)));
}

// out = f(d, dy, x) elementwise. Every element takes the same vector code (a partial vector goes
// through zero-padded copies), so results do not depend on where thread partitions fall. Outputs
// of stream_min_bytes() or more go out through non-temporal stores.
template <class T, bool kWide, class F>
void Elementwise(const ActivationDesc& d, const Context& ctx, F f) {
  const LaneTag<T, kWide> tag;
  const T* dy = static_cast<const T*>(d.dy);
  const T* x = static_cast<const T*>(d.x);
  T* out = static_cast<T*>(d.out);
  const bool stream = d.count * static_cast<int64_t>(sizeof(T)) >= stream_min_bytes();
  parallel_for(d.count, kGrain, ctx, [&](int64_t begin, int64_t end) {
    auto value = [&](int64_t j, int64_t valid) {
      PrefetchAhead(x + begin + j);
      if (dy) PrefetchAhead(dy + begin + j);
      const auto vx = LoadWideN(tag, x + begin + j, valid);
      return f(tag, dy ? LoadWideN(tag, dy + begin + j, valid) : hn::Zero(tag), vx);
    };
    if (stream) {
      WriteRun<true>(tag, out + begin, end - begin, value);
      hwy::FlushStream();
    } else {
      WriteRun<false>(tag, out + begin, end - begin, value);
    }
  });
}

// One row of a bias op: out = f(d, dy, x, b); acc (if given) += out, in lanes.
template <class D, class T, class Acc, class F>
void BiasRow(D d, const T* dy, const T* x, const T* b, T* out, int64_t cols, Acc* acc, F f) {
  using L = hn::TFromD<D>;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  auto accumulate = [&](hn::Vec<D> r, int64_t j, int64_t count) {
    if constexpr (std::is_same_v<Acc, L>) {
      if (count == n) return hn::StoreU(hn::Add(hn::LoadU(d, acc + j), r), d, acc + j);
    }
#if HWY_TARGET != HWY_SCALAR
    if constexpr (std::is_same_v<Acc, double> && std::is_same_v<L, float>) {
      if (count == n) {  // f32 lanes into f64 sums, a half at a time
        const hn::Half<D> dh;
        const hn::Rebind<double, decltype(dh)> dd;
        const int64_t h = n / 2;
        hn::StoreU(hn::Add(hn::LoadU(dd, acc + j), hn::PromoteTo(dd, hn::LowerHalf(dh, r))), dd, acc + j);
        hn::StoreU(hn::Add(hn::LoadU(dd, acc + j + h), hn::PromoteTo(dd, hn::UpperHalf(dh, r))), dd, acc + j + h);
        return;
      }
    }
#endif
    HWY_ALIGN L lanes[hn::MaxLanes(d)];  // tails
    hn::Store(r, d, lanes);
    for (int64_t k = 0; k < count; ++k) acc[j + k] += static_cast<Acc>(lanes[k]);
  };
  int64_t j = 0;
  for (; j + n <= cols; j += n) {
    PrefetchAhead(x + j);
    if (dy) PrefetchAhead(dy + j);
    const auto r = f(d, dy ? LoadWide(d, dy + j) : hn::Zero(d), LoadWide(d, x + j), LoadWide(d, b + j));
    StoreNarrow(d, r, out + j);
    if (acc) accumulate(r, j, n);
  }
  if (j == cols) return;
  const int64_t rest = cols - j;
  const auto r = f(d, dy ? LoadWideN(d, dy + j, rest) : hn::Zero(d), LoadWideN(d, x + j, rest), LoadWideN(d, b + j, rest));
  StoreNarrowN(d, r, out + j, rest);
  if (acc) accumulate(r, j, rest);
}

// Bias ops: dx (or y) row by row; dB from at most kBiasChunks fixed chunks of rows, each summed in
// row order, then the chunk partials summed in chunk order: the same bits for any thread count.
// Few chunks keep the partials (chunks x cols sums) small next to the tensor. dB sums run in f64
// for f32 storage whatever the lanes.
constexpr int64_t kBiasChunks = 64;
template <class T, bool kWide, class F>
Status BiasOp(const ActivationDesc& d, const Context& ctx, F f) {
  const LaneTag<T, kWide> tag;
  using A = std::conditional_t<std::is_same_v<T, float>, double, hn::TFromD<decltype(tag)>>;
  const T* dy = static_cast<const T*>(d.dy);
  const T* x = static_cast<const T*>(d.x);
  const T* b = static_cast<const T*>(d.bias);
  T* out = static_cast<T*>(d.out);
  T* db = static_cast<T*>(d.db);
  const int64_t cols = d.cols, rows = cols ? d.count / cols : 0;
  const int64_t chunk_rows = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
  auto row = [&](int64_t r, A* acc) {
    BiasRow(tag, dy ? dy + r * cols : nullptr, x + r * cols, b, out + r * cols, cols, acc, f);
  };
  if (!db) {
    parallel_for(rows, chunk_rows, ctx, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row(r, nullptr);
    });
    return {};
  }
  const int64_t sum_rows = std::max(chunk_rows, (rows + kBiasChunks - 1) / kBiasChunks);
  const int64_t chunks = chunk_count(rows, sum_rows);
  ::gradops::detail::Workspace ws;
  const auto bytes = sizeof(A) * static_cast<std::size_t>(std::max<int64_t>(chunks, 1) * cols);
  if (Status s = ws.allocate(ctx, Device::cpu(), bytes, op_schema(d.op).name); !s) return s;
  A* partial = ws.as<A>();
  if (chunks == 0) std::fill(partial, partial + cols, A(0));  // no rows: dB = 0
  parallel_for(chunks, 1, ctx, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      A* acc = partial + c * cols;
      std::fill(acc, acc + cols, A(0));
      const int64_t r1 = std::min(rows, (c + 1) * sum_rows);
      for (int64_t r = c * sum_rows; r < r1; ++r) row(r, acc);
    }
  });
  // Column blocks: partial rows added in chunk order into the first, a vector at a time.
  parallel_for(cols, 4096, ctx, [&](int64_t j0, int64_t j1) {
    const hn::ScalableTag<A> da;
    const int64_t n = static_cast<int64_t>(hn::Lanes(da));
    int64_t j = j0;
    for (; j + n <= j1; j += n) {
      auto s = hn::LoadU(da, partial + j);
      for (int64_t c = 1; c < chunks; ++c) s = hn::Add(s, hn::LoadU(da, partial + c * cols + j));
      hn::StoreU(s, da, partial + j);
    }
    for (; j < j1; ++j)
      for (int64_t c = 1; c < chunks; ++c) partial[j] += partial[c * cols + j];
    for (j = j0; j < j1; ++j) store(db, j, static_cast<std::conditional_t<sizeof(T) == 2, float, A>>(partial[j]));
  });
  return {};
}

// The elementwise form of a Kind that never has a bias.
template <class T, bool kWide, class F>
Status Plain(const ActivationDesc& d, const Context& ctx, F f) {
  Elementwise<T, kWide>(d, ctx, f);
  return {};
}
// The elementwise form, or (when the call has a bias) the row form at X + B.
template <class T, bool kWide, class F>
Status Apply(const ActivationDesc& d, const Context& ctx, F f) {
  if (d.bias) return BiasOp<T, kWide>(d, ctx, [f](auto t, auto g, auto x, auto b) { return f(t, g, hn::Add(x, b)); });
  return Plain<T, kWide>(d, ctx, f);
}

template <class T>
Status RunTyped(const ActivationDesc& d, const Context& ctx) {
  const auto alpha = d.alpha;
  using K = ::gradops::detail::ActivationKind;
  switch (d.kind) {
    case K::gelu_grad:
      // X + B as an exact two-term sum: the derivative's cancellation near x = -0.75 needs it.
      if (d.bias)
        return BiasOp<T, false>(d, ctx, [](auto t, auto g, auto x, auto b) {
          V<decltype(t)> hi, lo;
          TwoSum<decltype(t)>(x, b, hi, lo);
          return hn::Mul(g, GeluDerivativeSplit<true, T>(t, hi, lo));
        });
      return Plain<T, false>(d, ctx, [](auto t, auto g, auto x) {
        return hn::Mul(g, GeluDerivativeSplit<false, T>(t, x, hn::Zero(t)));
      });
    case K::fast_gelu_grad:
      return Apply<T, true>(d, ctx, [](auto t, auto g, auto x) { return hn::Mul(g, FastGeluDerivative<T>(t, x)); });
    case K::quick_gelu_grad:
      return Plain<T, true>(d, ctx, [alpha](auto t, auto g, auto x) {
        return hn::Mul(g, QuickGeluDerivative<T>(t, x, hn::Set(t, alpha)));
      });
    case K::relu_grad:
      return Plain<T, false>(d, ctx, [](auto t, auto g, auto x) { return hn::IfThenElseZero(hn::Gt(x, hn::Zero(t)), g); });
    case K::sigmoid_grad:
      return Plain<T, false>(d, ctx, [](auto t, auto g, auto y) {
        return hn::Mul(hn::Mul(g, y), hn::Sub(hn::Set(t, 1), y));
      });
    case K::tanh_grad:
      return Plain<T, false>(d, ctx, [](auto t, auto g, auto y) {
        const auto one = hn::Set(t, 1);
        return hn::Mul(g, hn::Mul(hn::Sub(one, y), hn::Add(one, y)));
      });
    case K::leaky_relu_grad:
      return Plain<T, false>(d, ctx, [alpha](auto t, auto g, auto y) {
        return hn::IfThenElse(hn::Gt(y, hn::Zero(t)), g, hn::Mul(hn::Set(t, alpha), g));
      });
    case K::gelu:
      if (d.bias)
        return BiasOp<T, false>(d, ctx, [](auto t, auto, auto x, auto b) {
          V<decltype(t)> hi, lo;
          TwoSum<decltype(t)>(x, b, hi, lo);
          return GeluSplit<true, T>(t, hi, lo);
        });
      return Plain<T, false>(d, ctx, [](auto t, auto, auto x) { return GeluSplit<false, T>(t, x, hn::Zero(t)); });
    case K::fast_gelu:
      return Apply<T, true>(d, ctx, [](auto t, auto, auto x) { return FastGelu<T>(t, x); });
    case K::quick_gelu:
      return Plain<T, true>(d, ctx, [alpha](auto t, auto, auto x) {
        return hn::Mul(x, Sigmoid<T>(t, hn::Mul(hn::Set(t, alpha), x)));
      });
    case K::relu:  // NaN propagates
      return Plain<T, false>(d, ctx, [](auto t, auto, auto x) {
        return hn::IfThenElse(hn::Lt(x, hn::Zero(t)), hn::Zero(t), hn::IfThenElse(hn::Eq(x, hn::Zero(t)), hn::Zero(t), x));
      });
    case K::sigmoid:
      return Plain<T, true>(d, ctx, [](auto t, auto, auto x) { return Sigmoid<T>(t, x); });
    case K::tanh:
      return Plain<T, true>(d, ctx, [](auto t, auto, auto x) { return VTanh(t, x); });
    case K::leaky_relu:
      return Plain<T, false>(d, ctx, [alpha](auto t, auto, auto x) {
        return hn::IfThenElse(hn::Gt(x, hn::Zero(t)), x, hn::Mul(hn::Set(t, alpha), x));
      });
  }
  return Status(StatusCode::internal, "activation kernel: unknown kind");
}

}  // namespace

Status Activation(const ActivationDesc& d, const Context& ctx) {
  return visit_dtype(d.dtype, [&](auto tag) { return RunTyped<decltype(tag)>(d, ctx); });
}

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradops::cpu {
HWY_EXPORT(Activation);
}  // namespace gradops::cpu

namespace gradops::detail {
Status cpu_activation(const ActivationDesc& d, const Context& ctx) {
  cpu::apply_simd_target_from_environment();
  return HWY_DYNAMIC_DISPATCH(cpu::Activation)(d, ctx);
}
}  // namespace gradops::detail
#endif
