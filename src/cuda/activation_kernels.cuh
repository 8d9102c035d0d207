// Activation family, CUDA kernels. Included once per storage type (activation_<dtype>.cu), which
// compiles the rows' entries at the end of this file for that type; the rows themselves, what each
// kernel takes and why, are in activation_rows.cu.
//
// Without a bias (cuda:flat_vec16, cuda:flat_scalar): one kernel over 16-byte packs (4 x f32,
// 8 x f16/bf16, 2 x f64), a block per contiguous chunk, kUnroll packs of every input in flight per
// thread, when every pointer sits at the same offset from a 16-byte boundary: the elements before
// the first boundary and after the last whole pack go one per thread. Otherwise the same kernel
// moves one element per access (still coalesced).
//
// Bias grads without dB on 16-byte-aligned rows of whole packs (cuda:flat_bias_vec16): the flat
// kernel, each pack adding its bias pack (p mod packs per row; 16384x4096 bf16 0.92 of copy against
// 0.89 in the 2-D kernel below, whose pieces of many rows cap it at 0.92 even without math).
//
// 16-bit bias grads with dB on such rows (cuda:bias_row_vec16): the row kernel, in which each block
// takes a tile of a row's columns (a pack a thread) down an interleaved group of rows (g, g + G,
// ...), so that the blocks in flight read neighbouring rows; each thread sums its own columns, with
// no block reduction (16384x4096 0.90 of copy on an H100 against 0.87-0.88 in the 2-D kernel).
//
// With a bias otherwise (cuda:bias_2d_vec16, cuda:bias_2d_scalar): a 2-D kernel
// in which each thread owns one column unit (a pack of columns, or a single column at the ragged
// ends of a row) for a range of rows, so that it reads its bias once and sums its dX columns in
// registers. dB: each block writes one row of compute-type partial sums per column, and a small
// second kernel, launched while the first drains (programmatic dependent launch), adds the
// partials of each column in a fixed order. The grid depends on the shape only, so dB has the
// same bits on every run and every device; no atomics.
//
// Math in f32 for f16/bf16/f32 and f64 for f64, each output rounded once. f32 and f64 outputs:
// CUDA's accurate library functions (exp, tanh; no fast-math) and a one-exp GELU (erfcx fitted in
// f32, the library's in f64) whose accuracy is derived below and checked by the tests. f16/bf16
// outputs, whose half ulp (2^-12 relative at best) dwarfs an f32 ulp: the hardware's exp2 and
// reciprocal, and a short GELU (Abramowitz and Stegun's rational form of the normal tail) with an
// absolute error of 3e-7.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>

#include "core/workspace.hpp"
#include "cuda/activation_rows.cuh"
#include "cuda/column_sum.cuh"
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

__device__ __forceinline__ float dtanh(float v) { return tanhf(v); }
__device__ __forceinline__ double dtanh(double v) { return ::tanh(v); }

// 1/v to within an ulp: the hardware's approximate reciprocal (exact to 2 ulp for v in the normal
// range) and one Newton step. The arguments here lie in [3, 3483] (gelu_parts: (t + 3)(2t + 1),
// t <= 40).
__device__ __forceinline__ float recip(float v) {
  const float r = __fdividef(1.0f, v);
  return fmaf(r, fmaf(-v, r, 1.0f), r);
}
__device__ __forceinline__ double recip(double v) { return 1.0 / v; }

// sigmoid(v) and sigmoid(-v) = 1 - sigmoid(v) from one exp, neither by subtraction from 1. kFast
// (results rounded to f16/bf16): the hardware's exp2 and reciprocal, within a few ulp of f32.
template <bool kFast = false, class A>
__device__ __forceinline__ void sigmoid_pair(A v, A& s, A& s_neg) {
  A e, r;
  if constexpr (kFast && std::is_same_v<A, float>) {
    e = ex2_approx(fabsf(v) * -1.44269504088896341f);
    r = rcp_approx(1.0f + e);
  } else {
    e = dexp(-dabs(v));
    r = recip(A(1) + e);
  }
  const A er = e * r;
  const bool pos = v >= A(0);
  s = pos ? r : er;
  s_neg = pos ? er : r;
}
template <bool kFast = false, class A>
__device__ __forceinline__ A sigmoid(A v) {
  A s, sn;
  sigmoid_pair<kFast>(v, s, sn);
  return s;
}

// GELU in f32 from one exp. With t = |x|/sqrt(2) and e = exp(-x^2/2), Phi(-|x|) = e erfcx(t) / 2,
// where erfcx(t) = exp(t^2) erfc(t) is smooth and decays like 1/(t sqrt(pi)):
//   erfcx(t) = (1 + P(u)) / (1 + 2t),  u = (t - K) / (t + K) in [-1, 1),
// P fitted (weighted least squares iterated towards minimax), K = 3, degree 11 (relative error
// below 4e-9). Then, without cancellation in either tail,
//   gelu'(x) = e (erfcx/2 + x/sqrt(2 pi))        for x < 0,
//   gelu'(x) = 1 - e (erfcx/2 - x/sqrt(2 pi))    for x >= 0,
// and gelu(x) = x Phi(x) likewise. x^2 is split exactly into p + pe so that e keeps its relative
// accuracy out to |x| ~ 13; the reciprocal is Newton-refined. Simulated in f32 against float64
// over [-14, 14]: gelu' within 1.8e-7 absolute and 3.3e-7 relative down the negative tail to
// x = -13; gelu within 4.1e-7 relative. About half the instructions of normcdff + expf.
__constant__ float kErfcxPoly[12] = {
    2.530080676e-01f, -1.356210709e-01f, -4.756214842e-02f, 1.296440512e-01f,
    -1.192753389e-01f, 6.831692904e-02f, -2.376340702e-02f, 2.498203656e-03f,
    1.874892274e-03f, -7.254716475e-04f, -9.247317212e-05f, 7.693195948e-05f};

// e = exp(-x^2/2) and h = erfcx(|x|/sqrt(2))/2, so that Phi(-|x|) = e h.
__device__ __forceinline__ void gelu_parts(float x, float& e, float& h) {
  constexpr float K = 3.0f;
  const float t = fminf(fabsf(x) * static_cast<float>(kSqrtHalf), 40.0f);  // e is 0 long before
  const float q = t + K, d = fmaf(2.0f, t, 1.0f);
  const float r = recip(q * d);
  const float u = (t - K) * d * r;
  const float inv_d = q * r;
  float p = kErfcxPoly[11];
#pragma unroll
  for (int k = 10; k >= 0; --k) p = fmaf(p, u, kErfcxPoly[k]);
  h = 0.5f * fmaf(p, inv_d, inv_d);
  const float x2 = x * x;
  const float ex = expf(-0.5f * x2);
  const float x2e = fmaf(x, x, -x2);
  e = ex == 0.0f ? 0.0f : fmaf(ex, -0.5f * x2e, ex);  // 0 also where x^2 overflowed
}

// f64: the same one-exp form with CUDA's erfcx (4 ulp) for erfcx(t): one exp an element where
// normcdf + exp took two (normcdf's erfc evaluates its own), and x^2 split exactly likewise.
__device__ __forceinline__ void gelu_parts(double x, double& e, double& h) {
  h = 0.5 * ::erfcx(fabs(x) * kSqrtHalf);
  const double x2 = x * x;
  const double ex = ::exp(-0.5 * x2);
  const double x2e = ::fma(x, x, -x2);
  e = ex == 0.0 ? 0.0 : ::fma(ex, -0.5 * x2e, ex);  // 0 also where x^2 overflowed
}

// GELU' and GELU from e and h, in f32 or f64. x/sqrt(2 pi) from x clamped to [-64, 64], where e
// is 0 long before: +-inf give the limits 0 and 1, not inf * 0 (NaN in x is NaN in e, and stays
// NaN).
template <class A>
__device__ __forceinline__ A gelu_derivative_long(A x) {
  A e, h;
  gelu_parts(x, e, h);
  const A w = fmin(fmax(x, A(-64)), A(64)) * static_cast<A>(kInvSqrt2Pi);
  return x < A(0) ? e * (h + w) : dfma(-e, h - w, A(1));
}
template <class A>
__device__ __forceinline__ A gelu_long(A x) {
  A e, h;
  gelu_parts(x, e, h);
  const A tail = e * h;  // Phi(-|x|)
  return x < A(0) ? x * tail : x * (A(1) - tail);
}

// The short form, for results rounded to f16/bf16 (whose half ulp, 2^-12 relative, dwarfs its
// error): Phi(-a) = Z(a) P(t), a = |x|, t = 1/(1 + p a), Z the normal density, P a degree-5
// polynomial (Abramowitz and Stegun 26.2.17, |error| < 7.5e-8), with the hardware's exp2 and
// reciprocal. Then gelu'(x) = v or 1 - v with v = Z (P - a) for x < 0 and x >= 0, and
// gelu(x) = -a Z P or x - a Z P: no cancellation in either tail. Simulated in f32 against float64
// over [-20, 20]: gelu' within 3.0e-7 absolute, gelu within 9.6e-7. About 16 instructions an
// element, half the long form's: the 16-bit kernels move 4 bytes an element and were issue-bound.
// a is clamped at 16 (Z is 0 in f32 long before) with NaN kept, so gelu' at +-inf is 1 and 0.
struct GeluShort {
  float a, z, zp;  // |x| (clamped), Z(a), Z(a) P(t)
};
__device__ __forceinline__ GeluShort gelu_short(float x) {
  constexpr double c = kInvSqrt2Pi;
  const float a = min_nan(fabsf(x), 16.0f);
  const float t = rcp_approx(fmaf(0.2316419f, a, 1.0f));
  float p = static_cast<float>(1.330274429 * c);
  p = fmaf(p, t, static_cast<float>(-1.821255978 * c));
  p = fmaf(p, t, static_cast<float>(1.781477937 * c));
  p = fmaf(p, t, static_cast<float>(-0.356563782 * c));
  p = fmaf(p, t, static_cast<float>(0.319381530 * c));
  const float e = ex2_approx(a * a * -0.72134752044448170f);  // exp(-a^2/2)
  return {a, e * static_cast<float>(c), e * (p * t)};
}

template <bool kShort>
__device__ __forceinline__ float gelu_derivative(float x) {
  if constexpr (kShort) {
    const GeluShort s = gelu_short(x);
    const float v = fmaf(-s.z, s.a, s.zp);  // Z (P - a)
    return x < 0.0f ? v : 1.0f - v;
  } else {
    return gelu_derivative_long(x);
  }
}
template <bool kShort>
__device__ __forceinline__ float gelu(float x) {
  if constexpr (kShort) {
    const GeluShort s = gelu_short(x);
    // x Z P for x < 0 (= -a Z P below the clamp), so that -inf gives NaN as x Phi(x) does in f32
    // and f64 and in the oracle, not the clamped -0.
    return x < 0.0f ? x * s.zp : fmaf(-s.a, s.zp, x);
  } else {
    return gelu_long(x);
  }
}

// f64: the long form.
template <bool>
__device__ __forceinline__ double gelu_derivative(double x) {
  return gelu_derivative_long(x);
}
template <bool>
__device__ __forceinline__ double gelu(double x) {
  return gelu_long(x);
}

// FastGelu: y = z s, s = sigmoid(2u), u = sqrt(2/pi) (z + gamma z^3).
template <class A>
__device__ __forceinline__ A fast_gelu_u2(A z) {
  return A(2 * kSqrt2OverPi) * z * dfma(A(kFastGeluGamma) * z, z, A(1));
}
template <bool kFast, class A>
__device__ __forceinline__ A fast_gelu_derivative(A z) {
  A s, sn;
  sigmoid_pair<kFast>(fast_gelu_u2(z), s, sn);
  const A w = s * sn;  // (1 - tanh^2 u) / 4
  if (w == A(0)) return s;  // saturated; avoids inf * 0 for huge |z|
  return s + A(2 * kSqrt2OverPi) * z * dfma(A(3 * kFastGeluGamma) * z, z, A(1)) * w;
}

// The formula is the family contract's ActivationKind (src/ops/activation.hpp). Its predicates are
// host constexpr functions, which device code may not call: the kernels read them as constants.
using Kind = detail::ActivationKind;
template <Kind F>
inline constexpr bool kTakesDy = detail::activation_is_grad(F);
template <Kind F>
inline constexpr bool kHasBiasForm = detail::activation_kind_takes_bias(F);
template <Kind>
inline constexpr bool kNoFormula = false;

// One element: g is dY (gradients only), v the op's main input (X, or Y where the op reads the
// forward output; X + B for the bias forms).
template <Kind F, class T, class A = compute_t<T>>
__device__ __forceinline__ A apply(A g, A v, A alpha) {
  constexpr bool kShort = sizeof(T) == 2;  // 16-bit outputs: the short GELU and fast exp suffice
  if constexpr (F == Kind::gelu_grad) return g * gelu_derivative<kShort>(v);
  else if constexpr (F == Kind::fast_gelu_grad) return g * fast_gelu_derivative<kShort>(v);
  else if constexpr (F == Kind::relu_grad) return v > A(0) ? g : A(0);
  else if constexpr (F == Kind::sigmoid_grad) return g * v * (A(1) - v);
  else if constexpr (F == Kind::tanh_grad) return g * ((A(1) - v) * (A(1) + v));
  else if constexpr (F == Kind::quick_gelu_grad) {
    const A w = alpha * v;
    A s, sn;
    sigmoid_pair<kShort>(w, s, sn);
    return g * (s * dfma(w, sn, A(1)));
  } else if constexpr (F == Kind::leaky_relu_grad) return v > A(0) ? g : alpha * g;
  else if constexpr (F == Kind::gelu) return gelu<kShort>(v);
  else if constexpr (F == Kind::fast_gelu) return v * sigmoid<kShort>(fast_gelu_u2(v));
  else if constexpr (F == Kind::quick_gelu) return v * sigmoid<kShort>(alpha * v);
  else if constexpr (F == Kind::relu) return v > A(0) || v != v ? v : A(0);  // NaN propagates
  else if constexpr (F == Kind::sigmoid) return sigmoid<kShort>(v);
  else if constexpr (F == Kind::tanh) return dtanh(v);
  else if constexpr (F == Kind::leaky_relu) return v > A(0) ? v : alpha * v;
  else static_assert(kNoFormula<F>, "a Kind of the family contract without its formula here");
}

// ---- without a bias: flat, grid-stride --------------------------------------------------------

// Threads per block, and packs of each input in flight per thread: 128 x 2 (f32, f16/bf16), the
// fastest of 128/256/512 x 2/4 on an H200 for every op and dtype (by up to 1%; 4 packs cost the
// 16-bit GELUs 1 to 5%), 256 x 1 for f64, whose library calls keep fewer values live.
constexpr int kFlatThreads = 256;  // the unit of kMinBlocks
template <class T>
inline constexpr int kFlatThreadsOf = sizeof(T) == 8 ? 256 : 128;
template <class T>
inline constexpr int kUnroll = sizeof(T) == 8 ? 1 : 2;
// Resident threads asked of the register allocator, in blocks of 256 (0: left to it): four for the
// 16-bit kernels (64 registers, where its own choices spilled); f64 takes the registers it needs
// (under the allocator's own budget its library calls spill).
template <class T>
inline constexpr int kMinBlocks = sizeof(T) == 8 ? 1 : sizeof(T) == 2 ? 4 : 0;
// Cache hint of the flat kernel's 16-byte accesses (load_pack/store_pack). Every byte is touched
// once, yet streaming (evict-first) accesses were 10% slower on an H200: plain ones.
template <class T>
inline constexpr int kFlatHint = 0;

struct FlatArgs {
  const void* dy;  // gradients only
  const void* x;
  void* out;       // may be dy itself
  int64_t n;       // elements
  int64_t head;    // single elements before the first 16-byte boundary (0 for the scalar path)
  int64_t packs;   // whole packs after them; the rest (fewer than a pack) are single elements
  float alpha;
  const void* b = nullptr;   // bias forms without dB: the bias, one pack per bias_packs of X
  uint32_t bias_packs = 1;   // packs in a row (head 0, rows of whole packs, packs < 2^32)
};

template <Kind F, class T, int VEC, bool kBias = false>
__device__ __forceinline__ Pack<T, VEC> apply_pack(const Pack<T, VEC>& g, const Pack<T, VEC>& v,
                                                   compute_t<T> alpha, const Pack<T, VEC>& b = {}) {
  using A = compute_t<T>;
  Pack<T, VEC> o;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const A gj = kTakesDy<F> ? unpack(g, j) : A(0);
    A vj = unpack(v, j);
    if constexpr (kBias) vj = vj + unpack(b, j);  // as the bias kernel: X + B in the compute type
    o.v[j] = from_compute<T>(apply<F, T>(gj, vj, alpha));
  }
  return o;
}

// Block b takes chunk b of kThreads * kU packs (and b + gridDim.x, ... only where there are more
// chunks than a grid can have): kU packs per thread, a block apart, so that each load
// instruction of a warp covers 512 contiguous bytes and a block one contiguous chunk. Every output
// element is read and written by the same thread, all loads of a chunk before its stores: dX may
// be the very buffer of dY. kBias: the bias forms without dB, on rows of whole packs from a
// 16-byte boundary: pack p takes bias pack p mod bias_packs (from L1 after its first use), so that
// the bias grads stream contiguous chunks like the plain ones instead of the bias kernel's pieces
// of many rows.
template <Kind F, class T, int VEC, int kU = kUnroll<T>, int kMinB = kMinBlocks<T>, int kHint = kFlatHint<T>,
          int kThreads = kFlatThreadsOf<T>, bool kBias = false>
__global__ void __launch_bounds__(kThreads, kMinB* kFlatThreads / kThreads) flat_kernel(FlatArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  constexpr bool kGrad = kTakesDy<F>;
  constexpr int64_t kChunk = int64_t{kThreads} * kU;
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
    P g[kU] = {}, v[kU], bb[kU] = {};
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (full || i + u * kThreads < a.packs) {
        if constexpr (kGrad) g[u] = load_pack<kHint>(pdy + i + u * kThreads);
        v[u] = load_pack<kHint>(px + i + u * kThreads);
        if constexpr (kBias)
          bb[u] = static_cast<const P*>(a.b)[static_cast<uint32_t>(i + u * kThreads) % a.bias_packs];
      }
#pragma unroll
    for (int u = 0; u < kU; ++u)
      if (full || i + u * kThreads < a.packs)
        store_pack<kHint>(po + i + u * kThreads, apply_pack<F, T, VEC, kBias>(g[u], v[u], alpha, bb[u]));
  }
}

template <Kind F, class T, int VEC, int kU = kUnroll<T>, int kMinB = kMinBlocks<T>, int kHint = kFlatHint<T>,
          int kThreads = kFlatThreadsOf<T>, bool kBias = false>
Status run_flat(std::string_view op, const ActivationDesc& d, const Context& ctx) {
  FlatArgs a{d.dy, d.x, d.out, d.count, 0, d.count, d.alpha};
  if constexpr (kBias) {
    a.b = d.bias;
    a.bias_packs = static_cast<uint32_t>(d.cols / VEC);
  }
  if constexpr (VEC > 1) {
    const unsigned m = misalignment16(d.x);
    a.head = std::min<int64_t>(d.count, (16 - m) % 16 / sizeof(T));
    a.packs = (d.count - a.head) / VEC;
  }
  // A block per chunk: measured on an H100, this keeps the memory system busier than a grid of
  // resident blocks looping over the tensor (0.99 against 0.95 of copy bandwidth).
  const int64_t blocks = std::clamp<int64_t>(ceil_div(a.packs, int64_t{kThreads} * kU), 1, 0x7fffffff);
  return launch(op, "the elementwise kernel launch", flat_kernel<F, T, VEC, kU, kMinB, kHint, kThreads, kBias>,
                dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream_of(ctx), a);
}

// ---- with a bias: rows x cols -----------------------------------------------------------------

constexpr int kBiasThreads = 256;
// The 2-D kernel runs for f32 bias grads with dB, for bias grads on rows not of whole 16-byte
// packs, for f64 and for the forwards (other bias grads take the flat kernel or, 16-bit with dB,
// the row kernel).
// Tuning per op and dtype, measured on an H200 (132 SMs) at 16384x4096 and 8192x3072 against
// 2/4/8 rows a batch, plain or software pipelined (the loads of batch i + 1 issued before batch i
// is computed, in two register buffers: lab/cuda/patches/bias_pipelined.patch), and 2 to 4
// resident blocks (lab/cuda/NOTES.md):
//   rows       rows of each input loaded per batch and thread;
//   min_blocks resident 256-thread blocks asked of the register allocator (128 registers at 2,
//              64 at 4);
//   target     blocks launched, at most (whole row groups of the column blocks): one wave of
//              min_blocks blocks on each of 132 SMs in f32 and 16-bit, 256 in f64. A constant, so
//              that the row groups, and with them dB's summation order and bits, depend on the
//              shape alone.
// f32: plain batches of 8 rows. GELU (its long form, ~50 instructions an element) with dB: 0.94 of
// copy on an H100 at 16384x4096 and 4096x16384 against 0.89 pipelined in batches of 4 (8192x3072:
// 0.86 against 0.83), 0.88-0.89 against 0.91 on an H200; FastGelu 0.96-0.97 against 0.93-0.94
// pipelined. 16-bit (measured when the 2-D kernel also took the aligned rows): more warps with
// fewer rows each, 4 rows x 4 blocks (0.89, dB 0.85; 8192x3072 0.79 against 0.75); the pipelined
// forms spilled under that register bound, and 8 rows x 2 blocks measured the same or up to 4%
// slower. f64: 2 rows.
struct BiasTuning {
  int rows;
  int min_blocks;
  int64_t target;
};
template <Kind F, class T>
constexpr BiasTuning bias_tuning() {
  if constexpr (sizeof(T) == 8) return {2, 1, 256};
  if constexpr (sizeof(T) == 2) return {4, 4, 4 * 132};
  return {8, 2, 2 * 132};
}
constexpr int64_t kMaxPartials = 1 << 22;  // dB partials per call, at most (16 MiB in f32)
// Column units of a block row at most (a warp's width: wider stretches of a row measured no
// faster).
constexpr int kBiasMaxTx = 32;

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
// kDb: whether dB is wanted (a.partial set); without it no column sums are kept, one add an element
// fewer.
template <Kind F, class T, int VEC, int kR, int kMinB, bool kDb>
__global__ void __launch_bounds__(kBiasThreads, kMinB) bias_kernel(BiasArgs a) {
  using A = compute_t<T>;
  griddep_launch_dependents();  // dB's column sum may launch now; it waits for this grid's end
  using P = Pack<T, VEC>;
  constexpr bool kGrad = kTakesDy<F>;
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
      // to_compute here, not unpack(): under this kernel's register bound unpack() spilled more.
#pragma unroll
      for (int j = 0; j < VEC; ++j) bv[j] = to_compute(bp.v[j]);
      auto row_step = [&](const P& g, const P& v, int64_t off) {
        P o;
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const A gj = kGrad ? to_compute(g.v[j]) : A(0);
          const A y = apply<F, T>(gj, to_compute(v.v[j]) + bv[j], alpha);
          o.v[j] = from_compute<T>(y);
          if constexpr (kDb) acc[j] += y;
        }
        *reinterpret_cast<P*>(out + off) = o;
      };
      // A batch: kR rows of both inputs loaded, then computed and stored. Each element is read and
      // written by one thread: dX may be dY.
      auto load = [&](P(&g)[kR], P(&v)[kR], int64_t rr) {
#pragma unroll
        for (int k = 0; k < kR; ++k) {
          const int64_t off = (rr + k * TY) * a.cols + col;
          if constexpr (kGrad) g[k] = *reinterpret_cast<const P*>(dy + off);
          v[k] = *reinterpret_cast<const P*>(x + off);
        }
      };
      auto compute = [&](const P(&g)[kR], const P(&v)[kR], int64_t rr) {
#pragma unroll
        for (int k = 0; k < kR; ++k) row_step(g[k], v[k], (rr + k * TY) * a.cols + col);
      };
      const int64_t step = int64_t{kR} * TY;
      int64_t r = r0 + ty;
      for (; r + (kR - 1) * TY < r1; r += step) {
        P g[kR] = {}, v[kR];
        load(g, v, r);
        compute(g, v, r);
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
        if constexpr (kDb) acc[0] += y;
      }
    }

    if constexpr (kDb) {
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

// dB from `groups` partial rows (cuda/column_sum.cuh), launched as the first kernel's last blocks
// start.
template <class T>
Status launch_column_sum(std::string_view op, const Context& ctx, const compute_t<T>* partial, T* db, int64_t groups,
                         int64_t cols) {
  return cuda::launch_column_sum<T>(op, stream_of(ctx), partial, db, groups, cols, "the dB column-sum launch");
}

int64_t pow2_ceil(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

template <Kind F, class T, int VEC, int kR = bias_tuning<F, T>().rows, int kMinB = bias_tuning<F, T>().min_blocks>
Status run_bias(std::string_view op, const ActivationDesc& d, const Context& ctx, const DeviceInfo& dev,
                int64_t target_blocks = bias_tuning<F, T>().target, int max_tx = kBiasMaxTx) {
  using A = compute_t<T>;
  BiasArgs a{d.dy, d.x, d.bias, d.out, nullptr, d.count / d.cols, d.cols, 0, d.cols, d.cols, 0, d.alpha};
  if constexpr (VEC > 1) {
    const unsigned m = misalignment16(d.x);  // the same for every row: cols fills whole packs
    a.head = std::min<int64_t>(d.cols, (16 - m) % 16 / sizeof(T));
    a.packs = (d.cols - a.head) / VEC;
    a.units = a.head + a.packs + (d.cols - a.head - a.packs * VEC);
  }
  // Column units per block row: 32 (fewer for narrow rows), a warp reading 512 contiguous bytes of
  // a row. The library passes kBiasMaxTx (32); the lab harness (lab/cuda/lab_activation.cu) passes
  // wider max_tx, which takes the widest of max_tx, ..., 64 leaving at most an eighth of its
  // threads without a column.
  int tx = static_cast<int>(std::min<int64_t>(32, pow2_ceil(a.units)));
  for (int w = max_tx; w > 32; w /= 2)
    if (a.units >= w && (ceil_div(a.units, w) * w - a.units) * 8 <= a.units) {
      tx = w;
      break;
    }
  const int ty = kBiasThreads / tx;
  const int64_t col_blocks = ceil_div(a.units, tx);
  // Row groups from the shape alone: dB's summation order, hence its bits, depends on nothing else.
  // Rounded down: a block past one wave would run alone after it.
  int64_t groups = std::clamp<int64_t>(target_blocks / col_blocks, 1, ceil_div(a.rows, ty));
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
  if (Status s = launch(op, "the bias kernel launch",
                        d.db ? bias_kernel<F, T, VEC, kR, kMinB, true> : bias_kernel<F, T, VEC, kR, kMinB, false>,
                        grid, dim3(tx, ty), stream_of(ctx), a);
      !s)
    return s;
  if (!d.db) return {};
  return launch_column_sum<T>(op, ctx, static_cast<const A*>(a.partial), static_cast<T*>(d.db), groups, d.cols);
}

// ---- 16-bit bias grads with dB, on rows of whole packs: the row kernel ----------------------------

// Block (x, y) takes column tile x (a pack a thread) of rows y, y + gridDim.y, ...: the blocks in
// flight read neighbouring rows, and each thread keeps its own columns' dX sums in registers (no
// block reduction). Each block writes them as partial row y; column_sum_kernel adds the partial
// rows in order. Against the 2-D kernel, 16-bit with dB (lab/cuda/NOTES.md, seventh round): H100
// 0.90 of copy against 0.87-0.88 at 16384x4096 and 4096x16384, 0.78-0.79 against 0.75-0.76 at
// 8192x3072; H200 0.85-0.87 against 0.84-0.86 on the large shapes, 0.69-0.70 against 0.70-0.72 at
// 8192x3072. f32 stays on the 2-D kernel (0.94 there against 0.90-0.93).
struct BiasRowArgs {
  const void* dy;
  const void* x;
  const void* b;
  void* out;
  void* partial;  // [gridDim.y][cols] compute-type column sums of dX
  int64_t rows, cols;
  int64_t packs;  // per row (cols / VEC)
  float alpha;
};

constexpr int64_t kRowKernelBlocks = 4 * 132;  // one wave of 4 resident blocks on 132 SMs (a constant)

template <Kind F, class T, int VEC>
__global__ void __launch_bounds__(kBiasThreads, 4) bias_row_kernel(BiasRowArgs a) {
  using A = compute_t<T>;
  using P = Pack<T, VEC>;
  griddep_launch_dependents();  // the column sum may launch now; it waits for this grid's end
  const P* dy = static_cast<const P*>(a.dy);
  const P* x = static_cast<const P*>(a.x);
  P* out = static_cast<P*>(a.out);
  const A alpha = static_cast<A>(a.alpha);
  const int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= a.packs) return;
  A acc[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) acc[j] = A(0);
  for (int64_t r = blockIdx.y; r < a.rows; r += gridDim.y) {
    const int64_t i = r * a.packs + p;
    // The bias pack is read again each row (from L1): held converted across the loop, its f16
    // values took 8 registers, and under the 64-register bound the compiler then issued X's load
    // only after dY's had returned (FastGelu f16 0.86 of copy against 0.90 for bf16).
    const P g = dy[i], v = x[i], b = static_cast<const P*>(a.b)[p];  // all read before dX is written
    P o;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const A y = apply<F, T>(unpack(g, j), unpack(v, j) + unpack(b, j), alpha);
      o.v[j] = from_compute<T>(y);
      acc[j] += y;
    }
    out[i] = o;
  }
  // In 16-byte pieces: element by element, each store of a warp touched 32 sectors for 4 bytes
  // each (the LayerNorm gradients' partial rows lost up to 28% of their time that way).
  A* part = static_cast<A*>(a.partial) + static_cast<int64_t>(blockIdx.y) * a.cols + p * VEC;
  store_pieces<VEC>(part, acc);
}

// Rows of whole packs from a 16-byte boundary (the caller checks). The tiles share a row's packs
// out evenly (at most 256 threads each); the row groups fill kRowKernelBlocks, so that they, and
// dB's bits, depend on the shape alone.
template <Kind F, class T, int VEC>
Status run_bias_row(std::string_view op, const ActivationDesc& d, const Context& ctx, const DeviceInfo& dev) {
  using A = compute_t<T>;
  const int64_t rows = d.count / d.cols, packs = d.cols / VEC;
  const int64_t tiles = ceil_div(packs, kBiasThreads);
  const int threads = static_cast<int>(ceil_div(ceil_div(packs, tiles), 32) * 32);
  const int64_t groups = std::clamp<int64_t>(
      std::min({kRowKernelBlocks / tiles, kMaxPartials / d.cols, int64_t{65535}}), 1, rows);
  detail::Workspace ws;
  if (Status s = ws.allocate(ctx, Device::cuda(dev.ordinal), sizeof(A) * static_cast<std::size_t>(groups * d.cols), op);
      !s)
    return s;
  const BiasRowArgs a{d.dy, d.x, d.bias, d.out, ws.as<A>(), rows, d.cols, packs, d.alpha};
  if (Status s = launch(op, "the bias row kernel launch", bias_row_kernel<F, T, VEC>,
                        dim3(static_cast<unsigned>(std::min<int64_t>(tiles, 0x7fffffff)), static_cast<unsigned>(groups)),
                        dim3(threads), stream_of(ctx), a);
      !s)
    return s;
  return launch_column_sum<T>(op, ctx, static_cast<const A*>(a.partial), static_cast<T*>(d.db), groups, d.cols);
}

// ---- the rows' entries ---------------------------------------------------------------------------

// Calls g with the Kind as a compile-time constant: every Kind of the contract is instantiated, so
// a new one needs only its formula in apply().
template <int I = 0, class G>
Status visit_kind(Kind k, G&& g) {
  if constexpr (I == detail::kActivationKinds) {
    return Status(StatusCode::internal, "not an activation kind");
  } else {
    if (k == static_cast<Kind>(I)) return g(std::integral_constant<Kind, static_cast<Kind>(I)>{});
    return visit_kind<I + 1>(k, std::forward<G>(g));
  }
}

}  // namespace

// The entries of the implementation rows (activation_rows.cu), one per kernel; each compiled for one
// storage type in activation_<dtype>.cu. The row's declines() has checked what the kernel needs.
inline Status not_for(std::string_view op, const char* kernel) {
  return Status(StatusCode::internal, std::string(op) + ": " + kernel + " does not take this op and dtype");
}

template <class T>
Status activation_flat(std::string_view op, const ActivationDesc& d, const Context& ctx, bool vec) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr Kind F = decltype(kind)::value;
    return vec ? run_flat<F, T, kPackElems<T>>(op, d, ctx) : run_flat<F, T, 1>(op, d, ctx);
  });
}

template <class T>
Status activation_flat_bias(std::string_view op, const ActivationDesc& d, const Context& ctx) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr Kind F = decltype(kind)::value;
    if constexpr (kTakesDy<F> && kHasBiasForm<F> && sizeof(T) != 8)
      return run_flat<F, T, kPackElems<T>, kUnroll<T>, kMinBlocks<T>, kFlatHint<T>, kFlatThreadsOf<T>, true>(op, d,
                                                                                                          ctx);
    else
      return not_for(op, "the flat bias kernel");
  });
}

template <class T>
Status activation_bias_row(std::string_view op, const ActivationDesc& d, const Context& ctx, const DeviceInfo& dev) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr Kind F = decltype(kind)::value;
    if constexpr (kTakesDy<F> && kHasBiasForm<F> && sizeof(T) == 2)
      return run_bias_row<F, T, kPackElems<T>>(op, d, ctx, dev);
    else
      return not_for(op, "the bias row kernel");
  });
}

template <class T>
Status activation_bias_2d(std::string_view op, const ActivationDesc& d, const Context& ctx, const DeviceInfo& dev,
                          bool vec) {
  return visit_kind(d.kind, [&](auto kind) -> Status {
    constexpr Kind F = decltype(kind)::value;
    if constexpr (kHasBiasForm<F>)
      return vec ? run_bias<F, T, kPackElems<T>>(op, d, ctx, dev) : run_bias<F, T, 1>(op, d, ctx, dev);
    else
      return not_for(op, "the 2-D bias kernel");
  });
}

}  // namespace gradops::cuda
