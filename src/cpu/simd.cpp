#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/simd.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <unistd.h>

#include "cpu/simd-inl.h"
#include "cpu/simd.hpp"
#include "hwy/highway.h"
#include "hwy/targets.h"

HWY_BEFORE_NAMESPACE();
namespace gradops::cpu::HWY_NAMESPACE {

// n values from `in` through f(d, in_block, out_block) a whole vector at a time, the last block
// through zero-padded copies: the test entry points below see exactly the kernels' lane code.
template <class D, class TIn, class TOut, class F>
void ThroughVectors(D d, const TIn* in, TOut* out, int64_t n, F&& f) {
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t i = 0; i < n; i += lanes) {
    HWY_ALIGN TIn a[hn::MaxLanes(d)] = {};
    HWY_ALIGN TOut b[hn::MaxLanes(d)];
    const int64_t m = std::min(lanes, n - i);
    std::copy(in + i, in + i + m, a);
    f(d, a, b);
    std::copy(b, b + m, out + i);
  }
}

template <class T>
void EvalVectorMath(VectorMath f, const T* in, T* out, int64_t n) {
  ThroughVectors(hn::ScalableTag<T>(), in, out, n, [f](auto d, const T* a, T* b) {
    auto v = hn::Load(d, a);
    switch (f) {
      case VectorMath::erfc: v = VErfc(d, v); break;
      case VectorMath::exp: v = VExp(d, v); break;
      case VectorMath::exp_for_16bit: v = VExpFor16Bit(d, v); break;
      case VectorMath::tanh: v = VTanh(d, v); break;
      case VectorMath::log: v = VLog(d, v); break;
    }
    hn::Store(v, d, b);
  });
}
// The kernels' f32 -> 16-bit rounding (Narrow) and f16 -> f32 widening (LoadWide).
template <class T>
void Narrow16(const float* in, uint16_t* out, int64_t n) {
  ThroughVectors(hn::ScalableTag<float>(), in, out, n, [](auto d, const float* a, uint16_t* b) {
    hn::Store(Narrow<T>(d, hn::Load(d, a)), hn::Rebind<uint16_t, decltype(d)>(), b);
  });
}
void NarrowBf16(const float* in, uint16_t* out, int64_t n) { Narrow16<bfloat16>(in, out, n); }
void NarrowHalf(const float* in, uint16_t* out, int64_t n) { Narrow16<half>(in, out, n); }
void WidenHalf(const uint16_t* in, float* out, int64_t n) {
  ThroughVectors(hn::ScalableTag<float>(), in, out, n, [](auto d, const uint16_t* a, float* b) {
    hn::Store(LoadWide(d, reinterpret_cast<const half*>(a)), d, b);  // half is its 16 bits
  });
}

void EvalF32(VectorMath f, const float* in, float* out, int64_t n) { EvalVectorMath(f, in, out, n); }
void EvalF64(VectorMath f, const double* in, double* out, int64_t n) { EvalVectorMath(f, in, out, n); }

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradops::cpu {
HWY_EXPORT(EvalF32);
HWY_EXPORT(EvalF64);
HWY_EXPORT(NarrowBf16);
HWY_EXPORT(NarrowHalf);
HWY_EXPORT(WidenHalf);

void narrow_to_bf16(const float* in, uint16_t* out, int64_t n) {
  apply_simd_target_from_environment();
  HWY_DYNAMIC_DISPATCH(NarrowBf16)(in, out, n);
}
void narrow_to_half(const float* in, uint16_t* out, int64_t n) {
  apply_simd_target_from_environment();
  HWY_DYNAMIC_DISPATCH(NarrowHalf)(in, out, n);
}
void widen_half(const uint16_t* in, float* out, int64_t n) {
  apply_simd_target_from_environment();
  HWY_DYNAMIC_DISPATCH(WidenHalf)(in, out, n);
}

void eval_vector_math(VectorMath f, const float* in, float* out, int64_t n) {
  apply_simd_target_from_environment();
  HWY_DYNAMIC_DISPATCH(EvalF32)(f, in, out, n);
}
void eval_vector_math(VectorMath f, const double* in, double* out, int64_t n) {
  apply_simd_target_from_environment();
  HWY_DYNAMIC_DISPATCH(EvalF64)(f, in, out, n);
}

namespace {

struct Named {
  std::string_view name;
  int64_t target;
};
// HWY_TARGETS here is the set compiled into gradops (HWY_DISABLED_TARGETS applies). "portable" is
// Highway's emulated 128-bit target where it is compiled, else its scalar one: x86 builds with
// Highway 1.0.3 compile the scalar target as their fallback below SSE4, and not EMU128.
constexpr int64_t kPortable = (HWY_TARGETS & HWY_EMU128) ? HWY_EMU128 : HWY_SCALAR;
constexpr Named kTargets[] = {
    {"avx512", HWY_AVX3}, {"avx2", HWY_AVX2}, {"sse4", HWY_SSE4}, {"portable", kPortable}};

int64_t available() { return hwy::SupportedTargets() & HWY_TARGETS; }

}  // namespace

const char* simd_target_name() {
  apply_simd_target_from_environment();
  const int64_t t = available();
  if (!t) return "none";
  const int64_t best = t & -t;
  return best == HWY_AVX3 && native_bf16() ? "AVX3+BF16" : hwy::TargetName(best);
}

bool force_simd_target(std::string_view name) {
  for (const Named& n : kTargets) {
    if (n.name != name) continue;
    if (!(n.target & HWY_TARGETS)) return false;
    hwy::SetSupportedTargetsForTest(0);  // back to what the CPU reports
    if (!(hwy::SupportedTargets() & n.target)) return false;
    // Keep `n.target` and everything worse (larger bits); drop the better ones.
    hwy::SetSupportedTargetsForTest(hwy::SupportedTargets() & ~(n.target - 1));
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    return true;
  }
  return false;
}

int supported_simd_targets(const char** names, int capacity) {
  int n = 0;
  hwy::SetSupportedTargetsForTest(0);
  const int64_t all = hwy::SupportedTargets() & HWY_TARGETS;
  for (const Named& t : kTargets)
    if ((all & t.target) && n < capacity) names[n++] = t.name.data();
  return n;
}

namespace {
int64_t default_stream_min_bytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return llc > 0 ? static_cast<int64_t>(llc) / 8 : int64_t{4} << 20;
}
std::atomic<int64_t> g_stream_min_bytes{-1};
}  // namespace

int64_t l2_reuse_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 >= (int64_t{64} << 10) ? static_cast<int64_t>(l2) / 4 * 3 : int64_t{512} << 10;
  }();
  return bytes;
}

int64_t llc_bytes() {
  static const int64_t bytes = [] {
    int64_t best = 0;  // the size of the highest level listed
    int best_level = 0;
    for (int i = 0; i < 8; ++i) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
      std::ifstream level_file(dir + "level"), size_file(dir + "size");
      int level = 0;
      int64_t size = 0;
      std::string unit;  // the kernel writes "32768K"
      if (!(level_file >> level) || !(size_file >> size) || level <= best_level) continue;
      size_file >> unit;
      best_level = level;
      best = size << (unit == "M" ? 20 : unit == "K" ? 10 : 0);
    }
    if (best >= (int64_t{1} << 20)) return best;
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return l3 >= (1L << 20) ? static_cast<int64_t>(l3) : int64_t{32} << 20;
  }();
  return bytes;
}

int64_t stream_min_bytes() {
  static const int64_t fallback = default_stream_min_bytes();
  const int64_t set = g_stream_min_bytes.load(std::memory_order_relaxed);
  return set >= 0 ? set : fallback;
}

void set_stream_min_bytes(int64_t bytes) { g_stream_min_bytes.store(bytes < 0 ? -1 : bytes, std::memory_order_relaxed); }

namespace {
bool cpu_has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}
const bool kCpuBf16 = cpu_has_avx512_bf16();
}  // namespace

std::atomic<bool> g_native_bf16{kCpuBf16};

bool native_bf16() { return g_native_bf16.load(std::memory_order_relaxed); }

bool set_native_bf16(bool on) {
  g_native_bf16.store(on && kCpuBf16, std::memory_order_relaxed);
  return native_bf16();
}

void apply_simd_target_from_environment() {
  static const bool applied = [] {
    const char* want = std::getenv("GRADOPS_CPU_TARGET");
    if (want && *want && !force_simd_target(want))
      std::fprintf(stderr, "gradops: GRADOPS_CPU_TARGET=%s is not available on this CPU; ignored\n", want);
    return true;
  }();
  (void)applied;
}

}  // namespace gradops::cpu

// The CPU rows' `target` in the implementation lists (declared with them in ops/dispatch.hpp, so
// that the op layer names the target without including the backend).
namespace gradops::detail {
const char* cpu_simd_target() { return cpu::simd_target_name(); }
}  // namespace gradops::detail
#endif  // HWY_ONCE

