// Lab: softmax gradients on a middle axis too long for a cluster (8x32768x128 and its like), read
// once from memory instead of twice (lab/cuda/NOTES-softmax-axis.md, "Long axes read once: L2,
// shared memory, producers and consumers"). Three forms, none kept (the notes have the numbers):
//
// [outer, axis, inner] is cut into strips: one outer index, a column group `cw` bytes wide, the
// whole axis. A strip is split along the axis over `b` blocks (a number set by the shape, so the
// order of every sum is too). The grid is resident for the whole call (a cooperative launch), and
// each block posts its column sums of a strip to global scratch and counts itself on the strip's
// counter (integer, no float atomics); a strip's sums are its b blocks' in rank order.
//   reread_kernel (the default): k strips at a time, each block walking strip slot, slot + k, ...:
//      sums its rows, posts, optionally asks L2 for its rows `pf` strips ahead, waits for the
//      strip's posts, rereads its rows (L1 or L2) and writes dx.
//   held_kernel (--held 1): a block's rows of each strip are copied into shared memory, a ring of
//      three strips, and the strips pipelined: while strip j's group is awaited the block sums strip
//      j + 1, and strip j + 2's copies are in flight.
//   piped_kernel (--piped 1): b producers sum and post the strips in order; b consumers follow, at
//      most `pf` strips behind, rereading their rows from L2 to write dx.
//
// A check-then-time harness: the tests' data, float64 reference and tolerance (check/oracle,
// gradops::check::tolerance; docs/tolerances.md) first, then the median of timed runs against a
// 1 GiB device copy timed the same way (an L2 flush and a spin ahead of each run); one line a run.
//   cmake --preset cuda && cmake --build build/cuda --target gradops_checker
//   nvcc -O3 -std=c++20 -arch=sm_90 -Iinclude -Isrc -Icheck lab/cuda/long_axis.cu \
//     build/cuda/check/harness/libgradops_checker.a build/cuda/check/oracle/libgradops_oracle.a \
//     build/cuda/libgradops.a -lhwy -lsleef -lgomp -o long_axis
//   long_axis --op sg|lsg --dtype f32|bf16|f16 --shape O,A,I [--cw 128] [--b 132] [--threads 512]
//             [--held 0|1] [--piped 0|1] [--pf 1] [--pfmode line|bulk] [--kmax k] [--order bits]
//             [--nowait 1] [--reps 20]
// --pf: staged, strips ahead to prefetch into L2 (0: none); piped, the producers' lead.
// --order (held): bit 0 posts strip j + 1 before issuing j + 2's copies, bit 1 counts in with
// red.release instead of a fence and an atomic; (piped) bit 2 rereads with ld.global.lu.
// --nowait 1 (held, a diagnostic): skips the wait for a strip's posts, so the sums are wrong and
// the check fails; it times what the wait costs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/reduce.cuh"      // the library's conversions and warp reduction
#include "harness/checker.hpp"  // the tests' tolerance
#include "oracle/oracle.hpp"    // the tests' data and float64 reference

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(2);                                                                        \
    }                                                                                      \
  } while (0)

namespace {

namespace gc = gradops::check;
namespace go = gradops::oracle;

using gradops::cuda::from_compute;
using gradops::cuda::to_compute;

struct Plan {
  int64_t outer, axis, inner;
  int cwe;          // columns a strip (elements)
  int lanes;        // threads along a row piece: cwe / vec
  int b;            // blocks a strip
  int k;            // strips at a time
  int strips;       // outer * inner / cwe
  int pf;           // reread: strips ahead to prefetch (0: none); piped: the producers' lead
  int bulk;         // 1: cp.async.bulk.prefetch.L2 a row piece, 0: prefetch.global.L2 a line
  int nowait;       // diagnostic: skip the group wait (wrong sums; times what the wait costs)
  int order;        // held: bit 0 posts strip j + 1 before issuing j + 2's copies, bit 1 counts
                    // in by red.release; piped: bit 2 rereads with ld.global.lu
};

__device__ inline void prefetch_line(const void* p) {
  asm volatile("prefetch.global.L2::evict_last [%0];" ::"l"(p));
}
__device__ inline void prefetch_bulk(const void* p, unsigned bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}
__device__ inline unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

template <class T> constexpr int kVec = 16 / sizeof(T);

// Asks L2 for a block's rows of strip s (both inputs).
template <class T>
__device__ void prefetch_strip(const Plan& p, const T* dy, const T* y, int s, int64_t r0, int64_t r1) {
  const int groups = static_cast<int>(p.inner / p.cwe);
  const int64_t o = s / groups, c0 = static_cast<int64_t>(s % groups) * p.cwe;
  const unsigned piece = p.cwe * sizeof(T);
  const int lines = p.bulk ? 1 : static_cast<int>((piece + 127) / 128);
  const int64_t n = (r1 - r0) * lines * 2;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int input = static_cast<int>(i & 1);
    const int64_t j = i >> 1, row = r0 + j / lines, line = j % lines;
    const T* base = (input ? y : dy) + (o * p.axis + row) * p.inner + c0;
    if (p.bulk) prefetch_bulk(base, piece);
    else prefetch_line(reinterpret_cast<const char*>(base) + line * 128);
  }
}

// A block's column sums: a running sum a thread over its rows (acc), then the threads of a warp
// that share a column by shuffles (a fixed tree), then the warps: a warp a column, lane w holding
// warp w's sum, a shuffle tree again. red is read across its rows, so they are cwe + 1 floats
// apart (no bank conflicts); it holds blockDim / 32 such rows. Leaves the sums in out[0, cwe)
// (global or shared). Ends with a barrier.
__device__ inline float warp_sum(float v) {
  return gradops::cuda::group_allreduce<gradops::cuda::SumOp<float>>(v, 32);
}
template <int V>
__device__ void column_sums(float (&acc)[V], int lanes, int cwe, float* red, float* out) {
  for (int off = lanes; off < 32; off <<= 1)
    _Pragma("unroll") for (int v = 0; v < V; ++v) acc[v] += __shfl_xor_sync(0xffffffffu, acc[v], off);
  const int warp = threadIdx.x / 32, wl = threadIdx.x % 32, warps = blockDim.x / 32, ld = cwe + 1;
  if (wl < lanes) _Pragma("unroll") for (int v = 0; v < V; ++v) red[warp * ld + wl * V + v] = acc[v];
  __syncthreads();
  for (int c = warp; c < cwe; c += warps) {
    const float t = warp_sum(wl < warps ? red[wl * ld + c] : 0.f);
    if (wl == 0) out[c] = t;
  }
  __syncthreads();
}

// The strip's b blocks' sums in a fixed order: slices of ranks read along the columns (coalesced),
// then a warp a column adding the slices, lane l slices l, l + 32, ..., and a shuffle tree. Into
// total (shared); ends with a barrier.
__device__ void group_totals(const float* part, int b, int cwe, float* red, float* total) {
  const int slices = blockDim.x / cwe, ld = cwe + 1;
  {
    const int c = threadIdx.x % cwe, sl = threadIdx.x / cwe;
    float t = 0.f;
#pragma unroll 4
    for (int r = sl; r < b; r += slices) t += __ldcg(part + static_cast<int64_t>(r) * cwe + c);
    red[sl * ld + c] = t;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, wl = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int c = warp; c < cwe; c += warps) {
    float t = 0.f;
    for (int j = wl; j < slices; j += 32) t += red[j * ld + c];
    t = warp_sum(t);
    if (wl == 0) total[c] = t;
  }
  __syncthreads();
}

// Waits until a strip's b blocks have posted (thread 0 spins; `wait` false skips it, a
// diagnostic), adds their sums into total and loads this thread's columns of it into tot.
template <int V>
__device__ void strip_totals(const unsigned* counter, bool wait, const float* part, int b, int cwe,
                             float* red, float* total, int lane, float (&tot)[V]) {
  if (threadIdx.x == 0 && wait) {
    while (load_acquire(counter) < static_cast<unsigned>(b)) __nanosleep(32);
    __threadfence();
  }
  __syncthreads();
  group_totals(part, b, cwe, red, total);
  _Pragma("unroll") for (int v = 0; v < V; ++v) tot[v] = total[lane * V + v];
}

// The per-element halves every form shares. load(i, r) gives the 16 bytes of row r of input i
// (0: dy, 1: y) that a thread handles, from memory or from shared memory.
// Adds y * dy (kLog: dy) of rows r, r + step, ... below r1 into acc.
template <class T, bool kLog, int U, class Load>
__device__ inline void sum_rows(Load load, int64_t r, int64_t r1, int step, float (&acc)[kVec<T>]) {
#pragma unroll U
  for (; r < r1; r += step) {
    const uint4 gd = load(0, r);
    const T* g = reinterpret_cast<const T*>(&gd);
    if constexpr (kLog) {
      _Pragma("unroll") for (int v = 0; v < kVec<T>; ++v) acc[v] += to_compute(g[v]);
    } else {
      const uint4 yd = load(1, r);
      const T* w = reinterpret_cast<const T*>(&yd);
      _Pragma("unroll") for (int v = 0; v < kVec<T>; ++v) acc[v] = fmaf(to_compute(w[v]), to_compute(g[v]), acc[v]);
    }
  }
}
// Writes dx = y (dy - tot) (kLog: dy - exp(y) tot) for the same rows; dx points at row 0's pack.
template <class T, bool kLog, int U, class Load>
__device__ inline void write_rows(Load load, T* dx, int64_t inner, int64_t r, int64_t r1, int step,
                                  const float (&tot)[kVec<T>]) {
#pragma unroll U
  for (; r < r1; r += step) {
    const uint4 gd = load(0, r), yd = load(1, r);
    const T* g = reinterpret_cast<const T*>(&gd);
    const T* w = reinterpret_cast<const T*>(&yd);
    uint4 od;
    T* out = reinterpret_cast<T*>(&od);
    _Pragma("unroll") for (int v = 0; v < kVec<T>; ++v) {
      const float gv = to_compute(g[v]), wv = to_compute(w[v]);
      out[v] = from_compute<T>(kLog ? gv - expf(wv) * tot[v] : wv * (gv - tot[v]));
    }
    __stcs(reinterpret_cast<uint4*>(dx + r * inner), od);
  }
}

// The reread form: sums from memory, dx from what L1 or L2 still holds of the same rows.
// kLog: LogSoftmaxGrad (dx = dy - exp(y) sum dy), else SoftmaxGrad (dx = y (dy - sum y dy)).
template <class T, bool kLog>
__global__ void __launch_bounds__(512, 2) reread_kernel(Plan p, const T* __restrict__ dy,
                                                     const T* __restrict__ y, T* __restrict__ dx,
                                                     float* __restrict__ partial,
                                                     unsigned* __restrict__ count) {
  constexpr int V = kVec<T>;
  extern __shared__ float smem[];  // the sums' scratch (column_sums, group_totals), then total
  const int slot = blockIdx.x / p.b, rank = blockIdx.x % p.b;
  const int lane = threadIdx.x % p.lanes, ro = threadIdx.x / p.lanes;
  const int rows_at_once = blockDim.x / p.lanes;
  const int64_t r0 = p.axis * rank / p.b, r1 = p.axis * (rank + 1) / p.b;
  const int groups = static_cast<int>(p.inner / p.cwe);
  float* total = smem + rows_at_once * p.cwe;

  if (p.pf)
    for (int a = 1; a <= p.pf; ++a)
      if (slot + a * p.k < p.strips) prefetch_strip(p, dy, y, slot + a * p.k, r0, r1);

  for (int s = slot, step = 0; s < p.strips; s += p.k, ++step) {
    const int64_t o = s / groups, c0 = static_cast<int64_t>(s % groups) * p.cwe + lane * V;
    const int64_t base = o * p.axis * p.inner + c0;
    // A: this block's sums, a running sum a thread over its rows, then the threads in order.
    float acc[V];
    _Pragma("unroll") for (int v = 0; v < V; ++v) acc[v] = 0.f;
    const auto global = [&](int i, int64_t r) {
      return *reinterpret_cast<const uint4*>((i ? y : dy) + base + r * p.inner);
    };
    sum_rows<T, kLog, 4>(global, r0 + ro, r1, rows_at_once, acc);
    column_sums(acc, p.lanes, p.cwe, smem, partial + (static_cast<int64_t>(s) * p.b + rank) * p.cwe);
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(count + s, 1u);
    }
    // P: the strip pf steps ahead, while the others post.
    if (p.pf && s + p.pf * p.k < p.strips && step > 0) prefetch_strip(p, dy, y, s + p.pf * p.k, r0, r1);
    // W: the strip's blocks, then their sums in rank order (slices of ranks, then the slices).
    float tot[V];
    strip_totals(count + s, true, partial + static_cast<int64_t>(s) * p.b * p.cwe, p.b, p.cwe, smem,
                 total, lane, tot);
    // B: dx for this block's rows.
    write_rows<T, kLog, 2>(global, dx + base, p.inner, r0 + ro, r1, rows_at_once, tot);
    __syncthreads();  // smem is reused by the next strip
  }
}

__device__ inline void cp_async16(void* smem, const void* gmem) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}
__device__ inline void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ inline void cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

// The held form: a block's rows of each strip are copied into shared memory (a ring of 3 strips)
// and the strips are pipelined: while strip j's group is awaited, this block sums strip j + 1 (its
// copies landed during strip j) and strip j + 2's copies are in flight. Memory sees each input
// once, and the wait for a group overlaps the next strip's sums and copies.
template <class T, bool kLog>
__global__ void __launch_bounds__(1024, 1) held_kernel(Plan p, const T* __restrict__ dy,
                                                       const T* __restrict__ y, T* __restrict__ dx,
                                                       float* __restrict__ partial,
                                                       unsigned* __restrict__ count) {
  constexpr int kRing = 3;  // strips in shared memory: awaited, being summed, being copied
  constexpr int V = kVec<T>;
  extern __shared__ __align__(16) unsigned char sm[];
  const int slot = blockIdx.x / p.b, rank = blockIdx.x % p.b;
  const int lane = threadIdx.x % p.lanes, ro = threadIdx.x / p.lanes;
  const int rows_at_once = blockDim.x / p.lanes;
  const int64_t r0 = p.axis * rank / p.b, r1 = p.axis * (rank + 1) / p.b;
  const int64_t rows_max = (p.axis + p.b - 1) / p.b;
  const int groups = static_cast<int>(p.inner / p.cwe);
  const int piece = p.cwe * static_cast<int>(sizeof(T));
  const size_t buf_bytes = static_cast<size_t>(rows_max) * piece * 2;
  float* red = reinterpret_cast<float*>(sm + kRing * buf_bytes);
  float* total = red + max(blockDim.x / 32, blockDim.x / p.cwe) * (p.cwe + 1);
  const int steps = (p.strips - slot + p.k - 1) / p.k;
  auto strip = [&](int step) { return slot + step * p.k; };
  auto col0 = [&](int s) {
    return (s / groups) * p.axis * p.inner + static_cast<int64_t>(s % groups) * p.cwe + lane * V;
  };
  auto buffer = [&](int step) { return sm + (step % kRing) * buf_bytes + lane * 16; };

  auto issue = [&](int step) {
    if (step < steps) {
      const int64_t base = col0(strip(step));
      unsigned char* buf = buffer(step);
      for (int64_t r = r0 + ro; r < r1; r += rows_at_once) {
        const int64_t i = r - r0;
        cp_async16(buf + i * piece, dy + base + r * p.inner);
        cp_async16(buf + (rows_max + i) * piece, y + base + r * p.inner);
      }
    }
    cp_commit();  // empty groups too, so that a wait counts the same groups on every step
  };
  // Sums the block's rows of a landed strip, posts them, counts the block in.
  // The strip held in buffer(step): row r of input i sits at (i * rows_max + r - r0) pieces.
  auto held = [&](int step) {
    const unsigned char* buf = buffer(step);
    return [=](int i, int64_t r) {
      return *reinterpret_cast<const uint4*>(buf + (i * rows_max + r - r0) * piece);
    };
  };
  auto post = [&](int step) {
    const int s = strip(step);
    float acc[V];
    _Pragma("unroll") for (int v = 0; v < V; ++v) acc[v] = 0.f;
    sum_rows<T, kLog, 2>(held(step), r0 + ro, r1, rows_at_once, acc);
    column_sums(acc, p.lanes, p.cwe, red, partial + (static_cast<int64_t>(s) * p.b + rank) * p.cwe);
    if (threadIdx.x == 0) {
      if (p.order & 2) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count + s) : "memory");
      } else {
        __threadfence();
        atomicAdd(count + s, 1u);
      }
    }
  };

  issue(0);
  issue(1);
  cp_wait<1>();
  if (steps > 0) post(0);
  for (int step = 0; step < steps; ++step) {
    if (p.order & 1) {  // the signal's fence then waits for no copies in flight
      cp_wait<0>();
      if (step + 1 < steps) post(step + 1);
      issue(step + 2);
    } else {
      issue(step + 2);
      cp_wait<1>();  // strip step + 1 has landed (this thread's copies)
      if (step + 1 < steps) post(step + 1);
    }
    const int s = strip(step);
    float tot[V];
    strip_totals(count + s, !p.nowait, partial + static_cast<int64_t>(s) * p.b * p.cwe, p.b, p.cwe,
                 red, total, lane, tot);
    write_rows<T, kLog, 2>(held(step), dx + col0(s), p.inner, r0 + ro, r1, rows_at_once, tot);
    // No barrier: total is rewritten only after the next step's post, which every warp reaches
    // after this loop.
  }
  cp_wait<0>();
}

// The piped form: producers and consumers, two kinds of block in one resident grid (no shared
// memory held). The b producers walk the strips in order: each reads its rows of strip s from
// memory, sums them and posts (A, W's counter). The b consumers walk the same strips `lag` behind
// at most: each waits for strip s's posts, adds them in rank order and rereads its rows, from L2
// now, to write dx (B), then counts itself done; a producer starts strip s only when strip
// s - lag is done, so that L2 holds the strips in between (lag x 2 x cw x axis bytes). The two
// passes of `cuda:strided`, but a few strips apart instead of a tensor apart: memory sees each
// input once, and neither kind of block waits on the other while the pipe is full.
template <class T, bool kLog>
__global__ void __launch_bounds__(512, 2) piped_kernel(Plan p, const T* __restrict__ dy,
                                                       const T* __restrict__ y, T* __restrict__ dx,
                                                       float* __restrict__ partial,
                                                       unsigned* __restrict__ count) {
  constexpr int V = kVec<T>;
  extern __shared__ float smem[];
  const bool producer = blockIdx.x < p.b;
  const int rank = producer ? blockIdx.x : blockIdx.x - p.b;
  const int lane = threadIdx.x % p.lanes, ro = threadIdx.x / p.lanes;
  const int rows_at_once = blockDim.x / p.lanes;
  const int64_t r0 = p.axis * rank / p.b, r1 = p.axis * (rank + 1) / p.b;
  const int groups = static_cast<int>(p.inner / p.cwe);
  unsigned* done = count + p.strips;
  float* total = smem + rows_at_once * p.cwe;
  for (int s = 0; s < p.strips; ++s) {
    const int64_t base = (s / groups) * p.axis * p.inner + static_cast<int64_t>(s % groups) * p.cwe + lane * V;
    const auto global = [&](int i, int64_t r) {
      return *reinterpret_cast<const uint4*>((i ? y : dy) + base + r * p.inner);
    };
    if (producer) {
      if (s >= p.pf) {  // L2 holds at most pf strips ahead of the consumers
        if (threadIdx.x == 0)
          while (load_acquire(done + s - p.pf) < static_cast<unsigned>(p.b)) __nanosleep(64);
        __syncthreads();
      }
      float acc[V];
      _Pragma("unroll") for (int v = 0; v < V; ++v) acc[v] = 0.f;
      sum_rows<T, kLog, 4>(global, r0 + ro, r1, rows_at_once, acc);
      column_sums(acc, p.lanes, p.cwe, smem, partial + (static_cast<int64_t>(s) * p.b + rank) * p.cwe);
      if (threadIdx.x == 0) asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(count + s) : "memory");
    } else {
      float tot[V];
      strip_totals(count + s, true, partial + static_cast<int64_t>(s) * p.b * p.cwe, p.b, p.cwe, smem,
                   total, lane, tot);
      // ld.global.lu (--order 4): the reread is the rows' last use.
      const auto last = [&](int i, int64_t r) {
        const uint4* q = reinterpret_cast<const uint4*>((i ? y : dy) + base + r * p.inner);
        return (p.order & 4) ? __ldlu(q) : *q;
      };
      write_rows<T, kLog, 4>(last, dx + base, p.inner, r0 + ro, r1, rows_at_once, tot);
      __syncthreads();  // every thread's rows read (and total, before the next strip rewrites it)
      if (threadIdx.x == 0) atomicAdd(done + s, 1u);
    }
  }
}

__global__ void spin(long long ns) {
  const long long t0 = clock64();
  while (clock64() - t0 < ns) {
  }
}

// ---- host ------------------------------------------------------------------------------------

struct Args {
  std::string op = "sg", dtype = "f32", pfmode = "line";
  int64_t O = 8, A = 32768, I = 128;
  int cw = 128, b = 132, threads = 512, pf = 1, reps = 20, kmax = 1 << 20, held = 0, nowait = 0, order = 0, piped = 0;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--op") a.op = v;
    else if (k == "--dtype") a.dtype = v;
    else if (k == "--pfmode") a.pfmode = v;
    else if (k == "--shape") std::sscanf(v.c_str(), "%ld,%ld,%ld", &a.O, &a.A, &a.I);
    else if (k == "--cw") a.cw = std::atoi(v.c_str());
    else if (k == "--b") a.b = std::atoi(v.c_str());
    else if (k == "--threads") a.threads = std::atoi(v.c_str());
    else if (k == "--pf") a.pf = std::atoi(v.c_str());
    else if (k == "--piped") a.piped = std::atoi(v.c_str());
    else if (k == "--order") a.order = std::atoi(v.c_str());
    else if (k == "--nowait") a.nowait = std::atoi(v.c_str());
    else if (k == "--held") a.held = std::atoi(v.c_str());
    else if (k == "--kmax") a.kmax = std::atoi(v.c_str());
    else if (k == "--reps") a.reps = std::atoi(v.c_str());
    else { std::fprintf(stderr, "unknown %s\n", k.c_str()); std::exit(2); }
  }
  return a;
}

template <class T> gradops::DType dtype_of() {
  if constexpr (std::is_same_v<T, __half>) return gradops::DType::f16;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return gradops::DType::bf16;
  return gradops::DType::f32;
}

template <class T, bool kLog>
int run(const Args& a) {
  constexpr int V = kVec<T>;
  const int64_t n = a.O * a.A * a.I;
  Plan p{};
  p.outer = a.O, p.axis = a.A, p.inner = a.I;
  p.cwe = a.cw / static_cast<int>(sizeof(T));
  p.lanes = p.cwe / V;
  p.b = a.b;
  p.pf = a.pf;
  p.bulk = a.pfmode == "bulk";
  p.nowait = a.nowait;
  p.order = a.order;
  if (a.I % p.cwe || p.cwe % V || a.threads % p.cwe || p.b > a.A) {
    std::fprintf(stderr, "bad plan: cw %d elements, inner %ld, threads %d\n", p.cwe, a.I, a.threads);
    return 2;
  }
  p.strips = static_cast<int>(a.O * (a.I / p.cwe));
  const int rows_at_once = a.threads / p.lanes;
  const int slices = a.threads / p.cwe;
  size_t smem = (std::max(rows_at_once, slices) + 1) * p.cwe * sizeof(float);
  auto kern = reread_kernel<T, kLog>;
  if (a.piped) kern = piped_kernel<T, kLog>;  // pf: the lag in strips
  if (a.held) {
    kern = held_kernel<T, kLog>;
    smem += 3 * static_cast<size_t>((a.A + p.b - 1) / p.b) * a.cw * 2;
    p.pf = 0;
  }
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  int dev = 0, sms = 0, per_sm = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, a.threads, smem));
  const int resident = sms * per_sm;
  p.k = a.piped ? 1 : std::min({resident / p.b, p.strips, a.kmax});
  if (p.k < 1 || (a.piped && 2 * p.b > resident)) {
    std::fprintf(stderr, "b %d > resident %d\n", p.b, resident);
    return 2;
  }
  const int grid = a.piped ? 2 * p.b : p.k * p.b;
  cudaFuncAttributes fa{};
  CK(cudaFuncGetAttributes(&fa, kern));

  // The tests' data, reference and tolerance (check/oracle, check/harness): dy and y as the
  // oracle draws them for this op, stored in T exactly.
  gc::Problem prob;
  prob.op = kLog ? gradops::OpId::LogSoftmaxGrad_13 : gradops::OpId::SoftmaxGrad_13;
  prob.sig = {{dtype_of<T>(), dtype_of<T>(), dtype_of<T>()}};
  prob.shape = {a.O, a.A, a.I};
  prob.attrs = {{"axis", 1.0}};
  const go::Attrs attrs = gc::full_attrs(prob);
  const std::string name(gradops::op_schema(prob.op).name);
  const gradops::DType dts[] = {gc::input_dtype(prob, 0), gc::input_dtype(prob, 1)};
  go::Rng rng(12345 + a.b * 7 + a.cw);
  const go::Tensors in = go::make_inputs(name, prob.shape, attrs, dts, rng);
  const go::Tensors ref = go::reference(name, in, attrs);
  std::vector<T> gt(n), yt(n), dxt(n);
  for (int64_t e = 0; e < n; ++e) {
    gt[e] = T(static_cast<float>(in[0]->v[e]));  // exact: the oracle's values are T's
    yt[e] = T(static_cast<float>(in[1]->v[e]));
  }
  T *dy, *y, *dx;
  float* partial;
  unsigned* count;
  const size_t bytes = n * sizeof(T);
  CK(cudaMalloc(&dy, bytes));
  CK(cudaMalloc(&y, bytes));
  CK(cudaMalloc(&dx, bytes));
  CK(cudaMalloc(&partial, static_cast<size_t>(p.strips) * p.b * p.cwe * sizeof(float)));
  CK(cudaMalloc(&count, 2 * p.strips * sizeof(unsigned)));
  CK(cudaMemcpy(dy, gt.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(y, yt.data(), bytes, cudaMemcpyHostToDevice));

  auto launch = [&] {
    CK(cudaMemsetAsync(count, 0, 2 * p.strips * sizeof(unsigned)));
    void* args[] = {&p, &dy, &y, &dx, &partial, &count};
    CK(cudaLaunchCooperativeKernel(reinterpret_cast<void*>(kern), grid, a.threads, args, smem));
  };
  CK(cudaMemset(dx, 0xff, bytes));
  launch();
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(dxt.data(), dx, bytes, cudaMemcpyDeviceToHost));

  // Check: |dx - reference| <= abs + rel |reference| everywhere.
  const gc::Tolerance tol = gc::tolerance(prob, 0);
  double worst = 0;
  int64_t bad = 0;
  for (int64_t e = 0; e < n; ++e) {
    const double want = ref[0]->v[e], err = std::fabs(double(static_cast<float>(dxt[e])) - want);
    const double bound = tol.abs + tol.rel * std::fabs(want);
    if (!(err <= bound)) ++bad;
    worst = std::max(worst, err / bound);
  }

  // Time: L2 flush and a spin ahead of each run, median of reps, against a 1 GiB copy timed so.
  char* flush;
  char *src, *dst;
  CK(cudaMalloc(&flush, 256 << 20));
  CK(cudaMalloc(&src, 1 << 30));
  CK(cudaMalloc(&dst, 1 << 30));
  CK(cudaMemset(src, 1, 1 << 30));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto median_ms = [&](auto fn) {
    for (int i = 0; i < 3; ++i) fn();
    std::vector<float> t;
    for (int i = 0; i < a.reps; ++i) {
      CK(cudaMemsetAsync(flush, i, 256 << 20));
      spin<<<1, 1>>>(400000);
      CK(cudaEventRecord(e0));
      fn();
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  };
  const float copy_ms = median_ms([&] { CK(cudaMemcpyAsync(dst, src, 1 << 30, cudaMemcpyDeviceToDevice)); });
  const float ms = median_ms(launch);
  const double copy_gbs = 2.0 * (1 << 30) / (copy_ms * 1e-3) / 1e9;
  const double moved = static_cast<double>(bytes) * 3;
  const double gbs = moved / (ms * 1e-3) / 1e9;
  std::printf("%s %s %ldx%ldx%ld cw %d b %d k %d grid %d (%d/SM, %d regs, %zu B smem) threads %d held %d piped %d order %d pf %d %s | "
              "check %s worst %.2f of tol (%ld bad) | %.1f us %.0f GB/s copy %.0f GB/s share %.3f\n",
              kLog ? "LogSoftmaxGrad_13" : "SoftmaxGrad_13", a.dtype.c_str(), a.O, a.A, a.I, a.cw,
              p.b, p.k, grid, per_sm, fa.numRegs, smem, a.threads, a.held, a.piped, a.order, p.pf, a.pfmode.c_str(),
              bad ? "FAIL" : "ok", worst, bad, ms * 1e3, gbs, copy_gbs, gbs / copy_gbs);
  return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  const bool lg = a.op == "lsg";
  if (a.dtype == "f32") return lg ? run<float, true>(a) : run<float, false>(a);
  if (a.dtype == "f16") return lg ? run<__half, true>(a) : run<__half, false>(a);
  if (a.dtype == "bf16") return lg ? run<__nv_bfloat16, true>(a) : run<__nv_bfloat16, false>(a);
  std::fprintf(stderr, "dtype?\n");
  return 2;
}
