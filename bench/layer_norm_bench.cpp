// The LayerNorm family's gradients over the last axis, with every optional output: 8192 rows of
// 1024 and 1024 rows of 8192. The statistics are f32 in both signatures (U = f32).
#include "microbench.hpp"

namespace gradops::bench {
namespace {

using C = const Context&;

constexpr int64_t kShapes[][2] = {{8192, 1024}, {1024, 8192}};

}  // namespace

void register_layer_norm() {
  for (DType t : kDTypes)
    for (const auto [rows, cols] : kShapes) {
      const Spec dy{t, {rows, cols}, -1, 1}, x{t, {rows, cols}, -3, 3}, scale{t, {cols}, 0.5f, 2};
      const Spec bias{t, {cols}, -1, 1}, mean{DType::f32, {rows}, -0.5f, 0.5f}, inv_std{DType::f32, {rows}, 0.5f, 2};
      const Spec dx{t, {rows, cols}}, per_col{t, {cols}};
      add({"LayerNormalizationGrad", t, {rows, cols}, "", {dy, x, scale, mean, inv_std}, {dx, per_col, per_col}, {},
           [](Views i, Views o, C c) {
             return layer_norm_grad({i[0], i[1], i[2], i[3], i[4], o[0], o[1], o[2]}, c);
           }});
      add({"InvertibleLayerNormalizationGrad", t, {rows, cols}, "", {dy, x, scale, bias, inv_std},
           {dx, per_col, per_col}, {}, [](Views i, Views o, C c) {
             return invertible_layer_norm_grad({i[0], i[1], i[2], i[3], i[4], o[0], o[1], o[2]}, c);
           }});
      add({"SimplifiedLayerNormalizationGrad", t, {rows, cols}, "", {dy, x, scale, inv_std}, {dx, per_col}, {},
           [](Views i, Views o, C c) { return rms_norm_grad({i[0], i[1], i[2], i[3], o[0], o[1]}, c); }});
    }
}

}  // namespace gradops::bench
