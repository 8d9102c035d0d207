// The typed C++ entry points: each maps its args struct onto the schema's input/output order.
#include <initializer_list>

#include "gradops/ops.hpp"
#include "ops/op_call.hpp"

namespace gradops {
namespace {

const TensorView* opt(const std::optional<TensorView>& t) { return t ? &*t : nullptr; }

Status call(OpId id, std::initializer_list<const TensorView*> in, std::initializer_list<const TensorView*> out,
            std::initializer_list<Attribute> attrs, const Context& ctx) {
  const OpSchema& op = op_schema(id);
  return detail::guarded(op.name, [&] {
    return detail::run_op(op, {in.begin(), in.size()}, {out.begin(), out.size()}, {attrs.begin(), attrs.size()},
                          ctx);
  });
}

}  // namespace

Status gelu_grad(const GeluGradArgs& a, const Context& ctx) {
  return call(OpId::GeluGrad, {&a.dy, &a.x}, {&a.dx}, {}, ctx);
}
Status fast_gelu_grad(const FastGeluGradArgs& a, const Context& ctx) {
  return call(OpId::FastGeluGrad, {&a.dy, &a.x}, {&a.dx}, {}, ctx);
}
Status bias_gelu_grad(const BiasGeluGradArgs& a, const Context& ctx) {
  return call(OpId::BiasGeluGrad_dX, {&a.dy, &a.x, &a.b}, {&a.dx, opt(a.db)}, {}, ctx);
}
Status bias_fast_gelu_grad(const BiasFastGeluGradArgs& a, const Context& ctx) {
  return call(OpId::BiasFastGeluGrad_dX, {&a.dy, &a.x, &a.b}, {&a.dx, opt(a.db)}, {}, ctx);
}
Status relu_grad(const ReluGradArgs& a, const Context& ctx) {
  return call(OpId::ReluGrad, {&a.dy, &a.x}, {&a.dx}, {}, ctx);
}
Status sigmoid_grad(const SigmoidGradArgs& a, const Context& ctx) {
  return call(OpId::SigmoidGrad, {&a.dy, &a.y}, {&a.dx}, {}, ctx);
}
Status tanh_grad(const TanhGradArgs& a, const Context& ctx) {
  return call(OpId::TanhGrad, {&a.dy, &a.y}, {&a.dx}, {}, ctx);
}
Status quick_gelu_grad(const QuickGeluGradArgs& a, const Context& ctx) {
  return call(OpId::QuickGeluGrad, {&a.dy, &a.x}, {&a.dx}, {{"alpha", a.alpha}}, ctx);
}
Status leaky_relu_grad(const LeakyReluGradArgs& a, const Context& ctx) {
  return call(OpId::LeakyReluGrad, {&a.dy, &a.y}, {&a.dx}, {{"alpha", a.alpha}}, ctx);
}

Status softmax_grad(const SoftmaxGradArgs& a, const Context& ctx) {
  return call(OpId::SoftmaxGrad, {&a.dy, &a.y}, {&a.dx}, {{"axis", double(a.axis)}}, ctx);
}
Status softmax_grad_13(const SoftmaxGrad13Args& a, const Context& ctx) {
  return call(OpId::SoftmaxGrad_13, {&a.dy, &a.y}, {&a.dx}, {{"axis", double(a.axis)}}, ctx);
}
Status log_softmax_grad(const LogSoftmaxGradArgs& a, const Context& ctx) {
  return call(OpId::LogSoftmaxGrad, {&a.dy, &a.y}, {&a.dx}, {{"axis", double(a.axis)}}, ctx);
}
Status log_softmax_grad_13(const LogSoftmaxGrad13Args& a, const Context& ctx) {
  return call(OpId::LogSoftmaxGrad_13, {&a.dy, &a.y}, {&a.dx}, {{"axis", double(a.axis)}}, ctx);
}

Status layer_norm_grad(const LayerNormGradArgs& a, const Context& ctx) {
  return call(OpId::LayerNormalizationGrad, {&a.dy, &a.x, &a.scale, &a.mean, &a.inv_std_dev},
              {&a.dx, opt(a.dscale), opt(a.dbias)}, {{"axis", double(a.axis)}}, ctx);
}
Status invertible_layer_norm_grad(const InvertibleLayerNormGradArgs& a, const Context& ctx) {
  return call(OpId::InvertibleLayerNormalizationGrad, {&a.dy, &a.y, &a.scale, &a.bias, &a.inv_std_dev},
              {&a.dx, opt(a.dscale), opt(a.dbias)}, {{"axis", double(a.axis)}}, ctx);
}
Status rms_norm_grad(const RmsNormGradArgs& a, const Context& ctx) {
  return call(OpId::SimplifiedLayerNormalizationGrad, {&a.dy, &a.x, &a.scale, &a.inv_std_var},
              {&a.dx, opt(a.dscale)}, {{"axis", double(a.axis)}}, ctx);
}
Status batch_norm_grad(const BatchNormGradArgs& a, const Context& ctx) {
  return call(OpId::BatchNormalizationGrad, {&a.dy, &a.x, &a.scale, &a.mean, &a.inv_std},
              {&a.dx, opt(a.dscale), opt(a.dbias)},
              {{"epsilon", a.epsilon}, {"channels_last", a.channels_last ? 1.0 : 0.0}}, ctx);
}

Status gelu(const UnaryArgs& a, const Context& ctx) { return call(OpId::Gelu, {&a.x}, {&a.y}, {}, ctx); }
Status fast_gelu(const FastGeluArgs& a, const Context& ctx) {
  return call(OpId::FastGelu, {&a.x, opt(a.bias)}, {&a.y}, {}, ctx);
}
Status bias_gelu(const BiasGeluArgs& a, const Context& ctx) {
  return call(OpId::BiasGelu, {&a.a, &a.b}, {&a.c}, {}, ctx);
}
Status quick_gelu(const QuickGeluArgs& a, const Context& ctx) {
  return call(OpId::QuickGelu, {&a.x}, {&a.y}, {{"alpha", a.alpha}}, ctx);
}
Status relu(const UnaryArgs& a, const Context& ctx) { return call(OpId::Relu, {&a.x}, {&a.y}, {}, ctx); }
Status sigmoid(const UnaryArgs& a, const Context& ctx) { return call(OpId::Sigmoid, {&a.x}, {&a.y}, {}, ctx); }
Status tanh(const UnaryArgs& a, const Context& ctx) { return call(OpId::Tanh, {&a.x}, {&a.y}, {}, ctx); }
Status leaky_relu(const LeakyReluArgs& a, const Context& ctx) {
  return call(OpId::LeakyRelu, {&a.x}, {&a.y}, {{"alpha", a.alpha}}, ctx);
}
Status softmax(const SoftmaxArgs& a, const Context& ctx) {
  return call(OpId::Softmax, {&a.x}, {&a.y}, {{"axis", double(a.axis)}}, ctx);
}
Status softmax_13(const Softmax13Args& a, const Context& ctx) {
  return call(OpId::Softmax_13, {&a.x}, {&a.y}, {{"axis", double(a.axis)}}, ctx);
}
Status log_softmax(const SoftmaxArgs& a, const Context& ctx) {
  return call(OpId::LogSoftmax, {&a.x}, {&a.y}, {{"axis", double(a.axis)}}, ctx);
}
Status log_softmax_13(const Softmax13Args& a, const Context& ctx) {
  return call(OpId::LogSoftmax_13, {&a.x}, {&a.y}, {{"axis", double(a.axis)}}, ctx);
}
Status layer_norm(const LayerNormArgs& a, const Context& ctx) {
  return call(OpId::LayerNormalization, {&a.x, &a.scale, opt(a.bias)}, {&a.y, opt(a.mean), opt(a.inv_std_dev)},
              {{"axis", double(a.axis)}, {"epsilon", a.epsilon}, {"stash_type", double(a.stash_type)}}, ctx);
}
Status rms_norm(const RmsNormArgs& a, const Context& ctx) {
  return call(OpId::SimplifiedLayerNormalization, {&a.x, &a.scale}, {&a.y, opt(a.inv_std_var)},
              {{"axis", double(a.axis)}, {"epsilon", a.epsilon}, {"stash_type", double(a.stash_type)}}, ctx);
}
Status batch_norm_training(const BatchNormTrainingArgs& a, const Context& ctx) {
  return call(OpId::BatchNormInternal, {&a.x, &a.scale, &a.bias, &a.input_mean, &a.input_var},
              {&a.y, opt(a.running_mean), opt(a.running_var), opt(a.saved_mean), opt(a.saved_inv_std)},
              {{"epsilon", a.epsilon}, {"momentum", a.momentum}, {"channels_last", a.channels_last ? 1.0 : 0.0}},
              ctx);
}


Status batch_norm_stats_reduce(const BatchNormStatsReduceArgs& a, const Context& ctx) {
  return call(OpId::BatchNormStatsReduce, {&a.x, &a.input_mean}, {&a.sums},
              {{"channels_last", a.channels_last ? 1.0 : 0.0}}, ctx);
}
Status batch_norm_stats_apply(const BatchNormStatsApplyArgs& a, const Context& ctx) {
  return call(OpId::BatchNormStatsApply, {&a.x, &a.scale, &a.bias, &a.input_mean, &a.input_var, &a.sums},
              {&a.y, opt(a.running_mean), opt(a.running_var), opt(a.saved_mean), opt(a.saved_inv_std)},
              {{"epsilon", a.epsilon}, {"momentum", a.momentum}, {"channels_last", a.channels_last ? 1.0 : 0.0}},
              ctx);
}
Status batch_norm_grad_reduce(const BatchNormGradReduceArgs& a, const Context& ctx) {
  return call(OpId::BatchNormGradReduce, {&a.dy, &a.x, &a.mean, &a.inv_std}, {&a.sums},
              {{"channels_last", a.channels_last ? 1.0 : 0.0}}, ctx);
}
Status batch_norm_grad_apply(const BatchNormGradApplyArgs& a, const Context& ctx) {
  return call(OpId::BatchNormGradApply, {&a.dy, &a.x, &a.scale, &a.mean, &a.inv_std, &a.sums},
              {&a.dx, opt(a.dscale), opt(a.dbias)}, {{"channels_last", a.channels_last ? 1.0 : 0.0}}, ctx);
}

}  // namespace gradops
