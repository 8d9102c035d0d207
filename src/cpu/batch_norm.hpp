// BatchNorm family, CPU: what the kernel is asked (Job) and how a shape is cut into pieces (Plan).
// Neither depends on the SIMD target but for the lane count, so both live outside the per-target
// code of batch_norm.cpp, which says how the pieces are summed and written.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "cpu/parallel.hpp"
#include "ops/batch_norm.hpp"

namespace gradops::cpu::batch_norm {

// What the kernel does, from any of the family's six descriptors. Every op is built from the same
// phases: plan (pieces and traversals, from the shape), reduce (piece partials in the compute
// type), combine (each channel's partials by a fixed pairwise tree into its two sums), finish (the
// channel's outputs and elementwise coefficients from its sums and count) and apply (the
// elementwise pass). The fused ops run them all, the split's reduce halves stop after combine and
// store the sums, the apply halves start at finish from the given sums. Both halves go through the
// very code the fused op does, so the fused op is bitwise their composition.
enum class Mode { fused, reduce, apply };
struct Job : ::gradops::detail::BatchNormShape {
  bool grad = false;  // BatchNormalizationGrad and its halves
  const char* op_name = "";  // the op called, for messages
  Mode mode = Mode::fused;
  const void* x = nullptr;
  const void* scale = nullptr;
  // grad
  const void* dy = nullptr;
  const void* mean = nullptr;
  const void* inv_std = nullptr;
  void* dx = nullptr;
  void* dscale = nullptr;
  void* dbias = nullptr;
  // forward
  const void* bias = nullptr;
  const void* input_mean = nullptr;  // also the shift K of the forward's sums
  const void* input_var = nullptr;
  void* y = nullptr;
  void* running_mean = nullptr;
  void* running_var = nullptr;
  void* saved_mean = nullptr;
  void* saved_inv_std = nullptr;
  float epsilon = 0;
  float momentum = 0;
  // the split
  // f64 values at any byte address (the C ABI allows any base alignment): read and written through
  // load_sum and store_sum, never as double lvalues.
  void* sums_out = nullptr;        // Mode::reduce
  const void* sums_in = nullptr;   // Mode::apply
};

inline double load_sum(const void* sums, int64_t i) {
  double v;
  std::memcpy(&v, static_cast<const std::byte*>(sums) + i * sizeof(double), sizeof v);
  return v;
}
inline void store_sum(void* sums, int64_t i, double v) {
  std::memcpy(static_cast<std::byte*>(sums) + i * sizeof(double), &v, sizeof v);
}

constexpr int64_t kChain = 128;      // sequential additions per accumulator within a piece
constexpr int64_t kPlaneMin = 1024;  // NCHW spatial size from which runs are folded in place
constexpr int64_t kMinWidth = 800;   // columns form: narrower rows are merged into super-rows

// How the kernels cut and share the work (batch_norm.cpp).
constexpr int64_t kMaxCols = 1600;        // columns at once: 7 arrays of them stay in L1; >= 2 kMinWidth
constexpr int64_t kJoinedRows = 1 << 20;  // super-rows a write run joins at most: its offsets stay 32-bit
constexpr int64_t kMaxJoinedElems = int64_t{1} << 31;  // a joined run of planes: offsets stay 32-bit
constexpr int64_t kMaxJoinedPlanes = int64_t{1} << 31;  // plane indices too
constexpr int64_t kTaskBytes = 1 << 20;   // fused task: inputs re-read from L2 by its write pass
constexpr int64_t kTasksPerThread = 4;    // fused tasks per thread at least, for balance
constexpr int64_t kCombineMin = 8192;     // piece partials from which the combine takes every thread
constexpr int64_t kSetupMinChannels = 512;  // channels from which the setup takes every thread
constexpr int64_t kMinReduceCols = 128;   // a reduce task's columns at least, where tasks are split for threads

// Runs the job on the best SIMD target this CPU has (batch_norm.cpp); the op entries
// (batch_norm_entries.cpp) build their jobs and call it.
Status run(const Job& job, const Context& ctx);

// The pieces and traversals of a shape (the two forms of batch_norm.cpp's opening comment).
struct Plan {
  bool planes = false;
  int64_t c = 0, count = 0;  // channels; values per channel (Mc)
  // planes: run (i, ch) of s values at (i·c + ch)·s, cut into segs segments of seg values;
  // piece i·segs + g.
  int64_t n = 0, s = 0, seg = 0, segs = 0;
  // columns: `rows` rows of `period` values, channel (w mod period) / group for column w; super-row r
  // = rows [r k, r k + k) at r·width, the last one possibly shorter; piece q = super-rows
  // [q kChain, q kChain + kChain).
  int64_t rows = 0, period = 0, group = 1, k = 1, srows = 0, width = 0;
  int64_t pieces = 0;  // per channel

  // Values of one channel in pieces [0, p).
  int64_t values_upto(int64_t p) const {
    if (planes) return (p / segs) * s + std::min(s, (p % segs) * seg);
    return std::min(p * kChain * k, rows) * group;
  }
  int64_t srow_width(int64_t r) const { return r + 1 < srows ? width : (rows - r * k) * period; }
  int64_t channel_of(int64_t w) const { return (w % period) / group; }
};

// `lanes`: the target's vector width in the compute type; plane segments hold whole vectors.
inline Plan make_plan(const Job& d, int64_t lanes) {
  Plan p;
  p.c = d.c;
  p.count = d.n * d.spatial;
  if (p.count == 0) return p;
  if (d.c == 1 || (!d.channels_last && d.spatial >= kPlaneMin)) {
    p.planes = true;
    p.n = d.c == 1 ? 1 : d.n;
    p.s = d.c == 1 ? p.count : d.spatial;
    p.seg = kChain * 4 * lanes;
    p.segs = chunk_count(p.s, p.seg);
    p.pieces = p.n * p.segs;
    return p;
  }
  if (d.channels_last) {
    p.rows = p.count, p.period = d.c, p.group = 1;
  } else {
    p.rows = d.n, p.period = d.c * d.spatial, p.group = d.spatial;
  }
  // No more replicas than rows: the spare ones would hold zeros that every pass still walks (a
  // 2x4 tensor took 800 columns, 10 µs a call).
  p.k = p.period < kMinWidth ? std::min(chunk_count(kMinWidth, p.period), p.rows) : 1;
  p.srows = chunk_count(p.rows, p.k);
  p.width = p.k * p.period;
  p.pieces = chunk_count(p.srows, kChain);
  return p;
}

}  // namespace gradops::cpu::batch_norm
