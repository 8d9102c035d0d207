// The op table. Names, input/output order, attributes and defaults are ONNX Runtime's
// (docs/semantics.md Part B); signatures are ORT's plus the extensions of Part A.
#include <algorithm>
#include <limits>

#include "gradops/schema.hpp"
#include "ops/batch_norm.hpp"
#include "ops/layer_norm.hpp"

namespace gradops {
namespace {

using enum DType;
constexpr bool kOpt = true, kReq = false;
constexpr bool kExt = true, kOrt = false;

constexpr std::string_view kT[] = {"T"};
constexpr std::string_view kTUV[] = {"T", "U", "V"};
constexpr std::string_view kTT1T2[] = {"T", "T1", "T2"};
constexpr std::string_view kTT2S[] = {"T", "T2", "S"};
constexpr std::string_view kTT1T2S[] = {"T", "T1", "T2", "S"};

constexpr TypeSignature kAllT[] = {{{f32}}, {{f64}}, {{f16}}, {{bf16}}};
// LayerNorm family (T, U, V): the family contract's list (src/ops/layer_norm.hpp).
constexpr std::span<const TypeSignature> kLayerNormSigs = detail::kLayerNormSignatures;
// BatchNorm (T, T1, T2): the family contract's list (src/ops/batch_norm.hpp).
constexpr std::span<const TypeSignature> kBatchNormSigs = detail::kBatchNormSignatures;
// The BatchNorm split (gradops' own): the same signatures with S = f64, the sums' type; the reduce
// halves have no T1.
constexpr std::span<const TypeSignature> kBatchNormApplySigs = detail::kBatchNormApplySignatures;
constexpr std::span<const TypeSignature> kBatchNormReduceSigs = detail::kBatchNormReduceSignatures;

constexpr AliasRule kDxMayBeDy[] = {{0, 0}};
constexpr AliasRule kBatchNormInternalAliases[] = {{1, 3}, {2, 4}};
constexpr std::string_view kGradops = "gradops";  // the domain of gradops' own operators

// Output shapes (ShapeRule): like input i, or one value per row of input i.
constexpr ShapeRule kLike0{ShapeRule::like_input, 0}, kLike1{ShapeRule::like_input, 1},
    kLike2{ShapeRule::like_input, 2}, kLike3{ShapeRule::like_input, 3};
constexpr ShapeRule kRowsOf0{ShapeRule::rows_of_input, 0};
constexpr ShapeRule kSumsOf1{ShapeRule::channel_sums, 1}, kSumsOf2{ShapeRule::channel_sums, 2};

// ---- arguments --------------------------------------------------------------------------------

constexpr ArgSchema kIn_dY_X[] = {{"dY", 0, kReq, kOrt, "incoming gradient"},
                                  {"X", 0, kReq, kOrt, "forward input"}};
constexpr ArgSchema kIn_dY_Y[] = {{"dY", 0, kReq, kOrt, "incoming gradient"},
                                  {"Y", 0, kReq, kOrt, "forward output"}};
constexpr ArgSchema kIn_dY_X_B[] = {{"dY", 0, kReq, kOrt, "incoming gradient"},
                                    {"X", 0, kReq, kOrt, "forward input, before the bias"},
                                    {"B", 0, kReq, kOrt, "bias, 1-D, length of X's last dim"}};
constexpr ArgSchema kIn_Softmax[] = {{"dY", 0, kReq, kOrt, "incoming gradient"},
                                     {"Y", 0, kReq, kOrt, "forward softmax output"}};
constexpr ArgSchema kIn_LogSoftmax[] = {
    {"dY", 0, kReq, kOrt, "incoming gradient"},
    {"X", 0, kReq, kOrt, "the forward log-softmax *output* (ORT names it X)"}};
constexpr ArgSchema kOut_dX[] = {{"dX", 0, kReq, kOrt, "gradient of the input", kLike0}};
constexpr ArgSchema kOut_dX_dB[] = {
    {"dX", 0, kReq, kOrt, "gradient at X + B", kLike0},
    {"dB", 0, kOpt, kExt, "sum of dX over all but the last axis, from the same pass", kLike2}};

constexpr ArgSchema kIn_LayerNormGrad[] = {
    {"Y_grad", 2, kReq, kOrt, "incoming gradient"},
    {"X", 0, kReq, kOrt, "forward input"},
    {"scale", 2, kReq, kOrt, "scale (gamma), cols values"},
    {"mean", 1, kReq, kOrt, "saved row means, one per row"},
    {"inv_std_dev", 1, kReq, kOrt, "saved 1/sqrt(var + epsilon), one per row"}};
constexpr ArgSchema kOut_LayerNormGrad[] = {{"X_grad", 0, kReq, kOrt, "gradient of X", kLike1},
                                            {"scale_grad", 2, kOpt, kOrt, "gradient of scale", kLike2},
                                            {"bias_grad", 2, kOpt, kOrt, "gradient of bias", kLike2}};
constexpr ArgSchema kIn_InvertibleLayerNormGrad[] = {
    {"Y_grad", 2, kReq, kOrt, "incoming gradient"},
    {"Y", 2, kReq, kOrt, "forward output"},
    {"scale", 2, kReq, kOrt, "scale (gamma), cols values"},
    {"bias", 2, kReq, kOrt, "bias (beta), cols values"},
    {"inv_std_var", 1, kReq, kOrt, "saved 1/sqrt(var + epsilon), one per row"}};
constexpr ArgSchema kIn_RmsNormGrad[] = {
    {"Y_grad", 2, kReq, kOrt, "incoming gradient"},
    {"X", 0, kReq, kOrt, "forward input"},
    {"scale", 2, kReq, kOrt, "scale (gamma), cols values"},
    {"inv_std_var", 1, kReq, kOrt, "saved inverse RMS 1/sqrt(mean(x^2) + epsilon), one per row"}};
constexpr ArgSchema kOut_RmsNormGrad[] = {{"X_grad", 0, kReq, kOrt, "gradient of X", kLike1},
                                          {"scale_grad", 2, kOpt, kOrt, "gradient of scale", kLike2}};
constexpr ArgSchema kIn_BatchNormGrad[] = {
    {"dY", 0, kReq, kOrt, "incoming gradient"},
    {"X", 0, kReq, kOrt, "forward input"},
    {"scale", 1, kReq, kOrt, "scale, one per channel"},
    {"mean", 2, kReq, kOrt, "saved batch mean, one per channel"},
    {"variance", 2, kReq, kOrt, "saved inverse std 1/sqrt(var + epsilon), one per channel"}};
constexpr ArgSchema kOut_BatchNormGrad[] = {{"X_grad", 0, kReq, kOrt, "gradient of X", kLike1},
                                            {"scale_grad", 1, kOpt, kOrt, "gradient of scale", kLike2},
                                            {"bias_grad", 1, kOpt, kOrt, "gradient of bias", kLike2}};

constexpr ArgSchema kIn_X[] = {{"X", 0, kReq, kOrt, "input"}};
constexpr ArgSchema kOut_Y[] = {{"Y", 0, kReq, kOrt, "output", kLike0}};
constexpr ArgSchema kIn_FastGelu[] = {{"X", 0, kReq, kOrt, "input"},
                                      {"bias", 0, kOpt, kOrt, "optional bias, 1-D, length of X's last dim"}};
constexpr ArgSchema kIn_BiasGelu[] = {{"A", 0, kReq, kOrt, "input"},
                                      {"B", 0, kReq, kOrt, "bias, 1-D, length of A's last dim"}};
constexpr ArgSchema kOut_C[] = {{"C", 0, kReq, kOrt, "Gelu(A + B)", kLike0}};
constexpr ArgSchema kIn_Softmax_X[] = {{"input", 0, kReq, kOrt, "input"}};
constexpr ArgSchema kOut_Softmax_Y[] = {{"output", 0, kReq, kOrt, "output", kLike0}};
constexpr ArgSchema kIn_LayerNorm[] = {{"X", 0, kReq, kOrt, "input"},
                                       {"Scale", 2, kReq, kOrt, "scale (gamma), cols values"},
                                       {"B", 2, kOpt, kOrt, "bias (beta), cols values"}};
constexpr ArgSchema kOut_LayerNorm[] = {{"Y", 2, kReq, kOrt, "output", kLike0},
                                        {"Mean", 1, kOpt, kOrt, "row means", kRowsOf0},
                                        {"InvStdDev", 1, kOpt, kOrt, "1/sqrt(biased var + epsilon) per row", kRowsOf0}};
constexpr ArgSchema kIn_RmsNorm[] = {{"X", 0, kReq, kOrt, "input"},
                                     {"scale", 2, kReq, kOrt, "scale (gamma), cols values"}};
constexpr ArgSchema kOut_RmsNorm[] = {{"Y", 2, kReq, kOrt, "output", kLike0},
                                      {"inv_std_var", 1, kOpt, kOrt, "1/sqrt(mean(x^2) + epsilon) per row", kRowsOf0}};
constexpr ArgSchema kIn_BatchNormInternal[] = {
    {"X", 0, kReq, kOrt, "input"},
    {"scale", 1, kReq, kOrt, "scale, one per channel"},
    {"B", 1, kReq, kOrt, "bias, one per channel"},
    {"input_mean", 2, kReq, kOrt, "running mean before the step"},
    {"input_var", 2, kReq, kOrt, "running variance before the step"}};
constexpr ArgSchema kOut_BatchNormInternal[] = {
    {"Y", 0, kReq, kOrt, "output", kLike0},
    {"running_mean", 2, kOpt, kOrt, "momentum*input_mean + (1-momentum)*batch mean", kLike3},
    {"running_var", 2, kOpt, kOrt, "momentum*input_var + (1-momentum)*unbiased batch variance", kLike3},
    {"saved_mean", 2, kOpt, kOrt, "batch mean", kLike3},
    {"saved_inv_std", 2, kOpt, kOrt, "1/sqrt(biased batch variance + epsilon)", kLike3}};

// The BatchNorm split: gradops' own operators, so no argument extends someone else's schema (the
// extension flags stay off). `sums` is one S tensor of 2·C + 1 values, two per-channel sums and
// the count of values they cover, so that a data-parallel caller adds every participant's with one
// all-reduce between the reduce and the apply (docs/ops/batch_norm.md).
constexpr ArgSchema kIn_BatchNormStatsReduce[] = {
    {"X", 0, kReq, kOrt, "input"},
    {"input_mean", 1, kReq, kOrt, "running mean before the step: the shift the sums are taken about"}};
constexpr ArgSchema kOut_BatchNormStatsReduce[] = {
    {"sums", 2, kReq, kOrt, "[sum(x - input_mean) per channel, sum((x - input_mean)^2) per channel, N*spatial]",
     kSumsOf1}};
constexpr ArgSchema kIn_BatchNormStatsApply[] = {
    {"X", 0, kReq, kOrt, "input"},
    {"scale", 1, kReq, kOrt, "scale, one per channel"},
    {"B", 1, kReq, kOrt, "bias, one per channel"},
    {"input_mean", 2, kReq, kOrt, "running mean before the step (the sums' shift)"},
    {"input_var", 2, kReq, kOrt, "running variance before the step"},
    {"sums", 3, kReq, kOrt, "BatchNormStatsReduce's sums, added over every participant"}};
constexpr ArgSchema kIn_BatchNormGradReduce[] = {
    {"dY", 0, kReq, kOrt, "incoming gradient"},
    {"X", 0, kReq, kOrt, "forward input"},
    {"mean", 1, kReq, kOrt, "saved batch mean, one per channel"},
    {"inv_std", 1, kReq, kOrt, "saved inverse std 1/sqrt(var + epsilon), one per channel"}};
constexpr ArgSchema kOut_BatchNormGradReduce[] = {
    {"sums", 2, kReq, kOrt, "[sum(dY) per channel, sum(dY*xhat) per channel, N*spatial]", kSumsOf2}};
constexpr ArgSchema kIn_BatchNormGradApply[] = {
    {"dY", 0, kReq, kOrt, "incoming gradient"},
    {"X", 0, kReq, kOrt, "forward input"},
    {"scale", 1, kReq, kOrt, "scale, one per channel"},
    {"mean", 2, kReq, kOrt, "saved batch mean, one per channel"},
    {"inv_std", 2, kReq, kOrt, "saved inverse std 1/sqrt(var + epsilon), one per channel"},
    {"sums", 3, kReq, kOrt, "BatchNormGradReduce's sums, added over every participant"}};
constexpr ArgSchema kOut_BatchNormGradApply[] = {
    {"X_grad", 0, kReq, kOrt, "gradient of X", kLike1},
    {"scale_grad", 1, kOpt, kOrt, "gradient of scale (the sums' sum(dY*xhat))", kLike2},
    {"bias_grad", 1, kOpt, kOrt, "gradient of bias (the sums' sum(dY))", kLike2}};

// ---- attributes -------------------------------------------------------------------------------

// Ranges (min, max, min_open, max_open): FLOAT attributes are checked after rounding to f32, so
// kFinite's ends are the largest finite floats and a value that rounds to infinity is rejected.
constexpr double kFltMax = std::numeric_limits<float>::max();
constexpr double kIntMax = 9.0e15;  // every integer up to here is exact in the double that carries it

constexpr AttrSchema kQuickGeluAttrs[] = {
    {"alpha", AttrType::float32, 1.702, false, kOrt, "sigmoid scale; 1 gives SiLU; any finite value",
     -kFltMax, kFltMax}};
constexpr AttrSchema kLeakyReluAttrs[] = {
    {"alpha", AttrType::float32, 0.01, false, kOrt, "slope for non-positive values; any finite value",
     -kFltMax, kFltMax}};
constexpr AttrSchema kLeakyReluGradAttrs[] = {
    {"alpha", AttrType::float32, 0.01, false, kOrt,
     "slope for non-positive Y; finite and >= 0 (the mask on Y is only a correct gradient for alpha >= 0)",
     0, kFltMax}};
constexpr AttrSchema kAxis1[] = {
    {"axis", AttrType::int64, 1, false, kOrt, "the tensor is coerced to 2-D at this axis; in [-rank, rank)",
     -kIntMax, kIntMax}};
constexpr AttrSchema kAxisMinus1[] = {
    {"axis", AttrType::int64, -1, false, kOrt, "the single axis reduced over; in [-rank, rank)", -kIntMax,
     kIntMax}};
// An attribute accepted and range-checked but not read (AttrSchema::read).
constexpr AttrSchema not_read(AttrSchema a) {
  a.read = false;
  return a;
}

// ORT's gradient builder copies the forward node's epsilon and stash_type onto these nodes (its
// schemas allow unchecked attributes): accepted and range-checked so such graphs map node by node,
// not read; any other name is rejected.
constexpr AttrSchema kNormGradAttrs[] = {
    {"axis", AttrType::int64, -1, false, kOrt, "first normalized dimension; in [-rank, rank)", -kIntMax,
     kIntMax},
    not_read({"epsilon", AttrType::float32, 1e-5, false, kOrt,
              "not read (the saved statistics include it); accepted as ORT's gradient builder sets it; finite "
              "and >= 0",
              0, kFltMax}),
    not_read({"stash_type", AttrType::int64, 1, false, kOrt, "not read; accepted as ORT's gradient builder sets it",
              -kIntMax, kIntMax})};
constexpr AttrSchema kNormAttrs[] = {
    {"axis", AttrType::int64, -1, false, kOrt, "first normalized dimension; in [-rank, rank)", -kIntMax,
     kIntMax},
    {"epsilon", AttrType::float32, 1e-5, false, kOrt, "added to the variance; finite and >= 0", 0, kFltMax},
    not_read({"stash_type", AttrType::int64, 1, false, kOrt,
              "ONNX type of the statistics (1 float, 11 double); not read: the statistics' dtype U decides",
              -kIntMax, kIntMax})};
constexpr AttrSchema kBatchNormGradAttrs[] = {
    not_read({"epsilon", AttrType::float32, 0, true, kOrt,
              "required; finite and >= 0; unused, the saved inverse std includes it", 0, kFltMax}),
    {"channels_last", AttrType::int64, 0, false, kExt, "1: NHWC, channels on the last axis; 0 or 1", 0, 1}};
constexpr AttrSchema kBatchNormInternalAttrs[] = {
    {"epsilon", AttrType::float32, 1e-5, false, kOrt, "added to the variance; finite and >= 0", 0, kFltMax},
    {"momentum", AttrType::float32, 0.9, false, kOrt, "weight of the old running value; in [0, 1]", 0, 1},
    {"training_mode", AttrType::int64, 1, false, kOrt, "must be 1: gradops runs the training form", 1, 1},
    {"channels_last", AttrType::int64, 0, false, kExt, "1: NHWC, channels on the last axis; 0 or 1", 0, 1}};
constexpr AttrSchema kBatchNormSplitAttrs[] = {
    {"channels_last", AttrType::int64, 0, false, kOrt, "1: NHWC, channels on the last axis; 0 or 1", 0, 1}};
constexpr AttrSchema kBatchNormStatsApplyAttrs[] = {
    {"epsilon", AttrType::float32, 1e-5, false, kOrt, "added to the variance; finite and >= 0", 0, kFltMax},
    {"momentum", AttrType::float32, 0.9, false, kOrt, "weight of the old running value; in [0, 1]", 0, 1},
    {"channels_last", AttrType::int64, 0, false, kOrt, "1: NHWC, channels on the last axis; 0 or 1", 0, 1}};

// ---- the table --------------------------------------------------------------------------------

constexpr std::string_view kMs = "com.microsoft";
constexpr std::string_view kOnnx = "";
constexpr bool kGrad = true, kFwd = false;
using F = OpFamily;

constexpr OpSchema kOps[] = {
    {OpId::GeluGrad, "GeluGrad", kMs, 1, F::activation, kGrad, kT, kIn_dY_X, kOut_dX,
     {}, kAllT, kDxMayBeDy, "dX = dY * (Phi(X) + X * phi(X))"},
    {OpId::FastGeluGrad, "FastGeluGrad", kMs, 1, F::activation, kGrad, kT, kIn_dY_X,
     kOut_dX, {}, kAllT, kDxMayBeDy, "gradient of the tanh approximation of GELU"},
    {OpId::BiasGeluGrad_dX, "BiasGeluGrad_dX", kMs, 1, F::activation, kGrad, kT,
     kIn_dY_X_B, kOut_dX_dB, {}, kAllT, kDxMayBeDy, "GeluGrad at X + B; optional dB"},
    {OpId::BiasFastGeluGrad_dX, "BiasFastGeluGrad_dX", kMs, 1, F::activation, kGrad,
     kT, kIn_dY_X_B, kOut_dX_dB, {}, kAllT, kDxMayBeDy, "FastGeluGrad at X + B; optional dB"},
    {OpId::ReluGrad, "ReluGrad", kMs, 1, F::activation, kGrad, kT, kIn_dY_X, kOut_dX,
     {}, kAllT, kDxMayBeDy, "dX = X > 0 ? dY : 0"},
    {OpId::SigmoidGrad, "SigmoidGrad", kMs, 1, F::activation, kGrad, kT, kIn_dY_Y,
     kOut_dX, {}, kAllT, kDxMayBeDy, "dX = dY * Y * (1 - Y)"},
    {OpId::TanhGrad, "TanhGrad", kMs, 1, F::activation, kGrad, kT, kIn_dY_Y, kOut_dX,
     {}, kAllT, kDxMayBeDy, "dX = dY * (1 - Y^2)"},
    {OpId::QuickGeluGrad, "QuickGeluGrad", kMs, 1, F::activation, kGrad, kT,
     kIn_dY_X, kOut_dX, kQuickGeluAttrs, kAllT, kDxMayBeDy,
     "dX = dY * s * (1 + v * (1 - s)), v = alpha * X, s = sigmoid(v)"},
    {OpId::LeakyReluGrad, "LeakyReluGrad", kMs, 1, F::activation, kGrad, kT,
     kIn_dY_Y, kOut_dX, kLeakyReluGradAttrs, kAllT, kDxMayBeDy, "dX = Y > 0 ? dY : alpha * dY"},
    {OpId::SoftmaxGrad, "SoftmaxGrad", kMs, 1, F::softmax, kGrad, kT, kIn_Softmax,
     kOut_dX, kAxis1, kAllT, {}, "dX = Y * (dY - sum(Y * dY)), 2-D coercion at axis"},
    {OpId::SoftmaxGrad_13, "SoftmaxGrad_13", kMs, 1, F::softmax, kGrad, kT,
     kIn_Softmax, kOut_dX, kAxisMinus1, kAllT, {}, "dX = Y * (dY - sum(Y * dY)) over one axis"},
    {OpId::LogSoftmaxGrad, "LogSoftmaxGrad", kMs, 1, F::softmax, kGrad, kT,
     kIn_LogSoftmax, kOut_dX, kAxis1, kAllT, {}, "dX = dY - exp(Y) * sum(dY), 2-D coercion at axis"},
    {OpId::LogSoftmaxGrad_13, "LogSoftmaxGrad_13", kMs, 1, F::softmax, kGrad, kT,
     kIn_LogSoftmax, kOut_dX, kAxisMinus1, kAllT, {}, "dX = dY - exp(Y) * sum(dY) over one axis"},
    {OpId::LayerNormalizationGrad, "LayerNormalizationGrad", kMs, 1, F::layer_norm, kGrad,
     kTUV, kIn_LayerNormGrad, kOut_LayerNormGrad, kNormGradAttrs, kLayerNormSigs, {},
     "LayerNorm backward from the saved mean and inverse std"},
    {OpId::InvertibleLayerNormalizationGrad, "InvertibleLayerNormalizationGrad", kMs, 1,
     F::layer_norm, kGrad, kTUV, kIn_InvertibleLayerNormGrad, kOut_LayerNormGrad,
     kNormGradAttrs, kLayerNormSigs, {}, "LayerNorm backward from the forward output Y"},
    {OpId::SimplifiedLayerNormalizationGrad, "SimplifiedLayerNormalizationGrad", kMs, 1,
     F::layer_norm, kGrad, kTUV, kIn_RmsNormGrad, kOut_RmsNormGrad, kNormGradAttrs,
     kLayerNormSigs, {}, "RMSNorm backward from the saved inverse RMS"},
    {OpId::BatchNormalizationGrad, "BatchNormalizationGrad", kMs, 1, F::batch_norm, kGrad,
     kTT1T2, kIn_BatchNormGrad, kOut_BatchNormGrad, kBatchNormGradAttrs, kBatchNormSigs,
     {}, "BatchNorm backward (spatial) from the saved mean and inverse std"},

    {OpId::Gelu, "Gelu", kMs, 1, F::activation, kFwd, kT, kIn_X, kOut_Y, {}, kAllT, {},
     "Y = X * Phi(X)"},
    {OpId::FastGelu, "FastGelu", kMs, 1, F::activation, kFwd, kT, kIn_FastGelu, kOut_Y,
     {}, kAllT, {}, "tanh approximation of GELU at X (+ bias)"},
    {OpId::BiasGelu, "BiasGelu", kMs, 1, F::activation, kFwd, kT, kIn_BiasGelu, kOut_C,
     {}, kAllT, {}, "C = Gelu(A + B)"},
    {OpId::QuickGelu, "QuickGelu", kMs, 1, F::activation, kFwd, kT, kIn_X, kOut_Y,
     kQuickGeluAttrs, kAllT, {}, "Y = X * sigmoid(alpha * X)"},
    {OpId::Relu, "Relu", kOnnx, 14, F::activation, kFwd, kT, kIn_X, kOut_Y, {}, kAllT,
     {}, "Y = max(X, 0)"},
    {OpId::Sigmoid, "Sigmoid", kOnnx, 13, F::activation, kFwd, kT, kIn_X, kOut_Y, {},
     kAllT, {}, "Y = 1 / (1 + exp(-X))"},
    {OpId::Tanh, "Tanh", kOnnx, 13, F::activation, kFwd, kT, kIn_X, kOut_Y, {}, kAllT,
     {}, "Y = tanh(X)"},
    {OpId::LeakyRelu, "LeakyRelu", kOnnx, 16, F::activation, kFwd, kT, kIn_X, kOut_Y,
     kLeakyReluAttrs, kAllT, {}, "Y = X > 0 ? X : alpha * X"},
    {OpId::Softmax, "Softmax", kOnnx, 1, F::softmax, kFwd, kT, kIn_Softmax_X,
     kOut_Softmax_Y, kAxis1, kAllT, {}, "softmax, 2-D coercion at axis (opset 1-12)"},
    {OpId::Softmax_13, "Softmax_13", kOnnx, 13, F::softmax, kFwd, kT, kIn_Softmax_X,
     kOut_Softmax_Y, kAxisMinus1, kAllT, {}, "softmax over one axis (opset 13)"},
    {OpId::LogSoftmax, "LogSoftmax", kOnnx, 1, F::softmax, kFwd, kT, kIn_Softmax_X,
     kOut_Softmax_Y, kAxis1, kAllT, {}, "log-softmax, 2-D coercion at axis (opset 1-12)"},
    {OpId::LogSoftmax_13, "LogSoftmax_13", kOnnx, 13, F::softmax, kFwd, kT,
     kIn_Softmax_X, kOut_Softmax_Y, kAxisMinus1, kAllT, {}, "log-softmax over one axis (opset 13)"},
    {OpId::LayerNormalization, "LayerNormalization", kOnnx, 1, F::layer_norm, kFwd,
     kTUV, kIn_LayerNorm, kOut_LayerNorm, kNormAttrs, kLayerNormSigs, {},
     "Y = (X - mean) * inv_std * Scale + B per row"},
    {OpId::SimplifiedLayerNormalization, "SimplifiedLayerNormalization", kOnnx, 1, F::layer_norm,
     kFwd, kTUV, kIn_RmsNorm, kOut_RmsNorm, kNormAttrs, kLayerNormSigs, {},
     "RMSNorm: Y = X * inv_rms * scale per row"},
    {OpId::BatchNormInternal, "BatchNormInternal", kMs, 1, F::batch_norm, kFwd, kTT1T2,
     kIn_BatchNormInternal, kOut_BatchNormInternal, kBatchNormInternalAttrs, kBatchNormSigs,
     kBatchNormInternalAliases, "BatchNorm training step with saved statistics"},

    {OpId::BatchNormStatsReduce, "BatchNormStatsReduce", kGradops, 1, F::batch_norm, kFwd, kTT2S,
     kIn_BatchNormStatsReduce, kOut_BatchNormStatsReduce, kBatchNormSplitAttrs, kBatchNormReduceSigs, {},
     "BatchNormInternal's first half: per-channel sums about input_mean, added across participants",
     OpOrigin::gradops},
    {OpId::BatchNormStatsApply, "BatchNormStatsApply", kGradops, 1, F::batch_norm, kFwd, kTT1T2S,
     kIn_BatchNormStatsApply, kOut_BatchNormInternal, kBatchNormStatsApplyAttrs, kBatchNormApplySigs,
     kBatchNormInternalAliases, "BatchNormInternal's second half: statistics from the summed sums, then Y",
     OpOrigin::gradops},
    {OpId::BatchNormGradReduce, "BatchNormGradReduce", kGradops, 1, F::batch_norm, kFwd, kTT2S,
     kIn_BatchNormGradReduce, kOut_BatchNormGradReduce, kBatchNormSplitAttrs, kBatchNormReduceSigs, {},
     "BatchNormalizationGrad's first half: per-channel sum(dY) and sum(dY*xhat), added across participants",
     OpOrigin::gradops},
    {OpId::BatchNormGradApply, "BatchNormGradApply", kGradops, 1, F::batch_norm, kFwd, kTT1T2S,
     kIn_BatchNormGradApply, kOut_BatchNormGradApply, kBatchNormSplitAttrs, kBatchNormApplySigs, {},
     "BatchNormalizationGrad's second half: X_grad (and scale_grad, bias_grad) from the summed sums",
     OpOrigin::gradops},
};

constexpr bool table_in_id_order() {
  for (int i = 0; i < kNumOps; ++i)
    if (static_cast<int>(kOps[i].id) != i) return false;
  return std::size(kOps) == kNumOps;
}
static_assert(table_in_id_order(), "kOps must list every OpId once, in order");

// Every output has a shape rule that names an input the op has and always has (a required one).
constexpr bool output_shapes_complete() {
  for (const OpSchema& op : kOps)
    for (const ArgSchema& o : op.outputs) {
      if (o.shape.kind == ShapeRule::none || o.shape.input < 0 ||
          static_cast<std::size_t>(o.shape.input) >= op.inputs.size() || op.inputs[o.shape.input].optional)
        return false;
      if (o.shape.kind == ShapeRule::rows_of_input) {
        bool has_axis = false;
        for (const AttrSchema& a : op.attributes) has_axis = has_axis || a.name == "axis";
        if (!has_axis) return false;
      }
    }
  return true;
}
static_assert(output_shapes_complete(), "every output needs a shape rule from a required input");

}  // namespace

int OpSchema::num_required_inputs() const noexcept {
  return static_cast<int>(std::count_if(inputs.begin(), inputs.end(), [](auto& a) { return !a.optional; }));
}
int OpSchema::num_required_outputs() const noexcept {
  return static_cast<int>(std::count_if(outputs.begin(), outputs.end(), [](auto& a) { return !a.optional; }));
}
int OpSchema::find_attribute(std::string_view attr) const noexcept {
  for (std::size_t i = 0; i < attributes.size(); ++i)
    if (attributes[i].name == attr) return static_cast<int>(i);
  return -1;
}

std::span<const OpSchema> op_schemas() noexcept { return kOps; }
const OpSchema& op_schema(OpId id) noexcept { return kOps[static_cast<int>(id)]; }
const OpSchema* find_op(std::string_view name) noexcept {
  for (const OpSchema& op : kOps)
    if (op.name == name) return &op;
  return nullptr;
}

const char* op_origin_name(OpOrigin o) noexcept {
  return o == OpOrigin::onnxruntime ? "onnxruntime" : o == OpOrigin::gradops ? "gradops" : "?";
}

const char* op_family_name(OpFamily f) noexcept {
  switch (f) {
    case OpFamily::activation: return "activation";
    case OpFamily::softmax: return "softmax";
    case OpFamily::layer_norm: return "layer_norm";
    case OpFamily::batch_norm: return "batch_norm";
  }
  return "?";
}

}  // namespace gradops
