// Timing shared by the CPU lab's stream harnesses: the median of repeated runs, and the same-run
// OpenMP memcpy (disjoint chunks, one per thread) that `gradops bench` takes as its reference.
#pragma once

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
