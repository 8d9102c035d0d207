// Softmax family, CUDA: what the implementation rows (softmax_rows.cu) and the kernels
// (softmax_kernels.cuh) both need on the host: the shape arithmetic that decides which kernel takes
// a row, and the entry of each row's kernel, compiled once per storage type (softmax_f32.cu,
// softmax_f16.cu, softmax_bf16.cu, softmax_f64.cu), so that the four compile in parallel and the
// rows compile without the kernels. T is the device storage type (float, double, __half,
// __nv_bfloat16); each entry runs only the kernel its row names, on what that row's declines()
// accepted.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>

#include "cuda/common.cuh"
#include "cuda/softmax.cuh"
#include "ops/softmax.hpp"

namespace gradops::cuda {

// ---- which kernel takes a row -------------------------------------------------------------------

// Packs per lane of the warp kernel at most: 8, or 4 of f64 (whose exp needs more registers).
constexpr int warp_max_packs_per_lane(std::size_t elem_size) { return elem_size == 8 ? 4 : 8; }

// Packs of each input per thread of the block and cluster kernels, the most that fit 64 registers
// (two 512-thread blocks per multiprocessor) without spilling more than a few bytes: gradients 4
// (two inputs), forwards 8 (one input; the softmax terms exp(x - max) are computed again for the
// output, Held), f64 gradients 2 (8 bytes of stack in LogSoftmaxGrad's cluster kernels; 4 and 8
// spilled 40-380 bytes), f64 forwards 4: a block then holds a row of 4,096, which took a cluster of
// two at 2 packs (8192x4096 0.46 -> 0.88-0.95 of copy on an H100, 32768x512 0.84-0.86 ->
// 0.91-0.95). With more bytes per barrier, long rows held on chip beat two passes: the 16-bit
// gradients took 2 packs while 16-bit elements were extracted one a register, and went from
// 0.61-0.88 of copy to 0.88-0.94 with 4 on an H100 (0.75-0.86 on an H200); the f32 and 16-bit
// forwards from 0.57-0.66 to 0.65-0.93 with 8 (lab/cuda/NOTES.md, sixth round); f64 from 1 pack to
// 2, rows of 512 to 4096 elements 1.1-1.8x faster on an H100 (gradients 0.53-0.90 of copy to
// 0.82-0.98, forwards 0.26-0.74 to 0.46-0.87; docs/performance-gpu.md).
constexpr int block_packs(SoftmaxKind k, std::size_t elem_size) {
  if (elem_size == 8) return is_grad(k) ? 2 : 4;
  return is_grad(k) ? 4 : 8;
}
constexpr int kBlockMaxThreads = 512;
constexpr int kMaxCluster = 16;  // 16 is beyond the portable 8: allowed per kernel at launch

inline std::size_t elem_size(const SoftmaxDesc& d) { return dtype_size(d.dtype); }
inline int64_t pack_elems(const SoftmaxDesc& d) { return static_cast<int64_t>(16 / elem_size(d)); }

// Every pointer aligned to its element size: hardware loads of that type would fault otherwise.
inline bool element_aligned(const SoftmaxDesc& d) {
  const std::size_t es = elem_size(d);
  for (const void* p : {d.dy, d.y, static_cast<const void*>(d.out)})
    if (p && !aligned_to(p, es)) return false;
  return true;
}
// Every pointer at one offset from a 16-byte boundary (then every row's packs line up).
inline bool congruent(const SoftmaxDesc& d) {
  const unsigned m = misalignment16(d.y);
  return m % elem_size(d) == 0 && misalignment16(d.out) == m && (!d.dy || misalignment16(d.dy) == m);
}
// Every row starts on a 16-byte boundary.
inline bool rows_aligned(const SoftmaxDesc& d) {
  return congruent(d) && misalignment16(d.y) == 0 && d.axis_len * static_cast<int64_t>(elem_size(d)) % 16 == 0;
}

// Packs (or single elements) of a row on the warp path.
inline int64_t warp_units(const SoftmaxDesc& d) { return rows_aligned(d) ? d.axis_len / pack_elems(d) : d.axis_len; }
// Elements one block holds, and how many blocks may share a row.
inline int64_t block_capacity(const SoftmaxDesc& d) {
  const int n = block_packs(d.kind, elem_size(d));
  return (congruent(d) ? pack_elems(d) : 1) * n * kBlockMaxThreads;
}
inline int max_cluster(const SoftmaxDesc& d) { return congruent(d) ? kMaxCluster : 1; }

// Threads of each of c blocks that hold a row together at n packs a thread (0: block_packs; the
// lab tries others), the row's whole packs (or elements, where the tensors sit at different
// offsets) shared evenly, the ragged ends one element a thread; 0 if c blocks of the largest size
// cannot hold it.
inline int row_block_threads(const SoftmaxDesc& d, int c, int n = 0) {
  const int64_t units = congruent(d) ? d.axis_len / pack_elems(d) : d.axis_len;
  const int64_t packs = n > 0 ? n : block_packs(d.kind, elem_size(d));
  const int64_t t = ceil_div(ceil_div(units, int64_t{c} * packs), 32) * 32;
  return t <= kBlockMaxThreads ? static_cast<int>(t < 32 ? 32 : t) : 0;
}
// The fewest blocks (a power of two, up to max_cluster) that hold a row: each block's share then
// carries the most data per barrier (two blocks share a multiprocessor, so one's reduction overlaps
// the other's loads). 1: cuda:block_per_row; more: cuda:cluster_per_row.
inline int row_blocks(const SoftmaxDesc& d, int n = 0) {
  int c = 1;
  while (c < max_cluster(d) && row_block_threads(d, c, n) == 0) c *= 2;
  return c;
}

// Where a row needs a cluster, streaming it twice (the second read from L2, with no cluster
// barriers between loads) was measured faster for f64 rows past 4096 elements in LogSoftmax (at 4
// packs a thread on an H100, 4096x8192 0.58 of copy against 0.54 on a cluster of 2, 2048x16384
// 0.61-0.62 against 0.53; not explained) and past 16384 in Softmax (there clusters won: 0.50 ->
// 0.60 and 0.51 -> 0.57, 1.11x and 1.00x PyTorch) and the gradients (at 2 packs, 32768 held on 16
// blocks: LogSoftmaxGrad 0.61 of copy against 0.74 in two passes, SoftmaxGrad 0.61 against 0.62).
// The limits are in elements, not blocks, so that they stay where they were measured whatever a
// block holds. Everything else stays on chip: the gradients (f32 0.80-0.90 of copy against
// 0.71-0.76 at 32768 and 50257 on an H200; 16-bit 0.88-0.94 against 0.77-0.88 on an H100 and
// 0.75-0.86 against 0.62-0.85 on an H200, where LogSoftmaxGrad at 50257 is the one exception,
// 0.75 against 0.80-0.85) and the f32 and 16-bit forwards (0.65-0.93 against 0.57-0.65 on an
// H100).
inline bool two_passes_faster(const SoftmaxDesc& d) {
  return d.dtype == DType::f64 && d.axis_len > (d.kind == SoftmaxKind::log_softmax ? 4096 : 16384);
}

// ---- a non-last axis (inner > 1) --------------------------------------------------------------

// cuda:strided_held: a block is TX x TY threads, TX units (an element, or a 16-byte pack where inner
// is a multiple of one and every pointer 16-byte aligned) of consecutive columns of the flattened
// [outer, inner] space by TY lanes along the axis; each thread holds N units of each input
// (strided_held_units, or kStridedHeldWideUnits) at axis positions TY apart, so every load
// instruction of the block reads TY rows of TX units and the loads of a thread are independent. An
// axis longer than one block holds is split over a cluster of up to 16 blocks. TX is 128 bytes of
// a row where inner allows (whole cache lines), on a cluster less where that would straddle two
// inner rows, or where only a narrower tile's cluster holds the axis; where the axis is short,
// fewer lanes along it and more columns.
constexpr int kStridedHeldThreads = 256;
constexpr int kStridedHeldBytes = 64;  // per input and thread: 16 f32 registers
// Units a thread holds per input: kStridedHeldBytes, at most 16 (32 single 16-bit elements took 175
// to 185 registers, one block a multiprocessor).
constexpr int strided_held_units(int unit_bytes) { return kStridedHeldBytes / unit_bytes < 16 ? kStridedHeldBytes / unit_bytes : 16; }
// 16-byte units whose axis one block does not hold at strided_held_units are held twice as many a
// thread (128 bytes of each input, 2 blocks a multiprocessor instead of 3 or 4): half the blocks a
// tile, or one instead of two. Each tile waits on its cluster's exchange,
// and those waits, not the loads, bound the cluster kernels (on an H100, the gradients of
// 2048x2048x8 bf16 went from 0.78 of copy on 2 blocks to 0.88-0.90 on one, of f32 512x32768x2 from
// 0.77-0.80 on 16 to 0.85 on 8; the forwards, which exchange twice a tile, 1.2x faster on
// 341x1000x96, 512x32768x2 and f32 2048x2048x8, 1.04-1.07x on 64x8192x64, up to 3% slower on 16-bit
// 2048x2048x8). f64 too: with its loads in flight together (load_pack in cuda/common.cuh), f64
// LogSoftmax_13 at 8 units ran 1.08-1.93x faster than at 4 on the six shapes where that changes the
// plan (before that fix it had run 16-31% slower at 8 units than at 4).
constexpr int kStridedHeldWideUnits = 8;
// Column groups of a tile whose statistics the cluster's blocks exchange, at most: a tile split over
// a cluster is 128 bytes of a row wide (TX = 128 / unit), so 128 / element size groups.
constexpr int kStridedHeldClusterGroups = 64;

struct StridedPlan {
  int vec = 1;     // elements per unit
  int fold = 1;    // > 1: inner, folded into rows of lcm(inner, vec) elements (see below)
  int64_t len = 0;    // rows of units: the axis length, or len * inner / lcm(inner, vec) where folded
  int n = 0;       // units a thread holds per input
  int tx = 0, ty = 0;
  int blocks = 0;  // per column tile (a cluster where > 1); 0: no cluster of up to 16 holds the axis
  int64_t units = 0;  // units per inner row
  int64_t tiles = 0;  // column tiles of tx units
};

inline bool all_aligned16(const SoftmaxDesc& d) {
  for (const void* p : {d.dy, d.y, static_cast<const void*>(d.out)})
    if (p && misalignment16(p) != 0) return false;
  return true;
}

// An inner size that is not a whole number of packs is folded where whole packs still tile the
// tensor: an outer slice [len, inner] is contiguous, so it is read as rows of P = lcm(inner, pack)
// elements, P / pack units each, len * inner / P of them, and element e of such a row belongs to
// column group e mod inner. The kernel keeps a statistic per element of a unit as for any pack and
// combines those of one group in element order at the end. Otherwise such inner sizes would move
// one element per access. A row is at most 128 bytes, so that a tile holds whole rows.
inline int64_t lcm64(int64_t a, int64_t b) {
  int64_t x = a, y = b;
  while (y != 0) x = std::exchange(y, x % y);
  return a / x * b;
}

inline StridedPlan strided_plan(const SoftmaxDesc& d) {
  StridedPlan p;
  if (d.outer <= 0 || d.axis_len <= 0 || d.inner <= 0) return p;  // empty: nothing runs
  const int64_t pe = pack_elems(d);
  const int64_t es = static_cast<int64_t>(elem_size(d));
  p.len = d.axis_len;
  const int64_t row = d.inner <= 128 ? lcm64(d.inner, pe) : 0;  // a folded row's elements
  if (all_aligned16(d) && d.inner % pe == 0) {
    p.vec = static_cast<int>(pe);
  } else if (all_aligned16(d) && row > 0 && row * es <= 128 && d.axis_len % (row / d.inner) == 0) {
    p.vec = static_cast<int>(pe);
    p.fold = static_cast<int>(d.inner);
    p.len = d.axis_len / (row / d.inner);
  }
  const int unit = p.vec * static_cast<int>(elem_size(d));
  p.n = strided_held_units(unit);
  p.units = p.fold > 1 ? row / pe : d.inner / p.vec;
  const int64_t line = std::max(1, 128 / unit);
  const int tx_min = static_cast<int>(std::min(p.units, line));
  if (p.vec > 1 && ceil_div(p.len, p.n) * tx_min > kStridedHeldThreads)
    p.n = kStridedHeldWideUnits;
  const int64_t lanes = ceil_div(p.len, p.n);  // lanes along the axis one block would need
  if (lanes * tx_min <= kStridedHeldThreads) {
    p.ty = static_cast<int>(lanes);
    p.tx = kStridedHeldThreads / p.ty;
    if (p.units <= p.tx) p.tx = static_cast<int>(p.units * (p.tx / p.units));  // whole inner rows a tile
    p.blocks = 1;
  } else {
    // Tiles of whole 128-byte lines of a row where its units allow, else of a power of two of
    // units that divides the row: a tile that straddles two rows reads pieces of lines.
    p.tx = tx_min;
    while (p.units % p.tx != 0) p.tx /= 2;
    const auto blocks_at = [&](int tx) { return ceil_div(p.len, int64_t{kStridedHeldThreads / tx} * p.n); };
    int64_t blocks = blocks_at(p.tx);
    // Where no cluster holds the axis in tiles that wide, the widest narrower tile (down to 32
    // bytes of a row, a sector) whose cluster does. On an H100, 64x8192x64 gradients held on 16
    // blocks in 64-byte tiles ran 1.15-1.5x faster than read twice by cuda:strided, and faster
    // than on 8 blocks in 32-byte tiles (f32 0.77 of copy against 0.67, 16-bit 0.64-0.71 against
    // 0.62-0.66). Tiles are not narrowed where a cluster holds the line-wide one: pieces of rows
    // cost more than ranks (341x1000x96 f32 on one block in 32-byte tiles ran 10% slower than on
    // 4 in 128-byte ones; 16-bit on one block against 2, the same).
    for (int tx = p.tx / 2; blocks > kMaxCluster && p.fold == 1 && tx >= std::max(1, 32 / unit); tx /= 2)
      if (blocks_at(tx) <= kMaxCluster) {
        p.tx = tx;
        blocks = blocks_at(tx);
      }
    p.ty = kStridedHeldThreads / p.tx;
    p.blocks = blocks <= kMaxCluster ? static_cast<int>(blocks) : 0;
  }
  p.tiles = ceil_div(d.outer * p.units, p.tx);
  return p;
}

// ---- the rows' kernels ----------------------------------------------------------------------------

template <class T>
Status softmax_warp(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev);
// One block per row (row_blocks(d) == 1).
template <class T>
Status softmax_block(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev);
// *blocks: the cluster size cuda:cluster_per_row runs a row on here, row_blocks(d) or, where a
// cluster that large cannot be co-scheduled on this device, the next smaller one that still holds
// the row; 0 where none can (then cuda:two_pass takes the row). Cached per kernel, block size and
// device, as the answer depends on nothing else.
template <class T>
Status softmax_cluster_size(std::string_view op, const SoftmaxDesc& d, const DeviceInfo& dev, int* blocks);
template <class T>
Status softmax_cluster(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev);
template <class T>
Status softmax_two_pass(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev);
// *fits: whether clusters of plan.blocks blocks of the held kernel can be co-scheduled here.
template <class T>
Status softmax_strided_held_fits(std::string_view op, const SoftmaxDesc& d, const StridedPlan& plan,
                                 const DeviceInfo& dev, bool* fits);
template <class T>
Status softmax_strided_held(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev);
template <class T>
Status softmax_strided(std::string_view op, const SoftmaxDesc& d, const Context& ctx, const DeviceInfo& dev);

}  // namespace gradops::cuda
