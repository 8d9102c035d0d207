// The op table: every operator's ORT name, inputs, outputs, attributes and dtype signatures.
// This one table drives validation, the by-name API, the C ABI, the CLI's `list`, the ONNX Runtime
// adapter and the tests.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <string_view>

#include "gradops/types.hpp"

namespace gradops {

enum class OpId : uint8_t {
  // the 17 gradient operators
  GeluGrad, FastGeluGrad, BiasGeluGrad_dX, BiasFastGeluGrad_dX, ReluGrad, SigmoidGrad, TanhGrad,
  QuickGeluGrad, LeakyReluGrad, SoftmaxGrad, SoftmaxGrad_13, LogSoftmaxGrad, LogSoftmaxGrad_13,
  LayerNormalizationGrad, InvertibleLayerNormalizationGrad, SimplifiedLayerNormalizationGrad,
  BatchNormalizationGrad,
  // forward companions
  Gelu, FastGelu, BiasGelu, QuickGelu, Relu, Sigmoid, Tanh, LeakyRelu, Softmax, Softmax_13,
  LogSoftmax, LogSoftmax_13, LayerNormalization, SimplifiedLayerNormalization, BatchNormInternal,
  // gradops' own: BatchNorm split at its per-channel sums, for data-parallel callers
  BatchNormStatsReduce, BatchNormStatsApply, BatchNormGradReduce, BatchNormGradApply,
};
inline constexpr int kNumOps = static_cast<int>(OpId::BatchNormGradApply) + 1;

// Op families: one source file per family in every layer (src/ops, src/cpu, src/cuda, tests, docs).
enum class OpFamily : uint8_t { activation, softmax, layer_norm, batch_norm };
const char* op_family_name(OpFamily f) noexcept;  // "activation", ...

enum class AttrType : uint8_t { int64, float32 };

struct AttrSchema {
  std::string_view name;
  AttrType type;
  double default_value;
  bool required;    // no default (BatchNormalizationGrad's epsilon)
  bool extension;   // gradops-only, not in ORT's schema
  std::string_view doc;
  // The valid range, checked for every call by every entry point (for a FLOAT attribute, on the
  // value after rounding to f32): [min, max], or open at an end whose *_open flag is set. The
  // defaults admit every finite value; no attribute admits NaN or an infinity.
  double min = -std::numeric_limits<float>::max();
  double max = std::numeric_limits<float>::max();
  bool min_open = false;
  bool max_open = false;
  // Whether gradops reads the value. False for attributes accepted (and range-checked) only because
  // ORT's graphs carry them: the LayerNorm grads' epsilon and stash_type, which ORT's gradient
  // builder copies from the forward; stash_type, which the statistics' dtype decides; the epsilon
  // BatchNormalizationGrad requires though the saved inverse std includes it.
  bool read = true;

  bool in_range(double v) const noexcept {
    return (min_open ? v > min : v >= min) && (max_open ? v < max : v <= max);
  }
};

// How an output's shape follows from the inputs of a valid call (infer_output_shapes in
// gradops/ops.hpp reads it; the op's shape checks then confirm it).
struct ShapeRule {
  enum Kind : uint8_t {
    none,         // inputs: no rule
    like_input,   // the shape of input `input`
    rows_of_input,  // the dims of input `input` before the op's 'axis' attribute, then 1s up to its
                    // rank (ONNX LayerNormalization's Mean and InvStdDev)
    channel_sums,   // 1-D [2·d0 + 1], d0 the length of 1-D input `input`: the BatchNorm split's two
                    // per-channel sums and their count, one tensor for one all-reduce
  };
  Kind kind = none;
  int8_t input = -1;
};

struct ArgSchema {
  std::string_view name;  // ORT's name
  uint8_t type_var;       // index into OpSchema::type_vars
  bool optional;
  bool extension;         // gradops-only, not in ORT's schema
  std::string_view doc;
  ShapeRule shape{};      // outputs: how the shape follows from the inputs
};

// One allowed assignment of dtypes to the op's type variables, in type_vars order.
struct TypeSignature {
  std::array<DType, 4> types;
};

// Output `output` may be the very same buffer as input `input` (same pointer, same bytes).
struct AliasRule {
  int8_t output;
  int8_t input;
};

// Whose operator this is. ONNX Runtime's operators (the ONNX domain or ORT's com.microsoft
// contrib and training ops) keep ORT's names and schemas, and only they are registered by the ONNX
// Runtime adapter; gradops' own operators are listed, run and checked like the others but never
// registered in a domain that belongs to someone else.
enum class OpOrigin : uint8_t { onnxruntime, gradops };
const char* op_origin_name(OpOrigin o) noexcept;  // "onnxruntime", "gradops"

struct OpSchema {
  OpId id;
  std::string_view name;    // ORT's op name
  std::string_view domain;  // "com.microsoft", or "" for the ONNX domain
  int since_version;
  OpFamily family;
  bool gradient;            // a gradient operator (they come first in the table)
  std::span<const std::string_view> type_vars;  // "T", or "T","U","V", or "T","T1","T2"(,"S")
  std::span<const ArgSchema> inputs;
  std::span<const ArgSchema> outputs;
  std::span<const AttrSchema> attributes;
  std::span<const TypeSignature> signatures;
  std::span<const AliasRule> aliases;
  std::string_view summary;
  OpOrigin origin = OpOrigin::onnxruntime;

  int num_required_inputs() const noexcept;
  int num_required_outputs() const noexcept;
  int find_attribute(std::string_view attr) const noexcept;  // index or -1
};

// All operators, gradients first, in OpId order.
std::span<const OpSchema> op_schemas() noexcept;
const OpSchema& op_schema(OpId id) noexcept;
// nullptr if no operator has this ORT name.
const OpSchema* find_op(std::string_view name) noexcept;

inline constexpr int kMaxArgs = 6;
inline constexpr int kMaxAttrs = 4;

}  // namespace gradops
