// BatchNormalizationGrad on a ResNet-50 layer at N = 32 (256 channels of 28x28), in NCHW and in
// NHWC, with every optional output. bf16 is ORT's (T, T1, T2) = (bf16, bf16, f32): the saved
// statistics stay f32.
#include "microbench.hpp"

namespace gradops::bench {

void register_batch_norm() {
  constexpr int64_t n = 32, c = 256, h = 28, w = 28;
  for (DType t : kDTypes)
    for (const bool channels_last : {false, true}) {
      const std::vector<int64_t> shape =
          channels_last ? std::vector<int64_t>{n, h, w, c} : std::vector<int64_t>{n, c, h, w};
      const Spec scale{t, {c}, 0.5f, 2}, mean{DType::f32, {c}, -0.5f, 0.5f}, inv_std{DType::f32, {c}, 0.5f, 2};
      add({"BatchNormalizationGrad", t, shape, channels_last ? "channels_last" : "",
           {{t, shape, -1, 1}, {t, shape, -3, 3}, scale, mean, inv_std}, {{t, shape}, {t, {c}}, {t, {c}}},
           {{"epsilon", 1e-5}, {"channels_last", channels_last ? 1.0 : 0.0}},
           [channels_last](Views i, Views o, const Context& ctx) {
             return batch_norm_grad({.dy = i[0], .x = i[1], .scale = i[2], .mean = i[3], .inv_std = i[4], .dx = o[0],
                                     .dscale = o[1], .dbias = o[2], .channels_last = channels_last},
                                    ctx);
           }});
    }
}

}  // namespace gradops::bench
