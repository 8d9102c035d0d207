// BatchNorm family, CPU kernels (portable code shaped for the compiler's vectorizer, OpenMP).
//
// Both ops reduce every channel over its Mc = n·spatial values, then make one elementwise pass.
// The values of a channel are cut into chunks fixed by the shape alone; a chunk is summed in short
// sequential runs and the chunk partials are combined by a fixed pairwise tree, so results are the
// same bits for any thread count, and no term of any sum passes through more than 191 additions
// inside its chunk (plus 3 for the lanes) and one per tree level: the tolerance model in
// tests/support/tolerance.cpp allows min(Mc, 256) + 4·log2(Mc) + 8. Two traversals, chosen from the
// shape:
//   rows:   element (r, w) at r·width + w, channel w / group. NHWC (width C, group 1) and NCHW with a
//           short spatial run (width C·spatial, group spatial): rows are read contiguously, the inner
//           loop runs over columns, a task holds one chunk of rows for a block of whole channels.
//   planes: NCHW with spatial >= 64: channel c of sample n is a contiguous run; a task sums one
//           channel over a chunk of 1024 values in 8 lanes.
// The forward's statistics are a two-pass mean and sum of squared deviations inside each chunk
// (the chunk is still in cache for the second pass), merged across chunks with Chan's formula:
// stable for data far from zero, and X is read from memory once for them.
#include <algorithm>
#include <cmath>
#include <limits>

#include "core/workspace.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "ops/batch_norm.hpp"

namespace gradops::cpu {
namespace {

using detail::BatchNormDesc;

constexpr int64_t kPlaneMin = 64;         // NCHW spatial size from which runs are summed in place
constexpr int64_t kPlaneChunk = 1024;     // values of one channel per chunk (planes)
constexpr int kLanes = 8;                 // independent accumulators per planes task
constexpr int64_t kBlockCols = 2048;      // columns per rows task (whole channels)
constexpr int64_t kChunkElems = 32768;    // target elements per rows task (cache-resident)
constexpr int64_t kMaxChunkRows = 128;    // rows per chunk at most: bounds the sequential runs
constexpr int64_t kSegment = 16384;       // elementwise pass: values per task within one plane
constexpr int64_t kGrain = 1 << 15;       // elements per thread below which work stays on one thread

// How a channel's values are cut into chunks; a function of the shape only.
struct Plan {
  bool planes = false;
  int64_t c = 0, count = 0;          // channels; values per channel (Mc)
  int64_t n = 0, s = 0;              // planes: element (i, ch, j) at (i·c + ch)·s + j
  int64_t rows = 0, width = 0, group = 1, block = 1, blocks = 0;  // rows
  int64_t units = 0, per_chunk = 1, chunks = 0;  // chunks of per_chunk rows, or values (planes)

  // Values of one channel in chunks [q0, q1).
  int64_t values_in(int64_t q0, int64_t q1) const {
    return (std::min(q1 * per_chunk, units) - q0 * per_chunk) * (planes ? 1 : group);
  }
  int64_t tasks() const { return planes ? chunks * c : chunks * blocks; }
};

// The NCHW view [n, c, s] with a single channel folded into one contiguous run.
struct Canonical {
  int64_t n, s;
};
Canonical canonical(const BatchNormDesc& d) {
  if (d.c == 1) return {1, d.n * d.spatial};
  return {d.n, d.spatial};
}

Plan make_plan(const BatchNormDesc& d) {
  Plan p;
  p.c = d.c;
  p.count = d.n * d.spatial;
  if (p.count == 0) return p;  // no chunks: every sum is 0
  const Canonical v = canonical(d);
  if (d.channels_last && d.c > 1) {
    p.rows = p.count, p.width = d.c, p.group = 1;
  } else if (v.s >= kPlaneMin) {
    p.planes = true;
    p.n = v.n, p.s = v.s;
    p.units = p.count, p.per_chunk = kPlaneChunk, p.chunks = chunk_count(p.count, kPlaneChunk);
    return p;
  } else {
    p.rows = v.n, p.width = d.c * v.s, p.group = v.s;
  }
  p.block = std::min(p.c, std::max<int64_t>(1, kBlockCols / p.group));
  p.blocks = chunk_count(p.c, p.block);
  p.units = p.rows;
  p.per_chunk = std::clamp<int64_t>(kChunkElems / (p.block * p.group), 1, kMaxChunkRows);
  p.chunks = chunk_count(p.rows, p.per_chunk);
  return p;
}

template <class A>
A lane_sum(const A* v) {  // fixed pairwise order
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// Calls f(offset, len) on the contiguous runs of channel ch in planes chunk q, in order.
template <class F>
void for_each_run(const Plan& p, int64_t q, int64_t ch, F&& f) {
  const int64_t m1 = std::min(p.count, (q + 1) * kPlaneChunk);
  for (int64_t m = q * kPlaneChunk; m < m1;) {
    const int64_t i = m / p.s, j = m % p.s, len = std::min(p.s - j, m1 - m);
    f((i * p.c + ch) * p.s + j, len);
    m += len;
  }
}

// Lane l of acc gets the terms l, l + 8, ... of the run: independent chains the vectorizer can use.
template <class A, class F>
void accumulate_lanes(int64_t len, A* acc, F&& term) {
  int64_t j = 0;
  for (; j + kLanes <= len; j += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += term(j + l);
  for (int l = 0; j < len; ++j, ++l) acc[l] += term(j);
}

template <class A>
A load_as(DType t, const void* p, int64_t i) {
  return visit_dtype(t, [&](auto tag) { return load<A>(static_cast<const decltype(tag)*>(p), i); });
}
template <class A>
void store_as(DType t, void* p, int64_t i, A v) {
  if (p) visit_dtype(t, [&](auto tag) { store(static_cast<decltype(tag)*>(p), i, v); });
}

// Scratch: the chunk partials (two arrays of chunks × c, chunk-major) and `vectors` arrays of c.
template <class A>
struct Scratch {
  detail::Workspace ws;
  A* part0 = nullptr;
  A* part1 = nullptr;
  A* vec[6] = {};

  Status allocate(const Context& ctx, const Plan& p, int vectors, const char* op) {
    const int64_t partials = p.chunks * p.c;
    const std::size_t bytes = sizeof(A) * static_cast<std::size_t>(2 * partials + vectors * p.c);
    if (Status s = ws.allocate(ctx, Device::cpu(), std::max<std::size_t>(bytes, sizeof(A)), op); !s) return s;
    part0 = ws.as<A>();
    part1 = part0 + partials;
    for (int k = 0; k < vectors; ++k) vec[k] = part1 + partials + k * p.c;
    return {};
  }
};

// Runs the per-chunk kernel over every task: planes (q, ch) or rows (q, channel block).
template <class F>
void for_each_task(const Plan& p, const Context& ctx, F&& task) {
  const int64_t task_elems = p.planes ? kPlaneChunk : p.per_chunk * p.block * p.group;
  parallel_for(p.tasks(), std::max<int64_t>(1, kGrain / std::max<int64_t>(task_elems, 1)), ctx,
               [&](int64_t t0, int64_t t1) {
                 for (int64_t t = t0; t < t1; ++t) {
                   if (p.planes) task(t / p.c, t % p.c);
                   else task(t / p.blocks, t % p.blocks);
                 }
               });
}

// Rows task geometry: channels [c0, c1), columns [w0, w0 + wn), rows [r0, r1) of chunk q.
struct RowsTask {
  int64_t c0, c1, w0, wn, r0, r1;
};
RowsTask rows_task(const Plan& p, int64_t q, int64_t b) {
  RowsTask t;
  t.c0 = b * p.block;
  t.c1 = std::min(p.c, t.c0 + p.block);
  t.w0 = t.c0 * p.group;
  t.wn = (t.c1 - t.c0) * p.group;
  t.r0 = q * p.per_chunk;
  t.r1 = std::min(p.rows, t.r0 + p.per_chunk);
  return t;
}

// out[i] = sum of the `group` adjacent columns of channel i, in column order.
template <class A>
void group_sums(const A* cols, int64_t channels, int64_t group, A* out) {
  if (group == 1) {
    std::copy(cols, cols + channels, out);
    return;
  }
  for (int64_t i = 0; i < channels; ++i) {
    A s = 0;
    for (int64_t g = 0; g < group; ++g) s += cols[i * group + g];
    out[i] = s;
  }
}

// cols[i·group + g] = v[i]: a per-channel value spread over the channel's columns.
template <class A>
void spread(const A* v, int64_t channels, int64_t group, A* cols) {
  if (group == 1) {
    std::copy(v, v + channels, cols);
    return;
  }
  for (int64_t i = 0; i < channels; ++i) std::fill(cols + i * group, cols + (i + 1) * group, v[i]);
}

// The elementwise pass: f(offset, len, ch) on runs of one channel (NCHW planes, split into
// segments), or g(row offset) on rows of c channels (NHWC, or NCHW with spatial 1).
template <class FRun, class FRow>
void for_each_element(const BatchNormDesc& d, const Context& ctx, FRun&& run, FRow&& row) {
  if (d.n * d.spatial == 0) return;
  const Canonical v = canonical(d);
  if ((d.channels_last && d.c > 1) || v.s == 1) {
    const int64_t rows = d.n * d.spatial;
    parallel_for(rows, std::max<int64_t>(1, kGrain / d.c), ctx, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) row(r * d.c);
    });
    return;
  }
  const int64_t segs = chunk_count(v.s, kSegment), planes = v.n * d.c;
  parallel_for(planes * segs, std::max<int64_t>(1, kGrain / std::min(v.s, kSegment)), ctx,
               [&](int64_t t0, int64_t t1) {
                 for (int64_t t = t0; t < t1; ++t) {
                   const int64_t pl = t / segs, sg = t % segs, j = sg * kSegment;
                   run(pl * v.s + j, std::min(kSegment, v.s - j), pl % d.c);
                 }
               });
}

// ---- BatchNormalizationGrad ---------------------------------------------------------------------

// Per chunk and channel: sum dY and sum dY·(x - mean); the second becomes S2 = sum dY·xhat once
// multiplied by inv_std after the combine.
template <class T, class A>
void grad_chunk_sums(const Plan& p, const T* dy, const T* x, const A* mean, A* s1, A* s2, const Context& ctx) {
  for_each_task(p, ctx, [&](int64_t q, int64_t k) {
    if (p.planes) {
      A a1[kLanes] = {}, a2[kLanes] = {};
      const A mu = mean[k];
      for_each_run(p, q, k, [&](int64_t off, int64_t len) {
        const T* g = dy + off;
        const T* v = x + off;
        accumulate_lanes(len, a1, [&](int64_t j) { return load<A>(g, j); });
        accumulate_lanes(len, a2, [&](int64_t j) { return load<A>(g, j) * (load<A>(v, j) - mu); });
      });
      s1[q * p.c + k] = lane_sum(a1);
      s2[q * p.c + k] = lane_sum(a2);
      return;
    }
    const RowsTask t = rows_task(p, q, k);
    A a1[kBlockCols], a2[kBlockCols], mu[kBlockCols];
    std::fill(a1, a1 + t.wn, A(0));
    std::fill(a2, a2 + t.wn, A(0));
    spread(mean + t.c0, t.c1 - t.c0, p.group, mu);
    for (int64_t r = t.r0; r < t.r1; ++r) {
      const T* g = dy + r * p.width + t.w0;
      const T* v = x + r * p.width + t.w0;
      #pragma omp simd
      for (int64_t w = 0; w < t.wn; ++w) {
        const A gw = load<A>(g, w);
        a1[w] += gw;
        a2[w] += gw * (load<A>(v, w) - mu[w]);
      }
    }
    group_sums(a1, t.c1 - t.c0, p.group, s1 + q * p.c + t.c0);
    group_sums(a2, t.c1 - t.c0, p.group, s2 + q * p.c + t.c0);
  });
}

// Pairwise tree over the chunks, per channel; the totals end in chunk 0.
template <class A>
void combine_sums(const Plan& p, A* s1, A* s2, const Context& ctx) {
  const int64_t nq = p.chunks, c = p.c;
  parallel_for(c, std::max<int64_t>(1, kGrain / std::max<int64_t>(nq, 1)), ctx, [&](int64_t c0, int64_t c1) {
    for (int64_t step = 1; step < nq; step *= 2)
      for (int64_t q = 0; q + step < nq; q += 2 * step) {
        A* a1 = s1 + q * c;
        A* a2 = s2 + q * c;
        const A* b1 = s1 + (q + step) * c;
        const A* b2 = s2 + (q + step) * c;
        #pragma omp simd
        for (int64_t ch = c0; ch < c1; ++ch) a1[ch] += b1[ch], a2[ch] += b2[ch];
      }
  });
}

template <class T>
Status run_grad(const BatchNormDesc& d, const Context& ctx) {
  using A = compute_t<T>;
  const Plan p = make_plan(d);
  Scratch<A> sc;
  if (Status s = sc.allocate(ctx, p, 6, "BatchNormalizationGrad"); !s) return s;
  A *scale = sc.vec[0], *mean = sc.vec[1], *istd = sc.vec[2], *ca = sc.vec[3], *cb = sc.vec[4], *cc = sc.vec[5];
  for (int64_t ch = 0; ch < p.c; ++ch) {
    scale[ch] = load_as<A>(d.t1, d.scale, ch);
    mean[ch] = load_as<A>(d.t2, d.mean, ch);
    istd[ch] = load_as<A>(d.t2, d.inv_std, ch);
  }
  const T* dy = static_cast<const T*>(d.dy);
  const T* x = static_cast<const T*>(d.x);
  grad_chunk_sums(p, dy, x, mean, sc.part0, sc.part1, ctx);
  combine_sums(p, sc.part0, sc.part1, ctx);

  // dX = k (dY - S1/Mc - xhat S2/Mc), k = scale·istd, written as ca·dY + cb + cc·(x - mean) so
  // that x - mean is formed before any scaling (x may sit far from zero).
  const A inv_count = p.count > 0 ? A(1) / A(p.count) : A(0);
  for (int64_t ch = 0; ch < p.c; ++ch) {
    const A s1 = p.chunks ? sc.part0[ch] : A(0);
    const A s2 = p.chunks ? istd[ch] * sc.part1[ch] : A(0);
    store_as(d.t1, d.dbias, ch, s1);
    store_as(d.t1, d.dscale, ch, s2);
    const A k = scale[ch] * istd[ch];
    ca[ch] = k;
    cb[ch] = -(k * (s1 * inv_count));
    cc[ch] = -(k * istd[ch]) * (s2 * inv_count);
  }
  T* dx = static_cast<T*>(d.dx);
  for_each_element(
      d, ctx,
      [&](int64_t off, int64_t len, int64_t ch) {
        const A a = ca[ch], b = cb[ch], c = cc[ch], mu = mean[ch];
        const T* g = dy + off;
        const T* v = x + off;
        T* out = dx + off;
        #pragma omp simd
        for (int64_t j = 0; j < len; ++j) store(out, j, a * load<A>(g, j) + b + c * (load<A>(v, j) - mu));
      },
      [&](int64_t off) {
        const T* g = dy + off;
        const T* v = x + off;
        T* out = dx + off;
        #pragma omp simd
        for (int64_t ch = 0; ch < p.c; ++ch)
          store(out, ch, ca[ch] * load<A>(g, ch) + cb[ch] + cc[ch] * (load<A>(v, ch) - mean[ch]));
      });
  return {};
}

// ---- BatchNormInternal (training) ---------------------------------------------------------------

// Per chunk and channel: the chunk's mean and sum of squared deviations from it.
template <class T, class A>
void forward_chunk_stats(const Plan& p, const T* x, A* cmean, A* cm2, const Context& ctx) {
  for_each_task(p, ctx, [&](int64_t q, int64_t k) {
    const A cnt = A(p.values_in(q, q + 1));
    if (p.planes) {
      A acc[kLanes] = {};
      for_each_run(p, q, k, [&](int64_t off, int64_t len) {
        const T* v = x + off;
        accumulate_lanes(len, acc, [&](int64_t j) { return load<A>(v, j); });
      });
      const A mu = lane_sum(acc) / cnt;
      std::fill(acc, acc + kLanes, A(0));
      for_each_run(p, q, k, [&](int64_t off, int64_t len) {
        const T* v = x + off;
        accumulate_lanes(len, acc, [&](int64_t j) {
          const A e = load<A>(v, j) - mu;
          return e * e;
        });
      });
      cmean[q * p.c + k] = mu;
      cm2[q * p.c + k] = lane_sum(acc);
      return;
    }
    const RowsTask t = rows_task(p, q, k);
    A acc[kBlockCols], mu[kBlockCols];
    std::fill(acc, acc + t.wn, A(0));
    for (int64_t r = t.r0; r < t.r1; ++r) {
      const T* v = x + r * p.width + t.w0;
      #pragma omp simd
      for (int64_t w = 0; w < t.wn; ++w) acc[w] += load<A>(v, w);
    }
    A* m = cmean + q * p.c + t.c0;
    const int64_t nch = t.c1 - t.c0;
    group_sums(acc, nch, p.group, m);
    for (int64_t i = 0; i < nch; ++i) m[i] /= cnt;
    spread(m, nch, p.group, mu);
    std::fill(acc, acc + t.wn, A(0));
    for (int64_t r = t.r0; r < t.r1; ++r) {
      const T* v = x + r * p.width + t.w0;
      #pragma omp simd
      for (int64_t w = 0; w < t.wn; ++w) {
        const A e = load<A>(v, w) - mu[w];
        acc[w] += e * e;
      }
    }
    group_sums(acc, nch, p.group, cm2 + q * p.c + t.c0);
  });
}

// Chan et al.'s pairwise merge of (count, mean, M2) over the same tree as combine_sums.
template <class A>
void combine_stats(const Plan& p, A* cmean, A* cm2, const Context& ctx) {
  const int64_t nq = p.chunks, c = p.c;
  parallel_for(c, std::max<int64_t>(1, kGrain / std::max<int64_t>(nq, 1)), ctx, [&](int64_t c0, int64_t c1) {
    for (int64_t step = 1; step < nq; step *= 2)
      for (int64_t q = 0; q + step < nq; q += 2 * step) {
        const double na = static_cast<double>(p.values_in(q, q + step));
        const double nb = static_cast<double>(p.values_in(q + step, std::min(q + 2 * step, nq)));
        const A wb = static_cast<A>(nb / (na + nb)), wab = static_cast<A>(na * nb / (na + nb));
        A* ma = cmean + q * c;
        A* va = cm2 + q * c;
        const A* mb = cmean + (q + step) * c;
        const A* vb = cm2 + (q + step) * c;
        #pragma omp simd
        for (int64_t ch = c0; ch < c1; ++ch) {
          const A delta = mb[ch] - ma[ch];
          ma[ch] += delta * wb;
          va[ch] += vb[ch] + delta * delta * wab;
        }
      }
  });
}

template <class T>
Status run_forward(const BatchNormDesc& d, const Context& ctx) {
  using A = compute_t<T>;
  const Plan p = make_plan(d);
  Scratch<A> sc;
  if (Status s = sc.allocate(ctx, p, 3, "BatchNormInternal"); !s) return s;
  A *mean = sc.vec[0], *coef = sc.vec[1], *shift = sc.vec[2];
  const T* x = static_cast<const T*>(d.x);
  forward_chunk_stats(p, x, sc.part0, sc.part1, ctx);
  combine_stats(p, sc.part0, sc.part1, ctx);

  // Mc = 0: no batch, so the running statistics pass through unchanged (PyTorch skips the update
  // too) and the saved ones are those of an empty sum: mean 0, variance 0. Mc = 1: the unbiased
  // variance is undefined and running_var becomes NaN, as cuDNN's and PyTorch's formulas give.
  const A eps = static_cast<A>(d.epsilon), mom = static_cast<A>(d.momentum), keep = A(1) - mom;
  const A count = static_cast<A>(p.count);
  for (int64_t ch = 0; ch < p.c; ++ch) {
    // Read before any write: running_* may be the very buffers of input_*.
    const A old_mean = load_as<A>(d.t2, d.input_mean, ch), old_var = load_as<A>(d.t2, d.input_var, ch);
    A mu = 0, var = 0, unbiased = std::numeric_limits<A>::quiet_NaN();
    if (p.count > 0) {
      mu = sc.part0[ch];
      var = sc.part1[ch] / count;
      if (p.count > 1) unbiased = sc.part1[ch] / static_cast<A>(p.count - 1);
    }
    const A istd = A(1) / std::sqrt(var + eps);
    store_as(d.t2, d.saved_mean, ch, mu);
    store_as(d.t2, d.saved_inv_std, ch, istd);
    store_as(d.t2, d.running_mean, ch, p.count > 0 ? mom * old_mean + keep * mu : old_mean);
    store_as(d.t2, d.running_var, ch, p.count > 0 ? mom * old_var + keep * unbiased : old_var);
    mean[ch] = mu;
    coef[ch] = istd * load_as<A>(d.t1, d.scale, ch);
    shift[ch] = load_as<A>(d.t1, d.bias, ch);
  }
  T* y = static_cast<T*>(d.y);
  for_each_element(
      d, ctx,
      [&](int64_t off, int64_t len, int64_t ch) {
        const A mu = mean[ch], k = coef[ch], b = shift[ch];
        const T* v = x + off;
        T* out = y + off;
        #pragma omp simd
        for (int64_t j = 0; j < len; ++j) store(out, j, (load<A>(v, j) - mu) * k + b);
      },
      [&](int64_t off) {
        const T* v = x + off;
        T* out = y + off;
        #pragma omp simd
        for (int64_t ch = 0; ch < p.c; ++ch) store(out, ch, (load<A>(v, ch) - mean[ch]) * coef[ch] + shift[ch]);
      });
  return {};
}

}  // namespace
}  // namespace gradops::cpu

namespace gradops::detail {

Status cpu_batch_norm(const BatchNormDesc& d, const Context& ctx) {
  if (d.c == 0) return {};  // no channels: every output is empty
  return cpu::visit_dtype(d.t, [&](auto tag) -> Status {
    using T = decltype(tag);
    return d.op == OpId::BatchNormalizationGrad ? cpu::run_grad<T>(d, ctx) : cpu::run_forward<T>(d, ctx);
  });
}

}  // namespace gradops::detail
