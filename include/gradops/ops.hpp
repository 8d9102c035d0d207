// One function per operator. Inputs, outputs and attributes follow ONNX Runtime's schemas (names,
// order, defaults); see docs/ops/ for the math, the dtypes and the tolerances of each.
//
// Every function validates the whole call before it writes anything: on failure it returns
// invalid_argument (or unimplemented for a valid call this build cannot run) and leaves every
// output byte untouched. Optional outputs are std::nullopt when not wanted.
#pragma once

#include <array>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"
#include "gradops/types.hpp"

namespace gradops {

// ---- elementwise gradients ------------------------------------------------------------------

// GeluGrad, FastGeluGrad, ReluGrad: x is the forward input. dx may be the same buffer as dy.
struct GeluGradArgs {
  TensorView dy, x;
  TensorView dx;
};
using FastGeluGradArgs = GeluGradArgs;
using ReluGradArgs = GeluGradArgs;  // ORT's gradient builder may pass the forward output as x

// SigmoidGrad, TanhGrad: y is the forward output.
struct SigmoidGradArgs {
  TensorView dy, y;
  TensorView dx;
};
using TanhGradArgs = SigmoidGradArgs;

struct QuickGeluGradArgs {
  TensorView dy, x;
  TensorView dx;
  float alpha = 1.702f;
};

// LeakyReluGrad masks on the forward *output* y, as ORT does; alpha < 0 is rejected.
struct LeakyReluGradArgs {
  TensorView dy, y;
  TensorView dx;
  float alpha = 0.01f;
};

// BiasGeluGrad_dX and BiasFastGeluGrad_dX: the gradient at z = x + b (b broadcast along the last
// axis). db, if given, receives the sum of dx over all but the last axis, from the same pass.
struct BiasGeluGradArgs {
  TensorView dy, x, b;
  TensorView dx;
  std::optional<TensorView> db;
};
using BiasFastGeluGradArgs = BiasGeluGradArgs;

Status gelu_grad(const GeluGradArgs& a, const Context& ctx = {});
Status fast_gelu_grad(const FastGeluGradArgs& a, const Context& ctx = {});
Status bias_gelu_grad(const BiasGeluGradArgs& a, const Context& ctx = {});            // BiasGeluGrad_dX
Status bias_fast_gelu_grad(const BiasFastGeluGradArgs& a, const Context& ctx = {});   // BiasFastGeluGrad_dX
Status relu_grad(const ReluGradArgs& a, const Context& ctx = {});
Status sigmoid_grad(const SigmoidGradArgs& a, const Context& ctx = {});
Status tanh_grad(const TanhGradArgs& a, const Context& ctx = {});
Status quick_gelu_grad(const QuickGeluGradArgs& a, const Context& ctx = {});
Status leaky_relu_grad(const LeakyReluGradArgs& a, const Context& ctx = {});

// ---- softmax gradients ----------------------------------------------------------------------

// SoftmaxGrad / LogSoftmaxGrad (axis default 1): the tensor is coerced to 2-D at axis, so a group
// spans all trailing dims. The _13 variants (axis default -1) reduce over the single axis, in
// place on strided data when it is not the last. For the LogSoftmax grads, y is the forward
// log-softmax *output* (ORT's schema calls that input "X").
struct SoftmaxGradArgs {
  TensorView dy, y;
  TensorView dx;
  int64_t axis = 1;
};
struct SoftmaxGrad13Args {
  TensorView dy, y;
  TensorView dx;
  int64_t axis = -1;
};
using LogSoftmaxGradArgs = SoftmaxGradArgs;
using LogSoftmaxGrad13Args = SoftmaxGrad13Args;

Status softmax_grad(const SoftmaxGradArgs& a, const Context& ctx = {});
Status softmax_grad_13(const SoftmaxGrad13Args& a, const Context& ctx = {});
Status log_softmax_grad(const LogSoftmaxGradArgs& a, const Context& ctx = {});
Status log_softmax_grad_13(const LogSoftmaxGrad13Args& a, const Context& ctx = {});

// ---- normalization gradients ----------------------------------------------------------------

// LayerNormalizationGrad. Rows are the dims before axis, cols the dims from axis on. mean and
// inv_std_dev hold one value per row; scale holds cols values.
struct LayerNormGradArgs {
  TensorView dy, x, scale, mean, inv_std_dev;
  TensorView dx;
  std::optional<TensorView> dscale, dbias;
  int64_t axis = -1;
};

// InvertibleLayerNormalizationGrad: x-hat is rebuilt from the forward output y as (y - bias)/scale.
struct InvertibleLayerNormGradArgs {
  TensorView dy, y, scale, bias, inv_std_dev;
  TensorView dx;
  std::optional<TensorView> dscale, dbias;
  int64_t axis = -1;
};

// SimplifiedLayerNormalizationGrad (RMSNorm): inv_std_var is the saved inverse RMS.
struct RmsNormGradArgs {
  TensorView dy, x, scale, inv_std_var;
  TensorView dx;
  std::optional<TensorView> dscale;
  int64_t axis = -1;
};

// BatchNormalizationGrad. mean and inv_std are BatchNormInternal's saved_mean and saved_inv_std
// (ORT's schema calls the latter "variance"; it is 1/sqrt(var + epsilon)). channels_last selects
// NHWC (channels on the last axis) instead of ORT's NCHW.
struct BatchNormGradArgs {
  TensorView dy, x, scale, mean, inv_std;
  TensorView dx;
  std::optional<TensorView> dscale, dbias;
  float epsilon = 1e-5f;  // required by ORT's schema; the saved statistics already include it
  bool channels_last = false;
};

Status layer_norm_grad(const LayerNormGradArgs& a, const Context& ctx = {});
Status invertible_layer_norm_grad(const InvertibleLayerNormGradArgs& a, const Context& ctx = {});
Status rms_norm_grad(const RmsNormGradArgs& a, const Context& ctx = {});   // SimplifiedLayerNormalizationGrad
Status batch_norm_grad(const BatchNormGradArgs& a, const Context& ctx = {});

// ---- forward companions ---------------------------------------------------------------------

struct UnaryArgs {
  TensorView x;
  TensorView y;
};
struct QuickGeluArgs {
  TensorView x;
  TensorView y;
  float alpha = 1.702f;
};
struct LeakyReluArgs {
  TensorView x;
  TensorView y;
  float alpha = 0.01f;
};
// FastGelu with an optional bias; BiasGelu with a required one.
struct FastGeluArgs {
  TensorView x;
  std::optional<TensorView> bias;
  TensorView y;
};
struct BiasGeluArgs {
  TensorView a, b;
  TensorView c;
};
struct SoftmaxArgs {
  TensorView x;
  TensorView y;
  int64_t axis = 1;
};
struct Softmax13Args {
  TensorView x;
  TensorView y;
  int64_t axis = -1;
};
struct LayerNormArgs {
  TensorView x, scale;
  std::optional<TensorView> bias;
  TensorView y;
  std::optional<TensorView> mean, inv_std_dev;
  int64_t axis = -1;
  float epsilon = 1e-5f;
  int64_t stash_type = 1;  // ONNX type code of the statistics: 1 = float, 11 = double
};
struct RmsNormArgs {
  TensorView x, scale;
  TensorView y;
  std::optional<TensorView> inv_std_var;
  int64_t axis = -1;
  float epsilon = 1e-5f;
  int64_t stash_type = 1;
};
// BatchNormInternal in training mode. running_mean/running_var may be the same buffers as
// input_mean/input_var (ORT's Alias(3,1) and Alias(4,2)).
struct BatchNormTrainingArgs {
  TensorView x, scale, bias, input_mean, input_var;
  TensorView y;
  std::optional<TensorView> running_mean, running_var, saved_mean, saved_inv_std;
  float epsilon = 1e-5f;
  float momentum = 0.9f;
  bool channels_last = false;
};

Status gelu(const UnaryArgs& a, const Context& ctx = {});
Status fast_gelu(const FastGeluArgs& a, const Context& ctx = {});
Status bias_gelu(const BiasGeluArgs& a, const Context& ctx = {});
Status quick_gelu(const QuickGeluArgs& a, const Context& ctx = {});
Status relu(const UnaryArgs& a, const Context& ctx = {});
Status sigmoid(const UnaryArgs& a, const Context& ctx = {});
Status tanh(const UnaryArgs& a, const Context& ctx = {});
Status leaky_relu(const LeakyReluArgs& a, const Context& ctx = {});
Status softmax(const SoftmaxArgs& a, const Context& ctx = {});
Status softmax_13(const Softmax13Args& a, const Context& ctx = {});
Status log_softmax(const SoftmaxArgs& a, const Context& ctx = {});
Status log_softmax_13(const Softmax13Args& a, const Context& ctx = {});
Status layer_norm(const LayerNormArgs& a, const Context& ctx = {});
Status rms_norm(const RmsNormArgs& a, const Context& ctx = {});                    // SimplifiedLayerNormalization
Status batch_norm_training(const BatchNormTrainingArgs& a, const Context& ctx = {});  // BatchNormInternal

// ---- gradops' own: the BatchNorm split for data-parallel callers ----------------------------
// Each reduce half writes `sums`, 2·C + 1 f64 values (two sums per channel, then the count);
// participants add them (one summed all-reduce) and pass the total to the apply half. Reduce +
// apply on one participant gives the fused op's bits (docs/ops/batch_norm.md).

// BatchNormStatsReduce: [Σ (x − input_mean), Σ (x − input_mean)², N·spatial].
struct BatchNormStatsReduceArgs {
  TensorView x, input_mean;
  TensorView sums;
  bool channels_last = false;
};
// BatchNormStatsApply: BatchNormInternal's outputs from the summed sums.
struct BatchNormStatsApplyArgs {
  TensorView x, scale, bias, input_mean, input_var, sums;
  TensorView y;
  std::optional<TensorView> running_mean, running_var, saved_mean, saved_inv_std;
  float epsilon = 1e-5f;
  float momentum = 0.9f;
  bool channels_last = false;
};
// BatchNormGradReduce: [Σ dY, Σ dY·x̂, N·spatial].
struct BatchNormGradReduceArgs {
  TensorView dy, x, mean, inv_std;
  TensorView sums;
  bool channels_last = false;
};
// BatchNormGradApply: BatchNormalizationGrad's outputs from the summed sums.
struct BatchNormGradApplyArgs {
  TensorView dy, x, scale, mean, inv_std, sums;
  TensorView dx;
  std::optional<TensorView> dscale, dbias;
  bool channels_last = false;
};
Status batch_norm_stats_reduce(const BatchNormStatsReduceArgs& a, const Context& ctx = {});
Status batch_norm_stats_apply(const BatchNormStatsApplyArgs& a, const Context& ctx = {});
Status batch_norm_grad_reduce(const BatchNormGradReduceArgs& a, const Context& ctx = {});
Status batch_norm_grad_apply(const BatchNormGradApplyArgs& a, const Context& ctx = {});

// ---- by name --------------------------------------------------------------------------------

// A named attribute. INT attributes take integral values; FLOAT attributes are rounded to float.
struct Attribute {
  std::string_view name;
  double value;
};

// Runs an operator by its ORT name ("GeluGrad", "LayerNormalizationGrad", ...). inputs and
// outputs are in the schema's order; a null pointer is an absent optional (trailing ones may be
// left out). Unlisted attributes take the schema's defaults.
Status run(std::string_view op_name, std::span<const TensorView* const> inputs,
           std::span<const TensorView* const> outputs, std::span<const Attribute> attributes = {},
           const Context& ctx = {});

// The display name of the implementation that `run` would pick for this call ("cpu:scalar",
// "cuda:warp_per_row", ...; CPU SIMD implementations add the target chosen for this processor, as
// the GRADOPS_VERBOSE=dispatch log does: "cpu:simd [AVX3]"). The call is validated exactly as
// `run` validates it and fails the same way; no tensor data is read or written. *name is empty for
// a valid call that needs no kernel.
Status implementation_name(std::string_view op_name, std::span<const TensorView* const> inputs,
                           std::span<const TensorView* const> outputs, std::span<const Attribute> attributes,
                           const Context& ctx, std::string* name);

// ---- what a call produces, and what this build runs ---------------------------------------------

// The dtype and shape of one output, as infer_output_shapes gives it.
struct TensorSpec {
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};

  std::span<const int64_t> shape() const noexcept { return {dims.data(), static_cast<std::size_t>(rank)}; }
};

// The dtype and shape of every output of `op_name` (optional ones included, in the schema's
// order) for these inputs and attributes, from the op table's per-output rules (ArgSchema::shape).
// Inputs are read for their dtype, shape and device only: data may be null. The call is validated
// as `run` would validate it with every output present at the inferred shapes (so a call that
// could never run fails here with run's message), except that nothing about data pointers is
// checked and a valid call that this build has no kernel for still gets its shapes. An output
// dtype that no input determines (InvertibleLayerNormalizationGrad's T, LayerNormalization's U
// without statistics outputs) is the first signature's that matches the inputs.
// outputs.size() must be at least the op's number of outputs; entries past it are left alone, and
// on failure nothing is written.
Status infer_output_shapes(std::string_view op_name, std::span<const TensorView* const> inputs,
                           std::span<const Attribute> attributes, std::span<TensorSpec> outputs);

// Whether this build has a kernel for `op` with the dtypes `signature` (one per type variable, in
// the schema's type_vars order) on devices of type `device`. A static fact of the build, read from
// the implementation lists: it is what `run` can dispatch to, before any kernel's own limits on a
// particular call (sizes, alignment) pick among the rows. A signature the op table does not list
// for `op` is never supported.
bool supports(OpId op, const TypeSignature& signature, DeviceType device) noexcept;
// ... in at least one of its signatures.
bool supports(OpId op, DeviceType device) noexcept;

// The display names of the implementation rows that may run `op` with `signature` on `device`, in
// the order dispatch tries them ("cuda:warp_per_row", "cuda:block_per_row", ...). Empty exactly when
// supports() is false.
std::vector<std::string> implementations(OpId op, const TypeSignature& signature, DeviceType device);

}  // namespace gradops
