// Lab: how close can an elementwise grad (ReluGrad: out = x > 0 ? dy : 0) get to a multithreaded
// memcpy on this machine, and what does it take? Variants: normal vs non-temporal stores, software
// prefetch distance, f32 vs bf16 storage. Every variant is checked against a scalar reference
// before it is timed; times are medians, the memcpy is measured in the same run.
//
// Build and run (Highway from Debian's libhwy-dev, static dispatch for AVX-512):
//   g++ -O3 -march=x86-64-v4 -maes -mpclmul -fopenmp -std=c++20 lab/cpu/stream_lab.cpp -o /tmp/stream_lab
//   /tmp/stream_lab [elements (default 2^26)] [threads (default 2)]
#include <omp.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lab_timing.hpp"

namespace hn = hwy::HWY_NAMESPACE;

using bf16 = uint16_t;  // bits; widened by shifting, narrowed with round to nearest even
inline float widen(bf16 b) { uint32_t u = uint32_t{b} << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline bf16 narrow(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  return static_cast<bf16>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

struct Variant {
  bool stream;
  int prefetch_bytes;  // 0: none
};

template <class T>
void relu_grad(const T* dy, const T* x, T* out, int64_t n, Variant v) {
  const hn::ScalableTag<float> d;
  const int64_t L = hn::Lanes(d);
  const int64_t step = sizeof(T) == 2 ? 2 * L : L;  // 16-bit: two vectors per full-width store
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    // Thread ranges start on 64-byte boundaries (buffers are 64-byte aligned).
    const int64_t per = 64 / sizeof(T);
    int64_t b = n * t / nt / per * per, e = t + 1 == nt ? n : n * (t + 1) / nt / per * per;
    int64_t i = b;
    for (; i + step <= e; i += step) {
      if (v.prefetch_bytes) {
        hwy::Prefetch(reinterpret_cast<const char*>(x + i) + v.prefetch_bytes);
        hwy::Prefetch(reinterpret_cast<const char*>(dy + i) + v.prefetch_bytes);
      }
      if constexpr (sizeof(T) == 4) {
        const auto r = hn::IfThenElseZero(hn::Gt(hn::LoadU(d, x + i), hn::Zero(d)), hn::LoadU(d, dy + i));
        if (v.stream) hn::Stream(r, d, out + i); else hn::StoreU(r, d, out + i);
      } else {
        const hn::Rebind<uint16_t, decltype(d)> d16;
        const hn::RebindToUnsigned<decltype(d)> du;
        auto wide = [&](const T* p) { return hn::BitCast(d, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p)))); };
        auto half = [&](int64_t j) {
          const auto r = hn::IfThenElseZero(hn::Gt(wide(x + j), hn::Zero(d)), wide(dy + j));
          return hn::DemoteTo(d16, hn::BitCast(hn::RebindToSigned<decltype(d)>(), hn::ShiftRight<16>(hn::BitCast(du, r))));
        };  // exact: r is dy or 0, already a bf16 value
        const hn::Twice<decltype(d16)> d2;
        const auto both = hn::Combine(d2, half(i + L), half(i));
        if (v.stream) hn::Stream(both, d2, out + i); else hn::StoreU(both, d2, out + i);
      }
    }
    for (; i < e; ++i) {
      if constexpr (sizeof(T) == 4) out[i] = x[i] > 0 ? dy[i] : 0.0f;
      else out[i] = widen(x[i]) > 0 ? dy[i] : bf16{0};
    }
    hwy::FlushStream();
  }
}

template <class T>
void* alloc(int64_t n) { return std::aligned_alloc(64, (n * sizeof(T) + 63) / 64 * 64); }

template <class T>
void run(const char* name, int64_t n, double copy_gbs) {
  T* dy = static_cast<T*>(alloc<T>(n));
  T* x = static_cast<T*>(alloc<T>(n));
  T* out = static_cast<T*>(alloc<T>(n));
  srand(1);
  for (int64_t i = 0; i < n; ++i) {
    const float a = rand() / float(RAND_MAX) - 0.5f, b = rand() / float(RAND_MAX) - 0.5f;
    if constexpr (sizeof(T) == 4) dy[i] = a, x[i] = b; else dy[i] = narrow(a), x[i] = narrow(b);
  }
  const Variant variants[] = {{false, 0}, {true, 0}, {true, 256}, {true, 1024}, {true, 4096}, {true, 16384}};
  for (const Variant& v : variants) {
    std::memset(out, 0xff, n * sizeof(T));  // poison: a skipped element cannot pass the check
    relu_grad(dy, x, out, n, v);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (sizeof(T) == 4) bad += out[i] != (x[i] > 0 ? dy[i] : 0.0f);
      else bad += out[i] != (widen(x[i]) > 0 ? dy[i] : bf16{0});
    }
    if (bad) { std::printf("%-5s stream=%d prefetch=%5d  FAILED (%lld wrong)\n", name, v.stream, v.prefetch_bytes, (long long)bad); continue; }
    const double s = median_seconds([&] { relu_grad(dy, x, out, n, v); }, 15);
    const double gbs = 3.0 * n * sizeof(T) / s / 1e9;
    std::printf("%-5s stream=%d prefetch=%5d  %7.2f GB/s  %4.0f%% of memcpy\n", name, v.stream, v.prefetch_bytes, gbs, 100 * gbs / copy_gbs);
  }
  std::free(dy), std::free(x), std::free(out);
}

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 26;
  omp_set_num_threads(argc > 2 ? std::atoi(argv[2]) : 2);
  const double copy_gbs = memcpy_gbs(int64_t{1} << 30, 7);
  std::printf("memcpy %.1f GB/s (read + write), %lld elements, %d threads, %d f32 lanes\n", copy_gbs,
              (long long)n, omp_get_max_threads(), static_cast<int>(hn::Lanes(hn::ScalableTag<float>())));
  run<float>("f32", n, copy_gbs);
  run<bf16>("bf16", n, copy_gbs);
}
