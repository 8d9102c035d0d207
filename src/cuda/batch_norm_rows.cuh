// BatchNorm family, CUDA: what the implementation rows (batch_norm_rows.cu) and the kernels
// (batch_norm_kernels.cuh) both need on the host: the view of the tensor a kernel walks, the
// geometry of its grid, and the entry of each kernel, compiled once per storage type
// (batch_norm_<dtype>.cu) so that the four compile in parallel and the rows compile without them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string_view>

#include "cuda/common.cuh"
#include "ops/batch_norm.hpp"

namespace gradops::cuda {

inline constexpr int kBnThreads = 256;  // every reduce and apply block
inline constexpr int kBnUnroll = 4;     // units a thread has in flight per input
// The fewest units a block's share of a channel is cut to: two batches of kBnUnroll a thread (fewer
// partials for the finish to add, and still enough loads in flight).
inline constexpr int64_t kBnMinUnits = int64_t{kBnThreads} * kBnUnroll * 2;

// What a call runs: the fused op (reduce, finish, apply), or one half of the split: the reduce half
// stops at the per-channel sums (f64, [Σ1 per channel, Σ2 per channel, count]), the apply half
// starts from given ones. The fused op forms the very same sums in registers and finishes from
// them, so it is bitwise the composition of the halves.
enum class BnMode { fused, reduce, apply };

// Everything the kernels read from any of the family's descriptors. Unused pointers are null.
struct BnCall {
  bool grad = false;
  BnMode mode = BnMode::fused;
  DType t = DType::f32, t1 = DType::f32, t2 = DType::f32;
  int64_t n = 0, c = 0, spatial = 0;
  bool channels_last = false;
  const void* x = nullptr;
  const void* dy = nullptr;          // grad
  const void* scale = nullptr;       // not read by the reduce halves
  const void* bias = nullptr;        // forward
  const void* mean = nullptr;        // grad: saved mean
  const void* inv_std = nullptr;     // grad: saved inverse std
  const void* input_mean = nullptr;  // forward: running mean before the step, the sums' shift K
  const void* input_var = nullptr;
  void* out = nullptr;               // dX or Y (not the reduce halves)
  void* dscale = nullptr;
  void* dbias = nullptr;
  void* running_mean = nullptr;
  void* running_var = nullptr;
  void* saved_mean = nullptr;
  void* saved_inv_std = nullptr;
  float epsilon = 0, momentum = 0;
  double* sums_out = nullptr;        // reduce halves
  const double* sums_in = nullptr;   // apply halves
};

// The tensor as a kernel walks it. Columns: `rows` rows of c channels, channels on the fast axis
// (NHWC, and NCHW with one spatial position, which is the same memory). Runs: n runs of s
// contiguous values per channel (NCHW; a single channel of any layout is one run of n·spatial).
struct BnView {
  bool columns = false;
  int64_t n = 0, c = 0, s = 0;  // columns: n rows (s = 1)
  int64_t count = 0;            // values per channel
};

inline BnView view_of(const BnCall& d) {
  BnView v;
  v.c = d.c;
  v.count = d.n * d.spatial;
  if (d.c == 1) {
    v.n = 1, v.s = v.count;
  } else if (d.channels_last || d.spatial == 1) {
    v.columns = true, v.n = v.count, v.s = 1;
  } else {
    v.n = d.n, v.s = d.spatial;
  }
  return v;
}

// Every pointer aligned to its element size: hardware loads of that type would fault otherwise.
inline const char* bn_unaligned(const BnCall& d) {
  const std::size_t t = dtype_size(d.t), t1 = dtype_size(d.t1), t2 = dtype_size(d.t2);
  const std::pair<const void*, std::size_t> ptrs[] = {
      {d.x, t},          {d.dy, t},           {d.out, t},          {d.scale, t1},      {d.bias, t1},
      {d.dscale, t1},    {d.dbias, t1},       {d.mean, t2},        {d.inv_std, t2},    {d.input_mean, t2},
      {d.input_var, t2}, {d.running_mean, t2}, {d.running_var, t2}, {d.saved_mean, t2}, {d.saved_inv_std, t2},
      {d.sums_out, 8},   {d.sums_in, 8}};
  for (const auto& [p, size] : ptrs)
    if (p && !aligned_to(p, size)) return "declines: a pointer is not aligned to its element size";
  return nullptr;
}

// The packed kernels: X, dY and the output on a `bytes` boundary, and every run (row) of whole
// packs of that size, so that no pack straddles two channels' runs (a row's channels line up with
// packs).
inline bool bn_packs(const BnCall& d, int64_t bytes = 16) {
  const BnView v = view_of(d);
  const int64_t pe = bytes / static_cast<int64_t>(dtype_size(d.t));
  if (pe < 2 || (v.columns ? v.c : v.s) % pe) return false;
  for (const void* p : {d.x, d.dy, static_cast<const void*>(d.out)})
    if (p && !aligned_to(p, static_cast<std::size_t>(bytes))) return false;
  return true;
}

// The grid of both passes. Runs: block b takes channel b / groups and the b % groups-th of its
// count/vec units, cut evenly. Columns: block b takes channel tile b % tiles (tw units of vec
// channels, one a thread) and the b / tiles-th of the rows, rb rows at a time.
struct BnGeom {
  BnView v;
  int vec = 1;
  int64_t units = 0;        // runs: per run; columns: per row
  int64_t per_channel = 0;  // runs: n·units
  int64_t groups = 0;       // partial sums per channel
  int64_t tiles = 1;
  int tw = 1, rb = 1;
  int64_t step_div = 0, step_mod = 0;  // runs: a block's thread step, kBnThreads, in (runs, units)
  int64_t blocks = 0;
  bool held = false;   // bn_held_geometry: groups blocks hold a channel, slots packs a thread
  int64_t slots = 0;
};

// target: the blocks of one full wave of the reduction. Blocks of equal work fill it without going
// over (a few blocks past a wave would take as long as the wave), or, with more channels (tiles)
// than it holds, take one block each. Each block gets kBnMinUnits units (rows: two batches of
// kBnUnroll a thread) where the tensor has them.
inline BnGeom bn_geometry(const BnCall& d, int vec, int64_t target) {
  BnGeom g;
  g.v = view_of(d);
  g.vec = vec;
  if (g.v.columns) {
    g.units = g.v.c / vec;
    g.tw = static_cast<int>(std::min<int64_t>(g.units, 32));
    g.rb = kBnThreads / g.tw;
    g.tiles = (g.units + g.tw - 1) / g.tw;
    const int64_t rows = int64_t{g.rb} * kBnUnroll * 2;
    const int64_t most = std::max<int64_t>(1, (g.v.n + rows - 1) / rows);
    g.groups = std::clamp<int64_t>(target / g.tiles, 1, most);
    g.blocks = g.tiles * g.groups;
  } else {
    g.units = g.v.s / vec;
    g.per_channel = g.v.n * g.units;
    const int64_t most = std::max<int64_t>(1, (g.per_channel + kBnMinUnits - 1) / kBnMinUnits);
    g.groups = std::clamp<int64_t>(target / g.v.c, 1, most);
    g.blocks = g.v.c * g.groups;
    if (g.units > 0) g.step_div = kBnThreads / g.units, g.step_mod = kBnThreads % g.units;
  }
  if (g.v.count == 0) g.groups = 0, g.blocks = 0;
  return g;
}

// The held grid (batch_norm_kernels.cuh), NCHW runs only: `groups` blocks, a cluster of up to
// kBnHeldCluster, hold a channel's X (and dY) in at most kBnHeldSmem bytes of shared memory each:
// two such blocks fit a multiprocessor's 228 KiB beside the 1 KiB the system keeps per block and
// the kernel's own. held = false where no cluster can hold a channel, and for NHWC: tiles of
// channels narrow enough to be held (4 or 8 packs a row) took up to twice the time of the reduce,
// sums and apply kernels on an H200 (docs/ops/batch_norm.md). The reduce half of the split takes
// the same grid, so that its sums are the fused op's.
inline constexpr int64_t kBnHeldSmem = 110 * 1024;
inline constexpr int kBnHeldCluster = 16;

inline BnGeom bn_held_geometry(const BnCall& d, int vec, int64_t target, int max_cluster = kBnHeldCluster) {
  BnGeom g;
  g.v = view_of(d);
  g.vec = vec;
  if (g.v.columns || g.v.count == 0) return g;
  g.units = g.v.s / vec;
  g.per_channel = g.v.n * g.units;
  const int64_t pack = int64_t{vec} * static_cast<int64_t>(dtype_size(d.t)) * (d.grad ? 2 : 1);
  // Packs a thread holds where a block takes 1/k of a channel.
  const auto slots = [&](int64_t k) { return ((g.per_channel + k - 1) / k + kBnThreads - 1) / kBnThreads; };
  const auto fits = [&](int64_t k) { return slots(k) * kBnThreads * pack <= kBnHeldSmem; };
  // The fewest blocks (a power of 2) that hold the channel, then more while the grid is below a
  // wave and each block keeps kBnMinUnits units (as bn_geometry: fewer, larger shares measured
  // faster than allowing 2 units a thread, 1.74 against 1.84 in the f32 gradient's geomean ratio to
  // PyTorch on an H200).
  if (max_cluster < 1) return g;
  int64_t k = 1;
  while (k < max_cluster && !fits(k)) k *= 2;
  if (k > max_cluster || !fits(k)) return g;
  while (k < max_cluster && k * 2 * g.v.c <= target && g.per_channel >= 2 * k * kBnMinUnits) k *= 2;
  g.groups = k;
  g.slots = slots(k);
  g.blocks = g.v.c * k;
  if (g.units > 0) g.step_div = kBnThreads / g.units, g.step_mod = kBnThreads % g.units;
  g.held = true;
  return g;
}

inline std::size_t bn_held_smem(const BnGeom& g, const BnCall& d) {
  return static_cast<std::size_t>(g.slots) * kBnThreads * static_cast<std::size_t>(g.vec) * dtype_size(d.t) *
         (d.grad ? 2 : 1);
}

// The kernels a row names (in the order of detail::CudaBatchNormKernel).
enum class BnKernel { runs_vec, runs_vec8, runs, columns_vec, columns };

// Runs the call's kernels (batch_norm_kernels.cuh) with kernel k's walk.
template <class T>
Status batch_norm_run(std::string_view op, const BnCall& d, const Context& ctx, const DeviceInfo& dev, BnKernel k);

}  // namespace gradops::cuda
