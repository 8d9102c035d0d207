// What a one-pass bf16 LogSoftmaxGrad-like write costs from memory: out = dy - exp(y) s, y and dy
// read, out written, with and without the exp, with plain and non-temporal stores, on every thread
// given. Each variant's output is first checked against a float64 formula (half a bf16 step, plus
// f32's error on the terms), then the four are timed in alternation, 5 rounds of a median of 3
// runs each. Prints each variant's best round in GB/s under the bytes model (6 bytes an element).
// lab/cpu/NOTES.md, section 33.
//
//   g++ -O2 -fopenmp -mavx512f -mavx512bw -mavx512dq -mavx512vl lab/cpu/lsg_stream_lab.cpp -o /tmp/lsg_stream_lab
//   /tmp/lsg_stream_lab [THREADS]
//
// The zero-masking intrinsics: GCC 12's plain ones pass an undefined vector and warn.
#include <immintrin.h>
#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "lab_timing.hpp"

namespace {

__m512 Widen(const uint16_t* p) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(0xFFFF, _mm512_maskz_cvtepu16_epi32(0xFFFF, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// The library's 16-bit exp (VExpFor16Bit in src/cpu/simd-inl.h).
__m512 Exp16(__m512 v) {
  const __m512 t = _mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896340736f));
  const __m512 f = _mm512_reduce_ps(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  __m512 p = _mm512_set1_ps(0.00021702254889532924f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0012439688434824347f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009678840637207031f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.055483341217041016f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022983014583588f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931470036506653f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_maskz_scalef_ps(0xFFFF, p, t);
}

// Two vectors (a 64-byte line of bf16) a step, each input prefetched 4 KiB ahead as the library does.
template <bool kExp, bool kNt>
__attribute__((noinline, target("avx512bf16"))) void Run(const uint16_t* y, const uint16_t* g, uint16_t* o, long n) {
  const __m512 s = _mm512_set1_ps(1.5f);
  for (long j = 0; j < n; j += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(y + j) + 4096, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(g + j) + 4096, _MM_HINT_T0);
    __m512 a = Widen(y + j), b = Widen(y + j + 16);
    if (kExp) a = Exp16(a), b = Exp16(b);
    const __m512 ra = _mm512_fnmadd_ps(a, s, Widen(g + j)), rb = _mm512_fnmadd_ps(b, s, Widen(g + j + 16));
    const __m512i line = _mm512_maskz_inserti64x4(0xFF, _mm512_castsi256_si512(reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(ra))),
                                            reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(rb)), 1);
    if (kNt) _mm512_stream_si512(reinterpret_cast<__m512i*>(o + j), line);
    else _mm512_store_si512(reinterpret_cast<__m512i*>(o + j), line);
  }
}

using Fn = void (*)(const uint16_t*, const uint16_t*, uint16_t*, long);
constexpr Fn kFns[4] = {Run<false, false>, Run<false, true>, Run<true, false>, Run<true, true>};

}  // namespace

int main(int argc, char** argv) {
  const long n = long{1} << 27;  // 256 MiB an array
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  auto* y = static_cast<uint16_t*>(std::aligned_alloc(64, n * 2));
  auto* g = static_cast<uint16_t*>(std::aligned_alloc(64, n * 2));
  auto* o = static_cast<uint16_t*>(std::aligned_alloc(64, n * 2));
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uy(-8.0f, 0.0f), ug(-1.0f, 1.0f);
  for (long i = 0; i < (1 << 20); ++i) y[i] = to_bf16(uy(rng)), g[i] = to_bf16(ug(rng));
#pragma omp parallel for num_threads(threads)
  for (long i = (1 << 20); i < n; ++i) y[i] = y[i % (1 << 20)], g[i] = g[i % (1 << 20)];
  for (int v = 0; v < 4; ++v) {
    kFns[v](y, g, o, 1 << 20);
    for (long i = 0; i < (1 << 20); ++i) {
      const double e = (v & 2) ? std::exp(from_bf16(y[i])) : from_bf16(y[i]);
      const double want = from_bf16(g[i]) - e * 1.5, got = from_bf16(o[i]);
      // Half a bf16 step of the result, plus the f32 arithmetic's error on the terms (the exp's
      // within 2 + 1.25 |y| ulp, |y| <= 8): where they cancel, the result is small and they are not.
      const double terms = std::fabs(from_bf16(g[i])) + 1.5 * e;
      if (std::fabs(got - want) > std::ldexp(std::fabs(want), -8) + std::ldexp(terms, -19)) {
        std::printf("variant %d: element %ld is %g, want %g\n", v, i, got, want);
        return 1;
      }
    }
  }
  std::printf("checked: 4 variants against float64 on 2^20 elements\n");
  const char* names[4] = {"no exp, plain stores", "no exp, non-temporal", "exp, plain stores", "exp, non-temporal"};
  double best[4] = {0, 0, 0, 0};
  for (int round = 0; round < 5; ++round) {
    for (int v = 0; v < 4; ++v) {
      const double sec = median_seconds([&] {
#pragma omp parallel num_threads(threads)
        {
          const long t = omp_get_thread_num(), a = n / threads * t, b = t + 1 == threads ? n : n / threads * (t + 1);
          kFns[v](y + a, g + a, o + a, b - a);
        }
      }, 3);
      best[v] = std::max(best[v], n * 6 / sec / 1e9);
    }
  }
  for (int v = 0; v < 4; ++v) std::printf("%-22s best of 5 rounds: %5.1f GB/s (%d threads)\n", names[v], best[v], threads);
  return 0;
}
