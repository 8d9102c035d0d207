// Kernel lab, activation family: the library's own kernels (src/cuda/activation.cu, included
// here) with other unroll factors, cache hints and grids; see lab_softmax.cu.
#include <cstdio>

#include "cuda/activation_kernels.cuh"

namespace lab {

using gradops::Context;
using gradops::DType;
using gradops::OpId;
using gradops::Status;
namespace gc = gradops::cuda;
namespace gd = gradops::detail;

inline int report(const Status& s) {
  if (s) return 0;
  std::fprintf(stderr, "lab: %s\n", s.to_string().c_str());
  return 1;
}

inline DType dtype_of(int code) { return static_cast<DType>(code); }

template <class G>
Status visit_dtype(int code, G&& g) {
  switch (dtype_of(code)) {
    case DType::f16: return g(__half{});
    case DType::bf16: return g(__nv_bfloat16{});
    default: break;
  }
  return g(float{});
}

// ---- activations --------------------------------------------------------------------------------

template <gc::Fn F>
constexpr OpId op_of() {
  if constexpr (F == gc::Fn::gelu_grad) return OpId::GeluGrad;
  if constexpr (F == gc::Fn::fast_gelu_grad) return OpId::FastGeluGrad;
  if constexpr (F == gc::Fn::relu_grad) return OpId::ReluGrad;
  return OpId::SigmoidGrad;
}

// Flat kernel: unroll in {1, 2, 4} packs per thread, 128, 256 or 512 threads per block. 16-bit
// kernels get the registers their unroll needs (64 at 1 and 2, 128 at 4: fewer spilled).
template <gc::Fn F, class T>
Status flat_variant(const gd::ActivationDesc& d, const Context& ctx, int unroll, int threads) {
  constexpr int V = gc::kPackElems<T>;
  constexpr bool kHalf = sizeof(T) == 2;
#define LAB_FLAT(U, N) \
  if (unroll == U && threads == N) return gc::run_flat<F, T, V, U, kHalf ? (U == 1 ? 4 : 8 / U) : 0, 0, N>("lab", d, ctx);
  LAB_FLAT(1, 128) LAB_FLAT(1, 256) LAB_FLAT(2, 128) LAB_FLAT(2, 256) LAB_FLAT(2, 512) LAB_FLAT(4, 128)
  LAB_FLAT(4, 256) LAB_FLAT(4, 512)
#undef LAB_FLAT
  return Status(gradops::StatusCode::invalid_argument, "lab: no such flat variant");
}

// Bias kernel: rows per batch, the register bound in resident 256-thread blocks (0: none, the
// previous 16-bit default), target blocks (the row groups follow), the widest column stretch a
// block row may take. (Software pipelined batches: lab/cuda/patches/bias_pipelined.patch.)
template <gc::Fn F, class T>
Status bias_variant(const gd::ActivationDesc& d, const Context& ctx, int rows_unroll, int min_blocks,
                    int64_t target_blocks, int max_tx) {
  constexpr int V = gc::kPackElems<T>;
  gc::DeviceInfo dev;
  if (Status s = gc::current_device("lab", &dev); !s) return s;
#define LAB_BIAS(R, MB)                        \
  if (rows_unroll == R && min_blocks == MB) \
    return gc::run_bias<F, T, V, R, MB>("lab", d, ctx, dev, target_blocks, max_tx);
  LAB_BIAS(8, 0) LAB_BIAS(8, 2) LAB_BIAS(4, 2)
  if constexpr (sizeof(T) == 2) {  // f32 spills under a bound of 3 or 4 blocks
    LAB_BIAS(4, 3) LAB_BIAS(4, 4) LAB_BIAS(2, 4)
  }
#undef LAB_BIAS
  return Status(gradops::StatusCode::invalid_argument, "lab: no such bias variant");
}

}  // namespace lab

extern "C" {

// fn: 0 GeluGrad, 1 FastGeluGrad, 2 ReluGrad, 3 SigmoidGrad.
int lab_flat(int fn, int dtype, const void* dy, const void* x, void* out, int64_t n, int unroll, int threads,
             void* stream) {
  using namespace lab;
  Context ctx;
  ctx.cuda_stream = stream;
  return report(visit_dtype(dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    auto go = [&](auto f) -> Status {
      constexpr gc::Fn F = decltype(f)::value;
      const gd::ActivationDesc d{op_of<F>(), dtype_of(dtype), n, 0, dy, x, nullptr, out, nullptr, 0.0f};
      return flat_variant<F, T>(d, ctx, unroll, threads);
    };
    switch (fn) {
      case 0: return go(gc::FnTag<gc::Fn::gelu_grad>{});
      case 1: return go(gc::FnTag<gc::Fn::fast_gelu_grad>{});
      case 2: return go(gc::FnTag<gc::Fn::relu_grad>{});
      default: break;
    }
    return go(gc::FnTag<gc::Fn::sigmoid_grad>{});
  }));
}

// fn: 0 BiasGeluGrad_dX, 1 BiasFastGeluGrad_dX, 2 ReluGrad of X + B (the kernel without its math);
// db may be null.
int lab_bias(int fn, int dtype, const void* dy, const void* x, const void* b, void* out, void* db, int64_t rows,
             int64_t cols, int rows_unroll, int min_blocks, int64_t target_blocks, int max_tx, void* stream) {
  using namespace lab;
  Context ctx;
  ctx.cuda_stream = stream;
  return report(visit_dtype(dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    const OpId op = fn == 0 ? OpId::BiasGeluGrad_dX : fn == 1 ? OpId::BiasFastGeluGrad_dX : OpId::ReluGrad;
    const gd::ActivationDesc d{op, dtype_of(dtype), rows * cols, cols, dy, x, b, out, db, 0.0f};
    if (fn == 0) return bias_variant<gc::Fn::gelu_grad, T>(d, ctx, rows_unroll, min_blocks, target_blocks, max_tx);
    if (fn == 2)  // not an op: the bias kernel's loads, stores and dB with next to no math
      return bias_variant<gc::Fn::relu_grad, T>(d, ctx, rows_unroll, min_blocks, target_blocks, max_tx);
    return bias_variant<gc::Fn::fast_gelu_grad, T>(d, ctx, rows_unroll, min_blocks, target_blocks, max_tx);
  }));
}

}  // extern "C"
