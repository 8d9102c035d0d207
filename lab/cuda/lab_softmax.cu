// Kernel lab, softmax family: the library's own kernels (src/cuda/softmax.cu, included here)
// launched with tuning choices other than the ones the library makes, so that lab.py can check
// and time them beside the library's defaults, the previous library build and PyTorch.
// Built by run_lab.sh into liblab.so with lab_activation.cu, linked against the libgradops.so of
// the same sources (for status_of, current_device, the workspace and the op table).
#include <cstdio>

#include "cuda/softmax_kernels.cuh"

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

// ---- softmax grads ------------------------------------------------------------------------------

// path 0, warp: cfg 0 prefetch (persistent grid), 1 one step per warp; ppl = packs per lane the
//               lane count aims at.
// path 1, block: cfg 2 the register kernel (4 packs; 16-bit forwards 2; up to 512 threads; the library's
//                for one-block rows and f32), 3 the register kernel for one-block rows with registers
//                bounded for 3 resident blocks of 512 threads, 12 and 14 the register kernel with 2
//                and 4 packs a thread, on clusters wherever a row needs them.
// path 2, two passes: cfg blocks a row (a cluster; 0: as the library picks them).
// The register kernel at N packs a thread: one block a row, or a cluster where the row needs one.
template <gd::SoftmaxKind K, class T, int V, int N>
Status block_or_cluster(const gd::SoftmaxDesc& d, const Context& ctx, const gc::DeviceInfo& dev) {
  if (gc::row_blocks(d, N) == 1) return gc::run_block<K, T, V, N>("lab", d, ctx);
  return gc::run_cluster<K, T, V, N>("lab", d, ctx, dev);
}

template <gd::SoftmaxKind K, class T>
Status softmax_variant(const gd::SoftmaxDesc& d, const Context& ctx, int path, int cfg, int ppl) {
  gc::DeviceInfo dev;
  if (Status s = gc::current_device("lab", &dev); !s) return s;
  constexpr int V = gc::kPackElems<T>;
  gc::RowTuning tune;
  tune.warp_packs_per_lane = ppl;
  if (!gc::congruent(d) || (path == 0 && !gc::rows_aligned(d)))
    return Status(gradops::StatusCode::invalid_argument, "lab: the warp path takes aligned rows, the others congruent");
  switch (path) {
    case 0:
      if (cfg == 0) return gc::run_warp<K, T, V, true>("lab", d, ctx, dev, tune);
      return gc::run_warp<K, T, V, false>("lab", d, ctx, dev, tune);
    case 1:
      if (cfg == 2) return block_or_cluster<K, T, V, gc::kBlockPacks<K, T>>(d, ctx, dev);
      if (cfg == 12) return block_or_cluster<K, T, V, 2>(d, ctx, dev);
      if (cfg == 14) return block_or_cluster<K, T, V, 4>(d, ctx, dev);
      if (cfg == 3) {  // one block a row, registers bounded for 3 resident blocks of 512 threads
        constexpr int N = gc::kBlockPacks<K, T>;
        const int64_t threads = ((d.axis_len / V + N - 1) / N + 31) / 32 * 32;
        if (threads > gc::kBlockMaxThreads)
          return Status(gradops::StatusCode::invalid_argument, "lab: the row needs more than one block");
        const gc::RowArgs a{d.dy, d.y, d.out, d.outer, d.axis_len};
        return gc::launch("lab", "block m3", gc::block_kernel<K, T, V, 1, 3>, dim3(static_cast<unsigned>(d.outer)),
                          dim3(static_cast<unsigned>(std::max<int64_t>(threads, 32))), gc::stream_of(ctx), a);
      }
      return Status(gradops::StatusCode::invalid_argument, "lab: no such block variant");
    default: break;
  }
  tune.two_pass_cluster = cfg;
  return gc::run_two_pass<K, T, V>("lab", d, ctx, dev, tune);
}

}  // namespace lab

extern "C" {

// kind: 0 SoftmaxGrad, 1 LogSoftmaxGrad, 2 Softmax, 3 LogSoftmax (dy unused). dtype: gradops' codes
// (0 f32, 2 f16, 3 bf16).
int lab_softmax(int kind, int dtype, const void* dy, const void* y, void* out, int64_t rows, int64_t len, int path,
                int cfg, int ppl, void* stream) {
  using namespace lab;
  using SK = gd::SoftmaxKind;
  const SK kinds[] = {SK::softmax_grad, SK::log_softmax_grad, SK::softmax, SK::log_softmax};
  const OpId ops[] = {OpId::SoftmaxGrad_13, OpId::LogSoftmaxGrad_13, OpId::Softmax_13, OpId::LogSoftmax_13};
  if (kind < 0 || kind > 3) return 1;
  const gd::SoftmaxDesc d{ops[kind], kinds[kind], dtype_of(dtype), rows, len, 1, kind < 2 ? dy : nullptr, y, out};
  Context ctx;
  ctx.cuda_stream = stream;
  return report(visit_dtype(dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    switch (kind) {
      case 0: return softmax_variant<SK::softmax_grad, T>(d, ctx, path, cfg, ppl);
      case 1: return softmax_variant<SK::log_softmax_grad, T>(d, ctx, path, cfg, ppl);
      case 2: return softmax_variant<SK::softmax, T>(d, ctx, path, cfg, ppl);
      default: return softmax_variant<SK::log_softmax, T>(d, ctx, path, cfg, ppl);
    }
  }));
}

}  // extern "C"
