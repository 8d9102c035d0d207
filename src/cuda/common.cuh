// Shared pieces of the CUDA backend: storage types and their compute types, 16-byte packs,
// launches that report their own errors, and what the kernels need to know about the device.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "gradops/context.hpp"
#include "gradops/status.hpp"
#include "gradops/types.hpp"

namespace gradops::cuda {

// ---- errors ------------------------------------------------------------------------------------

// ok, or device_error "<op>: CUDA error in <what>: <name> (<text>)". Clears the runtime's record
// of a non-sticky error so that it cannot surface in the caller's next, unrelated check.
Status status_of(cudaError_t e, std::string_view op, std::string_view what);

// ---- the device --------------------------------------------------------------------------------

struct DeviceInfo {
  int ordinal = 0;
  int sm_count = 0;
  int max_threads_per_sm = 0;
  int compute_major = 0;
  int l2_bytes = 0;
  bool cluster_launch = false;  // thread-block clusters (compute capability 9.0 and later)
};

// Properties of the current device, read once per device and cached.
Status current_device(std::string_view op, DeviceInfo* out);

// The context's stream (nullptr is the legacy default stream).
inline cudaStream_t stream_of(const Context& ctx) { return static_cast<cudaStream_t>(ctx.cuda_stream); }

// Resident blocks per multiprocessor of kKernel at `threads` threads (no dynamic shared memory),
// cached per kernel, device and block size: the answer depends on nothing else.
template <auto kKernel>
Status blocks_per_sm(std::string_view op, const DeviceInfo& dev, int threads, int* out) {
  constexpr int kDevices = 16, kSizes = 1024 / 32 + 1;
  static std::atomic<int> cache[kDevices][kSizes];  // 0: not asked yet
  const int slot = threads / 32;
  const bool cacheable = dev.ordinal < kDevices && threads % 32 == 0 && slot < kSizes;
  if (cacheable) {
    if (const int v = cache[dev.ordinal][slot].load(std::memory_order_relaxed); v > 0) {
      *out = v;
      return {};
    }
  }
  int n = 0;
  if (Status s = status_of(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kKernel, threads, 0), op,
                           "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      !s)
    return s;
  n = n > 0 ? n : 1;
  if (cacheable) cache[dev.ordinal][slot].store(n, std::memory_order_relaxed);
  *out = n;
  return {};
}

// Launches kernel<<<grid, block, 0, stream>>>(args...) and returns the launch's own error (not a
// stale one left by earlier calls, as cudaGetLastError would).
template <class... Params, class... Args>
Status launch(std::string_view op, const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
              cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  return status_of(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, what);
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A grid of `units` independent pieces of work for kernels whose blocks (clusters) loop over them,
// at most what is resident at once, and sized so that every block takes the same number of pieces
// (a ragged last round would leave most of the machine idle while a few blocks finish).
inline int64_t even_grid(int64_t units, int64_t resident) {
  resident = resident > 1 ? resident : 1;
  const int64_t rounds = ceil_div(units, resident);
  const int64_t grid = ceil_div(units, rounds);
  return grid < 1 ? 1 : grid > 0x7fffffff ? 0x7fffffff : grid;
}

// The launch of `grid` blocks of `block` threads in clusters of `cluster` blocks (1: no cluster
// attribute) with `smem` bytes of dynamic shared memory; *attr holds the cluster attribute and
// must outlive the configuration.
inline cudaLaunchConfig_t cluster_config(dim3 grid, dim3 block, int cluster, std::size_t smem, cudaStream_t stream,
                                         cudaLaunchAttribute* attr) {
  *attr = cudaLaunchAttribute{};
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = static_cast<unsigned>(cluster);
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = cluster > 1 ? attr : nullptr;
  cfg.numAttrs = cluster > 1 ? 1 : 0;
  return cfg;
}

// Launches kernel(args...) as cluster_config describes.
template <class... Params, class... Args>
Status launch_clustered(std::string_view op, const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                        int cluster, std::size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_config(grid, block, cluster, smem, stream, &attr);
  return status_of(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, what);
}

// Lets `kernel` take up to `bytes` of dynamic shared memory on the current device (beyond 48 KiB
// of static and dynamic shared memory together an opt-in is needed). The limit only ever rises, so
// that a concurrent call's larger launch stays valid; the driver is asked once per kernel and
// device, and once per larger size.
Status allow_dynamic_smem(std::string_view op, const void* kernel, const DeviceInfo& dev, std::size_t bytes);
template <class... Params>
Status allow_dynamic_smem(std::string_view op, void (*kernel)(Params...), const DeviceInfo& dev, std::size_t bytes) {
  return allow_dynamic_smem(op, reinterpret_cast<const void*>(kernel), dev, bytes);
}

// Clusters of `size` blocks of `threads` threads of `kernel`, with `smem` bytes of dynamic shared
// memory each, that the device runs at once: 0 where none can be co-scheduled (a device without
// cluster launch, a kernel built for an architecture before sm_90, a cluster too large for a GPC).
// Sizes beyond the portable 8, and smem beyond 48 KiB, are allowed on the kernel first, so that a
// launch of what the answer counts is valid. The driver is asked once per kernel, device, size,
// block size and shared memory, and the answer cached: it depends on nothing else, and launch
// decisions ask it every call.
Status resident_clusters(std::string_view op, const void* kernel, const DeviceInfo& dev, int size, int threads,
                         int* clusters, std::size_t smem = 0);
template <class... Params>
Status resident_clusters(std::string_view op, void (*kernel)(Params...), const DeviceInfo& dev, int size, int threads,
                         int* clusters, std::size_t smem = 0) {
  return resident_clusters(op, reinterpret_cast<const void*>(kernel), dev, size, threads, clusters, smem);
}

// ---- storage and compute types ------------------------------------------------------------------

// The device-side storage type of a DType, and its compute type: f32 for f16/bf16/f32, f64 for f64.
template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Calls f(T{}) with the device storage type named by dt.
template <class F>
decltype(auto) visit_storage(DType dt, F&& f) {
  switch (dt) {
    case DType::f64: return f(double{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::f32: break;
  }
  return f(float{});
}

__device__ __forceinline__ float to_compute(float v) { return v; }
__device__ __forceinline__ double to_compute(double v) { return v; }
__device__ __forceinline__ float to_compute(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_compute(__nv_bfloat16 v) { return __bfloat162float(v); }

// Rounds once, to nearest even (overflow to infinity, NaN stays NaN).
template <class T> __device__ __forceinline__ T from_compute(compute_t<T> v);
template <> __device__ __forceinline__ float from_compute<float>(float v) { return v; }
template <> __device__ __forceinline__ double from_compute<double>(double v) { return v; }
template <> __device__ __forceinline__ __half from_compute<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_compute<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N elements moved as one access: 16 bytes when N * sizeof(T) == 16.
template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Element j of a pack in the compute type, from the 32-bit word that holds it. bf16: a bf16 value is
// the high half of its f32, so one shift (even j) or mask (odd j) of the word. f16: the word's
// pair converted together. Converted element by element, each half is first extracted into a
// register of its own: a row held in bf16 packs took 54 registers where f16 took 39, and a softmax
// forward held at 8 f16 packs a thread spilled 134 bytes where it now spills 16, as bf16 does.
template <class T, int N>
__device__ __forceinline__ compute_t<T> unpack(const Pack<T, N>& p, int j) {
  if constexpr (std::is_same_v<T, __nv_bfloat16> && N % 2 == 0) {
    uint32_t w;
    memcpy(&w, &p.v[j & ~1], sizeof(w));
    return __uint_as_float((j & 1) ? (w & 0xffff0000u) : (w << 16));
  } else if constexpr (std::is_same_v<T, __half> && N % 2 == 0) {
    __half2 h;
    memcpy(&h, &p.v[j & ~1], sizeof(h));
    const float2 f = __half22float2(h);
    return (j & 1) ? f.y : f.x;
  } else {
    return to_compute(p.v[j]);
  }
}

// A 16-byte pack moved with a cache hint: kHint 0 is an ordinary access; 1 streams (evict-first in
// L1 and L2: ld.global.cs / st.global.cs), for data that is touched once; 2 (loads only) has L2
// fill the whole 128-byte line (ld.global.L2::128B), for tiles that read half a line each while
// the tile beside them reads the other half. Other sizes ignore it.
//
// A hinted pack of f64 loads as two doubles. Loaded as four 32-bit words, ptxas put each pack's
// halves in register pairs apart from where the load landed and copied them there right after it,
// and a copy waits for its data: a thread's loads went out one at a time, not together (on an H100
// the f64 softmax kernels held on chip ran 1.26-1.56x slower for it; lab/cuda/sass_load_waits.py
// finds such loads in a build). An ordinary access is the pack's own load, in every dtype.
template <int kHint, class P>
__device__ __forceinline__ P load_pack(const P* p) {
  if constexpr (kHint == 0 || sizeof(P) != 16) {
    return *p;
  } else if constexpr (sizeof(p->v[0]) == 8) {
    double2 v;
    if constexpr (kHint == 1) {
      v = __ldcs(reinterpret_cast<const double2*>(p));
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750  // the PTX qualifier's floor
      asm volatile("ld.global.L2::128B.v2.f64 {%0, %1}, [%2];" : "=d"(v.x), "=d"(v.y) : "l"(p));
#else
      v = *reinterpret_cast<const double2*>(p);
#endif
    }
    P r;
    r.v[0] = v.x;
    r.v[1] = v.y;
    return r;
  } else {
    uint4 v;
    if constexpr (kHint == 1) {
      v = __ldcs(reinterpret_cast<const uint4*>(p));
    } else {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
      asm volatile("ld.global.L2::128B.v4.u32 {%0, %1, %2, %3}, [%4];"
                   : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                   : "l"(p));
#else
      v = *reinterpret_cast<const uint4*>(p);
#endif
    }
    P r;
    *reinterpret_cast<uint4*>(&r) = v;
    return r;
  }
}
template <int kHint, class P>
__device__ __forceinline__ void store_pack(P* p, const P& v) {
  static_assert(kHint != 2, "kHint 2 is a load hint");
  if constexpr (kHint == 1 && sizeof(P) == 16) {
    __stcs(reinterpret_cast<uint4*>(p), *reinterpret_cast<const uint4*>(&v));
  } else {
    *p = v;
  }
}

// Stores v[0, N) at dst (16-byte aligned where N values fill whole 16-byte pieces) in 16-byte
// pieces. A thread writing its N consecutive column sums element by element makes each store of a
// warp touch 32 sectors for a few bytes each; in pieces, a warp's stores fill whole sectors between
// them.
template <int N, class A>
__device__ __forceinline__ void store_pieces(A* dst, const A (&v)[N]) {
  constexpr int kPiece = 16 / static_cast<int>(sizeof(A));
  if constexpr (N % kPiece == 0) {
#pragma unroll
    for (int q = 0; q < N / kPiece; ++q) {
      Pack<A, kPiece> piece;
#pragma unroll
      for (int i = 0; i < kPiece; ++i) piece.v[i] = v[q * kPiece + i];
      reinterpret_cast<Pack<A, kPiece>*>(dst)[q] = piece;
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) dst[j] = v[j];
  }
}

// Elements of T in a 16-byte pack.
template <class T>
inline constexpr int kPackElems = static_cast<int>(16 / sizeof(T));

// Pointer alignment helpers for choosing between the 16-byte and the scalar paths.
inline unsigned misalignment16(const void* p) { return static_cast<unsigned>(reinterpret_cast<uintptr_t>(p) % 16); }
inline bool aligned_to(const void* p, std::size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Compute-type math with one spelling for float and double.
__device__ __forceinline__ float dexp(float v) { return expf(v); }
__device__ __forceinline__ double dexp(double v) { return ::exp(v); }
__device__ __forceinline__ float dlog(float v) { return logf(v); }
__device__ __forceinline__ double dlog(double v) { return ::log(v); }
__device__ __forceinline__ float dabs(float v) { return fabsf(v); }
__device__ __forceinline__ double dabs(double v) { return ::fabs(v); }
__device__ __forceinline__ float dmax(float a, float b) { return fmaxf(a, b); }
__device__ __forceinline__ double dmax(double a, double b) { return ::fmax(a, b); }
__device__ __forceinline__ float dfma(float a, float b, float c) { return fmaf(a, b, c); }
__device__ __forceinline__ double dfma(double a, double b, double c) { return ::fma(a, b, c); }
// Never contracted into an fma: combine steps that must give the same bits in either operand order.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }

// The hardware's approximations (one MUFU instruction each), for results rounded to f16/bf16: 2^v
// and 1/v within 2 ulp of f32, far below half an ulp of either 16-bit format (2^-12 relative).
// Subnormal inputs and results are flushed to zero.
__device__ __forceinline__ float ex2_approx(float v) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
__device__ __forceinline__ float rcp_approx(float v) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}
// min(a, b) that returns NaN when either is NaN (fminf would return the other operand).
__device__ __forceinline__ float min_nan(float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return a != a ? a : b != b ? b : fminf(a, b);
#endif
}

// Asks L2 for the 128-byte line of element p of base, once a line: a thread walking every element
// issues one instruction per line and holds no register for it.
template <class P>
__device__ __forceinline__ void prefetch_line(const P* base, int64_t p) {
  if (((p * static_cast<int64_t>(sizeof(P))) & 127) == 0) asm volatile("prefetch.global.L2 [%0];" ::"l"(base + p));
}

// Launch with programmatic stream serialization (Hopper): the kernel may start while the previous
// kernel on the stream drains, and must call griddep_wait() before it touches that kernel's output.
// Elsewhere the attribute is ignored and the launch is an ordinary one.
template <class... Params, class... Args>
Status launch_dependent(std::string_view op, const char* what, void (*kernel)(Params...), dim3 grid, dim3 block,
                        cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  return status_of(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), op, what);
}
// Waits until the preceding kernel of the stream has completed and its writes are visible (a no-op
// when the launch was an ordinary one, or below compute capability 9.0).
__device__ __forceinline__ void griddep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// Lets the dependent kernel of the stream begin launching (its griddep_wait still waits for all of
// this kernel to finish).
__device__ __forceinline__ void griddep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

}  // namespace gradops::cuda
