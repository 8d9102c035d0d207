// Lab: how fast can a core read two streams while reducing them, and what do the BatchNorm NHWC
// passes lose against that? The reduction pass of BatchNormalizationGrad sums dy and dy·(x - mu)
// per channel; NHWC keeps those sums in column arrays in L1 (a load and a store per vector and
// accumulator) because a row holds every channel. Variants:
//   regs        sums in registers (what a pure read stream can do), no software prefetch
//   regs+pf1    the same with prefetcht1 4 KiB ahead once a line (the library's choice)
//   regs+pf0    prefetcht0 4 KiB ahead once a line
//   cols+pf1    column arrays of `width` floats in memory, as the library's NHWC pass, prefetcht1
//   cols+pf0    the same, prefetcht0
//   coef ...    the write pass: out = a·dy + b + c·(x - mean) with per-column coefficient arrays,
//               non-temporal stores, forward (fwd) or backward (bwd) through each thread's range
//   relu fwd    the same streams with no coefficient arrays (out = x > 0 ? dy : 0), the control
// Every variant is checked (sums against a float64 loop, outputs against a scalar loop) before it
// is timed; medians; the memcpy is measured in the same run with the same threads.
//
// Build and run (Highway from Debian's libhwy-dev, static dispatch for AVX-512):
//   g++ -O3 -march=x86-64-v4 -fopenmp -std=c++20 lab/cpu/read_lab.cpp -o /tmp/read_lab
//   /tmp/read_lab [elements per stream (default 2^28)] [threads (default 2)] [width (default 1024)]
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "lab_timing.hpp"

namespace hn = hwy::HWY_NAMESPACE;
using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

enum class Kind { regs, cols };
struct Variant {
  const char* name;
  Kind kind;
  int prefetch;  // -1 none, 0 prefetcht0, 1 prefetcht1
};

// Thread t's range of whole rows of `width` values.
inline void range(int64_t n, int64_t width, int64_t& b, int64_t& e) {
  const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads(), rows = n / width;
  b = rows * t / nt * width, e = rows * (t + 1) / nt * width;
}

inline void prefetch(const float* p, int64_t i, int level) {
  constexpr int64_t kAhead = 4096 / sizeof(float);
  if (level < 0 || (i & 15) != 0) return;
  if (level == 0) __builtin_prefetch(p + i + kAhead, 0, 3); else __builtin_prefetch(p + i + kAhead, 0, 2);
}

// Returns per-thread (Σ dy, Σ dy·(x - mu)) summed over lanes and threads (mu = 0.25 for all).
std::pair<double, double> reduce(const float* x, const float* dy, int64_t n, int64_t width, Variant v) {
  const D d;
  const int64_t L = hn::Lanes(d);
  double s1 = 0, s2 = 0;
#pragma omp parallel reduction(+ : s1, s2)
  {
    int64_t b, e;
    range(n, width, b, e);
    const auto mu = hn::Set(d, 0.25f);
    if (v.kind == Kind::regs) {
      V a0 = hn::Zero(d), a1 = a0, c0 = a0, c1 = a0;
      for (int64_t i = b; i < e; i += 2 * L) {
        prefetch(x, i, v.prefetch), prefetch(dy, i, v.prefetch);
        const V g0 = hn::Load(d, dy + i), g1 = hn::Load(d, dy + i + L);
        a0 = hn::Add(a0, g0), a1 = hn::Add(a1, g1);
        c0 = hn::MulAdd(g0, hn::Sub(hn::Load(d, x + i), mu), c0);
        c1 = hn::MulAdd(g1, hn::Sub(hn::Load(d, x + i + L), mu), c1);
      }
      s1 = hn::GetLane(hn::SumOfLanes(d, hn::Add(a0, a1))), s2 = hn::GetLane(hn::SumOfLanes(d, hn::Add(c0, c1)));
    } else {
      float* acc = static_cast<float*>(std::aligned_alloc(64, 3 * width * sizeof(float)));
      float* acc2 = acc + width;
      float* m = acc + 2 * width;
      std::fill(acc, acc + 2 * width, 0.0f), std::fill(m, m + width, 0.25f);
      for (int64_t r = b; r < e; r += width) {
        for (int64_t j = 0; j < width; j += L) {
          prefetch(x + r, j, v.prefetch), prefetch(dy + r, j, v.prefetch);
          const V g = hn::Load(d, dy + r + j);
          hn::Store(hn::Add(hn::Load(d, acc + j), g), d, acc + j);
          hn::Store(hn::MulAdd(g, hn::Sub(hn::Load(d, x + r + j), hn::Load(d, m + j)), hn::Load(d, acc2 + j)), d, acc2 + j);
        }
      }
      for (int64_t j = 0; j < width; ++j) s1 += acc[j], s2 += acc2[j];
      std::free(acc);
    }
  }
  return {s1, s2};
}

struct WriteVariant {
  const char* name;
  bool backward, relu;  // relu: no coefficient arrays, what an elementwise grad does
  int prefetch;         // as Variant's (forward walks only)
};

void write(const float* x, const float* dy, float* out, int64_t n, int64_t width, const float* coef, WriteVariant v) {
  const D d;
  const int64_t L = hn::Lanes(d);
#pragma omp parallel
  {
    int64_t b, e;
    range(n, width, b, e);
    const float *ca = coef, *cb = coef + width, *cc = coef + 2 * width, *cm = coef + 3 * width;
    const int64_t rows = (e - b) / width;
    for (int64_t k = 0; k < rows; ++k) {
      const int64_t r = b + (v.backward ? rows - 1 - k : k) * width;
      for (int64_t j = 0; j < width; j += L) {
        if (!v.backward) prefetch(x + r, j, v.prefetch), prefetch(dy + r, j, v.prefetch);
        V o;
        if (v.relu) {
          o = hn::IfThenElseZero(hn::Gt(hn::Load(d, x + r + j), hn::Zero(d)), hn::Load(d, dy + r + j));
        } else {
          const V ex = hn::Sub(hn::Load(d, x + r + j), hn::Load(d, cm + j));
          o = hn::MulAdd(hn::Load(d, ca + j), hn::Load(d, dy + r + j), hn::MulAdd(hn::Load(d, cc + j), ex, hn::Load(d, cb + j)));
        }
        hn::Stream(o, d, out + r + j);
      }
    }
    hwy::FlushStream();
  }
}

int main(int argc, char** argv) {
  const int64_t width = argc > 3 ? std::atoll(argv[3]) : 1024;
  const int64_t n = (argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 28) / width * width;
  omp_set_num_threads(argc > 2 ? std::atoi(argv[2]) : 2);
  float* x = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  float* dy = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
  float* out = static_cast<float*>(std::aligned_alloc(64, n * sizeof(float)));
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) x[i] = float((i * 7919) % 1000) / 1000.0f, dy[i] = float((i * 104729) % 997) / 997.0f - 0.5f;
  double r1 = 0, r2 = 0, a1 = 0, a2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double t2 = double(dy[i]) * (double(x[i]) - 0.25);
    r1 += dy[i], r2 += t2, a1 += std::abs(dy[i]), a2 += std::abs(t2);
  }
  const double before = memcpy_gbs(int64_t{1} << 31, 5);
  std::printf("memcpy %.1f GB/s (read + write), %lld f32 per stream, %d threads, width %lld\n", before, (long long)n,
              omp_get_max_threads(), (long long)width);
  const Variant variants[] = {{"regs", Kind::regs, -1}, {"regs+pf1", Kind::regs, 1}, {"regs+pf0", Kind::regs, 0},
                              {"cols+pf1", Kind::cols, 1}, {"cols+pf0", Kind::cols, 0}, {"cols", Kind::cols, -1}};
  for (const Variant& v : variants) {
    const auto [s1, s2] = reduce(x, dy, n, width, v);
    // f32 columns add n / width terms in sequence: allow 1e-4 of the sum of magnitudes.
    if (std::abs(s1 - r1) > 1e-4 * a1 || std::abs(s2 - r2) > 1e-4 * a2) {
      std::printf("%-10s FAILED: %.9g %.9g against %.9g %.9g\n", v.name, s1, s2, r1, r2);
      continue;
    }
    const double s = median_seconds([&] { reduce(x, dy, n, width, v); }, 9);
    const double gbs = 2.0 * n * sizeof(float) / s / 1e9;
    std::printf("%-10s read 2 streams  %6.1f GB/s  %.2f of memcpy\n", v.name, gbs, gbs / before);
  }
  std::vector<float> coef(4 * width);
  for (int64_t j = 0; j < 4 * width; ++j) coef[j] = 0.5f + 0.001f * j;
  const WriteVariant writes[] = {{"coef fwd", false, false, -1},
                                 {"coef fwd+pf1", false, false, 1},
                                 {"coef fwd+pf0", false, false, 0},
                                 {"coef bwd", true, false, -1},
                                 {"relu fwd", false, true, -1}};
  for (const WriteVariant& v : writes) {
    std::memset(out, 0xff, n * sizeof(float));  // poison: a skipped element cannot pass the check
    write(x, dy, out, n, width, coef.data(), v);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = i % width;
      const float want = v.relu ? (x[i] > 0 ? dy[i] : 0.0f) : std::fma(coef[j], dy[i], std::fma(coef[2 * width + j], x[i] - coef[3 * width + j], coef[width + j]));
      bad += out[i] != want;
    }
    if (bad) { std::printf("%-12s FAILED (%lld wrong)\n", v.name, (long long)bad); continue; }
    const double s = median_seconds([&] { write(x, dy, out, n, width, coef.data(), v); }, 9);
    const double gbs = 3.0 * n * sizeof(float) / s / 1e9;
    std::printf("%-12s 2 reads + 1 write  %6.1f GB/s  %.2f of memcpy\n", v.name, gbs, gbs / before);
  }
  std::printf("memcpy again %.1f GB/s\n", memcpy_gbs(int64_t{1} << 31, 5));
}
