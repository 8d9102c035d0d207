// The softmax family's gradients, each over the last axis (its default axis on a 2-D tensor):
// many short rows (8192x1024) and few long ones (1024x32768, 128 KiB per f32 row).
#include <cmath>

#include "microbench.hpp"

namespace gradops::bench {
namespace {

using C = const Context&;

struct Op {
  const char* op;
  bool log;  // Y is the forward log-softmax output rather than the softmax output
  Status (*call)(Views in, Views out, C ctx);
};

const Op kOps[] = {
    {"SoftmaxGrad", false, [](Views i, Views o, C c) { return softmax_grad({i[0], i[1], o[0]}, c); }},
    {"SoftmaxGrad_13", false, [](Views i, Views o, C c) { return softmax_grad_13({i[0], i[1], o[0]}, c); }},
    {"LogSoftmaxGrad", true, [](Views i, Views o, C c) { return log_softmax_grad({i[0], i[1], o[0]}, c); }},
    {"LogSoftmaxGrad_13", true, [](Views i, Views o, C c) { return log_softmax_grad_13({i[0], i[1], o[0]}, c); }},
};

constexpr int64_t kShapes[][2] = {{8192, 1024}, {1024, 32768}};

}  // namespace

void register_softmax() {
  for (DType t : kDTypes)
    for (const Op& op : kOps)
      for (const auto [rows, cols] : kShapes) {
        // Y around the values of a softmax (mean 1/cols) or of its logarithm.
        const float mean = 1.0f / static_cast<float>(cols), log_mean = std::log(mean);
        const Spec y = op.log ? Spec{t, {rows, cols}, log_mean - 1, log_mean + 1} : Spec{t, {rows, cols}, 0, 2 * mean};
        add({op.op, t, {rows, cols}, "", {{t, {rows, cols}, -1, 1}, y}, {{t, {rows, cols}}}, {}, op.call});
      }
}

}  // namespace gradops::bench
