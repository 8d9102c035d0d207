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

// The tensor as a kernel walks it. Columns: `rows` rows of c channels, channels on the fast axis
// (NHWC, and NCHW with one spatial position, which is the same memory). Runs: n runs of s
// contiguous values per channel (NCHW; a single channel of any layout is one run of n·spatial).
struct BnView {
  bool columns = false;
  int64_t n = 0, c = 0, s = 0;  // columns: n rows (s = 1)
  int64_t count = 0;            // values per channel
};

inline BnView view_of(const detail::BatchNormDesc& d) {
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

inline bool is_grad(const detail::BatchNormDesc& d) { return d.op == OpId::BatchNormalizationGrad; }

// The tensors the elementwise kernels stream: X, then dY and dX (grad) or Y (forward).
inline const void* bn_out(const detail::BatchNormDesc& d) { return is_grad(d) ? d.dx : d.y; }

// Every pointer aligned to its element size: hardware loads of that type would fault otherwise.
inline const char* bn_unaligned(const detail::BatchNormDesc& d) {
  const std::size_t t = dtype_size(d.t), t1 = dtype_size(d.t1), t2 = dtype_size(d.t2);
  const std::pair<const void*, std::size_t> ptrs[] = {
      {d.x, t},         {d.dy, t},           {bn_out(d), t},        {d.scale, t1},          {d.bias, t1},
      {d.dscale, t1},   {d.dbias, t1},       {d.mean, t2},          {d.inv_std, t2},        {d.input_mean, t2},
      {d.input_var, t2}, {d.running_mean, t2}, {d.running_var, t2}, {d.saved_mean, t2},     {d.saved_inv_std, t2}};
  for (const auto& [p, size] : ptrs)
    if (p && !aligned_to(p, size)) return "declines: a pointer is not aligned to its element size";
  return nullptr;
}

// The 16-byte kernels: X, dY and the output on a 16-byte boundary, and every run (row) of whole
// packs, so that no pack straddles two channels' runs (a row's channels line up with packs).
inline bool bn_packs(const detail::BatchNormDesc& d) {
  const BnView v = view_of(d);
  const int64_t pe = 16 / static_cast<int64_t>(dtype_size(d.t));
  if ((v.columns ? v.c : v.s) % pe) return false;
  for (const void* p : {d.x, is_grad(d) ? d.dy : nullptr, bn_out(d)})
    if (p && misalignment16(p)) return false;
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
};

// target: the blocks of one full wave of the reduction. Blocks of equal work fill it without going
// over (a few blocks past a wave would take as long as the wave), or, with more channels (tiles)
// than it holds, take one block each. Each thread gets two batches of kBnUnroll units (rows) where
// the tensor has them: fewer partials for the finish to add, and still loads enough in flight.
inline BnGeom bn_geometry(const detail::BatchNormDesc& d, int vec, int64_t target) {
  BnGeom g;
  g.v = view_of(d);
  g.vec = vec;
  const int64_t min_units = int64_t{kBnThreads} * kBnUnroll * 2;
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
    const int64_t most = std::max<int64_t>(1, (g.per_channel + min_units - 1) / min_units);
    g.groups = std::clamp<int64_t>(target / g.v.c, 1, most);
    g.blocks = g.v.c * g.groups;
    if (g.units > 0) g.step_div = kBnThreads / g.units, g.step_mod = kBnThreads % g.units;
  }
  if (g.v.count == 0) g.groups = 0, g.blocks = 0;
  return g;
}

// The kernels a row names.
enum class BnKernel { runs_vec, runs, columns_vec, columns };

// What a fused call runs: the reduction into per-block partial sums, the per-channel finish (the
// op's per-channel outputs and the elementwise coefficients), the elementwise pass.
template <class T>
Status batch_norm_run(std::string_view op, const detail::BatchNormDesc& d, const Context& ctx, const DeviceInfo& dev,
                      BnKernel k);

}  // namespace gradops::cuda
