// Activation family, CUDA kernels.
//
// Without a bias: one kernel over 16-byte packs (4 x f32, 8 x f16/bf16, 2 x f64), a block per
// contiguous chunk, kUnroll packs of every input in flight per thread. "cuda:vec16" runs when
// every pointer sits at the same offset from a 16-byte boundary: the elements before the first
// boundary and after the last whole pack go one per thread. Otherwise "cuda:scalar" moves one
// element per access (still coalesced).
//
// With a bias (BiasGeluGrad_dX, BiasFastGeluGrad_dX, BiasGelu, FastGelu with bias): a 2-D kernel
// in which each thread owns one column unit (a pack of columns, or a single column at the ragged
// ends of a row) for a range of rows, so that it reads its bias once and sums its dX columns in
// registers. dB: each block writes one row of compute-type partial sums per column, and a small
// second kernel adds the partials of each column in a fixed order. The grid depends on the shape
// only, so dB has the same bits on every run and every device; no atomics.
//
// Math in f32 for f16/bf16/f32 and f64 for f64, each output rounded once: CUDA's accurate library
// functions (exp, tanh; normcdf for f64; no fast-math), and for f32 GELU a one-exp formulation
// whose accuracy is derived below and checked by the tests.
#include <algorithm>

#include "core/workspace.hpp"
#include "cuda/common.cuh"
#include "ops/activation.hpp"

namespace gradops::cuda {
namespace {

using detail::ActivationDesc;

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kFastGeluGamma = 0.044715;

// ---- math ---------------------------------------------------------------------------------------

__device__ __forceinline__ double dnormcdf(double v) { return ::normcdf(v); }
__device__ __forceinline__ float dtanh(float v) { return tanhf(v); }
__device__ __forceinline__ double dtanh(double v) { return ::tanh(v); }

// 1/v to within an ulp: the hardware's approximate reciprocal (exact to 2 ulp for v in the normal
// range) and one Newton step. The arguments here lie in [1, 400].
__device__ __forceinline__ float recip(float v) {
  const float r = __fdividef(1.0f, v);
  return fmaf(r, fmaf(-v, r, 1.0f), r);
}
__device__ __forceinline__ double recip(double v) { return 1.0 / v; }

// sigmoid(v) and sigmoid(-v) = 1 - sigmoid(v) from one exp, neither by subtraction from 1.
template <class A>
__device__ __forceinline__ void sigmoid_pair(A v, A& s, A& s_neg) {
  const A e = dexp(-dabs(v));
  const A r = recip(A(1) + e);
  const A er = e * r;
  const bool pos = v >= A(0);
  s = pos ? r : er;
  s_neg = pos ? er : r;
}
template <class A>
__device__ __forceinline__ A sigmoid(A v) {
  A s, sn;
  sigmoid_pair(v, s, sn);
  return s;
}

// GELU in f32 from one exp. With t = |x|/sqrt(2) and e = exp(-x^2/2), Phi(-|x|) = e erfcx(t) / 2,
// where erfcx(t) = exp(t^2) erfc(t) is smooth and decays like 1/(t sqrt(pi)):
//   erfcx(t) = (1 + P(u)) / (1 + 2t),  u = (t - K) / (t + K) in [-1, 1),
// P fitted (weighted least squares iterated towards minimax). Then, without cancellation in either
// tail,
//   gelu'(x) = e (erfcx/2 + x/sqrt(2 pi))        for x < 0,
//   gelu'(x) = 1 - e (erfcx/2 - x/sqrt(2 pi))    for x >= 0,
// and gelu(x) = x Phi(x) likewise. About half the instructions of normcdff + expf, which made the
// 16-bit kernels compute-bound on an H100.
//   f32 outputs: K = 3, degree 11 (relative error below 4e-9), x^2 split exactly into p + pe so
//     that e keeps its relative accuracy out to |x| ~ 13, a Newton-refined reciprocal. Simulated
//     in f32 against float64 over [-14, 14]: gelu' within 1.8e-7 absolute and 3.3e-7 relative
//     down the negative tail to x = -13; gelu within 4.1e-7 relative.
//   f16/bf16 outputs (the short form): K = 2.5, degree 7 (below 3.2e-6), no split, the hardware
//     reciprocal as is: gelu' within 6e-7 absolute and 4e-6 relative in the tail, gelu within
//     6e-6 relative, all far below half an ulp of f16 (2.4e-4), so still rounded once from f32.
__constant__ float kErfcxPoly[12] = {
    2.530080676e-01f, -1.356210709e-01f, -4.756214842e-02f, 1.296440512e-01f,
    -1.192753389e-01f, 6.831692904e-02f, -2.376340702e-02f, 2.498203656e-03f,
    1.874892274e-03f, -7.254716475e-04f, -9.247317212e-05f, 7.693195948e-05f};
__constant__ float kErfcxPolyShort[8] = {
    2.648356557e-01f, -1.223734990e-01f, -9.894108772e-02f, 1.578470469e-01f,
    -1.034030840e-01f, 3.196991235e-02f, 1.695965067e-03f, -3.255299991e-03f};

// e = exp(-x^2/2) and h = erfcx(|x|/sqrt(2))/2, so that Phi(-|x|) = e h.
template <bool kShort>
__device__ __forceinline__ void gelu_parts(float x, float& e, float& h) {
  constexpr float K = kShort ? 2.5f : 3.0f;
  const float t = fminf(fabsf(x) * static_cast<float>(kSqrtHalf), 40.0f);  // e is 0 long before
  const float q = t + K, d = fmaf(2.0f, t, 1.0f);
  const float r = kShort ? __fdividef(1.0f, q * d) : recip(q * d);
  const float u = (t - K) * d * r;
  const float inv_d = q * r;
  float p;
  if constexpr (kShort) {
    p = kErfcxPolyShort[7];
#pragma unroll
    for (int k = 6; k >= 0; --k) p = fmaf(p, u, kErfcxPolyShort[k]);
  } else {
    p = kErfcxPoly[11];
#pragma unroll
    for (int k = 10; k >= 0; --k) p = fmaf(p, u, kErfcxPoly[k]);
  }
  h = 0.5f * fmaf(p, inv_d, inv_d);
  const float x2 = x * x;
  const float ex = expf(-0.5f * x2);
  if constexpr (kShort) {
    e = ex;
  } else {
    const float x2e = fmaf(x, x, -x2);
    e = ex == 0.0f ? 0.0f : fmaf(ex, -0.5f * x2e, ex);  // 0 also where x^2 overflowed
  }
}

template <bool kShort>
__device__ __forceinline__ float gelu_derivative(float x) {
  float e, h;
  gelu_parts<kShort>(x, e, h);
  const float w = x * static_cast<float>(kInvSqrt2Pi);
  return x < 0.0f ? e * (h + w) : fmaf(-e, h - w, 1.0f);
}
template <bool kShort>
__device__ __forceinline__ float gelu(float x) {
  float e, h;
  gelu_parts<kShort>(x, e, h);
  const float tail = e * h;  // Phi(-|x|)
  return x < 0.0f ? x * tail : x * (1.0f - tail);
}

// f64: the library's normcdf and exp, with the same split of x^2.
template <bool>
__device__ __forceinline__ double gelu_derivative(double x) {
  const double p = x * x;
  const double pe = ::fma(x, x, -p);
  const double t = ::exp(-0.5 * p);
  const double pdf = t == 0.0 ? 0.0 : ::fma(t, -0.5 * pe, t) * kInvSqrt2Pi;
  return dnormcdf(x) + x * pdf;
}
template <bool>
__device__ __forceinline__ double gelu(double x) {
  return x * dnormcdf(x);
}

// FastGelu: y = z s, s = sigmoid(2u), u = sqrt(2/pi) (z + gamma z^3).
template <class A>
__device__ __forceinline__ A fast_gelu_u2(A z) {
  return A(2 * kSqrt2OverPi) * z * dfma(A(kFastGeluGamma) * z, z, A(1));
}
template <class A>
__device__ __forceinline__ A fast_gelu_derivative(A z) {
  A s, sn;
  sigmoid_pair(fast_gelu_u2(z), s, sn);
  const A w = s * sn;  // (1 - tanh^2 u) / 4
  if (w == A(0)) return s;  // saturated; avoids inf * 0 for huge |z|
  return s + A(2 * kSqrt2OverPi) * z * dfma(A(3 * kFastGeluGamma) * z, z, A(1)) * w;
}

enum class Fn : uint8_t {
  // gradients (read dY)
  gelu_grad, fast_gelu_grad, relu_grad, sigmoid_grad, tanh_grad, quick_gelu_grad, leaky_relu_grad,
  // forwards
  gelu, fast_gelu, quick_gelu, relu, sigmoid, tanh, leaky_relu,
};
template <Fn F>
struct FnTag {
  static constexpr Fn value = F;
};
__host__ __device__ constexpr bool takes_dy(Fn f) { return f < Fn::gelu; }
__host__ __device__ constexpr bool has_bias_form(Fn f) {
  return f == Fn::gelu_grad || f == Fn::fast_gelu_grad || f == Fn::gelu || f == Fn::fast_gelu;
}

// One element: g is dY (gradients only), v the op's main input (X, or Y where the op reads the
// forward output; X + B for the bias forms).
template <Fn F, class T, class A = compute_t<T>>
__device__ __forceinline__ A apply(A g, A v, A alpha) {
  constexpr bool kShort = sizeof(T) == 2;  // 16-bit outputs: the short GELU suffices
  if constexpr (F == Fn::gelu_grad) return g * gelu_derivative<kShort>(v);
  if constexpr (F == Fn::fast_gelu_grad) return g * fast_gelu_derivative(v);
  if constexpr (F == Fn::relu_grad) return v > A(0) ? g : A(0);
  if constexpr (F == Fn::sigmoid_grad) return g * v * (A(1) - v);
  if constexpr (F == Fn::tanh_grad) return g * ((A(1) - v) * (A(1) + v));
  if constexpr (F == Fn::quick_gelu_grad) {
    const A w = alpha * v;
    A s, sn;
    sigmoid_pair(w, s, sn);
    return g * (s * dfma(w, sn, A(1)));
  }
  if constexpr (F == Fn::leaky_relu_grad) return v > A(0) ? g : alpha * g;
  if constexpr (F == Fn::gelu) return gelu<kShort>(v);
  if constexpr (F == Fn::fast_gelu) return v * sigmoid(fast_gelu_u2(v));
  if constexpr (F == Fn::quick_gelu) return v * sigmoid(alpha * v);
  if constexpr (F == Fn::relu) return v > A(0) || v != v ? v : A(0);  // NaN propagates
  if constexpr (F == Fn::sigmoid) return sigmoid(v);
  if constexpr (F == Fn::tanh) return dtanh(v);
  if constexpr (F == Fn::leaky_relu) return v > A(0) ? v : alpha * v;
  return A(0);
}

// ---- without a bias: flat, grid-stride --------------------------------------------------------

constexpr int kFlatThreads = 256;
// Packs of each input in flight per thread: 16 elements of f32 or f16/bf16 (whose 16-bit kernels
// otherwise take so many registers for the converted values that too few threads stay resident
// to hide the GELU's latency); f64 keeps fewer live across the calls its library functions make.
template <class T>
inline constexpr int kUnroll = sizeof(T) == 8 ? 1 : sizeof(T) == 4 ? 4 : 2;
// Resident blocks of 256 threads asked of the register allocator (0: left to it): four for the
// 16-bit kernels (64 registers, where its own choices spilled); f64 takes the registers it needs
// (under the allocator's own budget its library calls spill).
template <class T>
inline constexpr int kMinBlocks = sizeof(T) == 8 ? 1 : sizeof(T) == 2 ? 4 : 0;

struct FlatArgs {
  const void* dy;  // gradients only
  const void* x;
  void* out;       // may be dy itself
  int64_t n;       // elements
  int64_t head;    // single elements before the first 16-byte boundary (0 for the scalar path)
  int64_t packs;   // whole packs after them; the rest (fewer than a pack) are single elements
  float alpha;
};

template <Fn F, class T, int VEC>
__device__ __forceinline__ Pack<T, VEC> apply_pack(const Pack<T, VEC>& g, const Pack<T, VEC>& v,
                                                   compute_t<T> alpha) {
  using A = compute_t<T>;
  Pack<T, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const A gj = takes_dy(F) ? to_compute(g.v[j]) : A(0);
    o.v[j] = from_compute<T>(apply<F, T>(gj, to_compute(v.v[j]), alpha));
  }
  return o;
}

// Block b takes chunk b of kFlatThreads * kUnroll packs (and b + gridDim.x, ... only where there are
// more chunks than a grid can have): kUnroll packs per thread, a block apart, so that each load
// instruction of a warp covers 512 contiguous bytes and a block one contiguous chunk. Every output
// element is read and written by the same thread, all loads of a chunk before its stores: dX may
// be the very buffer of dY.
template <Fn F, class T, int VEC>
__global__ void __launch_bounds__(kFlatThreads, kMinBlocks<T>) flat_kernel(FlatArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  constexpr bool kGrad = takes_dy(F);
  constexpr int kU = kUnroll<T>;
  constexpr int64_t kChunk = int64_t{kFlatThreads} * kU;
  const T* dy = static_cast<const T*>(a.dy);
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.out);
  const A alpha = static_cast<A>(a.alpha);

  // The ragged ends: fewer than two packs' worth of elements, one per thread of block 0.
  const int64_t body_end = a.head + a.packs * VEC;
  if (blockIdx.x == 0 && threadIdx.x < a.head + (a.n - body_end)) {
    const int64_t i = threadIdx.x < a.head ? threadIdx.x : body_end + (threadIdx.x - a.head);
    A g = A(0);
    if constexpr (kGrad) g = to_compute(dy[i]);
    out[i] = from_compute<T>(apply<F, T>(g, to_compute(x[i]), alpha));
  }

  const P* pdy = kGrad ? reinterpret_cast<const P*>(dy + a.head) : nullptr;
  const P* px = reinterpret_cast<const P*>(x + a.head);
  P* po = reinterpret_cast<P*>(out + a.head);
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * kChunk; c < a.packs; c += static_cast<int64_t>(gridDim.x) * kChunk) {
    const int64_t i = c + threadIdx.x;
    const bool full = c + kChunk <= a.packs;
    P g[kU] = {}, v[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (full || i + u * kFlatThreads < a.packs) {
        if constexpr (kGrad) g[u] = pdy[i + u * kFlatThreads];
        v[u] = px[i + u * kFlatThreads];
      }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (full || i + u * kFlatThreads < a.packs) po[i + u * kFlatThreads] = apply_pack<F, T, VEC>(g[u], v[u], alpha);
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <Fn F, class T, int VEC>
Status run_flat(std::string_view op, const ActivationDesc& d, const Context& ctx) {
  FlatArgs a{d.dy, d.x, d.out, d.count, 0, d.count, d.alpha};
  if constexpr (VEC > 1) {
    const unsigned m = misalignment16(d.x);
    a.head = std::min<int64_t>(d.count, (16 - m) % 16 / sizeof(T));
    a.packs = (d.count - a.head) / VEC;
  }
  // A block per chunk: measured on an H100, this keeps the memory system busier than a grid of
  // resident blocks looping over the tensor (0.99 against 0.95 of copy bandwidth).
  const int64_t blocks = std::clamp<int64_t>(ceil_div(a.packs, int64_t{kFlatThreads} * kUnroll<T>), 1, 0x7fffffff);
  return launch(op, "the elementwise kernel launch", flat_kernel<F, T, VEC>, dim3(static_cast<unsigned>(blocks)),
                dim3(kFlatThreads), stream_of(ctx), a);
}

// ---- with a bias: rows x cols -----------------------------------------------------------------

constexpr int kBiasThreads = 256;
// Rows in flight per thread: 16 elements of f32 or f16/bf16, as in the flat kernel.
template <class T>
inline constexpr int kRowUnroll = sizeof(T) == 2 ? 2 : 4;
constexpr int64_t kTargetBlocks = 4096;    // several waves of resident blocks on a large GPU
constexpr int64_t kMaxPartials = 1 << 22;  // dB partials per call, at most (16 MiB in f32)

// As kMinBlocks; f32 gets up to 128 registers (its GELU spilled at the allocator's choice of 64).
template <class T>
inline constexpr int kBiasMinBlocks = sizeof(T) == 8 ? 1 : sizeof(T) == 4 ? 2 : 0;

struct BiasArgs {
  const void* dy;  // gradients only
  const void* x;
  const void* b;
  void* out;
  void* partial;          // [groups][cols] compute-type column sums of dX, or nullptr (no dB)
  int64_t rows, cols;
  int64_t head, packs;    // per row: `head` single columns, `packs` whole packs, then single columns
  int64_t units;          // head + packs + the single columns after them
  int64_t rows_per_group; // rows of one blockIdx.y
  float alpha;
};

// blockDim = (TX, TY): threadIdx.x picks the column unit, threadIdx.y the row lane. Threads of a
// column unit take rows ty, ty + TY, ... of the block's row group.
template <Fn F, class T, int VEC>
__global__ void __launch_bounds__(kBiasThreads, kBiasMinBlocks<T>) bias_kernel(BiasArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  constexpr bool kGrad = takes_dy(F);
  __shared__ A red[kBiasThreads * VEC];
  const T* dy = static_cast<const T*>(a.dy);
  const T* x = static_cast<const T*>(a.x);
  const T* b = static_cast<const T*>(a.b);
  T* out = static_cast<T*>(a.out);
  A* partial = static_cast<A*>(a.partial);
  const A alpha = static_cast<A>(a.alpha);
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x, TY = blockDim.y;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * a.rows_per_group;
  const int64_t r1 = min(a.rows, r0 + a.rows_per_group);
  const int64_t tail_start = a.head + a.packs * VEC;

  for (int64_t cb = blockIdx.x; cb * TX < a.units; cb += gridDim.x) {
    const int64_t u = cb * TX + tx;
    int width = 0;
    int64_t col = 0;
    if (u < a.head) {
      col = u, width = 1;
    } else if (u - a.head < a.packs) {
      col = a.head + (u - a.head) * VEC, width = VEC;
    } else if (u < a.units) {
      col = tail_start + (u - a.head - a.packs), width = 1;
    }
    A acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = A(0);

    if (width == VEC) {
      const P bp = *reinterpret_cast<const P*>(b + col);
      A bv[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) bv[j] = to_compute(bp.v[j]);
      auto row_step = [&](const P& g, const P& v, int64_t off) {
        P o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A gj = kGrad ? to_compute(g.v[j]) : A(0);
          const A y = apply<F, T>(gj, to_compute(v.v[j]) + bv[j], alpha);
          o.v[j] = from_compute<T>(y);
          acc[j] += y;
        }
        *reinterpret_cast<P*>(out + off) = o;
      };
      int64_t r = r0 + ty;
      constexpr int kR = kRowUnroll<T>;
      for (; r + (kR - 1) * TY < r1; r += kR * TY) {
        P g[kR] = {}, v[kR];
#pragma unroll
        for (int k = 0; k < kR; ++k) {
          const int64_t off = (r + k * TY) * a.cols + col;
          if constexpr (kGrad) g[k] = *reinterpret_cast<const P*>(dy + off);
          v[k] = *reinterpret_cast<const P*>(x + off);
        }
#pragma unroll
        for (int k = 0; k < kR; ++k) row_step(g[k], v[k], (r + k * TY) * a.cols + col);
      }
      for (; r < r1; r += TY) {
        const int64_t off = r * a.cols + col;
        P g = {};
        if constexpr (kGrad) g = *reinterpret_cast<const P*>(dy + off);
        const P v = *reinterpret_cast<const P*>(x + off);
        row_step(g, v, off);
      }
    } else if (width == 1) {
      const A bv = to_compute(b[col]);
      for (int64_t r = r0 + ty; r < r1; r += TY) {
        const int64_t off = r * a.cols + col;
        A g = A(0);
        if constexpr (kGrad) g = to_compute(dy[off]);
        const A y = apply<F, T>(g, to_compute(x[off]) + bv, alpha);
        out[off] = from_compute<T>(y);
        acc[0] += y;
      }
    }

    if (partial) {  // the same for every thread of the launch
#pragma unroll
      for (int j = 0; j < VEC; ++j) red[(ty * TX + tx) * VEC + j] = acc[j];
      __syncthreads();
      if (ty == 0) {
        for (int j = 0; j < width; ++j) {
          A s = red[tx * VEC + j];
          for (int k = 1; k < TY; ++k) s += red[(k * TX + tx) * VEC + j];
          partial[static_cast<int64_t>(blockIdx.y) * a.cols + col + j] = s;
        }
      }
      __syncthreads();
    }
  }
}

// db[c] = sum over groups g of partial[g][c] in a fixed order: lane ty of a 32 x 32 block adds
// groups ty, ty + 32, ...; the 32 lane sums are then added in lane order.
constexpr int kSumLanes = 32;

template <class T>
__global__ void __launch_bounds__(32 * kSumLanes) column_sum_kernel(const compute_t<T>* partial, T* db,
                                                                   int64_t groups, int64_t cols) {
  using A = compute_t<T>;
  __shared__ A lanes[kSumLanes][33];
  const int tx = threadIdx.x % 32, ty = threadIdx.x / 32;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.x) * 32; c0 < cols; c0 += static_cast<int64_t>(gridDim.x) * 32) {
    const int64_t c = c0 + tx;
    A s = A(0);
    if (c < cols)
      for (int64_t g = ty; g < groups; g += kSumLanes) s += partial[g * cols + c];
    lanes[ty][tx] = s;
    __syncthreads();
    if (ty == 0 && c < cols) {
      A t = lanes[0][tx];
      for (int k = 1; k < kSumLanes; ++k) t += lanes[k][tx];
      db[c] = from_compute<T>(t);
    }
    __syncthreads();
  }
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

template <Fn F, class T, int VEC>
Status run_bias(std::string_view op, const ActivationDesc& d, const Context& ctx, const DeviceInfo& dev) {
  using A = compute_t<T>;
  BiasArgs a{d.dy, d.x, d.bias, d.out, nullptr, d.count / d.cols, d.cols, 0, d.cols, d.cols, 0, d.alpha};
  if constexpr (VEC > 1) {
    const unsigned m = misalignment16(d.x);  // the same for every row: cols fills whole packs
    a.head = std::min<int64_t>(d.cols, (16 - m) % 16 / sizeof(T));
    a.packs = (d.cols - a.head) / VEC;
    a.units = a.head + a.packs + (d.cols - a.head - a.packs * VEC);
  }
  const int tx = static_cast<int>(std::min<int64_t>(32, pow2_ceil(a.units)));
  const int ty = kBiasThreads / tx;
  const int64_t col_blocks = ceil_div(a.units, tx);
  // Row groups from the shape alone: dB's summation order, hence its bits, depends on nothing else.
  int64_t groups = std::clamp<int64_t>(ceil_div(kTargetBlocks, col_blocks), 1, ceil_div(a.rows, ty));
  if (d.db) groups = std::min<int64_t>(groups, std::max<int64_t>(1, kMaxPartials / d.cols));
  groups = std::min<int64_t>(groups, 65535);
  a.rows_per_group = ceil_div(a.rows, groups);
  groups = ceil_div(a.rows, a.rows_per_group);

  detail::Workspace ws;
  if (d.db) {
    const std::size_t bytes = sizeof(A) * static_cast<std::size_t>(groups * d.cols);
    if (Status s = ws.allocate(ctx, Device::cuda(dev.ordinal), bytes, op); !s) return s;
    a.partial = ws.as<A>();
  }
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>(col_blocks, 0x7fffffff)), static_cast<unsigned>(groups));
  if (Status s = launch(op, "the bias kernel launch", bias_kernel<F, T, VEC>, grid, dim3(tx, ty), stream_of(ctx), a);
      !s)
    return s;
  if (!d.db) return {};
  const int64_t sum_blocks = std::min<int64_t>(ceil_div(d.cols, 32), 65535);
  return launch(op, "the dB column-sum launch", column_sum_kernel<T>, dim3(static_cast<unsigned>(sum_blocks)),
                dim3(32 * kSumLanes), stream_of(ctx), static_cast<const A*>(a.partial), static_cast<T*>(d.db), groups,
                d.cols);
}

// ---- dispatch -----------------------------------------------------------------------------------

template <class G>
Status visit_fn(OpId op, G&& g) {
  switch (op) {
    case OpId::GeluGrad: case OpId::BiasGeluGrad_dX: return g(FnTag<Fn::gelu_grad>{});
    case OpId::FastGeluGrad: case OpId::BiasFastGeluGrad_dX: return g(FnTag<Fn::fast_gelu_grad>{});
    case OpId::ReluGrad: return g(FnTag<Fn::relu_grad>{});
    case OpId::SigmoidGrad: return g(FnTag<Fn::sigmoid_grad>{});
    case OpId::TanhGrad: return g(FnTag<Fn::tanh_grad>{});
    case OpId::QuickGeluGrad: return g(FnTag<Fn::quick_gelu_grad>{});
    case OpId::LeakyReluGrad: return g(FnTag<Fn::leaky_relu_grad>{});
    case OpId::Gelu: case OpId::BiasGelu: return g(FnTag<Fn::gelu>{});
    case OpId::FastGelu: return g(FnTag<Fn::fast_gelu>{});
    case OpId::QuickGelu: return g(FnTag<Fn::quick_gelu>{});
    case OpId::Relu: return g(FnTag<Fn::relu>{});
    case OpId::Sigmoid: return g(FnTag<Fn::sigmoid>{});
    case OpId::Tanh: return g(FnTag<Fn::tanh>{});
    case OpId::LeakyRelu: return g(FnTag<Fn::leaky_relu>{});
    default: break;
  }
  return Status(StatusCode::internal, std::string(op_schema(op).name) + ": not an activation op");
}

bool element_aligned(const ActivationDesc& d) {
  const std::size_t es = dtype_size(d.dtype);
  for (const void* p : {d.dy, d.x, d.bias, static_cast<const void*>(d.out), static_cast<const void*>(d.db)})
    if (p && !aligned_to(p, es)) return false;
  return true;
}

Status run(const ActivationDesc& d, const Context& ctx, bool vec) {
  const std::string_view op = op_schema(d.op).name;
  if (!element_aligned(d))
    return Status(StatusCode::unimplemented,
                  std::string(op) + ": the CUDA kernels need every pointer aligned to its element size (" +
                      std::to_string(dtype_size(d.dtype)) + " bytes)");
  if (d.count == 0) {  // dB over zero rows is zero (+0.0 has all-zero bits in every format)
    if (d.db && d.cols > 0)
      return status_of(cudaMemsetAsync(d.db, 0, static_cast<std::size_t>(d.cols) * dtype_size(d.dtype), stream_of(ctx)),
                       op, "cudaMemsetAsync (dB of an empty tensor)");
    return {};
  }
  DeviceInfo dev;
  if (Status s = current_device(op, &dev); !s) return s;
  return visit_storage(d.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    constexpr int V = kPackElems<T>;
    return visit_fn(d.op, [&](auto fn) -> Status {
      constexpr Fn F = decltype(fn)::value;
      if constexpr (has_bias_form(F)) {
        if (d.bias) return vec ? run_bias<F, T, V>(op, d, ctx, dev) : run_bias<F, T, 1>(op, d, ctx, dev);
      }
      return vec ? run_flat<F, T, V>(op, d, ctx) : run_flat<F, T, 1>(op, d, ctx);
    });
  });
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

const char* cuda_activation_vec16_declines(const ActivationDesc& d) {
  const std::size_t es = dtype_size(d.dtype);
  const unsigned m = cuda::misalignment16(d.x);
  if (m % es) return "declines: X is not aligned to its element size";
  if ((d.dy && cuda::misalignment16(d.dy) != m) || cuda::misalignment16(d.out) != m)
    return "declines: the tensors sit at different offsets from a 16-byte boundary";
  if (d.bias) {
    if (cuda::misalignment16(d.bias) != m) return "declines: the bias sits at another offset from a 16-byte boundary";
    if (d.cols * static_cast<int64_t>(es) % 16) return "declines: a row is not a whole number of 16-byte packs";
  }
  return nullptr;
}

Status cuda_activation_vec16(const ActivationDesc& d, const Context& ctx) { return cuda::run(d, ctx, true); }
Status cuda_activation_scalar(const ActivationDesc& d, const Context& ctx) { return cuda::run(d, ctx, false); }

}  // namespace gradops::detail
