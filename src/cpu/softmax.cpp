// Softmax family, CPU kernels: one source compiled for SSE4, AVX2, AVX-512 and a portable target
// (Highway), chosen at run time; exp is inline (a shorter one for 16-bit outputs) and log SLEEF's
// vector function (cpu/simd-inl.h).
//
// The descriptor's two layouts (see ops/softmax.hpp):
//   inner == 1, contiguous rows: per row, the reduction pass with four vector accumulators
//     (FoldBlocks: block b into accumulator b mod 4, combined pairwise, then the lanes pairwise),
//     then the write pass while the row is still in L1/L2. Each row comes from memory once.
//   inner > 1, a non-last axis, read in place (nothing is transposed). One outer index's
//     [axis_len, inner] slab is contiguous:
//     - inner < 4 lanes, or lcm(inner, lanes) at most 64 vectors and the slab within the cache
//       budget, folded: the slab is read as one run of whole vectors, lane c of the vector at
//       offset j accumulating into acc[(j + c) mod W], W a multiple of lcm(inner, lanes);
//       acc[c] then folds into column c mod inner, and the column values are spread back into a
//       W-periodic pattern for the write pass. Lanes past the slab's end alias real columns, so
//       they are masked out of the forwards' max and sum.
//     - otherwise: whole rows of inner positions, one accumulator lane per position, updated by
//       a contiguous vector loop over the row while walking down the axis; the slab is one
//       contiguous run. A slab past the cache budget, where the slabs the threads hold at once
//       also pass an eighth of the L3, goes in blocks of columns whose inputs fit the budget, so
//       that the write pass reads them back from L2, where the block's runs (a row apart) are at
//       least 256 bytes; otherwise its write pass reads it again from the L3, or from memory.
//       Slabs too few for the threads are cut into blocks of columns too.
//     A tile (a folded slab, a slab or a block) is read from memory by its first pass (the
//     gradients' sum, the forwards' max) and written from cache, where it fits, by its write
//     pass; a thread runs tile u's write pass in one loop with tile u + 1's first pass, so reads
//     from memory never wait on writing.
//     Accumulators are per-thread scratch arrays (two sets), not registers.
// Each group is reduced by one thread in an order fixed by the shape (and the target's lane
// count), so results are bitwise the same for any thread count and any partition. A partial
// vector (a row's or a block's tail, or the head that aligns non-temporal stores) goes through
// zero-padded copies and the same lane-wise code as whole vectors, so an element's value does not
// depend on which of them it fell in.
//
// Softmax forward evaluates each exp once: exp(x - m) is parked in a per-thread scratch row (or
// tile) between the sum and the write, so the output is written exactly once. Groups too long for
// the scratch (tiles too large for the cache budget with it) evaluate exp again in the write pass
// (the same function of the same input: the same bits).
//
// Outputs from an eighth of the last-level cache up (stream_min_bytes) are written with
// non-temporal stores: a normal store first reads the line it writes (a third input stream), and
// the output, sharing the cache with the other cores, would only evict the inputs still to be read.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/softmax.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>

#include "core/workspace.hpp"
#include "gradops/schema.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/simd.hpp"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "ops/softmax.hpp"


HWY_BEFORE_NAMESPACE();
namespace gradops::cpu::HWY_NAMESPACE {
namespace {

using ::gradops::detail::SoftmaxDesc;
using ::gradops::detail::SoftmaxKind;

constexpr int64_t kMaxParked = 1 << 16;   // Softmax: exp values a thread keeps between sum and write
constexpr int64_t kMaxFoldVectors = 64;  // the most vectors lcm(inner, lanes) may span to fold
constexpr int64_t kFoldSpacing = 8;      // vectors between two updates of one folded accumulator, at least
constexpr int64_t kMinBlockRun = 256;    // bytes: the shortest run a row of a column block may have

template <class D> using V = hn::Vec<D>;

// Splits [0, units) into equal contiguous ranges, one per thread and at most one per `grain` units
// begun, and runs range(u0, u1, scratch) on each; every thread gets its own `scratch_len` compute
// values (64-byte aligned).
template <class A, class F>
Status ForEachRange(OpId op, int64_t units, int64_t grain, int64_t scratch_len, const Context& ctx, F&& range) {
  const int64_t slots = std::min<int64_t>(max_threads(ctx), chunk_count(units, std::max<int64_t>(grain, 1)));
  ::gradops::detail::Workspace ws;
  A* scratch = nullptr;
  if (scratch_len > 0) {
    scratch_len = (scratch_len + 15) / 16 * 16;  // keeps every slot 64-byte aligned
    const auto bytes = sizeof(A) * static_cast<std::size_t>(slots * scratch_len);
    if (Status s = ws.allocate(ctx, Device::cpu(), bytes, op_schema(op).name); !s) return s;
    scratch = ws.as<A>();
  }
  parallel_for(slots, 1, ctx, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s)
      range(units * s / slots, units * (s + 1) / slots, scratch ? scratch + s * scratch_len : nullptr);
    hwy::FlushStream();
  });
  return {};
}

// ---- inner == 1: contiguous rows ------------------------------------------------------------

// Per row: a reduction pass that reads the row from memory, then the write pass over the row in
// cache. Within a thread's range of rows, each row's write pass runs in one loop with the next
// row's first reduction (FoldBlocksWriting), so reads from memory never pause for a write pass.
template <class T, SoftmaxKind kKind, bool kStream>
Status RunRows(const SoftmaxDesc& desc, const Context& ctx) {
  const ComputeTag<T> d;
  using A = hn::TFromD<decltype(d)>;
  using VA = V<decltype(d)>;
  const T* dy = static_cast<const T*>(desc.dy);
  const T* y = static_cast<const T*>(desc.y);
  T* out = static_cast<T*>(desc.out);
  const int64_t n = desc.axis_len;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  constexpr bool kGrad = kKind == SoftmaxKind::softmax_grad || kKind == SoftmaxKind::log_softmax_grad;
  const bool park = kKind == SoftmaxKind::softmax && n <= kMaxParked;
  const VA ninf = hn::Set(d, -std::numeric_limits<A>::infinity());
  const auto add = [](VA a, VA b) { return hn::Add(a, b); };
  const auto vmax = [](VA a, VA b) { return hn::Max(a, b); };
  const auto plus = [](A a, A b) { return a + b; };

  // The first reduction of row r: the gradients' sum, the forwards' max. NaN never wins hn::Max's
  // comparison here or in ReduceLanes; it still reaches every output of its group through
  // exp(x - m) and the sum.
  auto first_step = [=](int64_t r) {
    const T* v = y + r * n;
    const T* g = kGrad ? dy + r * n : nullptr;
    return [=](VA acc, int64_t j, int64_t valid) -> VA {
      PrefetchAhead(v + j);
      if constexpr (kGrad) PrefetchAhead(g + j);
      if constexpr (kKind == SoftmaxKind::softmax_grad) {
        return hn::MulAdd(LoadWideN(d, v + j, valid), LoadWideN(d, g + j, valid), acc);  // padding adds 0 * 0
      } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
        return hn::Add(acc, LoadWideN(d, g + j, valid));
      } else {
        const auto x = LoadWideN(d, v + j, valid);
        return hn::Max(acc, valid == L ? x : hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(valid)), x, ninf));
      }
    };
  };
  const VA init = kGrad ? hn::Zero(d) : ninf;
  const auto combine = [=](VA a, VA b) { return kGrad ? add(a, b) : vmax(a, b); };

  // Streamed, a range's rows are written as one run: where a row does not end on a stream
  // boundary, its last partial unit goes out with the next row's first, in one store, once that
  // row's sums are known (right after this row's write pass, whose loop reduced it). Written row
  // by row, two rows sharing a line both wrote it with normal stores, which first read it from
  // memory: a 128-column f32 row on a base 16 bytes past a line ran at 0.6 of copy against 0.85
  // aligned (lab/cpu/NOTES.md section 16).
  const int64_t unit = L * kStreamVectors<decltype(d), T>;  // elements a stream store writes
  const uintptr_t unit_bytes = static_cast<uintptr_t>(unit) * sizeof(T);
  const bool join = kStream && n >= 2 * unit && reinterpret_cast<uintptr_t>(out) % sizeof(T) == 0;

  auto range = [&](int64_t r0, int64_t r1, A* scratch) {
    // Row r's state for its write pass: the gradients' sum in s; the forwards' max in s and
    // 1/sum (Softmax) or log(sum) (LogSoftmax) in t.
    VA s = hn::Zero(d), t = hn::Zero(d);
    auto finish = [&](int64_t r, VA acc) {
      if constexpr (kGrad) {
        s = hn::Set(d, ReduceLanes(d, acc, plus));
      } else {
        s = hn::Set(d, ReduceLanes(d, acc, [](A a, A b) { return b > a ? b : a; }));
        const T* v = y + r * n;
        const A total = ReduceLanes(d, FoldBlocks(d, n, hn::Zero(d), [&](VA sum, int64_t j, int64_t valid) {
          auto e = VExpFor<T>(d, hn::Sub(LoadWideN(d, v + j, valid), s));
          if (park) hn::Store(e, d, scratch + j);
          if (valid < L) e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), e);
          return hn::Add(sum, e);
        }, add), plus);
        if constexpr (kKind == SoftmaxKind::log_softmax)
          t = VLog(d, hn::Set(d, total));
        else
          t = hn::Div(hn::Set(d, A(1)), hn::Set(d, total));
      }
    };
    // Row r's write-pass value with the sums now in s and t (captured); `parked`: Softmax reads
    // the exp values parked in scratch (row r's until finish(r + 1)).
    auto row_value = [&](int64_t r, bool parked) {
      const T* v = y + r * n;
      const T* g = kGrad ? dy + r * n : nullptr;
      return [=](int64_t j, int64_t valid) -> VA {
        if constexpr (kKind == SoftmaxKind::softmax_grad) {
          return hn::Mul(LoadWideN(d, v + j, valid), hn::Sub(LoadWideN(d, g + j, valid), s));
        } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
          return hn::NegMulAdd(VExpFor<T>(d, LoadWideN(d, v + j, valid)), s, LoadWideN(d, g + j, valid));
        } else if constexpr (kKind == SoftmaxKind::log_softmax) {
          return hn::Sub(hn::Sub(LoadWideN(d, v + j, valid), s), t);
        } else {
          return hn::Mul(park && parked ? hn::LoadU(d, scratch + j) : VExpFor<T>(d, hn::Sub(LoadWideN(d, v + j, valid), s)), t);
        }
      };
    };
    finish(r0, FoldBlocks(d, n, init, first_step(r0), combine));
    for (int64_t r = r0; r < r1; ++r) {
      const auto value = row_value(r, true);
      // Row r's values once scratch holds row r + 1's. Made here, not where it is used: the lambda
      // copies s and t, which finish(r + 1) overwrites with row r + 1's sums.
      const auto value_after = row_value(r, false);
      const bool next = r + 1 < r1;
      // Joined: row r's write stops at the last stream boundary before row r + 1 (rows are at
      // least two units long, so past its head).
      int64_t end = n;
      if (join && next) end = n - static_cast<int64_t>(reinterpret_cast<uintptr_t>(out + (r + 1) * n) % unit_bytes / sizeof(T));
      const VA acc = FoldBlocksWriting<kStream>(d, next ? n : 0, init, first_step(r + 1), combine, out + r * n, end, value,
                                                join && r > r0);
      if (!next) continue;
      finish(r + 1, acc);
      if (end < n) {  // the unit row r ends and row r + 1 starts, each lane from its own row
        const auto next_value = row_value(r + 1, false);
        auto part = [&](int64_t o) {
          const int64_t mine = std::clamp<int64_t>(n - end - o, 0, L);
          return hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(mine)), value_after(end + o, L), next_value(end + o - n, L));
        };
        StreamNarrow(d, part(0), kStreamVectors<decltype(d), T> == 2 ? part(L) : hn::Zero(d), out + r * n + end);
      }
    }
  };
  // Parked values sit at their column; the write pass may read a vector starting anywhere in the
  // row (after an aligning head), hence one vector of slack.
  return ForEachRange<A>(desc.op, desc.outer, kGrain / n, park ? n + L : 0, ctx, range);
}

// ---- inner > 1: a non-last axis, in place on the strided data --------------------------------

template <class T, SoftmaxKind kKind, bool kStream>
Status RunStrided(const SoftmaxDesc& desc, const Context& ctx) {
  const ComputeTag<T> d;
  using A = hn::TFromD<decltype(d)>;
  using VA = V<decltype(d)>;
  const T* dy = static_cast<const T*>(desc.dy);
  const T* y = static_cast<const T*>(desc.y);
  T* out = static_cast<T*>(desc.out);
  const int64_t n = desc.axis_len, inner = desc.inner;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  constexpr bool kGrad = kKind == SoftmaxKind::softmax_grad || kKind == SoftmaxKind::log_softmax_grad;
  constexpr bool kSoftmax = kKind == SoftmaxKind::softmax;
  const int64_t slab = n * inner;  // one outer index's elements, contiguous
  const int64_t elem_bytes = static_cast<int64_t>(sizeof(T)) * (kGrad ? 2 : 1) + (kSoftmax ? int64_t{sizeof(A)} : 0);
  const int64_t slab_bytes = slab * elem_bytes;  // what a pass over one slab reads (Softmax: and parks)

  // Narrow inner sizes fold: the slab is one contiguous run read a whole vector at a time, lane c
  // of the vector at offset j accumulating into acc[(j + c) mod W], W a multiple of lcm(inner, L);
  // acc[c] then folds into column c mod inner (finish below). W depends on the shape and L only.
  // Wider ones fold too where the slab fits the cache budget and lcm(inner, L) is at most 64
  // vectors: one run of whole vectors then replaces a run a row, whose head and tail (where the
  // row is not vector-aligned in memory) cost a partial line each.
  const int64_t lcm = std::lcm(inner, L);
  const bool folded = inner < 4 * L || (lcm <= kMaxFoldVectors * L && slab_bytes <= l2_reuse_bytes());
  int64_t W = 0, block = inner, per_slice = 1;
  if (folded) {
    // Folding W costs about W / L vector ops a slab (fill, fold, spread), so W is at most an
    // eighth of the slab. Where that reaches 64 vectors, the passes go in runs of W (fold_run
    // below). Otherwise the slab is one run whose vector at j takes accumulator j mod W, and W need
    // only keep one accumulator's load-add-store updates kFoldSpacing vectors apart: a longer W was
    // a fifth of the in-cache time of [1000, 3] slabs (lab/cpu/NOTES.md, section 35).
    const int64_t m = std::max<int64_t>(1, std::min(chunk_count(kMaxFoldVectors * L, lcm), chunk_count(slab, 8 * lcm)));
    W = lcm * (lcm * m >= kMaxFoldVectors * L ? m : std::min(m, chunk_count(kFoldSpacing * L, lcm)));
  } else {
    // Not folded, a tile is the slab in whole rows, or a block of its columns (a multiple of L
    // wide): lane i of vector k in a row serves inner position i0 + k L + i. Where the slab's
    // inputs pass the cache budget, whole rows would have the write pass read them from memory
    // again; blocks whose inputs fit the budget are read back from L2, their rows runs a row apart
    // (prefetched by `ahead` below). Such runs must be at least kMinBlockRun long: 64x1024x4096
    // f32 in 384-byte runs took 0.6-0.85 of the time of whole rows, 32x2048x4096 in 192-byte
    // runs 1.1-1.3x it (lab/cpu/NOTES.md, section 29). Blocks larger than the budget lose to whole
    // rows (section 24). And blocks pay only where the second read would go to memory: where the
    // slabs the threads hold at once fit an eighth of the L3, whole rows read them back from it
    // and won (256x512x512 f32 at 2 threads: 0.73-0.86 of copy against blocks' 0.59-0.78 on a
    // Zen 4 CCD, 1.2-1.3x faster on a 300 MiB Xeon L3); at twice that, SoftmaxGrad_13 still
    // gained from blocks (section 30).
    // Where the tiles are too few to share out over the threads that will run, the blocks narrow
    // further, until no thread takes more than a quarter over its share. A block changes which
    // thread sums a column, not the order of its sum.
    const int64_t threads = slot_count(desc.outer * slab, kGrain, ctx);
    const auto uneven = [&](int64_t p) {
      const int64_t tiles = desc.outer * p;
      return chunk_count(tiles, threads) * threads * 4 > tiles * 5;
    };
    const int64_t fits = l2_reuse_bytes() / (n * elem_bytes) / L * L;  // columns whose tile fits the budget
    const bool reread_from_memory = slab_bytes > l2_reuse_bytes() && slab_bytes * threads > llc_bytes() / 8;
    if (reread_from_memory && fits * static_cast<int64_t>(sizeof(T)) >= kMinBlockRun)
      per_slice = chunk_count(inner, fits);
    while (per_slice < chunk_count(inner, L) && uneven(per_slice)) ++per_slice;
    block = chunk_count(chunk_count(inner, per_slice), L) * L;
    per_slice = chunk_count(inner, block);
  }
  const int64_t acc_len = (folded ? W : chunk_count(block, L) * L) + L;  // a vector of slack for unaligned reads
  const int64_t park_len = folded ? slab + L : n * (acc_len - L) + L;
  // Softmax parks exp(x - max) where the tile's inputs and parked values fit the budget together
  // (exp is most of a forward's compute; the write pass then only multiplies).
  const bool park = kSoftmax && (park_len - L) * elem_bytes <= l2_reuse_bytes();
  // Runs shorter than 2 KiB (short rows, or blocks' runs a row apart, which defeat the hardware
  // prefetchers: they follow runs within a page) ask at their start for the run kPrefetchBytes of
  // runs ahead.
  const int64_t run_bytes = block * static_cast<int64_t>(sizeof(T));
  const int64_t ahead = !folded && run_bytes < 2048 ? chunk_count(kPrefetchBytes, run_bytes) : 0;

  const int64_t padded = acc_len - L;
  const int64_t stride = chunk_count(acc_len, 16) * 16;  // keeps each accumulator array 64-byte aligned
  // Folded, a tile's passes go in runs of W elements where W is 64 vectors (the slab is long: a
  // run's fixed cost is small beside it); otherwise in one run over the slab (in runs short
  // enough for 32-bit offsets, a multiple of W each), its vector at offset j taking accumulator
  // j mod W. The fixed cost of a run of W (its call, the write's head and tail) was what held a
  // [1000, 3] bf16 slab, W 24 vectors, at 0.44 of copy; one run reaches 0.67.
  const int64_t fold_run = !folded ? 0 : W >= kMaxFoldVectors * L ? W : W * std::max<int64_t>(1, (int64_t{1} << 31) / W);
  const FastMod mod(static_cast<uint32_t>(folded ? W : 1));
  const int64_t rows = folded ? chunk_count(slab, fold_run) : n;  // the steps a tile's passes go in
  const VA ninf = hn::Set(d, -std::numeric_limits<A>::infinity());
  struct Tile {
    int64_t base, w;  // the tile's first element; its accumulators (not folded: its width)
    A* s;             // the gradients' sum; the forwards' sum, then 1/sum or log(sum)
    A* m;             // the forwards' max
  };

  // A tile's passes go in steps: a row of the tile; folded, a run of the slab. Step r starts at
  // element `at(t, r)` and has `len(t, r)` elements; its element j has accumulator index acc_of(j).
  auto at = [&](const Tile& t, int64_t r) { return t.base + r * (folded ? fold_run : inner); };
  auto len = [&](const Tile& t, int64_t r) { return folded ? std::min(fold_run, slab - r * fold_run) : t.w; };
  auto parked_at = [&](int64_t r) { return r * (folded ? fold_run : padded); };
  const bool wrap = folded && fold_run > W;
  const auto acc_of = [wrap, mod](int64_t j) { return wrap ? int64_t{mod(static_cast<uint32_t>(j))} : j; };

  // The vector ops of step r of tile t's first pass (the one that reads the tile from memory: the
  // gradients' sum, the forwards' max), as FoldBlocksWriting's step: the accumulators are the
  // tile's arrays, so its register accumulator goes through untouched. A partial vector's padded
  // lanes hold no element; folded, they alias real columns, so they are kept out of the forwards'
  // max and sum (the gradients' terms there are 0 * 0 and 0). NaN never wins these comparisons;
  // it reaches its whole group through exp(x - m) and the sum.
  // `contiguous` (a std::bool_constant): the tile's steps run on into each other in memory (folded
  // runs; whole rows with no runs-ahead prefetch), so a vector's prefetch is the line
  // kPrefetchBytes past it. Known at compile time, the pass keeps its pointers in registers: with
  // the blocks' tests and row-end arithmetic a bf16 folded vector took about 28 instructions, 4 of
  // them the sum (lab/cpu/NOTES.md, sections 33-34). Column blocks keep their code as it was.
  auto first = [&](const Tile& t, int64_t r, auto contiguous) {
    const T* HWY_RESTRICT yr = y + at(t, r);
    const T* HWY_RESTRICT gr = kGrad ? dy + at(t, r) : nullptr;
    const int64_t skip = ahead && r + ahead < n ? ahead * inner : 0;
    // Otherwise (column blocks, never folded), runs of 2 KiB or more prefetch kPrefetchBytes ahead
    // in the order the pass walks: a block's row continues in the next row, `gap` elements on.
    const int64_t w = len(t, r), gap = inner - t.w;
    A* HWY_RESTRICT s = t.s;
    A* HWY_RESTRICT m = t.m;
    return [=](VA acc, int64_t j, int64_t valid) -> VA {
      if constexpr (decltype(contiguous)::value) {
        PrefetchAhead(yr + j);
        if constexpr (kGrad) PrefetchAhead(gr + j);
      } else if (!ahead) {
        const int64_t k = j + (j + kPrefetchBytes / int64_t{sizeof(T)} >= w ? gap : 0);
        PrefetchAhead(yr + k);
        if constexpr (kGrad) PrefetchAhead(gr + k);
      } else if (skip && j == 0) {
        for (int64_t b = 0; b < run_bytes; b += 64) {
          hwy::Prefetch(reinterpret_cast<const char*>(yr + skip) + b);
          if constexpr (kGrad) hwy::Prefetch(reinterpret_cast<const char*>(gr + skip) + b);
        }
      }
      const int64_t c = acc_of(j);
      if constexpr (kKind == SoftmaxKind::softmax_grad) {
        hn::Store(hn::MulAdd(LoadWideN(d, yr + j, valid), LoadWideN(d, gr + j, valid), hn::Load(d, s + c)), d, s + c);
      } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
        hn::Store(hn::Add(hn::Load(d, s + c), LoadWideN(d, gr + j, valid)), d, s + c);
      } else {
        auto x = LoadWideN(d, yr + j, valid);
        if (valid < L) x = hn::IfThenElse(hn::FirstN(d, static_cast<size_t>(valid)), x, ninf);
        hn::Store(hn::Max(hn::Load(d, m + c), x), d, m + c);
      }
      return acc;
    };
  };
  // Step r of tile t's write pass, as FoldBlocksWriting's value.
  auto value = [&](const Tile& t, const A* parked, int64_t r) {
    const T* HWY_RESTRICT yr = y + at(t, r);
    const T* HWY_RESTRICT gr = kGrad ? dy + at(t, r) : nullptr;
    const A* HWY_RESTRICT s = t.s;
    const A* HWY_RESTRICT m = t.m;
    const A* HWY_RESTRICT e = parked + parked_at(r);
    const bool parked_here = park;
    return [=](int64_t j, int64_t valid) -> VA {
      const int64_t c = acc_of(j);
      if constexpr (kKind == SoftmaxKind::softmax_grad) {
        return hn::Mul(LoadWideN(d, yr + j, valid), hn::Sub(LoadWideN(d, gr + j, valid), hn::LoadU(d, s + c)));
      } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
        return hn::NegMulAdd(VExpFor<T>(d, LoadWideN(d, yr + j, valid)), hn::LoadU(d, s + c), LoadWideN(d, gr + j, valid));
      } else if constexpr (kKind == SoftmaxKind::log_softmax) {
        return hn::Sub(hn::Sub(LoadWideN(d, yr + j, valid), hn::LoadU(d, m + c)), hn::LoadU(d, s + c));
      } else {
        const auto x = parked_here ? hn::LoadU(d, e + j) : VExpFor<T>(d, hn::Sub(LoadWideN(d, yr + j, valid), hn::LoadU(d, m + c)));
        return hn::Mul(x, hn::LoadU(d, s + c));
      }
    };
  };
  auto fill = [&](A* acc, VA v) {
    for (int64_t c = 0; c < padded; c += L) hn::Store(v, d, acc + c);
  };
  // Makes acc[c] fn(column c mod inner's reduction by op). Folded, in an order fixed by the shape:
  // vectors lcm apart first (c, c + lcm, .. for c < lcm, in that order), then the lanes of one
  // column within lcm (k, k + inner, ..); the column values then repeat with period inner over
  // acc, one vector past W. Not folded, acc[c] is its column's already.
  auto finish = [&](const Tile& t, A* acc, auto&& vop, auto&& op, auto&& fn) {
    if (folded) {
      for (int64_t c = lcm, k = 0; c < W; c += L, k = k + L == lcm ? 0 : k + L)
        hn::Store(vop(hn::Load(d, acc + k), hn::Load(d, acc + c)), d, acc + k);
      if (lcm == inner) {  // one column a lane already
        for (int64_t k = 0; k < inner; k += L) hn::Store(fn(hn::Load(d, acc + k)), d, acc + k);
      } else {
        HWY_ALIGN A col[(kMaxFoldVectors + 1) * hn::MaxLanes(d)];
        for (int64_t k = 0; k < inner; ++k) {
          A r = acc[k];
          for (int64_t c = k + inner; c < lcm; c += inner) r = op(r, acc[c]);
          col[k] = r;
        }
        for (int64_t k = inner; k % L; ++k) col[k] = A(0);
        for (int64_t k = 0; k < inner; k += L) hn::Store(fn(hn::Load(d, col + k)), d, col + k);
        for (int64_t c = 0, k = 0; c < lcm; ++c, k = k + 1 == inner ? 0 : k + 1) acc[c] = col[k];
      }
      for (int64_t c = lcm; c < W + L; c += L) hn::Store(hn::Load(d, acc + c - lcm), d, acc + c);
    } else {
      for (int64_t j = 0; j < t.w; j += L) hn::Store(fn(hn::Load(d, acc + j)), d, acc + j);
    }
  };
  const auto add = [](VA a, VA b) { return hn::Add(a, b); };
  const auto plus = [](A a, A b) { return a + b; };
  const auto same = [](VA v) { return v; };

  // Between the passes, on the tile in cache: the forwards' sum of exp(x - max).
  auto middle = [&](const Tile& t, A* parked) {
    if constexpr (kGrad) {
      if (folded) finish(t, t.s, add, plus, same);
    } else {
      if (folded) finish(t, t.m, [](VA a, VA b) { return hn::Max(a, b); }, [](A a, A b) { return b > a ? b : a; }, same);
      A* HWY_RESTRICT s = t.s;
      const A* HWY_RESTRICT m = t.m;
      for (int64_t r = 0; r < rows; ++r) {
        const T* HWY_RESTRICT yr = y + at(t, r);
        A* HWY_RESTRICT e = parked + parked_at(r);
        const int64_t w = len(t, r);
        for (int64_t j = 0; j < w; j += L) {
          const int64_t valid = std::min(L, w - j), c = acc_of(j);
          auto x = VExpFor<T>(d, hn::Sub(LoadWideN(d, yr + j, valid), hn::Load(d, m + c)));
          if (park) hn::Store(x, d, e + j);
          if (valid < L) x = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), x);
          hn::Store(hn::Add(hn::Load(d, s + c), x), d, s + c);
        }
      }
      if constexpr (kKind == SoftmaxKind::log_softmax) finish(t, s, add, plus, [&](VA v) { return VLog(d, v); });
      else finish(t, s, add, plus, [&](VA v) { return hn::Div(hn::Set(d, A(1)), v); });
    }
  };
  auto tile = [&](int64_t u, A* acc) {
    const int64_t i0 = (u % per_slice) * block;
    Tile t{(u / per_slice) * slab + i0, folded ? W : std::min(block, inner - i0), acc, acc + stride};
    fill(t.s, hn::Zero(d));
    if constexpr (!kGrad) fill(t.m, ninf);
    return t;
  };

  // A thread's tiles go in a pipeline: each step of tile u's write pass (from cache) runs in one
  // loop with the same step of tile u + 1's first pass (from memory), four vectors of each at a
  // time, so that reads from memory never pause for a write pass. Two sets of accumulators take
  // turns.
  const auto keep = [](VA a, VA) { return a; };
  auto pipeline = [&](int64_t u0, int64_t u1, A* scratch, auto contiguous) {
    A* parked = scratch + 4 * stride;
    Tile t = tile(u0, scratch);
    for (int64_t r = 0; r < rows; ++r) FoldBlocks(d, len(t, r), hn::Zero(d), first(t, r, contiguous), keep);
    for (int64_t u = u0; u < u1; ++u) {
      middle(t, parked);
      const bool more = u + 1 < u1;
      const Tile next = more ? tile(u + 1, (u - u0) % 2 ? scratch : scratch + 2 * stride) : t;
      for (int64_t r = 0; r < rows; ++r)
        FoldBlocksWriting<kStream>(d, more ? len(next, r) : 0, hn::Zero(d), first(next, r, contiguous), keep,
                                   out + at(t, r), len(t, r), value(t, parked, r));
      t = next;
    }
  };
  const bool contiguous = folded || (per_slice == 1 && !ahead);
  auto range = [&](int64_t u0, int64_t u1, A* scratch) {
    if (contiguous) pipeline(u0, u1, scratch, std::true_type{});
    else pipeline(u0, u1, scratch, std::false_type{});
  };
  const int64_t scratch = 4 * stride + (park ? park_len : 0);
  return ForEachRange<A>(desc.op, desc.outer * per_slice, kGrain / std::max<int64_t>(1, block * n), scratch, ctx, range);
}

template <class T, SoftmaxKind kKind>
Status RunKind(const SoftmaxDesc& d, const Context& ctx) {
  if (d.outer == 0 || d.axis_len == 0 || d.inner == 0) return {};
  const int64_t out_bytes = d.outer * d.axis_len * d.inner * static_cast<int64_t>(sizeof(T));
  const bool stream = out_bytes >= stream_min_bytes();
  if (d.inner == 1)
    return stream ? RunRows<T, kKind, true>(d, ctx) : RunRows<T, kKind, false>(d, ctx);
  return stream ? RunStrided<T, kKind, true>(d, ctx) : RunStrided<T, kKind, false>(d, ctx);
}

template <class T>
Status RunTyped(const SoftmaxDesc& d, const Context& ctx) {
  switch (d.kind) {
    case SoftmaxKind::softmax_grad: return RunKind<T, SoftmaxKind::softmax_grad>(d, ctx);
    case SoftmaxKind::log_softmax_grad: return RunKind<T, SoftmaxKind::log_softmax_grad>(d, ctx);
    case SoftmaxKind::softmax: return RunKind<T, SoftmaxKind::softmax>(d, ctx);
    case SoftmaxKind::log_softmax: return RunKind<T, SoftmaxKind::log_softmax>(d, ctx);
  }
  return Status(StatusCode::internal, "softmax kernel: unknown kind");
}

}  // namespace

Status Softmax(const SoftmaxDesc& d, const Context& ctx) {
  return visit_dtype(d.dtype, [&](auto tag) { return RunTyped<decltype(tag)>(d, ctx); });
}

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradops::cpu {
HWY_EXPORT(Softmax);
}  // namespace gradops::cpu

namespace gradops::detail {
Status cpu_softmax(const SoftmaxDesc& d, const Context& ctx) {
  cpu::apply_simd_target_from_environment();
  return HWY_DYNAMIC_DISPATCH(cpu::Softmax)(d, ctx);
}
}  // namespace gradops::detail
#endif
