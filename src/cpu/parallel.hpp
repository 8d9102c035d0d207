// CPU threading: OpenMP with static, contiguous partitions. Work below a grain stays on the
// calling thread. Reductions never depend on the partition: they go through fixed-size chunks
// whose count depends only on the problem (see chunk_count), combined in chunk order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gradops/context.hpp"

#if defined(_OPENMP)
#include <omp.h>
#endif

namespace gradops::cpu {

inline int max_threads(const Context& ctx) {
#if defined(_OPENMP)
  return ctx.num_threads > 0 ? ctx.num_threads : omp_get_max_threads();
#else
  (void)ctx;
  return 1;
#endif
}

// Calls f(begin, end) on disjoint contiguous ranges covering [0, n). Ranges hold at least `grain`
// items (except the last), so small problems run on one thread.
template <class F>
void parallel_for(int64_t n, int64_t grain, const Context& ctx, F&& f) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t by_grain = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads(ctx), by_grain));
  if (threads <= 1) {
    f(int64_t{0}, n);
    return;
  }
#if defined(_OPENMP)
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    if (begin < end) f(begin, end);
  }
#else
  f(int64_t{0}, n);
#endif
}

// Number of fixed-size chunks of `chunk` items covering n (0 for n = 0).
inline int64_t chunk_count(int64_t n, int64_t chunk) { return (n + chunk - 1) / chunk; }

}  // namespace gradops::cpu
