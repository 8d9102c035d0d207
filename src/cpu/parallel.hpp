// CPU threading: OpenMP with static, contiguous partitions. Work below a grain stays on the
// calling thread. Reductions never depend on the partition: they go through fixed-size chunks
// whose count depends only on the problem (see chunk_count), combined in chunk order.
#pragma once

#include <algorithm>
#include <cstdint>

#include "gradops/context.hpp"
#include "hwy/cache_control.h"

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

// Calls f(begin, end) on disjoint contiguous ranges covering [0, n): at most ceil(n / grain) of them,
// equal to within one item (so more than grain / 2 items each when there are several), and a
// problem of at most `grain` items runs on the calling thread.
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

// Elements per thread below which work stays on one thread: every family's threads start from this
// one grain (a thread's start-up and its share of the fork-join cost against its work).
inline constexpr int64_t kGrain = int64_t{1} << 15;

// Threads for `units` of work: at most one per `grain` units, begun (ceil), and at least one.
inline int64_t slot_count(int64_t units, int64_t grain, const Context& ctx) {
  return std::max<int64_t>(1, std::min<int64_t>(max_threads(ctx), chunk_count(units, std::max<int64_t>(grain, 1))));
}

// Splits [0, units) into `slots` contiguous ranges, one per slot, and runs f(u0, u1, slot) for each,
// slots in parallel: a kernel that keeps per-thread scratch indexes it by slot. Non-temporal stores
// are flushed before a thread's work is handed back (its results are read after the join).
template <class F>
void ForEachSlot(int64_t units, int64_t slots, const Context& ctx, F&& f) {
  parallel_for(slots, 1, ctx, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) f(units * s / slots, units * (s + 1) / slots, s);
    hwy::FlushStream();
  });
}

}  // namespace gradops::cpu
