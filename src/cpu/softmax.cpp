// Softmax family, CPU kernels: one source compiled for SSE4, AVX2, AVX-512 and a portable target
// (Highway), chosen at run time; exp is inline and log SLEEF's vector function (cpu/simd-inl.h).
//
// The descriptor's two layouts (see ops/softmax.hpp):
//   inner == 1, contiguous rows: per row, the reduction pass with four vector accumulators
//     (FoldBlocks: block b into accumulator b mod 4, combined pairwise, then the lanes pairwise),
//     then the write pass while the row is still in L1/L2. Each row comes from memory once.
//   inner > 1, a non-last axis: per outer slice and block of inner positions, one accumulator lane
//     per inner position, all updated by a contiguous vector loop over the block while walking down
//     the axis; then the write pass over the same block, still in L2. Nothing is transposed.
// Each group is reduced by one thread in an order fixed by the shape (and the target's lane
// count), so results are bitwise the same for any thread count and any partition. A partial
// vector (a row's or a block's tail, or the head that aligns non-temporal stores) goes through
// zero-padded copies and the same lane-wise code as whole vectors, so an element's value does not
// depend on which of them it fell in.
//
// Softmax forward evaluates each exp once: exp(x - m) is parked in a per-thread scratch row (or
// block) between the sum and the write, so the output is written exactly once. Groups too long for
// the scratch evaluate exp again in the write pass (the same function of the same input: the same
// bits).
//
// Outputs much larger than the last-level cache are written with non-temporal stores: a normal
// store first reads the line it writes (a third input stream), and the output would only evict the
// inputs still to be read.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/softmax.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstdint>
#include <limits>

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

constexpr int64_t kBlockBytes = 1 << 17;  // a strided block's inputs, re-read by its write pass from L2
constexpr int64_t kMaxBlock = 1024;       // inner positions per strided block (accumulators on the stack)
constexpr int64_t kMaxParked = 1 << 16;   // Softmax: exp values a thread keeps between sum and write

template <class D> using V = hn::Vec<D>;

// Splits [0, units) into contiguous ranges of at least `grain` units, one per thread, and runs
// range(u0, u1, scratch) on each; every thread gets its own `scratch_len` compute values (64-byte
// aligned).
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
          auto e = VExp(d, hn::Sub(LoadWideN(d, v + j, valid), s));
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
    finish(r0, FoldBlocks(d, n, init, first_step(r0), combine));
    for (int64_t r = r0; r < r1; ++r) {
      const T* v = y + r * n;
      const T* g = kGrad ? dy + r * n : nullptr;
      auto value = [=](int64_t j, int64_t valid) -> VA {
        if constexpr (kKind == SoftmaxKind::softmax_grad) {
          return hn::Mul(LoadWideN(d, v + j, valid), hn::Sub(LoadWideN(d, g + j, valid), s));
        } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
          return hn::NegMulAdd(VExp(d, LoadWideN(d, v + j, valid)), s, LoadWideN(d, g + j, valid));
        } else if constexpr (kKind == SoftmaxKind::log_softmax) {
          return hn::Sub(hn::Sub(LoadWideN(d, v + j, valid), s), t);
        } else {
          return hn::Mul(park ? hn::LoadU(d, scratch + j) : VExp(d, hn::Sub(LoadWideN(d, v + j, valid), s)), t);
        }
      };
      const bool next = r + 1 < r1;
      const VA acc = FoldBlocksWriting<kStream>(d, next ? n : 0, init, first_step(r + 1), combine, out + r * n, n, value);
      if (next) finish(r + 1, acc);
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
  const T* dy = static_cast<const T*>(desc.dy);
  const T* y = static_cast<const T*>(desc.y);
  T* out = static_cast<T*>(desc.out);
  const int64_t n = desc.axis_len, inner = desc.inner;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  constexpr bool kGrad = kKind == SoftmaxKind::softmax_grad || kKind == SoftmaxKind::log_softmax_grad;
  const int64_t in_bytes = static_cast<int64_t>(sizeof(T)) * (kGrad ? 2 : 1);

  // Blocks: wide enough for whole vectors, narrow enough that the block's inputs stay in L2 between
  // the reduction and the write pass. They are the unit of parallel work, so a small outer still
  // spreads over threads. Lane i of a block's vector k serves inner position i0 + k L + i.
  int64_t block = kBlockBytes / in_bytes / n;
  block = std::clamp<int64_t>(block / L * L, L, kMaxBlock);
  block = std::min(block, inner);
  const int64_t per_slice = chunk_count(inner, block);
  const int64_t padded = chunk_count(block, L) * L;  // the block's lanes, whole vectors
  const bool park = kKind == SoftmaxKind::softmax && n * padded <= kMaxParked;

  auto unit = [&](int64_t b, A* scratch) {
    const int64_t i0 = (b % per_slice) * block;
    const int64_t base = (b / per_slice) * n * inner + i0;
    const int64_t w = std::min(block, inner - i0);
    // Per-position state, one vector of slack for the write pass's unaligned reads.
    HWY_ALIGN A s[kMaxBlock + hn::MaxLanes(d)];
    auto load = [&](const T* p, int64_t a, int64_t j, int64_t valid) { return LoadWideN(d, p + base + a * inner + j, valid); };
    auto each_vector = [&](auto&& f) {  // f(j, valid) over the block's vectors
      for (int64_t j = 0; j < w; j += L) f(j, std::min(L, w - j));
    };
    auto write = [&](int64_t a, auto&& value) { WriteRun<kStream>(d, out + base + a * inner, w, value); };
    each_vector([&](int64_t j, int64_t) { hn::Store(hn::Zero(d), d, s + j); });
    // Padded lanes of a partial vector hold values for no position: they are never written out.
    if constexpr (kKind == SoftmaxKind::softmax_grad) {
      for (int64_t a = 0; a < n; ++a)
        each_vector([&](int64_t j, int64_t valid) {
          hn::Store(hn::MulAdd(load(y, a, j, valid), load(dy, a, j, valid), hn::Load(d, s + j)), d, s + j);
        });
      for (int64_t a = 0; a < n; ++a)
        write(a, [&](int64_t j, int64_t valid) {
          return hn::Mul(load(y, a, j, valid), hn::Sub(load(dy, a, j, valid), hn::LoadU(d, s + j)));
        });
    } else if constexpr (kKind == SoftmaxKind::log_softmax_grad) {
      for (int64_t a = 0; a < n; ++a)
        each_vector([&](int64_t j, int64_t valid) {
          hn::Store(hn::Add(hn::Load(d, s + j), load(dy, a, j, valid)), d, s + j);
        });
      for (int64_t a = 0; a < n; ++a)
        write(a, [&](int64_t j, int64_t valid) {
          return hn::NegMulAdd(VExp(d, load(y, a, j, valid)), hn::LoadU(d, s + j), load(dy, a, j, valid));
        });
    } else {
      HWY_ALIGN A m[kMaxBlock + hn::MaxLanes(d)];
      const auto ninf = hn::Set(d, -std::numeric_limits<A>::infinity());
      each_vector([&](int64_t j, int64_t) { hn::Store(ninf, d, m + j); });
      for (int64_t a = 0; a < n; ++a)
        each_vector([&](int64_t j, int64_t valid) {
          hn::Store(hn::Max(hn::Load(d, m + j), load(y, a, j, valid)), d, m + j);
        });
      for (int64_t a = 0; a < n; ++a)
        each_vector([&](int64_t j, int64_t valid) {
          const auto e = VExp(d, hn::Sub(load(y, a, j, valid), hn::Load(d, m + j)));
          if (kKind == SoftmaxKind::softmax && park) hn::Store(e, d, scratch + a * padded + j);
          hn::Store(hn::Add(hn::Load(d, s + j), e), d, s + j);
        });
      if constexpr (kKind == SoftmaxKind::log_softmax) {
        each_vector([&](int64_t j, int64_t) { hn::Store(VLog(d, hn::Load(d, s + j)), d, s + j); });
        for (int64_t a = 0; a < n; ++a)
          write(a, [&](int64_t j, int64_t valid) {
            return hn::Sub(hn::Sub(load(y, a, j, valid), hn::LoadU(d, m + j)), hn::LoadU(d, s + j));
          });
      } else {
        each_vector([&](int64_t j, int64_t) { hn::Store(hn::Div(hn::Set(d, A(1)), hn::Load(d, s + j)), d, s + j); });
        for (int64_t a = 0; a < n; ++a)
          write(a, [&](int64_t j, int64_t valid) {
            const auto e = park ? hn::LoadU(d, scratch + a * padded + j)
                                : VExp(d, hn::Sub(load(y, a, j, valid), hn::LoadU(d, m + j)));
            return hn::Mul(e, hn::LoadU(d, s + j));
          });
      }
    }
  };
  const int64_t scratch = park ? n * padded + L : 0;
  return ForEachRange<A>(desc.op, desc.outer * per_slice, kGrain / (block * n), scratch, ctx, [&](int64_t b0, int64_t b1, A* sc) {
    for (int64_t b = b0; b < b1; ++b) unit(b, sc);
  });
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
