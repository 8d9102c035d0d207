// Timing shared by the CPU lab's stream harnesses: the median of repeated runs, the same-run
// OpenMP memcpy (disjoint chunks, one per thread) that `gradops bench` takes as its reference, a
// 2-thread non-temporal copy (AVX-512), and bf16 conversions for the harnesses' inputs.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

// Median seconds of `reps` runs of f, after one untimed warm-up run.
template <class F>
double median_seconds(F&& f, int reps) {
  std::vector<double> s;
  f();
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// GB/s (bytes read + written) of an OpenMP memcpy of `bytes`, median of `reps` runs.
inline double memcpy_gbs(int64_t bytes, int reps) {
  char* src = static_cast<char*>(std::aligned_alloc(64, bytes));
  char* dst = static_cast<char*>(std::aligned_alloc(64, bytes));
  std::memset(src, 1, bytes), std::memset(dst, 0, bytes);
  const double s = median_seconds([&] {
#pragma omp parallel
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::memcpy(dst + bytes * t / nt, src + bytes * t / nt, bytes * (t + 1) / nt - bytes * t / nt);
    }
  }, reps);
  std::free(src), std::free(dst);
  return 2.0 * bytes / s / 1e9;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Two threads, each copying its half of `bytes` (64-byte aligned buffers) with non-temporal
// stores and a software prefetch 4 KiB ahead.
inline void stream2(char* dst, const char* src, size_t bytes) {
#pragma omp parallel num_threads(2)
  {
    const size_t half = bytes / 128 * 64, t = static_cast<size_t>(omp_get_thread_num());
    const size_t b0 = t * half, b1 = t ? bytes / 64 * 64 : half;
    size_t b = b0;
    for (; b + 256 <= b1; b += 256) {
      _mm_prefetch(src + b + 4096, _MM_HINT_T0);
      _mm_prefetch(src + b + 4096 + 128, _MM_HINT_T0);
      const __m512i v0 = _mm512_load_si512(src + b), v1 = _mm512_load_si512(src + b + 64);
      const __m512i v2 = _mm512_load_si512(src + b + 128), v3 = _mm512_load_si512(src + b + 192);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + b), v0);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + b + 64), v1);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + b + 128), v2);
      _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + b + 192), v3);
    }
    for (; b < b1; b += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + b), _mm512_load_si512(src + b));
  }
  _mm_sfence();
}

inline uint16_t to_bf16(float f) {  // round to nearest even (no NaN here)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
inline float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
