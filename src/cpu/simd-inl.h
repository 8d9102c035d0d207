// Per-target SIMD helpers shared by the CPU kernels: loads that widen every storage type to its
// compute vector, stores that round once to the storage type (round to nearest even, NaN kept),
// and vector transcendentals (exp inline, in f32 lanes and, on AVX2 and AVX-512, f64; SLEEF on x86
// targets and the C library lane by lane elsewhere for the rest).
//
// Included by each kernel file inside its HWY_NAMESPACE, once per target (Highway's
// foreach_target pattern), hence the toggling include guard.
#if defined(GRADOPS_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GRADOPS_CPU_SIMD_INL_H_
#undef GRADOPS_CPU_SIMD_INL_H_
#else
#define GRADOPS_CPU_SIMD_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cpu/simd.hpp"
#include "gradops/types.hpp"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
// After highway.h: per-target like this file.
#include "hwy/contrib/math/math-inl.h"

#if HWY_ARCH_X86
#include "cpu/sleef_x86.hpp"
#endif

HWY_BEFORE_NAMESPACE();
namespace gradops::cpu::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// The compute vector tag for storage type T: f32 lanes for f32/f16/bf16, f64 lanes for f64.
template <class T>
using ComputeTag = std::conditional_t<std::is_same_v<T, double>, hn::ScalableTag<double>, hn::ScalableTag<float>>;

// ---- loads: Lanes(d) elements of T from p (any alignment), widened to d's lane type ----------

template <class D, class T>
HWY_INLINE hn::Vec<D> LoadWide(D d, const T* HWY_RESTRICT p) {
  using L = hn::TFromD<D>;
  if constexpr (std::is_same_v<T, L>) {
    return hn::LoadU(d, p);
  } else if constexpr (std::is_same_v<T, float>) {  // f32 storage widened to f64 lanes
    return hn::PromoteTo(d, hn::LoadU(hn::Rebind<float, D>(), p));
  } else if constexpr (std::is_same_v<T, bfloat16>) {  // bf16 -> f32: the bits, shifted up
    static_assert(std::is_same_v<L, float>);
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToUnsigned<D> d32;
    const auto bits = hn::PromoteTo(d32, hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p)));
    return hn::BitCast(d, hn::ShiftLeft<16>(bits));
  } else {  // half -> f32 (exact; F16C where the target has it)
    static_assert(std::is_same_v<T, half> && std::is_same_v<L, float>);
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX2
    // No F16C: Highway 1.0.3's software conversion makes inf and NaN finite (inf read as 65536).
    // Exponent and mantissa moved into f32's places and scaled by 2^(127 - 15) are exact for
    // normal and subnormal halves; the top exponent maps to f32's, keeping the NaN payload.
    const hn::Rebind<uint16_t, D> d16;
    const hn::RebindToSigned<D> di;
    const auto h = hn::PromoteTo(di, hn::BitCast(hn::Rebind<int16_t, D>(), hn::LoadU(d16, reinterpret_cast<const uint16_t*>(p))));
    const auto magnitude = hn::And(h, hn::Set(di, 0x7fff));
    const auto placed = hn::ShiftLeft<13>(magnitude);
    const auto finite = hn::Mul(hn::BitCast(d, placed), hn::Set(d, 0x1p112f));
    const auto special = hn::BitCast(d, hn::Or(placed, hn::Set(di, 0x7f800000)));
    const auto sign = hn::BitCast(d, hn::ShiftLeft<16>(hn::And(h, hn::Set(di, 0x8000))));
    return hn::Or(sign, hn::IfThenElse(hn::RebindMask(d, hn::Gt(magnitude, hn::Set(di, 0x7bff))), special, finite));
#else
    const hn::Rebind<hwy::float16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p)));
#endif
  }
}

// ---- stores: round each lane once to T --------------------------------------------------------

namespace simd_detail {
// The lane type a vector of T is stored through (T's bits for the 16-bit types).
template <class T>
using StorageLane = std::conditional_t<sizeof(T) == 2, uint16_t, T>;
}  // namespace simd_detail

// v rounded once to T, as a vector of T's storage lanes (Rebind<StorageLane<T>, D>).
template <class T, class D>
HWY_INLINE auto Narrow(D d, hn::Vec<D> v) {
  using L = hn::TFromD<D>;
  const hn::Rebind<simd_detail::StorageLane<T>, D> dn;
  if constexpr (std::is_same_v<T, L>) {
    return v;
  } else if constexpr (std::is_same_v<T, float>) {  // f64 lanes -> f32, round to nearest even
    return hn::DemoteTo(dn, v);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    // AVX512-BF16's conversion (Highway 1.0.3 does not emit it; the assembler does, whatever the
    // compiler's target flags) unless a lane is subnormal, which it would flush to zero.
    if constexpr (hn::MaxLanes(d) == 16) {
      if (g_native_bf16.load(std::memory_order_relaxed) && !_mm512_fpclass_ps_mask(v.raw, 0x20)) {
        __m256i r;
        asm("vcvtneps2bf16 %1, %0" : "=v"(r) : "v"(v.raw));
        return hn::Vec<decltype(dn)>{r};
      }
    }
#endif
    // Highway's bf16 DemoteTo truncates; round to nearest even in integer arithmetic instead.
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const auto bits = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1));
    const auto rounded = hn::Add(hn::Add(bits, hn::Set(du, 0x7fff)), odd);
    const auto quiet_nan = hn::Or(bits, hn::Set(du, 0x00400000u));
    const auto out = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
    return hn::DemoteTo(dn, hn::BitCast(di, hn::ShiftRight<16>(out)));
  } else {
    static_assert(std::is_same_v<T, half>);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    // F16C's conversion rounds to nearest even and keeps NaNs.
    return hn::BitCast(dn, hn::DemoteTo(hn::Rebind<hwy::float16_t, D>(), v));
#else
    // Highway's software conversion truncates: use the exact scalar one lane by lane.
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    HWY_ALIGN uint16_t bits[hn::MaxLanes(dn)];
    hn::Store(v, d, lanes);
    for (size_t i = 0; i < hn::Lanes(d); ++i) {
      const half h(lanes[i]);
      std::memcpy(&bits[i], &h, sizeof(h));
    }
    return hn::Load(dn, bits);
#endif
  }
}

// Stores v rounded once to T at p[0, Lanes(d)) (any alignment).
template <class D, class T>
HWY_INLINE void StoreNarrow(D d, hn::Vec<D> v, T* HWY_RESTRICT p) {
  const hn::Rebind<simd_detail::StorageLane<T>, D> dn;
  hn::StoreU(Narrow<T>(d, v), dn, reinterpret_cast<simd_detail::StorageLane<T>*>(p));
}

// How many vectors of d StreamNarrow takes: two where T is narrower than d's lanes, so that every
// non-temporal store writes a whole register (a half-register stream leaves write-combining
// buffers partly filled, and costs most of what streaming saves).
template <class D, class T>
constexpr int64_t kStreamVectors = sizeof(T) < sizeof(hn::TFromD<D>) ? 2 : 1;

// StoreNarrow of lo then hi (or of lo alone when kStreamVectors is 1) with a non-temporal store
// that bypasses the caches; p must be aligned to the bytes written. Call hwy::FlushStream()
// before the data is handed to another thread.
template <class D, class T>
HWY_INLINE void StreamNarrow(D d, hn::Vec<D> lo, hn::Vec<D> hi, T* HWY_RESTRICT p) {
  using S = simd_detail::StorageLane<T>;
  const hn::Rebind<S, D> dn;
  auto* out = reinterpret_cast<S*>(p);
  if constexpr (kStreamVectors<D, T> == 1) {
    (void)hi;
    if constexpr (hn::MaxLanes(dn) * sizeof(S) >= 16) hn::Stream(Narrow<T>(d, lo), dn, out);
    else hn::StoreU(Narrow<T>(d, lo), dn, out);  // Highway streams whole 16-byte registers only
  } else {
#if HWY_TARGET == HWY_SCALAR  // one lane: nothing to combine, nothing worth streaming
    StoreNarrow(d, lo, p);
    StoreNarrow(d, hi, p + 1);
#else
    const hn::Twice<decltype(dn)> d2;
    const auto both = hn::Combine(d2, Narrow<T>(d, hi), Narrow<T>(d, lo));
    if constexpr (hn::MaxLanes(d2) * sizeof(S) >= 16) hn::Stream(both, d2, out);
    else hn::StoreU(both, d2, out);
#endif
  }
}

// ---- software prefetch for inputs streamed from memory ------------------------------------------

// How far ahead of its reads a kernel streaming an input from memory asks for it. The hardware
// prefetchers alone leave a fifth to a third of the bandwidth unused with two or three concurrent
// streams; on the 2-core reference machine bf16 ReluGrad went from 0.70 of memcpy to 0.86 (256 B
// ahead), 0.94 (1 KiB), 1.03 (4 KiB) and 0.94 (16 KiB).
constexpr int64_t kPrefetchBytes = 4096;

// Asks for the line kPrefetchBytes past p; a prefetch past the end of a buffer is harmless.
template <class T>
HWY_INLINE void PrefetchAhead(const T* p) {
  hwy::Prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes);
}

// ---- partial vectors: the first `valid` (1 .. Lanes(d)) elements ---------------------------------

// AVX-512's masked moves leave the memory of the lanes they skip untouched (no fault, no write) and
// cost about what a whole vector does, where memcpy of a variable length is a call. A run that is
// not vector-aligned takes a partial vector at each end: a 128-column f32 SoftmaxGrad_13 on a base
// 16 bytes past a line went from 0.50 to 0.58 of copy. Other targets' masked loads read whole
// vectors, so they keep the copies.
constexpr bool kMaskedPartials = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3;

// LoadWide of p[0, valid); the other lanes are zero. Never reads past p + valid.
template <class D, class T>
HWY_INLINE hn::Vec<D> LoadWideN(D d, const T* HWY_RESTRICT p, int64_t valid) {
  if (valid == static_cast<int64_t>(hn::Lanes(d))) return LoadWide(d, p);
  if constexpr (kMaskedPartials) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(T) == 0) {
      using S = simd_detail::StorageLane<T>;
      const hn::Rebind<S, D> dn;
      HWY_ALIGN S lanes[hn::MaxLanes(dn)];
      hn::Store(hn::MaskedLoad(hn::FirstN(dn, static_cast<size_t>(valid)), dn, reinterpret_cast<const S*>(p)), dn, lanes);
      return LoadWide(d, reinterpret_cast<const T*>(lanes));
    }
  }
  T pad[hn::MaxLanes(d)] = {};
  // p may be unaligned for T. The clamp changes nothing (valid <= Lanes) but lets GCC see the bound.
  std::memcpy(pad, p, std::min(static_cast<std::size_t>(valid) * sizeof(T), sizeof(pad)));
  return LoadWide(d, pad);
}

// StoreNarrow of the first `valid` lanes to p[0, valid). Never writes past p + valid.
template <class D, class T>
HWY_INLINE void StoreNarrowN(D d, hn::Vec<D> v, T* HWY_RESTRICT p, int64_t valid) {
  if (valid == static_cast<int64_t>(hn::Lanes(d))) return StoreNarrow(d, v, p);
  if constexpr (kMaskedPartials) {
    if (reinterpret_cast<uintptr_t>(p) % sizeof(T) == 0) {
      using S = simd_detail::StorageLane<T>;
      const hn::Rebind<S, D> dn;
      return hn::BlendedStore(Narrow<T>(d, v), hn::FirstN(dn, static_cast<size_t>(valid)), dn, reinterpret_cast<S*>(p));
    }
  }
  T pad[hn::MaxLanes(d)];
  StoreNarrow(d, v, pad);
  std::memcpy(p, pad, std::min(static_cast<std::size_t>(valid) * sizeof(T), sizeof(pad)));  // as above
}

// ---- vector math ------------------------------------------------------------------------------

namespace simd_detail {
// Applies a scalar function lane by lane (targets without a SLEEF variant).
template <class D, class F>
HWY_INLINE hn::Vec<D> PerLane(D d, hn::Vec<D> v, F f) {
  using L = hn::TFromD<D>;
  HWY_ALIGN L lanes[hn::MaxLanes(d)];
  hn::Store(v, d, lanes);
  for (size_t i = 0; i < hn::Lanes(d); ++i) lanes[i] = f(lanes[i]);
  return hn::Load(d, lanes);
}
}  // namespace simd_detail

// SLEEF's u10/u15 functions (1.0 to 1.5 ulp) on full x86 vectors; the C library elsewhere.
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL)
#define GRADOPS_SLEEF_F(name, u) Sleef_##name##f16_##u##avx512f
#define GRADOPS_SLEEF_D(name, u) Sleef_##name##d8_##u##avx512f
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
#define GRADOPS_SLEEF_F(name, u) Sleef_##name##f8_##u##avx2
#define GRADOPS_SLEEF_D(name, u) Sleef_##name##d4_##u##avx2
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_SSE4
#define GRADOPS_SLEEF_F(name, u) Sleef_##name##f4_##u##sse4
#define GRADOPS_SLEEF_D(name, u) Sleef_##name##d2_##u##sse4
#endif

#if defined(GRADOPS_SLEEF_F)
#define GRADOPS_VMATH(Name, sleef_name, ulp, libm)                                        \
  template <class D>                                                                      \
  HWY_INLINE hn::Vec<D> Name(D d, hn::Vec<D> v) {                                         \
    if constexpr (hn::MaxLanes(d) * sizeof(hn::TFromD<D>) != HWY_MAX_BYTES) {             \
      return simd_detail::PerLane(d, v, [](auto x) { return decltype(x)(libm(x)); });          \
    } else if constexpr (sizeof(hn::TFromD<D>) == 4) {                                    \
      return hn::Vec<D>{GRADOPS_SLEEF_F(sleef_name, ulp)(v.raw)};                         \
    } else {                                                                              \
      return hn::Vec<D>{GRADOPS_SLEEF_D(sleef_name, ulp)(v.raw)};                         \
    }                                                                                     \
  }
#else
#define GRADOPS_VMATH(Name, sleef_name, ulp, libm)                               \
  template <class D>                                                             \
  HWY_INLINE hn::Vec<D> Name(D d, hn::Vec<D> v) {                                \
    return simd_detail::PerLane(d, v, [](auto x) { return decltype(x)(libm(x)); });   \
  }
#endif

GRADOPS_VMATH(VErfc, erfc, u15, std::erfc)
GRADOPS_VMATH(VExpSleef, exp, u10, std::exp)
GRADOPS_VMATH(VTanh, tanh, u10, std::tanh)
GRADOPS_VMATH(VLog, log, u10, std::log)

#undef GRADOPS_VMATH
#undef GRADOPS_SLEEF_F
#undef GRADOPS_SLEEF_D

// exp, inlined where it can be: SLEEF's is a call into a shared library around which the caller
// spills every live vector register (all are caller-saved), which made exp-heavy row kernels
// compute-bound. f64 lanes on AVX2 and AVX-512, f32 lanes on AVX-512: e^r (|r| <= ln2/2, two-part
// ln2 reduction, Highway's polynomial of degree 7 in f32 and 12 in f64, 1 ulp) scaled by 2^n. On
// AVX-512 with scalef, which also gives overflow, underflow and subnormal results their IEEE values
// (about 16 instructions a vector in f32, against about 29 for Highway's Exp, whose two-step
// scaling needs integer work and guards); f64 on AVX2 by two powers of two built from n's bits.
// Other f32 lanes: Highway's Exp, which is defined up to 104, where the result has long
// overflowed, and maps NaN to 0: clamp, and keep NaN. Other f64 lanes: SLEEF's (SSE4), or the C
// library's.
namespace simd_detail {
// exp's range reduction: n = round(x / ln2) and r = x - n ln2, ln2 in two parts (hi + lo), x
// clamped to +-limit first, beyond which the result is inf or 0 either way; the clamp keeps n and r
// finite (+-inf would make inf - inf). The constant goes first: x86 min/max return their second
// operand when either is NaN, so NaN passes through to r.
template <class D, class T = hn::TFromD<D>>
HWY_INLINE void ExpReduce(D d, hn::Vec<D> v, T limit, T ln2_hi, T ln2_lo, hn::Vec<D>& n, hn::Vec<D>& r) {
  const auto x = hn::Max(hn::Set(d, -limit), hn::Min(hn::Set(d, limit), v));
  n = hn::Round(hn::Mul(x, hn::Set(d, T(1.442695040888963407359924681))));
  r = hn::MulAdd(n, hn::Set(d, -ln2_hi), x);
  r = hn::MulAdd(n, hn::Set(d, -ln2_lo), r);
}
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// e 2^floor(n) on a full AVX-512 vector, with IEEE overflow, underflow and subnormals. The
// zero-masking form: GCC 12's plain _mm512_scalef_* pass an undefined vector to the builtin and
// warn about it wherever they are inlined.
template <class V>
HWY_INLINE V Scalef(V e, V n) {
  if constexpr (sizeof(hn::TFromV<V>) == 4) {
    return V{_mm512_maskz_scalef_ps(static_cast<__mmask16>(0xFFFF), e.raw, n.raw)};
  } else {
    return V{_mm512_maskz_scalef_pd(static_cast<__mmask8>(0xFF), e.raw, n.raw)};
  }
}
#endif
}  // namespace simd_detail

template <class D>
HWY_INLINE hn::Vec<D> VExp(D d, hn::Vec<D> v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  if constexpr (sizeof(hn::TFromD<D>) == 8) {
    // The result overflows past 709.8 and is 0 below -745.2.
    hn::Vec<D> n, r;
    simd_detail::ExpReduce(d, v, 1100.0, 0.6931471805596629565116018, 0.28235290563031577122588448175e-12, n, r);
    // Highway's f64 coefficients (about 1/k! for k = 2 to 12), in Estrin's scheme as Highway's Exp.
    const auto r2 = hn::Mul(r, r), r4 = hn::Mul(r2, r2), r8 = hn::Mul(r4, r4);
    const auto c = [&](double k) { return hn::Set(d, k); };
    const auto p01 = hn::MulAdd(c(+0.166666666666666851703837), r, c(+0.5));
    const auto p23 = hn::MulAdd(c(+0.00833333333331652721664984), r, c(+0.0416666666666665047591422));
    const auto p45 = hn::MulAdd(c(+0.000198412698960509205564975), r, c(+0.00138888888889774492207962));
    const auto p67 = hn::MulAdd(c(+2.75572362911928827629423e-6), r, c(+2.4801587159235472998791e-5));
    const auto p89 = hn::MulAdd(c(+2.51112930892876518610661e-8), r, c(+2.75573911234900471893338e-7));
    const auto p03 = hn::MulAdd(p23, r2, p01);
    const auto p47 = hn::MulAdd(p67, r2, p45);
    const auto p8a = hn::MulAdd(c(+2.08860621107283687536341e-9), r2, p89);
    const auto p = hn::MulAdd(r8, p8a, hn::MulAdd(r4, p47, p03));
    const auto e = hn::Add(hn::MulAdd(p, r2, r), hn::Set(d, 1.0));
#if HWY_TARGET <= HWY_AVX3
    if constexpr (hn::MaxLanes(d) == 8) return simd_detail::Scalef(e, n);
#endif
    // 2^n as 2^h 2^(n - h), h = n / 2: both factors are normal for |n| <= 1587, so a result that
    // overflows does so in the second product, and a subnormal one is rounded once, there. A NaN x
    // makes e NaN, whatever n's bits give.
    const hn::Rebind<int32_t, D> di32;
    const hn::RebindToSigned<D> di64;
    const auto q = hn::DemoteTo(di32, n);
    const auto h = hn::ShiftRight<1>(q);
    const auto pow2 = [&](auto k) {
      return hn::BitCast(d, hn::ShiftLeft<52>(hn::PromoteTo(di64, hn::Add(k, hn::Set(di32, 1023)))));
    };
    return hn::Mul(hn::Mul(e, pow2(h)), pow2(hn::Sub(q, h)));
  }
#endif
  if constexpr (sizeof(hn::TFromD<D>) == 4) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
    if constexpr (hn::MaxLanes(d) == 16) {
      hn::Vec<D> n, r;
      simd_detail::ExpReduce(d, v, 104.0f, 0.693145751953125f, 1.428606765330187045e-6f, n, r);
      auto p = hn::Set(d, 0.000198527617612853646278381f);
      p = hn::MulAdd(p, r, hn::Set(d, 0.00139304355252534151077271f));
      p = hn::MulAdd(p, r, hn::Set(d, 0.00833336077630519866943359f));
      p = hn::MulAdd(p, r, hn::Set(d, 0.0416664853692054748535156f));
      p = hn::MulAdd(p, r, hn::Set(d, 0.166666671633720397949219f));
      p = hn::MulAdd(p, r, hn::Set(d, 0.5f));
      const auto e = hn::Add(hn::MulAdd(p, hn::Mul(r, r), r), hn::Set(d, 1.0f));
      return simd_detail::Scalef(e, n);
    }
#endif
    const auto limit = hn::Set(d, 104.0f);
    const auto e = hn::Exp(d, hn::IfThenElse(hn::Gt(v, limit), limit, v));
    return hn::IfThenElse(hn::IsNaN(v), v, e);
  } else {
    return VExpSleef(d, v);
  }
}

// exp for results stored in 16 bits (bf16, f16), whose rounding (2^-8 or 2^-11 relative) swamps a
// few f32 ulp; it made the softmax family's 16-bit kernels bound by the core. f32 lanes on
// AVX-512: 2^t with t = x log2(e) rounded once, f = t - floor(t) from vreduceps (0 for +-inf, so
// no clamp), 2^f on [0, 1] by a degree-6 polynomial (0.03 ulp), and scalef by floor(t):
// 9 instructions against VExp's 15. Within 2 + 1.25 |x| ulp of f32: t's rounding and log2(e)'s in
// f32 carry up to 1.25 |x| into the result (the profile of the CUDA kernels' ex2.approx form), and
// f's rounding with the polynomial's last up to 2 where the result is just below 1 (measured 1.5).
// Elsewhere VExp.
template <class D>
HWY_INLINE hn::Vec<D> VExpFor16Bit(D d, hn::Vec<D> v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  if constexpr (sizeof(hn::TFromD<D>) == 4 && hn::MaxLanes(d) == 16) {
    const auto t = hn::Mul(v, hn::Set(d, 1.44269504088896340736f));
    const hn::Vec<D> f{_mm512_reduce_ps(t.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
    // A near-minimax fit of 2^f for relative error on [0, 1], its constant term 1.
    auto p = hn::Set(d, 0.00021702254889532924f);
    p = hn::MulAdd(p, f, hn::Set(d, 0.0012439688434824347f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.009678840637207031f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.055483341217041016f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.24022983014583588f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.6931470036506653f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.0f));
    return simd_detail::Scalef(p, t);
  }
#endif
  return VExp(d, v);
}

// exp(v) for a result stored as TOut: the shorter form where TOut is 16-bit.
template <class TOut, class D>
HWY_INLINE hn::Vec<D> VExpFor(D d, hn::Vec<D> v) {
  if constexpr (sizeof(TOut) == 2) return VExpFor16Bit(d, v);
  else return VExp(d, v);
}

// 1 / (1 + exp(-v)) for a result stored as TOut: accurate for every v (exp overflow gives exactly 0).
template <class TOut, class D>
HWY_INLINE hn::Vec<D> Sigmoid(D d, hn::Vec<D> v) {
  const auto one = hn::Set(d, 1);
  return hn::Div(one, hn::Add(one, VExpFor<TOut>(d, hn::Neg(v))));
}

// j mod w for 32-bit j by two multiplications instead of a division (Lemire, Kaser and Kurz,
// "Faster remainder by direct computation", 2019): for passes that take one per vector.
__extension__ using Uint128 = unsigned __int128;  // GCC and Clang; __extension__ keeps -Wpedantic quiet
struct FastMod {
  uint64_t m;
  uint32_t w;
  explicit FastMod(uint32_t w_) : m(~uint64_t{0} / w_ + 1), w(w_) {}
  uint32_t operator()(uint32_t j) const { return static_cast<uint32_t>((Uint128{m * j} * w) >> 64); }
  uint32_t quotient(uint32_t j) const { return static_cast<uint32_t>((Uint128{m} * j) >> 64); }  // j / w
};

// The head of a run written with non-temporal stores: out[0, head) = value(j, valid) through
// normal stores, a partial vector at a time, where out + head is the first boundary of a stream
// store (kStreamVectors vectors of T); nothing where the caller wrote the head (`written`). Sets
// w = head and returns true; returns false, writing nothing, where out is not element-aligned
// (then nothing of the run streams).
template <class D, class T, class Value>
HWY_INLINE bool WriteStreamHead(D d, T* HWY_RESTRICT out, int64_t n_out, const Value& value, int64_t& w,
                                bool written = false) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto addr = reinterpret_cast<uintptr_t>(out);
  const uintptr_t bytes = static_cast<uintptr_t>(L * kStreamVectors<D, T>) * sizeof(T);
  if (n_out <= 0 || addr % sizeof(T) != 0) return false;
  const int64_t head = std::min(n_out, static_cast<int64_t>((bytes - addr % bytes) % bytes / sizeof(T)));
  for (w = written ? head : 0; w < head; w += std::min(L, head - w)) {
    const int64_t valid = std::min(L, head - w);
    StoreNarrowN(d, value(w, valid), out + w, valid);
  }
  return true;
}

// Up to `count` whole vectors of a run at w (while w + L <= n_out), advancing w: kStreamVectors at
// a time (two where T is narrower than the lanes, so each stream store is a whole vector) through
// non-temporal stores where the run streams (after WriteStreamHead), else one at a time.
template <bool kStream, class D, class T, class Value>
HWY_INLINE void WriteWhole(D d, T* HWY_RESTRICT out, int64_t n_out, const Value& value, bool stream, int64_t& w,
                           int64_t count) {
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  if (kStream && stream) {
    constexpr int64_t kV = kStreamVectors<D, T>;
    for (; count >= kV && w + kV * L <= n_out; count -= kV, w += kV * L) {
      const auto lo = value(w, L);
      const auto hi = kV == 2 ? value(w + L, L) : hn::Zero(d);
      StreamNarrow(d, lo, hi, out + w);
    }
    if (count > 0 && w + L <= n_out) StoreNarrow(d, value(w, L), out + w), --count, w += L;
  } else {
    for (; count > 0 && w + L <= n_out; --count, w += L) StoreNarrow(d, value(w, L), out + w);
  }
}

// ---- reductions in a fixed order, and writing contiguous runs ----------------------------------
// The order of every reduction below depends only on n and the target's lane count, never on
// data, alignment, threads or what is written alongside: the same inputs give the same bits on a
// given target.

// Writes out[0, n_out) while folding [0, n) into one vector, in one loop, so that a reduction
// streaming in from memory overlaps a write pass over data already in cache (a row's write pass
// with the next row's reduction): every stream then stays busy, the way a memcpy keeps them.
//
// The fold: vector block b (elements b L .. b L + L - 1, L = Lanes(d)) goes into accumulator
// b mod 4 as acc = step(acc, b L, valid), `valid` being L except for a last, partial block (step
// must load it with LoadWideN and keep its lanes past `valid` from counting); the accumulators,
// each started at `init`, end as combine(combine(a0, a1), combine(a2, a3)). Four independent
// chains keep the adder busy while loads are in flight.
//
// The write: out[j, j + valid) = value(j, valid), a vector (valid < L only for partial blocks,
// whose inputs value() must load with LoadWideN). With kStream the whole vectors go out through
// non-temporal stores, after a head of partial blocks that brings out + j to a stream store's
// boundary (when out is element-aligned at all; `head_written`: the caller wrote that head). An
// element's value is the same whichever block it falls in, since value() works lane by lane.
template <bool kStream, class D, class Step, class Combine, class T, class Value>
HWY_NOINLINE HWY_FLATTEN hn::Vec<D> FoldBlocksWriting(D d, int64_t n, hn::Vec<D> init, Step step_in, Combine combine,
                                                      T* HWY_RESTRICT out, int64_t n_out, Value value_in,
                                                      bool head_written = false) {
  // Local copies: the stores below may alias anything, and would otherwise make every captured
  // pointer a reload. (Out of line and flattened: one call per run, everything inside inlined.)
  const Step step = step_in;
  const Value value = value_in;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t w = 0;  // the next element to write
  bool stream = false;
  if constexpr (kStream) stream = WriteStreamHead(d, out, n_out, value, w, head_written);
  auto write_whole = [&](int64_t count) HWY_ATTR { WriteWhole<kStream>(d, out, n_out, value, stream, w, count); };
  auto a0 = init, a1 = init, a2 = init, a3 = init;
  int64_t j = 0;
  for (; j + 4 * L <= n; j += 4 * L) {
    a0 = step(a0, j, L);
    a1 = step(a1, j + L, L);
    a2 = step(a2, j + 2 * L, L);
    a3 = step(a3, j + 3 * L, L);
    write_whole(4);
  }
  if (j < n) a0 = step(a0, j, std::min(L, n - j)), j += L;
  if (j < n) a1 = step(a1, j, std::min(L, n - j)), j += L;
  if (j < n) a2 = step(a2, j, std::min(L, n - j)), j += L;
  if (j < n) a3 = step(a3, j, std::min(L, n - j));
  write_whole(n_out);
  if (w < n_out) StoreNarrowN(d, value(w, n_out - w), out + w, n_out - w);
  return combine(combine(a0, a1), combine(a2, a3));
}

// FoldBlocksWriting's fold alone.
template <class D, class Step, class Combine>
HWY_INLINE hn::Vec<D> FoldBlocks(D d, int64_t n, hn::Vec<D> init, Step&& step, Combine&& combine) {
  return FoldBlocksWriting<false>(d, n, init, step, combine, static_cast<float*>(nullptr), 0,
                                  [&](int64_t, int64_t) { return init; });
}

// FoldBlocksWriting's write alone.
template <bool kStream, class D, class T, class Value>
HWY_INLINE void WriteRun(D d, T* HWY_RESTRICT out, int64_t n, Value&& value) {
  FoldBlocksWriting<kStream>(d, 0, hn::Zero(d), [](hn::Vec<D> a, int64_t, int64_t) { return a; },
                             [](hn::Vec<D> a, hn::Vec<D>) { return a; }, out, n, value);
}

// The lanes of v reduced pairwise: lane l takes op(lane l, lane l + w) for w = L/2, L/4, .., 1.
template <class D, class Op>
HWY_INLINE hn::TFromD<D> ReduceLanes(D d, hn::Vec<D> v, Op&& op) {
  HWY_ALIGN hn::TFromD<D> lanes[hn::MaxLanes(d)];
  hn::Store(v, d, lanes);
  for (size_t w = hn::Lanes(d) / 2; w > 0; w /= 2)
    for (size_t l = 0; l < w; ++l) lanes[l] = op(lanes[l], lanes[l + w]);
  return lanes[0];
}

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
