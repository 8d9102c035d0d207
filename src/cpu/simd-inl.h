// Per-target SIMD helpers shared by the CPU kernels: loads that widen every storage type to its
// compute vector, stores that round once to the storage type (round to nearest even, NaN kept),
// and vector transcendentals (SLEEF on x86 targets, the C library lane by lane elsewhere).
//
// Included by each kernel file inside its HWY_NAMESPACE, once per target (Highway's
// foreach_target pattern), hence the toggling include guard.
#if defined(GRADOPS_CPU_SIMD_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef GRADOPS_CPU_SIMD_INL_H_
#undef GRADOPS_CPU_SIMD_INL_H_
#else
#define GRADOPS_CPU_SIMD_INL_H_
#endif

#include <cmath>
#include <cstring>
#include <type_traits>

#include "gradops/types.hpp"
#include "hwy/highway.h"

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
    const hn::Rebind<hwy::float16_t, D> d16;
    return hn::PromoteTo(d, hn::LoadU(d16, reinterpret_cast<const hwy::float16_t*>(p)));
  }
}

// ---- stores: round each lane once to T --------------------------------------------------------

template <class D, class T>
HWY_INLINE void StoreNarrow(D d, hn::Vec<D> v, T* HWY_RESTRICT p) {
  using L = hn::TFromD<D>;
  if constexpr (std::is_same_v<T, L>) {
    hn::StoreU(v, d, p);
  } else if constexpr (std::is_same_v<T, float>) {  // f64 lanes -> f32, round to nearest even
    hn::StoreU(hn::DemoteTo(hn::Rebind<float, D>(), v), hn::Rebind<float, D>(), p);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    // Highway's bf16 DemoteTo truncates; round to nearest even in integer arithmetic instead.
    const hn::RebindToUnsigned<D> du;
    const hn::RebindToSigned<D> di;
    const hn::Rebind<uint16_t, D> d16;
    const auto bits = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1));
    const auto rounded = hn::Add(hn::Add(bits, hn::Set(du, 0x7fff)), odd);
    const auto quiet_nan = hn::Or(bits, hn::Set(du, 0x00400000u));
    const auto out = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet_nan, rounded);
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, hn::ShiftRight<16>(out))), d16,
               reinterpret_cast<uint16_t*>(p));
  } else {
    static_assert(std::is_same_v<T, half>);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
    // F16C's conversion rounds to nearest even and keeps NaNs.
    const hn::Rebind<hwy::float16_t, D> d16;
    hn::StoreU(hn::DemoteTo(d16, v), d16, reinterpret_cast<hwy::float16_t*>(p));
#else
    // Highway's software conversion truncates: use the exact scalar one lane by lane.
    HWY_ALIGN float lanes[hn::MaxLanes(d)];
    hn::Store(v, d, lanes);
    for (size_t i = 0; i < hn::Lanes(d); ++i) p[i] = half(lanes[i]);
#endif
  }
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

GRADOPS_VMATH(Erfc, erfc, u15, std::erfc)
GRADOPS_VMATH(Exp, exp, u10, std::exp)
GRADOPS_VMATH(Tanh, tanh, u10, std::tanh)
GRADOPS_VMATH(Log, log, u10, std::log)

#undef GRADOPS_VMATH
#undef GRADOPS_SLEEF_F
#undef GRADOPS_SLEEF_D

// 1 / (1 + exp(-v)): accurate for every v (exp overflow gives exactly 0).
template <class D>
HWY_INLINE hn::Vec<D> Sigmoid(D d, hn::Vec<D> v) {
  const auto one = hn::Set(d, 1);
  return hn::Div(one, hn::Add(one, Exp(d, hn::Neg(v))));
}

// ---- elementwise driver ------------------------------------------------------------------------

// Calls f(i, n_valid) for each vector-sized block of [begin, end); the last block is processed
// through padded local copies by the caller-supplied tail handler, so every element goes through
// the same vector code (results do not depend on where thread partitions fall).
template <class D, class Body>
HWY_INLINE void ForEachVector(D d, int64_t begin, int64_t end, Body&& body) {
  const int64_t step = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = begin;
  for (; i + step <= end; i += step) body(i, step);
  if (i < end) body(i, end - i);
}

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
