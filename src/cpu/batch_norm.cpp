// BatchNorm family, CPU kernels: one source compiled for SSE4, AVX2, AVX-512 and a portable target
// (Highway), chosen at run time (batch_norm::run); the six ops' descriptors become Jobs in
// batch_norm_entries.cpp.
//
// Every op of the family is plan -> reduce -> combine -> finish -> apply (Job, in batch_norm.hpp): both fused
// ops reduce every channel over its Mc = n·spatial values, then make one elementwise pass; the
// split's reduce halves stop at the channel sums, its apply halves start from given ones.
// The values of a channel are cut into pieces fixed by the shape (and the target's lane count);
// each piece is summed into vector accumulators and the piece partials are combined by a fixed
// pairwise tree, so results are the same bits for any thread count and schedule. Two forms, chosen
// from the shape:
//   columns: the tensor as rows of P contiguous values (NHWC: a position's C channels; NCHW with a
//            short spatial run: a sample's C·spatial values, a channel's `spatial` columns
//            adjacent). Rows narrower than kMinWidth are taken k at a time as super-rows. A piece
//            is up to 128 super-rows of a block of whole channels: each column accumulates down
//            the rows in a vector lane, then a channel's k replicas of a column are added
//            pairwise and its adjacent columns folded as a run (below).
//   planes:  NCHW with spatial >= kPlaneMin, and any single channel: each (sample, channel) run is
//            contiguous; a piece is a segment of 512 vectors of it.
// A run is folded in FoldBlocks' order: vector block b into accumulator b mod 4, the four combined
// pairwise, then the lanes pairwise. So a term passes through at most 128 sequential additions
// down its accumulator, ceil(log2 k) replica levels, a fold of the channel's spatial < 1024 columns
// (spatial/(4·lanes) + 2 + log2(lanes) <= 131 additions, far fewer on the x86 targets) and one
// addition per tree level: at most 261 + log2(Mc) for Mc >= 256, against the min(Mc, 256) +
// 4·log2(Mc) + 8 that the tolerance model in check/harness/tolerance.cpp allows (below 256 terms
// no order exceeds Mc - 1).
// The forward's statistics are a mean m and the sums of (x - m)² and (x - m) inside each piece (the
// piece is still in cache for the second sweep): stable for data far from zero, and X is read from
// memory once for them. Each piece then becomes its sums about the shift K = input_mean in f64
// (combine), which add across pieces, and across the participants of a data-parallel step
// (BatchNormStatsReduce); the variance is formed from them in f64 (finish_from).
//
// Traffic (which passes read what from memory, where runs start, non-temporal stores): written
// out once, in docs/ops/batch_norm.md's CPU implementation section.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "cpu/batch_norm.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include <algorithm>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "core/workspace.hpp"
#include "cpu/batch_norm.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "cpu/simd-inl.h"
#include "cpu/simd.hpp"
#include "hwy/cache_control.h"
#include "hwy/highway.h"


HWY_BEFORE_NAMESPACE();
namespace gradops::cpu::HWY_NAMESPACE {
namespace {

using namespace ::gradops::cpu::batch_norm;  // Job, Mode, Plan and the tuning constants

template <class D> using V = hn::Vec<D>;

// ---- per-channel values of any storage type -------------------------------------------------------

template <class A>
A load_as(DType t, const void* p, int64_t i) {
  return visit_dtype(t, [&](auto tag) { return load<A>(static_cast<const decltype(tag)*>(p), i); });
}
template <class A>
void store_as(DType t, void* p, int64_t i, A v) {
  if (p) visit_dtype(t, [&](auto tag) { store(static_cast<decltype(tag)*>(p), i, v); });
}

// ---- fixed-order sums ---------------------------------------------------------------------------

// The sum of term(j, valid) over the blocks of [0, n) in FoldBlocks' order (block b into
// accumulator b mod 4, combined pairwise), then the lanes pairwise; a partial block's lanes past
// `valid` are dropped.
template <class D, class Term>
HWY_INLINE hn::TFromD<D> SumOf(D d, int64_t n, Term term) {
  using A = hn::TFromD<D>;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto acc = FoldBlocks(
      d, n, hn::Zero(d),
      [=](V<D> a, int64_t j, int64_t valid) HWY_ATTR {
        auto t = term(j, valid);
        if (valid < L) t = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), t);
        return hn::Add(a, t);
      },
      [](V<D> a, V<D> b) HWY_ATTR { return hn::Add(a, b); });
  return ReduceLanes(d, acc, [](A a, A b) { return a + b; });
}

// Software prefetch for inputs streamed from memory, kPrefetchBytes ahead as PrefetchAhead, but
// into L2 only (an L1 request holds one of the line fill buffers the non-temporal stores need, and
// the fused write pass re-reads its inputs from L2 anyway), and once per 64-byte line: `j` counts
// elements from the run's start in blocks of `lanes`, and blocks narrower than a line (16-bit
// types) ask every other time.
template <class T>
HWY_INLINE void PrefetchLine(const T* p, int64_t j, int64_t lanes) {
  constexpr int64_t kLine = 64 / static_cast<int64_t>(sizeof(T));
  if ((j & (kLine - 1)) < lanes) __builtin_prefetch(p, 0, 2);
}

// ---- the kernel ---------------------------------------------------------------------------------

template <class T, bool kGrad, bool kStream>
class Kernel {
 public:
  using D = ComputeTag<T>;
  using A = hn::TFromD<D>;

  Kernel(const Job& job, const Context& ctx) : d_(job), ctx_(ctx) {}

  Status run() {
    // ---- plan ----
    p_ = batch_norm::make_plan(d_, L);
    const int64_t c = p_.c, threads = max_threads(ctx_);
    const Mode mode = d_.mode;
    x_ = static_cast<const T*>(d_.x);
    dy_ = kGrad ? static_cast<const T*>(d_.dy) : nullptr;
    out_ = static_cast<T*>(kGrad ? d_.dx : d_.y);

    // Fused tasks: blocks of cb whole channels whose inputs fit kTaskBytes, at least
    // kTasksPerThread per thread.
    const int64_t in_bytes = static_cast<int64_t>(sizeof(T)) * (kGrad ? 2 : 1);
    int64_t cb = std::max<int64_t>(1, kTaskBytes / (std::max<int64_t>(p_.count, 1) * in_bytes));
    if (!p_.planes) cb = std::min(cb, kMaxCols / p_.group);
    block_ = std::max<int64_t>(1, std::min(cb, chunk_count(c, kTasksPerThread * threads)));
    fused_ = mode == Mode::fused && p_.count > 0 && !d_.channels_last && c > 1 && (p_.planes || p_.k == 1) &&
             (threads == 1 || c >= kTasksPerThread * threads);

    // Scratch: piece partials (three arrays in the compute type, and for the forward two more in
    // f64, where pieces become sums about the shift), per-channel vectors, per-thread column arrays
    // (accumulators and coefficients).
    const int64_t parts = mode == Mode::apply ? 0 : round_up(c * p_.pieces), vec = round_up(c);
    const int64_t dparts = kGrad ? 0 : 2 * parts;
    const bool columns = !p_.planes && p_.count > 0;
    slots_ = threads;
    slot_stride_ = columns ? 7 * kColsArray : 0;
    const int64_t total = (kGrad ? 2 : 3) * parts + 6 * vec + slots_ * slot_stride_;
    if (Status s = ws_.allocate(ctx_, Device::cpu(), sizeof(A) * static_cast<std::size_t>(std::max<int64_t>(total, 1)),
                                d_.op_name);
        !s)
      return s;
    if (Status s = dws_.allocate(ctx_, Device::cpu(), sizeof(double) * static_cast<std::size_t>(dparts + vec),
                                 d_.op_name);
        !s)
      return s;
    A* w = ws_.as<A>();
    part1_ = w, part2_ = w + parts, part3_ = kGrad ? nullptr : w + 2 * parts, w += (kGrad ? 2 : 3) * parts;
    for (A*& v : vec_) v = w, w += vec;
    slot_base_ = w, w += slots_ * slot_stride_;
    double* dw = dws_.as<double>();
    shift_ = dw, dpart1_ = dw + vec, dpart2_ = dw + vec + parts;

    // Setup, a share per slot: its column arrays zeroed (partial vectors read their slack, unused)
    // and a slice of the channels' loads and apply finish, 20-30 ns a channel: every thread from
    // kSetupMinChannels on, else one (lab/cpu/NOTES.md section 22).
    const double count = mode == Mode::apply ? batch_norm::load_sum(d_.sums_in, 2 * c) : 0.0;
    parallel_for(slots_, c >= kSetupMinChannels ? 1 : slots_, ctx_, [&](int64_t s0, int64_t s1) {
      std::fill(slot_array(s0, 0), slot_array(s1, 0), A(0));
      for (int64_t ch = s0 * c / slots_; ch < s1 * c / slots_; ++ch) setup_channel(ch, mode, count);
    });
    if (mode == Mode::apply) {  // the sums are given and finished: the elementwise pass
      if (p_.count > 0) write_all();
      return {};
    }
    if (p_.count == 0) {  // no values: empty sums, nothing to write
      if (mode == Mode::reduce) {
        for (int64_t i = 0; i <= 2 * c; ++i) batch_norm::store_sum(d_.sums_out, i, 0.0);
      } else {
        for (int64_t ch = 0; ch < c; ++ch) finish_from(ch, 0, 0, 0);
      }
      return {};
    }
    if (fused_) {
      const int64_t blocks = chunk_count(c, block_);
      ForEachSlot(blocks, slot_count(blocks, kGrain / (block_ * p_.count), ctx_), ctx_,
                  [&](int64_t b0, int64_t b1, int64_t slot) { fused_range(b0, b1, slot); });
      return {};
    }
    // ---- reduce, combine ----
    reduce_all();
    // A piece costs tens of nanoseconds to combine (in f64 for the forward): one thread for few
    // pieces, else every thread (lab/cpu/NOTES.md sections 18 and 22).
    parallel_for(c, c * p_.pieces < kCombineMin ? c : chunk_count(c, max_threads(ctx_)), ctx_, [&](int64_t c0, int64_t c1) {
      for (int64_t ch = c0; ch < c1; ++ch) close_channel(ch, mode);
    });
    if (mode == Mode::reduce) {
      batch_norm::store_sum(d_.sums_out, 2 * c, static_cast<double>(p_.count));
      return {};
    }
    // ---- apply ----
    write_all();
    return {};
  }

 private:
  // Fixed-width targets only (x86 and the portable one): Lanes == MaxLanes.
  static constexpr int64_t L = static_cast<int64_t>(hn::MaxLanes(D()));
  static constexpr int64_t kStreamUnit = L * kStreamVectors<D, T>;  // elements a non-temporal store writes
  // The coefficient arrays (3..6) start kHead in, where a fused run's head takes the columns
  // before its block's (columns_span).
  static constexpr int64_t kHead = (kStreamUnit + 15) / 16 * 16;
  static constexpr int64_t kColsArray = (kHead + kMaxCols + L + 15) / 16 * 16;  // one column array, with slack
  static int64_t round_up(int64_t n) { return (n + 15) / 16 * 16; }     // keeps arrays 64-byte aligned

  // Outputs to write: [off, off + n), channel ch's but for the first `head`, channel ch - 1's (ch:
  // the planes form's; the columns form takes each column's coefficients from the slot's arrays).
  struct Span {
    int64_t off = 0, n = 0, head = 0, ch = 0;
  };

  A* slot_array(int64_t slot, int i) const { return slot_base_ + slot * slot_stride_ + i * kColsArray; }
  int64_t part(int64_t ch, int64_t q) const { return q * p_.c + ch; }
  int64_t prefetch_ahead() const { return kPrefetchBytes / static_cast<int64_t>(sizeof(T)); }
  // Columns form, a block of wn columns per row: prefetch along the row into the next when the
  // block is the whole row (rows adjacent), else the next row's same columns.
  int64_t columns_ahead(int64_t wn) const { return wn == p_.width ? prefetch_ahead() : p_.width; }

  // A vector's elementwise coefficients: a, b, c (grad only) and mean, lane by lane.
  struct Coefs {
    V<D> a, b, c, m;
    // mask's lanes from x, the others from y.
    static HWY_INLINE Coefs select(hn::Mask<D> mask, const Coefs& x, const Coefs& y) {
      return {hn::IfThenElse(mask, x.a, y.a), hn::IfThenElse(mask, x.b, y.b), hn::IfThenElse(mask, x.c, y.c),
              hn::IfThenElse(mask, x.m, y.m)};
    }
  };
  // The per-channel coefficient arrays, copied out of the kernel so that a loop storing through
  // out_ need not reload them; (ch) broadcasts channel ch's.
  struct Channels {
    const A *a, *b, *c, *m;
    HWY_INLINE Coefs operator()(int64_t ch) const {
      const D d;
      return {hn::Set(d, a[ch]), hn::Set(d, b[ch]), hn::Set(d, c[ch]), hn::Set(d, m[ch])};
    }
  };
  Channels channels() const { return {ca_, cb_, kGrad ? cc_ : ca_, mean_}; }  // the forward's c is unused

  // The outputs of the vector at j from its coefficients: the grad's dX = a·dY + (c·(x − mean) + b),
  // the forward's Y = (x − mean)·a + b, x − mean formed before any scaling. Every write path
  // computes its values here; they differ only in where the coefficients come from.
  // kPrefetch: the inputs `ahead` elements on are asked for too.
  template <bool kPrefetch>
  static HWY_INLINE V<D> output(const T* x, const T* g, int64_t j, int64_t valid, int64_t ahead, const Coefs& k) {
    const D d;
    if constexpr (kPrefetch) PrefetchLine(x + j + ahead, j, L);
    const auto e = hn::Sub(LoadWideN(d, x + j, valid), k.m);
    if constexpr (kGrad) {
      if constexpr (kPrefetch) PrefetchLine(g + j + ahead, j, L);
      return hn::MulAdd(k.a, LoadWideN(d, g + j, valid), hn::MulAdd(k.c, e, k.b));
    } else {
      return hn::MulAdd(e, k.a, k.b);
    }
  }
  // The same with the coefficients of columns at cf in the slot's arrays (stride kColsArray).
  template <bool kPrefetch>
  static HWY_INLINE V<D> output_at(const T* x, const T* g, int64_t j, int64_t valid, int64_t ahead, const A* cf) {
    const D d;
    constexpr int64_t K = kColsArray;
    return output<kPrefetch>(x, g, j, valid, ahead,
                             {hn::LoadU(d, cf), hn::LoadU(d, cf + K), hn::LoadU(d, cf + 2 * K), hn::LoadU(d, cf + 3 * K)});
  }

  // ---- one run: a reduction sweep over one run while writing another -------------------------

  // Columns form, with the slot's arrays at sb (slot_array order: acc, acc2, mu, then the write's
  // coefficients a, b, c, mean; one register addresses them all). Reduces the nr values at off_r
  // into column accumulators (kSweep 1: acc += dY and acc2 += dY·(x - mu) for the grad, acc += x
  // for the forward; kSweep 2: acc += (x - mu)², from cache, no prefetch), prefetching the inputs
  // at j + ahead_r, while writing the nw outputs at off_w (kPrefetchW: prefetching j + ahead_w),
  // which lie `back` columns before the coefficient arrays' first.
  template <int kSweep, bool kPrefetchW>
  void columns_run(int64_t off_r, int64_t nr, int64_t ahead_r, A* sb, int64_t off_w, int64_t nw, int64_t ahead_w,
                   int64_t back = 0) {
    const D d;
    constexpr int64_t K = kColsArray;
    const T* xr = x_ + off_r;
    const T* gr = kGrad ? dy_ + off_r : nullptr;
    auto step = [=](V<D> unused, int64_t j, int64_t valid) HWY_ATTR {
      if constexpr (kSweep > 0) {
        A* acc = sb + j;
        if constexpr (kSweep == 1) PrefetchLine(xr + j + ahead_r, j, L);
        const auto xv = LoadWideN(d, xr + j, valid);
        if constexpr (kGrad) {
          PrefetchLine(gr + j + ahead_r, j, L);
          const auto gv = LoadWideN(d, gr + j, valid);
          auto e = hn::Sub(xv, hn::Load(d, acc + 2 * K));
          if (valid < L) e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), e);
          hn::Store(hn::Add(hn::Load(d, acc), gv), d, acc);
          hn::Store(hn::MulAdd(gv, e, hn::Load(d, acc + K)), d, acc + K);
        } else if constexpr (kSweep == 2) {
          auto e = hn::Sub(xv, hn::Load(d, acc + 2 * K));
          if (valid < L) e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), e);
          hn::Store(hn::MulAdd(e, e, hn::Load(d, acc)), d, acc);
          hn::Store(hn::Add(hn::Load(d, acc + K), e), d, acc + K);
        } else {
          hn::Store(hn::Add(hn::Load(d, acc), xv), d, acc);
        }
      }
      return unused;
    };
    const T* xw = x_ + off_w;
    const T* gw = kGrad ? dy_ + off_w : nullptr;
    const A* coef = sb + 3 * K + kHead - back;
    auto value = [=](int64_t j, int64_t valid) HWY_ATTR {
      return output_at<kPrefetchW>(xw, gw, j, valid, ahead_w, coef + j);  // a, b, c, mean at stride K
    };
    FoldBlocksWriting<kStream>(d, kSweep > 0 ? nr : 0, hn::Zero(d), step, [](V<D> u, V<D>) HWY_ATTR { return u; },
                               out_ ? out_ + off_w : nullptr, nw, value);
  }

  // Columns form, writing only: the n outputs at off_w, a run of whole super-rows from a row's
  // start (the last one possibly shorter), with the coefficients of the whole row at sb as
  // columns_run has them. Written row by row, each row's ends shared a cache line with its
  // neighbours' where the tensor does not start on a line (numpy's arrays start 16 bytes past
  // one), and each such line took normal stores beside the streaming ones: bf16 NHWC 32x56x56x256
  // wrote 40% slower there than on an aligned base.
  void rows_run(int64_t off_w, int64_t n, A* sb) {
    const D d;
    constexpr int64_t K = kColsArray;
    const int64_t ahead = prefetch_ahead();
    const FastMod column(static_cast<uint32_t>(p_.width));
    const T* xw = x_ + off_w;
    const T* gw = kGrad ? dy_ + off_w : nullptr;
    auto value = [=](int64_t j, int64_t valid) HWY_ATTR {
      // A vector that crosses a row's end reads the wrapped copies spread_coefficients leaves past it.
      const A* cf = sb + 3 * K + kHead + column(static_cast<uint32_t>(j));  // a, b, c, mean
      return output_at<true>(xw, gw, j, valid, ahead, cf);
    };
    WriteRun<kStream>(d, out_ + off_w, n, value);
  }

  // Planes form, writing only: planes [t0, t1), contiguous, as one run (planes written one a run
  // shared a cache line at each end where the tensor does not start on one, as rows_run's rows
  // did). A vector that crosses from one plane into the next takes each lane's own channel.
  void planes_joined(int64_t t0, int64_t t1) {
    const D d;
    const int64_t s = p_.s, ahead = prefetch_ahead();
    const FastMod plane(static_cast<uint32_t>(s)), channel(static_cast<uint32_t>(p_.c));
    const Channels coefs = channels();
    const T* xw = x_ + t0 * s;
    const T* gw = kGrad ? dy_ + t0 * s : nullptr;
    const uint32_t first = static_cast<uint32_t>(t0), c = static_cast<uint32_t>(p_.c);
    auto value = [=](int64_t j, int64_t valid) HWY_ATTR {
      const uint32_t q = plane.quotient(static_cast<uint32_t>(j));
      const int64_t into = j - static_cast<int64_t>(q) * s;  // position in plane q
      const uint32_t ch = channel(first + q);
      Coefs k = coefs(ch);
      if (into + L > s)  // lanes s - into and on are the next plane's
        k = Coefs::select(hn::FirstN(d, static_cast<size_t>(s - into)), k, coefs(ch + 1 == c ? 0 : ch + 1));
      return output<true>(xw, gw, j, valid, ahead, k);
    };
    WriteRun<kStream>(d, out_ + t0 * s, (t1 - t0) * s, value);
  }

  // Planes form. Sums the nr values at off_r (kSweep 1: grad *s1 = Σ dY, *s2 = Σ dY·(x - mu),
  // forward *s1 = Σ x; kSweep 2: *s1 = Σ (x - mu)², *s2 = Σ (x - mu), from cache), prefetching into `next` past the
  // run's end, while writing the outputs of span w (prefetching ahead_w on where that is not 0).
  template <int kSweep>
  void planes_run(int64_t off_r, int64_t nr, int64_t next_r, A mu, A* s1, A* s2, Span w, int64_t ahead_w) {
    const D d;
    const T* xr = x_ + off_r;
    const T* gr = kGrad ? dy_ + off_r : nullptr;
    const int64_t ahead = prefetch_ahead();
    const int64_t skip = next_r - off_r - nr;  // from the run's end to the next run
    const auto vmu = hn::Set(d, mu);
    // The grad's second sum: accumulator b mod 4 of FoldBlocks' order, kept in memory by the step.
    HWY_ALIGN A second[4 * L] = {};
    A* sec = second;
    auto step = [=](V<D> acc, int64_t j, int64_t valid) HWY_ATTR {
      if constexpr (kSweep == 0) {
        return acc;
      } else {
        const int64_t at = j + ahead < nr ? j + ahead : j + ahead + skip;
        if constexpr (kSweep == 1) PrefetchLine(xr + at, j, L);
        const auto xv = LoadWideN(d, xr + j, valid);
        if constexpr (kSweep == 2) {
          auto e = hn::Sub(xv, vmu);
          if (valid < L) e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), e);
          A* s = sec + ((j / L) & 3) * L;
          hn::Store(hn::Add(e, hn::Load(d, s)), d, s);
          return hn::MulAdd(e, e, acc);
        } else if constexpr (kGrad) {
          PrefetchLine(gr + at, j, L);
          const auto gv = LoadWideN(d, gr + j, valid);
          auto e = hn::Sub(xv, vmu);
          if (valid < L) e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(valid)), e);
          A* s = sec + ((j / L) & 3) * L;
          hn::Store(hn::MulAdd(gv, e, hn::Load(d, s)), d, s);
          return hn::Add(acc, gv);
        } else {
          return hn::Add(acc, xv);
        }
      }
    };
    const Channels coefs = channels();
    const auto zero = hn::Zero(d);
    const Coefs k = w.n > 0 ? coefs(w.ch) : Coefs{zero, zero, zero, zero};  // no span: no channel's values read
    // The head (the plane before's last values) goes out first as one stream unit of its own, so
    // that the loop below keeps one channel's coefficients (a test in its values cost the fused
    // forward a fifth of its speed).
    int64_t done = 0;
    if (w.head > 0) {
      done = std::min(w.n, kStreamUnit);
      const int64_t head = w.head;
      const Coefs before = coefs(w.ch - 1);
      const T* xh = x_ + w.off;
      const T* gh = kGrad ? dy_ + w.off : nullptr;
      WriteRun<kStream>(d, out_ + w.off, done, [=](int64_t j, int64_t valid) HWY_ATTR {
        const auto earlier = hn::FirstN(d, static_cast<size_t>(std::max<int64_t>(head - j, 0)));
        return output<false>(xh, gh, j, valid, 0, Coefs::select(earlier, before, k));
      });
    }
    const T* xw = x_ + w.off + done;
    const T* gw = kGrad ? dy_ + w.off + done : nullptr;
    auto value = [=](int64_t j, int64_t valid) HWY_ATTR {
      return ahead_w ? output<true>(xw, gw, j, valid, ahead_w, k) : output<false>(xw, gw, j, valid, 0, k);
    };
    const auto total = FoldBlocksWriting<kStream>(d, kSweep > 0 ? nr : 0, hn::Zero(d), step,
                                                  [](V<D> u, V<D> v) HWY_ATTR { return hn::Add(u, v); },
                                                  out_ ? out_ + w.off + done : nullptr, w.n - done, value);
    if constexpr (kSweep > 0) {
      const auto plus = [](A u, A v) { return u + v; };
      *s1 = ReduceLanes(d, total, plus);
      if constexpr ((kGrad && kSweep == 1) || kSweep == 2) {
        const auto s = hn::Add(hn::Add(hn::Load(d, sec), hn::Load(d, sec + L)),
                               hn::Add(hn::Load(d, sec + 2 * L), hn::Load(d, sec + 3 * L)));
        *s2 = ReduceLanes(d, s, plus);
      }
    }
  }

  // ---- pieces ----

  // Columns: piece q of the channels of columns [w0, w0 + wn) (a super-row's, all of them when
  // k > 1); when `write` is given (fused, k == 1), writes the same rows' columns_span(r, ...) of
  // its columns alongside, with the coefficient arrays of slot arrays 3..6.
  struct Write {
    int64_t w0 = -1, wn = 0;
    std::pair<int64_t, int64_t> mine;
  };
  void columns_piece(int64_t q, int64_t w0, int64_t wn, Write write, int64_t slot) {
    A* acc = slot_array(slot, 0);
    A* acc2 = slot_array(slot, 1);
    A* mu = slot_array(slot, 2);
    const int64_t r0 = q * kChain, r1 = std::min(p_.srows, r0 + kChain), stride = p_.width;
    const int64_t ahead = columns_ahead(wn);
    const int64_t span = (wn + L - 1) / L * L;
    auto sweep = [&](auto tag) {
      constexpr int kSweep = decltype(tag)::value;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t n = std::min(wn, p_.srow_width(r) - w0);
        const Span w = kSweep == 1 && write.w0 >= 0 ? columns_span(r, write.w0, write.wn, write.mine) : Span{};
        columns_run<kSweep, false>(r * stride + w0, n, ahead, acc, w.off, w.n, 0, w.head);
      }
    };
    std::fill(acc, acc + span, A(0));
    if constexpr (kGrad) {
      std::fill(acc2, acc2 + span, A(0));
      spread(mean_, w0, wn, mu);
      sweep(std::integral_constant<int, 1>());
      fold_columns(acc, w0, wn, q, part1_);
      fold_columns(acc2, w0, wn, q, part2_);
    } else {
      sweep(std::integral_constant<int, 1>());
      fold_columns(acc, w0, wn, q, part1_);
      // Piece means, spread back over the columns, for the squared deviations.
      const A cnt = static_cast<A>(p_.values_upto(q + 1) - p_.values_upto(q));
      const int64_t c0 = p_.channel_of(w0), c1 = p_.k > 1 ? p_.c : c0 + wn / p_.group;
      for (int64_t ch = c0; ch < c1; ++ch) part1_[part(ch, q)] /= cnt;
      spread(part1_ + part(0, q), w0, wn, mu);
      std::fill(acc, acc + span, A(0));
      std::fill(acc2, acc2 + span, A(0));
      sweep(std::integral_constant<int, 2>());
      fold_columns(acc, w0, wn, q, part2_);
      fold_columns(acc2, w0, wn, q, part3_);
    }
  }

  // Columns: the channel sums of acc over the block's columns [0, wn) starting at column w0 of a
  // super-row, into piece q of each channel the block holds.
  void fold_columns(A* acc, int64_t w0, int64_t wn, int64_t q, A* dst) {
    const D d;
    const int64_t P = p_.period, g = p_.group;
    if (p_.k > 1) {  // the k replicas of each column, pairwise (the block is the whole super-row)
      for (int64_t step = 1; step < p_.k; step *= 2)
        for (int64_t r = 0; r + step < p_.k; r += 2 * step) {
          A* a = acc + r * P;
          const A* b = acc + (r + step) * P;
          int64_t w = 0;
          for (; w + L <= P; w += L) hn::StoreU(hn::Add(hn::LoadU(d, a + w), hn::LoadU(d, b + w)), d, a + w);
          for (; w < P; ++w) a[w] += b[w];
        }
      wn = P;
    }
    const int64_t c0 = p_.channel_of(w0), c1 = c0 + wn / g;
    for (int64_t ch = c0; ch < c1; ++ch) {
      const A* col = acc + (ch - c0) * g;
      dst[part(ch, q)] =
          g == 1 ? col[0] : SumOf(d, g, [=](int64_t j, int64_t) HWY_ATTR { return hn::LoadU(d, col + j); });
    }
  }

  // Planes: the pieces of channel ch (all samples, all segments); when ch_w >= 0, writes channel
  // ch_w's same segments alongside (fused_span, the thread's channels [mine.first, mine.second)).
  // `last`: the offset the thread reads after the channel.
  void planes_channel(int64_t ch, int64_t ch_w, int64_t last, std::pair<int64_t, int64_t> mine) {
    for (int64_t i = 0; i < p_.n; ++i)
      for (int64_t g = 0; g < p_.segs; ++g) {
        const int64_t off = (i * p_.c + ch) * p_.s + g * p_.seg, len = std::min(p_.seg, p_.s - g * p_.seg);
        const int64_t next = g + 1 < p_.segs ? off + len : i + 1 < p_.n ? ((i + 1) * p_.c + ch) * p_.s : last;
        planes_piece(ch, i * p_.segs + g, off, len, next, ch_w >= 0 ? fused_span(i, ch_w, g, mine) : Span{});
      }
  }

  // Planes: piece q of channel ch, the run of len values at off (then reading `next`), writing
  // span w alongside.
  void planes_piece(int64_t ch, int64_t q, int64_t off, int64_t len, int64_t next, Span w) {
    A* s1 = part1_ + part(ch, q);
    A* s2 = part2_ + part(ch, q);
    if constexpr (kGrad) {
      planes_run<1>(off, len, next, mean_[ch], s1, s2, w, 0);
    } else {
      A sum;
      planes_run<1>(off, len, next, A(0), &sum, nullptr, w, 0);
      *s1 = sum / static_cast<A>(len);
      planes_run<2>(off, len, next, *s1, s2, part3_ + part(ch, q), Span{}, 0);
    }
  }

  // Fused planes: the outputs of segment g of plane (i, ch). A run that ends inside a cache line
  // shares it with the next run, and each writes its part with normal stores beside its streaming
  // ones: on a base 16 bytes past a line, as numpy's arrays are, bf16 32x256x56x56 wrote 15-24%
  // slower. So each end moves down to a stream store's boundary, the span then starting with the
  // end of the plane before (its `head`) - except at the ends of the thread's channels
  // [mine.first, mine.second), whose neighbours another thread writes, or this one before their
  // coefficients are known.
  Span fused_span(int64_t i, int64_t ch, int64_t g, std::pair<int64_t, int64_t> mine) const {
    const int64_t start = (i * p_.c + ch) * p_.s + g * p_.seg;
    const int64_t end = g + 1 < p_.segs ? start + p_.seg : (i * p_.c + ch + 1) * p_.s;
    const int64_t w0 = g == 0 && ch == mine.first ? start : stream_floor(start);
    const int64_t w1 = g + 1 == p_.segs && ch + 1 == mine.second ? end : stream_floor(end);
    return {w0, w1 - w0, g == 0 ? start - w0 : 0, ch};  // a later segment's head is its own plane's
  }

  // The same for the columns form (fused, k == 1): row r's outputs of columns [w0, w0 + wn), whole
  // channels, each end moved down to a stream store's boundary where the thread has the channel
  // before it (the run's head is that channel's end) and the one after. Not where a channel is
  // shorter than a store: the head would span several.
  Span columns_span(int64_t r, int64_t w0, int64_t wn, std::pair<int64_t, int64_t> mine) const {
    const int64_t start = r * p_.period + w0, end = start + wn;
    const bool ends = p_.group >= kStreamUnit;
    const int64_t a = !ends || w0 == mine.first * p_.group ? start : stream_floor(start);
    const int64_t b = !ends || w0 + wn == mine.second * p_.group ? end : stream_floor(end);
    return {a, b - a, start - a, 0};
  }

  // The stream store boundary at or below out_ + pos (pos itself when nothing streams).
  int64_t stream_floor(int64_t pos) const {
    if (!kStream || !out_) return pos;
    constexpr auto kUnit = static_cast<uintptr_t>(kStreamUnit) * sizeof(T);
    const auto addr = reinterpret_cast<uintptr_t>(out_ + pos);
    return addr % sizeof(T) ? pos : pos - static_cast<int64_t>(addr % kUnit / sizeof(T));
  }

  // dst[w] = v[channel of column w0 + w], w in [0, wn): a channel's runs of adjacent columns, no
  // division per column; where a column is a channel (NHWC), runs of channels copied at once.
  void spread(const A* v, int64_t w0, int64_t wn, A* dst) const {
    const int64_t col = w0 % p_.period;
    int64_t ch = col / p_.group, in = col % p_.group;
    if (p_.group == 1) {
      for (int64_t w = 0; w < wn; ch = 0) {
        const int64_t len = std::min(p_.c - ch, wn - w);
        std::copy(v + ch, v + ch + len, dst + w);
        w += len;
      }
      return;
    }
    for (int64_t w = 0; w < wn; in = 0, ch = ch + 1 == p_.c ? 0 : ch + 1) {
      const int64_t len = std::min(p_.group - in, wn - w);
      std::fill(dst + w, dst + w + len, v[ch]);
      w += len;
    }
  }

  // Per-column coefficients a, b, c, mean for columns [w0, w0 + wn) into the slot's arrays 3..6,
  // each followed by its first L values again: a vector that crosses the end of a whole row
  // (rows_run) takes the next row's first columns there; elsewhere the copies are read by partial
  // vectors' unused lanes only.
  // `before`: the columns before w0 too (at most kHead, w0 - before >= 0), for a fused run's head.
  void spread_coefficients(int64_t w0, int64_t wn, int64_t slot, int64_t before = 0) const {
    const A* from[4] = {ca_, cb_, kGrad ? cc_ : ca_, mean_};
    for (int i = 0; i < 4; ++i) {
      A* cf = slot_array(slot, 3 + i) + kHead;
      spread(from[i], w0 - before, wn + before, cf - before);
      for (int64_t j = 0; j < L; ++j) cf[wn + j] = cf[j % wn];
    }
  }

  // Channel ch's parameters in the compute type (grad) or its shift (forward), and for the apply
  // half its finish from the given sums over `count` values.
  void setup_channel(int64_t ch, Mode mode, double count) {
    if constexpr (kGrad) {
      if (mode != Mode::reduce) scale_[ch] = load_as<A>(d_.t1, d_.scale, ch);
      mean_[ch] = load_as<A>(d_.t2, d_.mean, ch);
      istd_[ch] = load_as<A>(d_.t2, d_.inv_std, ch);
    } else {
      // Any value every participant shares serves as the shift; a non-finite running mean must
      // not poison the batch's statistics, so it is replaced by 0.
      const double k = load_as<double>(d_.t2, d_.input_mean, ch);
      shift_[ch] = std::isfinite(k) ? k : 0.0;
    }
    if (mode == Mode::apply)
      finish_from(ch, batch_norm::load_sum(d_.sums_in, ch), batch_norm::load_sum(d_.sums_in, p_.c + ch), count);
  }

  // ---- combining, per channel ----

  // Pairwise tree over the channel's pieces. Grad: the totals end in piece 0. Forward: each piece's
  // (mean m, Σ (x − m)², Σ (x − m)) first becomes its sums about the shift K in f64,
  //   Σ (x − K) = Σ (x − m) + n·(m − K),   Σ (x − K)² = Σ (x − m)² + 2·(m − K)·Σ (x − m) + n·(m − K)²,
  // exact identities whose terms carry no cancellation (the piece's deviations are small, and the
  // f64 terms hold (m − K)² with 53 bits), then the pieces are added; the totals end in piece 0 of
  // the f64 arrays. Sums about a shift that every participant shares are what participants can add.
  void combine(int64_t ch) {
    const int64_t nq = p_.pieces;
    if constexpr (kGrad) {
      for (int64_t step = 1; step < nq; step *= 2)
        for (int64_t q = 0; q + step < nq; q += 2 * step) {
          part1_[part(ch, q)] += part1_[part(ch, q + step)];
          part2_[part(ch, q)] += part2_[part(ch, q + step)];
        }
    } else {
      double* s1 = dpart1_ + ch * nq;
      double* s2 = dpart2_ + ch * nq;
      const double k = shift_[ch];
      for (int64_t q = 0; q < nq; ++q) {
        const double n = static_cast<double>(p_.values_upto(q + 1) - p_.values_upto(q));
        const double delta = static_cast<double>(part1_[part(ch, q)]) - k;
        const double rq = static_cast<double>(part3_[part(ch, q)]);
        if (!std::isfinite(delta)) {  // an infinite or NaN value in the piece: the sums are too
          s1[q] = n * delta;
          s2[q] = n * delta * delta;
          continue;
        }
        s1[q] = rq + n * delta;
        s2[q] = static_cast<double>(part2_[part(ch, q)]) + 2 * delta * rq + n * delta * delta;
      }
      for (int64_t step = 1; step < nq; step *= 2)
        for (int64_t q = 0; q + step < nq; q += 2 * step) {
          s1[q] += s1[q + step];
          s2[q] += s2[q + step];
        }
    }
  }

  // The channel's two sums, as the split's reduce half stores them: grad Σ dY and Σ dY·x̂ (the
  // latter istd·Σ dY·(x − mean), in the compute type, as the fused op forms it); forward Σ (x − K)
  // and Σ (x − K)². f64 holds the compute type's values exactly.
  std::pair<double, double> channel_sums(int64_t ch) const {
    if (p_.count == 0) return {0.0, 0.0};
    if constexpr (kGrad) return {static_cast<double>(part1_[ch]), static_cast<double>(istd_[ch] * part2_[ch])};
    return {dpart1_[ch * p_.pieces], dpart2_[ch * p_.pieces]};
  }

  // Channel ch's pieces combined, then its outputs and coefficients (the reduce half: its sums
  // stored instead).
  void close_channel(int64_t ch, Mode mode) {
    combine(ch);
    const auto [s1, s2] = channel_sums(ch);
    if (mode != Mode::reduce) {
      finish_from(ch, s1, s2, static_cast<double>(p_.count));
      return;
    }
    batch_norm::store_sum(d_.sums_out, ch, s1);
    batch_norm::store_sum(d_.sums_out, p_.c + ch, s2);
  }

  // The channel's outputs and its elementwise coefficients from its two sums over `count` values
  // (this call's, or every participant's for the split's apply half).
  void finish_from(int64_t ch, double sum1, double sum2, double count) {
    if constexpr (kGrad) {
      // dX = k (dY - S1/Mc - xhat S2/Mc), k = scale·istd, as a·dY + b + c·(x - mean) so that
      // x - mean is formed before any scaling (x may sit far from zero). The sums hold values of
      // the compute type when they come from one reduce; a sum over several is rounded to it once.
      const A inv_count = count > 0 ? A(1) / static_cast<A>(count) : A(0);
      const A s1 = static_cast<A>(sum1), s2 = static_cast<A>(sum2);
      store_as(d_.t1, d_.dbias, ch, s1);
      store_as(d_.t1, d_.dscale, ch, s2);
      const A a = scale_[ch] * istd_[ch];
      ca_[ch] = a;
      cb_[ch] = -(a * (s1 * inv_count));
      cc_[ch] = -(a * istd_[ch]) * (s2 * inv_count);
    } else {
      // The statistics in f64 (ops/batch_norm.hpp). Read before any write: running_* may be the
      // very buffers of input_*.
      const double eps = static_cast<double>(d_.epsilon);
      const auto st = ::gradops::detail::batch_norm_channel_stats(
          shift_[ch], sum1, sum2, count, eps, static_cast<double>(d_.momentum),
          load_as<double>(d_.t2, d_.input_mean, ch), load_as<double>(d_.t2, d_.input_var, ch));
      store_as(d_.t2, d_.saved_mean, ch, static_cast<A>(st.mean));
      store_as(d_.t2, d_.saved_inv_std, ch, static_cast<A>(st.inv_std));
      store_as(d_.t2, d_.running_mean, ch, static_cast<A>(st.running_mean));
      store_as(d_.t2, d_.running_var, ch, static_cast<A>(st.running_var));
      mean_[ch] = static_cast<A>(st.mean);
      ca_[ch] = static_cast<A>(st.y_scale(load_as<double>(d_.t1, d_.scale, ch), eps));
      cb_[ch] = load_as<A>(d_.t1, d_.bias, ch);
    }
  }

  // ---- fused: blocks of whole channels, both passes ----

  // Blocks [b0, b1) on one thread. The write pass of block b runs in one loop with the reduction
  // of block b + 1 (the same geometry, cb channels further on), so that reads from memory go on
  // while block b's outputs are written from its inputs still in L2: one block later, in the same
  // order, so each input is re-read after one block's worth of other reads.
  void fused_range(int64_t b0, int64_t b1, int64_t slot) {
    auto channels = [&](int64_t b) { return std::min(p_.c, (b + 1) * block_) - b * block_; };
    const std::pair<int64_t, int64_t> mine{b0 * block_, std::min(p_.c, b1 * block_)};
    reduce_block(b0, -1, slot, mine);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t c0 = b * block_, c1 = c0 + channels(b);
      for (int64_t ch = c0; ch < c1; ++ch) close_channel(ch, Mode::fused);
      if (!p_.planes) {  // with channel c0 - 1's last columns where block b's runs start with them
        const bool head = c0 > mine.first && p_.group >= kStreamUnit;
        spread_coefficients(c0 * p_.group, (c1 - c0) * p_.group, slot, head ? kStreamUnit : 0);
      }
      if (b + 1 < b1 && channels(b + 1) == channels(b)) {
        reduce_block(b + 1, b, slot, mine);
      } else {
        write_block(b, slot, mine);
        if (b + 1 < b1) reduce_block(b + 1, -1, slot, mine);
      }
    }
  }

  // Block b's pieces; when wb >= 0, block wb's outputs alongside (same size). `mine`: the thread's
  // channels.
  void reduce_block(int64_t b, int64_t wb, int64_t slot, std::pair<int64_t, int64_t> mine) {
    const int64_t c0 = b * block_, c1 = std::min(p_.c, c0 + block_);
    if (p_.planes) {
      for (int64_t ch = c0; ch < c1; ++ch)
        planes_channel(ch, wb >= 0 ? ch - (b - wb) * block_ : -1, (ch + 1) * p_.s, mine);
      return;
    }
    const int64_t w0 = c0 * p_.group, wn = (c1 - c0) * p_.group;
    const Write write = wb >= 0 ? Write{wb * block_ * p_.group, wn, mine} : Write{};
    for (int64_t q = 0; q < p_.pieces; ++q) columns_piece(q, w0, wn, write, slot);
  }

  // Block b's outputs alone, backwards: the inputs read last are still in cache.
  void write_block(int64_t b, int64_t slot, std::pair<int64_t, int64_t> mine) {
    const int64_t c0 = b * block_, c1 = std::min(p_.c, c0 + block_);
    if (p_.planes) {
      for (int64_t ch = c1 - 1; ch >= c0; --ch)
        for (int64_t i = p_.n - 1; i >= 0; --i)
          for (int64_t g = p_.segs - 1; g >= 0; --g)
            planes_run<0>(0, 0, 0, A(0), nullptr, nullptr, fused_span(i, ch, g, mine), 0);
      return;
    }
    const int64_t w0 = c0 * p_.group, wn = (c1 - c0) * p_.group;
    for (int64_t r = p_.rows - 1; r >= 0; --r) {
      const Span w = columns_span(r, w0, wn, mine);
      columns_run<0, false>(0, 0, 0, slot_array(slot, 0), w.off, w.n, 0, w.head);
    }
  }

  // ---- split: each pass over the whole tensor ----

  // Columns handled at once: whole channels in blocks of about equal width, the whole super-row
  // when k > 1.
  int64_t block_columns() const {
    if (p_.k > 1) return p_.width;
    const int64_t most = std::max<int64_t>(1, kMaxCols / p_.group);  // channels
    return chunk_count(p_.c, chunk_count(p_.c, most)) * p_.group;   // balanced blocks
  }

  void reduce_all() {
    const int64_t c = p_.c;
    if (p_.planes) {  // pieces (i, ch, g) in memory order
      const int64_t tasks = p_.n * c * p_.segs;
      ForEachSlot(tasks, slot_count(tasks, kGrain / p_.seg, ctx_), ctx_, [&](int64_t t0, int64_t t1, int64_t) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t g = t % p_.segs, plane = t / p_.segs;
          const int64_t off = plane * p_.s + g * p_.seg, len = std::min(p_.seg, p_.s - g * p_.seg);
          planes_piece(plane % c, (plane / c) * p_.segs + g, off, len, off + len, Span{});
        }
      });
      return;
    }
    // Pieces (q, column block). Where the pieces alone are too few tasks for the threads (NHWC with
    // 1,024 channels and more: 49 pieces of 1,024 columns at 32x14x14x1024, 3 or 4 a thread at 16
    // threads), narrower column blocks of whole channels make more; a channel's sums do not depend
    // on which of its neighbours share its task.
    int64_t bw = block_columns(), nb = chunk_count(p_.width, bw);
    const int64_t want = kTasksPerThread * max_threads(ctx_);
    if (p_.k == 1 && p_.pieces * nb < want) {
      const int64_t blocks = std::min(chunk_count(want, p_.pieces), std::max<int64_t>(1, p_.c * p_.group / kMinReduceCols));
      bw = chunk_count(p_.c, std::max(blocks, nb)) * p_.group;
      nb = chunk_count(p_.width, bw);
    }
    const int64_t tasks = p_.pieces * nb;
    const int64_t task_elems = std::min(p_.srows, kChain) * std::min(bw, p_.width);
    ForEachSlot(tasks, slot_count(tasks, kGrain / task_elems, ctx_), ctx_, [&](int64_t t0, int64_t t1, int64_t slot) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t w0 = (t % nb) * bw;
        columns_piece(t / nb, w0, std::min(bw, p_.width - w0), Write{}, slot);
      }
    });
  }

  // Each thread walks its range forwards, prefetching ahead as the reduction does. (Walking it
  // backwards, to start with what the reduction left in the caches, measured 5-12% slower on
  // tensors larger than the cache and no faster on the suite's: lab/cpu/NOTES.md, section 10.)
  void write_all() {
    const int64_t planes = p_.n * p_.c;
    if (p_.planes && p_.s >= L && p_.s <= kMaxJoinedElems && planes <= kMaxJoinedPlanes &&
        planes >= kTasksPerThread * max_threads(ctx_)) {
      // Whole planes a thread, enough of them for every thread: a thread's planes are contiguous,
      // so they go as long runs (see rows_run).
      const int64_t most = std::max<int64_t>(1, kMaxJoinedElems / p_.s);
      ForEachSlot(planes, slot_count(planes, kGrain / p_.s, ctx_), ctx_, [&](int64_t t0, int64_t t1, int64_t) {
        for (int64_t ta = t0; ta < t1; ta += most) planes_joined(ta, std::min(t1, ta + most));
      });
      return;
    }
    if (p_.planes) {
      const int64_t tasks = p_.n * p_.c * p_.segs;
      ForEachSlot(tasks, slot_count(tasks, kGrain / p_.seg, ctx_), ctx_, [&](int64_t t0, int64_t t1, int64_t) {
        for (int64_t t = t0; t < t1; ++t) {
          const int64_t plane = t / p_.segs, g = t % p_.segs;
          const int64_t off = plane * p_.s + g * p_.seg;
          planes_run<0>(0, 0, 0, A(0), nullptr, nullptr, Span{off, std::min(p_.seg, p_.s - g * p_.seg), 0, plane % p_.c},
                        prefetch_ahead());
        }
      });
      return;
    }
    // Column blocks outermost: each thread spreads a block's coefficients once.
    const int64_t bw = block_columns(), nb = chunk_count(p_.width, bw);
    ForEachSlot(p_.srows, slot_count(p_.srows, kGrain / p_.width, ctx_), ctx_, [&](int64_t r0, int64_t r1, int64_t slot) {
      if (nb == 1) {  // whole super-rows: the thread's rows are contiguous, so they go as long runs
        spread_coefficients(0, p_.width, slot);
        for (int64_t ra = r0; ra < r1; ra += kJoinedRows) {
          const int64_t rb = std::min(r1, ra + kJoinedRows);
          rows_run(ra * p_.width, (rb - 1 - ra) * p_.width + p_.srow_width(rb - 1), slot_array(slot, 0));
        }
        return;
      }
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t w0 = b * bw, wn = std::min(bw, p_.width - w0);
        spread_coefficients(w0, wn, slot);
        for (int64_t r = r0; r < r1; ++r) {
          const int64_t n = std::min(wn, p_.srow_width(r) - w0);
          if (n > 0) columns_run<0, true>(0, 0, 0, slot_array(slot, 0), r * p_.width + w0, n, columns_ahead(wn));
        }
      }
    });
  }

  const Job& d_;
  const Context& ctx_;
  Plan p_;
  const T* x_ = nullptr;
  const T* dy_ = nullptr;
  T* out_ = nullptr;
  bool fused_ = false;
  int64_t block_ = 1, slots_ = 1, slot_stride_ = 0;
  ::gradops::detail::Workspace ws_, dws_;
  // part1_..part3_ hold piece q's value of channel ch at part(ch, q): a piece's channels side by
  // side, so that the threads folding neighbouring pieces write lines of their own (channel by
  // channel, 16 threads' pieces shared each line, and NHWC with 1,024 channels and more paid a
  // line transfer per channel and piece).
  A* part1_ = nullptr;  // grad: Σ dY pieces; forward: piece means m
  A* part2_ = nullptr;  // grad: Σ dY·(x - mean) pieces; forward: piece Σ (x - m)²
  A* part3_ = nullptr;  // forward: piece Σ (x - m)
  double* shift_ = nullptr;   // forward: K = input_mean per channel
  double* dpart1_ = nullptr;  // forward: piece Σ (x - K), then the channel's in piece 0
  double* dpart2_ = nullptr;  // forward: piece Σ (x - K)²
  A* vec_[6] = {};
  A*& scale_ = vec_[0];  // grad only
  A*& istd_ = vec_[1];   // grad only
  A*& mean_ = vec_[2];   // grad: the saved mean; forward: the batch mean
  A*& ca_ = vec_[3];     // a: the dY (grad) or x - mean (forward) coefficient
  A*& cb_ = vec_[4];     // b: the constant term
  A*& cc_ = vec_[5];     // c: the x - mean coefficient (grad only)
  A* slot_base_ = nullptr;
};

// Non-temporal stores from stream_min_bytes() on, counted over everything the call moves (the
// inputs read and the output written) rather than the output alone: the output could stay in
// cache for its next reader only if all of that fit, and the elementwise pass comes last, after
// the inputs have gone through the caches once already.
template <class T>
Status RunTyped(const Job& job, const Context& ctx) {
  // An empty tensor's other dims may multiply past int64 ([2^63 - 1, 13, 0] is valid): count in
  // f64, from 0 when any dim is.
  const double tensors = job.grad ? 3 : 2;
  const double moved = job.n == 0 || job.spatial == 0
                           ? 0.0
                           : tensors * static_cast<double>(job.n) * static_cast<double>(job.c) *
                                 static_cast<double>(job.spatial) * sizeof(T);
  const bool stream = job.mode != Mode::reduce && moved >= stream_min_bytes();  // reduce writes no tensor
  if (job.grad) return stream ? Kernel<T, true, true>(job, ctx).run() : Kernel<T, true, false>(job, ctx).run();
  return stream ? Kernel<T, false, true>(job, ctx).run() : Kernel<T, false, false>(job, ctx).run();
}

}  // namespace

Status BatchNorm(const Job& job, const Context& ctx) {
  return visit_dtype(job.t, [&](auto tag) { return RunTyped<decltype(tag)>(job, ctx); });
}

}  // namespace gradops::cpu::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradops::cpu {
HWY_EXPORT(BatchNorm);
}  // namespace gradops::cpu

namespace gradops::cpu::batch_norm {
Status run(const Job& job, const Context& ctx) {
  if (job.c == 0) {  // no channels: every output is empty but the sums' count
    // (n·spatial in f64: with no channels the other dims may multiply past int64)
    if (job.mode == Mode::reduce) store_sum(job.sums_out, 0, static_cast<double>(job.n) * static_cast<double>(job.spatial));
    return {};
  }
  apply_simd_target_from_environment();
  return HWY_DYNAMIC_DISPATCH(BatchNorm)(job, ctx);
}
}  // namespace gradops::cpu::batch_norm
#endif
