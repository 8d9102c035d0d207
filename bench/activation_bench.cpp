// The activation family's gradients: the elementwise ones over 2^24 elements, the bias-GELU ones
// at 4096x4096 (2^24 too) with dB and with dX alone.
#include "microbench.hpp"

namespace gradops::bench {
namespace {

using C = const Context&;

// The second input is the forward input X or output Y; its range is the one that op meets.
struct Elementwise {
  const char* op;
  float lo, hi;
  Status (*call)(Views in, Views out, C ctx);
};

const Elementwise kElementwise[] = {
    {"GeluGrad", -4, 4, [](Views i, Views o, C c) { return gelu_grad({i[0], i[1], o[0]}, c); }},
    {"FastGeluGrad", -4, 4, [](Views i, Views o, C c) { return fast_gelu_grad({i[0], i[1], o[0]}, c); }},
    {"ReluGrad", -4, 4, [](Views i, Views o, C c) { return relu_grad({i[0], i[1], o[0]}, c); }},
    {"SigmoidGrad", 0, 1, [](Views i, Views o, C c) { return sigmoid_grad({i[0], i[1], o[0]}, c); }},
    {"TanhGrad", -1, 1, [](Views i, Views o, C c) { return tanh_grad({i[0], i[1], o[0]}, c); }},
    {"QuickGeluGrad", -4, 4, [](Views i, Views o, C c) { return quick_gelu_grad({i[0], i[1], o[0]}, c); }},
    {"LeakyReluGrad", -0.04f, 4, [](Views i, Views o, C c) { return leaky_relu_grad({i[0], i[1], o[0]}, c); }},
};

std::optional<TensorView> db(Views o) { return o.size() > 1 ? std::optional<TensorView>(o[1]) : std::nullopt; }

const Elementwise kBias[] = {
    {"BiasGeluGrad_dX", -4, 4,
     [](Views i, Views o, C c) { return bias_gelu_grad({i[0], i[1], i[2], o[0], db(o)}, c); }},
    {"BiasFastGeluGrad_dX", -4, 4,
     [](Views i, Views o, C c) { return bias_fast_gelu_grad({i[0], i[1], i[2], o[0], db(o)}, c); }},
};

constexpr int64_t kElements = int64_t{1} << 24;
constexpr int64_t kRows = 4096, kCols = 4096;

}  // namespace

void register_activation() {
  for (DType t : kDTypes) {
    for (const Elementwise& e : kElementwise)
      add({e.op, t, {kElements}, "", {{t, {kElements}, -1, 1}, {t, {kElements}, e.lo, e.hi}}, {{t, {kElements}}}, {},
           e.call});
    for (const Elementwise& e : kBias)
      for (const bool with_db : {true, false}) {
        std::vector<Spec> outputs = {{t, {kRows, kCols}}};
        if (with_db) outputs.push_back({t, {kCols}});
        add({e.op, t, {kRows, kCols}, with_db ? "" : "dX_only",
             {{t, {kRows, kCols}, -1, 1}, {t, {kRows, kCols}, e.lo, e.hi}, {t, {kCols}, -1, 1}}, outputs, {},
             e.call});
      }
  }
}

}  // namespace gradops::bench
