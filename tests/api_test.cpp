// The typed C++ entry points against the by-name `run` and the op table: each typed function must
// reach the same operator with its arguments in the schema's order and its attributes under their
// schema names and defaults, so that both give bitwise the same outputs on the same buffers. Plus
// the attribute defaults, unknown op names, and the invariants the rest of gradops relies on in
// the table itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "harness/call_buffers.hpp"

namespace gradops::testing {
namespace {

const std::vector<int64_t> kShape = {2, 3, 5};

std::optional<TensorView> opt_in(const CallBuffers& b, int i) {
  return b.in_ptr[i] ? std::optional<TensorView>(b.in_view[i]) : std::nullopt;
}
std::optional<TensorView> opt_out(const CallBuffers& b, int o) {
  return b.out_ptr[o] ? std::optional<TensorView>(b.out_view[o]) : std::nullopt;
}
template <class T>
void set(const oracle::Attrs& a, const char* name, T& field) {
  if (auto it = a.find(name); it != a.end()) field = static_cast<T>(it->second);
}

// A typed entry point: builds its args struct from the buffers (in schema order) and the given
// attributes (the struct's own defaults for the rest).
struct Typed {
  std::string op;
  std::function<Status(const CallBuffers&, const oracle::Attrs&)> call;
};

void PrintTo(const Typed& t, std::ostream* os) { *os << t.op; }

std::vector<Typed> typed_entry_points() {
  using B = const CallBuffers&;
  using A = const oracle::Attrs&;
  return {
      {"GeluGrad", [](B b, A) { return gelu_grad({b.in_view[0], b.in_view[1], b.out_view[0]}); }},
      {"FastGeluGrad", [](B b, A) { return fast_gelu_grad({b.in_view[0], b.in_view[1], b.out_view[0]}); }},
      {"BiasGeluGrad_dX",
       [](B b, A) { return bias_gelu_grad({b.in_view[0], b.in_view[1], b.in_view[2], b.out_view[0], opt_out(b, 1)}); }},
      {"BiasFastGeluGrad_dX",
       [](B b, A) {
         return bias_fast_gelu_grad({b.in_view[0], b.in_view[1], b.in_view[2], b.out_view[0], opt_out(b, 1)});
       }},
      {"ReluGrad", [](B b, A) { return relu_grad({b.in_view[0], b.in_view[1], b.out_view[0]}); }},
      {"SigmoidGrad", [](B b, A) { return sigmoid_grad({b.in_view[0], b.in_view[1], b.out_view[0]}); }},
      {"TanhGrad", [](B b, A) { return tanh_grad({b.in_view[0], b.in_view[1], b.out_view[0]}); }},
      {"QuickGeluGrad",
       [](B b, A a) {
         QuickGeluGradArgs x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "alpha", x.alpha);
         return quick_gelu_grad(x);
       }},
      {"LeakyReluGrad",
       [](B b, A a) {
         LeakyReluGradArgs x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "alpha", x.alpha);
         return leaky_relu_grad(x);
       }},
      {"SoftmaxGrad",
       [](B b, A a) {
         SoftmaxGradArgs x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "axis", x.axis);
         return softmax_grad(x);
       }},
      {"SoftmaxGrad_13",
       [](B b, A a) {
         SoftmaxGrad13Args x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "axis", x.axis);
         return softmax_grad_13(x);
       }},
      {"LogSoftmaxGrad",
       [](B b, A a) {
         LogSoftmaxGradArgs x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "axis", x.axis);
         return log_softmax_grad(x);
       }},
      {"LogSoftmaxGrad_13",
       [](B b, A a) {
         LogSoftmaxGrad13Args x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "axis", x.axis);
         return log_softmax_grad_13(x);
       }},
      {"LayerNormalizationGrad",
       [](B b, A a) {
         LayerNormGradArgs x{b.in_view[0], b.in_view[1], b.in_view[2], b.in_view[3], b.in_view[4],
                             b.out_view[0], opt_out(b, 1), opt_out(b, 2)};
         set(a, "axis", x.axis);
         return layer_norm_grad(x);
       }},
      {"InvertibleLayerNormalizationGrad",
       [](B b, A a) {
         InvertibleLayerNormGradArgs x{b.in_view[0], b.in_view[1], b.in_view[2], b.in_view[3], b.in_view[4],
                                       b.out_view[0], opt_out(b, 1), opt_out(b, 2)};
         set(a, "axis", x.axis);
         return invertible_layer_norm_grad(x);
       }},
      {"SimplifiedLayerNormalizationGrad",
       [](B b, A a) {
         RmsNormGradArgs x{b.in_view[0], b.in_view[1], b.in_view[2], b.in_view[3], b.out_view[0], opt_out(b, 1)};
         set(a, "axis", x.axis);
         return rms_norm_grad(x);
       }},
      {"BatchNormalizationGrad",
       [](B b, A a) {
         BatchNormGradArgs x{b.in_view[0], b.in_view[1], b.in_view[2], b.in_view[3], b.in_view[4],
                             b.out_view[0], opt_out(b, 1), opt_out(b, 2)};
         set(a, "epsilon", x.epsilon);
         set(a, "channels_last", x.channels_last);
         return batch_norm_grad(x);
       }},

      {"Gelu", [](B b, A) { return gelu({b.in_view[0], b.out_view[0]}); }},
      {"FastGelu", [](B b, A) { return fast_gelu({b.in_view[0], opt_in(b, 1), b.out_view[0]}); }},
      {"BiasGelu", [](B b, A) { return bias_gelu({b.in_view[0], b.in_view[1], b.out_view[0]}); }},
      {"QuickGelu",
       [](B b, A a) {
         QuickGeluArgs x{b.in_view[0], b.out_view[0]};
         set(a, "alpha", x.alpha);
         return quick_gelu(x);
       }},
      {"Relu", [](B b, A) { return relu({b.in_view[0], b.out_view[0]}); }},
      {"Sigmoid", [](B b, A) { return sigmoid({b.in_view[0], b.out_view[0]}); }},
      {"Tanh", [](B b, A) { return tanh({b.in_view[0], b.out_view[0]}); }},
      {"LeakyRelu",
       [](B b, A a) {
         LeakyReluArgs x{b.in_view[0], b.out_view[0]};
         set(a, "alpha", x.alpha);
         return leaky_relu(x);
       }},
      {"Softmax",
       [](B b, A a) {
         SoftmaxArgs x{b.in_view[0], b.out_view[0]};
         set(a, "axis", x.axis);
         return softmax(x);
       }},
      {"Softmax_13",
       [](B b, A a) {
         Softmax13Args x{b.in_view[0], b.out_view[0]};
         set(a, "axis", x.axis);
         return softmax_13(x);
       }},
      {"LogSoftmax",
       [](B b, A a) {
         SoftmaxArgs x{b.in_view[0], b.out_view[0]};
         set(a, "axis", x.axis);
         return log_softmax(x);
       }},
      {"LogSoftmax_13",
       [](B b, A a) {
         Softmax13Args x{b.in_view[0], b.out_view[0]};
         set(a, "axis", x.axis);
         return log_softmax_13(x);
       }},
      {"LayerNormalization",
       [](B b, A a) {
         LayerNormArgs x{b.in_view[0], b.in_view[1], opt_in(b, 2), b.out_view[0], opt_out(b, 1), opt_out(b, 2)};
         set(a, "axis", x.axis);
         set(a, "epsilon", x.epsilon);
         set(a, "stash_type", x.stash_type);
         return layer_norm(x);
       }},
      {"SimplifiedLayerNormalization",
       [](B b, A a) {
         RmsNormArgs x{b.in_view[0], b.in_view[1], b.out_view[0], opt_out(b, 1)};
         set(a, "axis", x.axis);
         set(a, "epsilon", x.epsilon);
         set(a, "stash_type", x.stash_type);
         return rms_norm(x);
       }},
      {"BatchNormInternal",
       [](B b, A a) {
         BatchNormTrainingArgs x{b.in_view[0], b.in_view[1], b.in_view[2], b.in_view[3], b.in_view[4],
                                 b.out_view[0], opt_out(b, 1), opt_out(b, 2), opt_out(b, 3), opt_out(b, 4)};
         set(a, "epsilon", x.epsilon);
         set(a, "momentum", x.momentum);
         set(a, "channels_last", x.channels_last);
         return batch_norm_training(x);
       }},
      {"BatchNormStatsReduce",
       [](B b, A a) {
         BatchNormStatsReduceArgs x{b.in_view[0], b.in_view[1], b.out_view[0]};
         set(a, "channels_last", x.channels_last);
         return batch_norm_stats_reduce(x);
       }},
      {"BatchNormStatsApply",
       [](B b, A a) {
         BatchNormStatsApplyArgs x{b.in_view[0],  b.in_view[1], b.in_view[2],   b.in_view[3],  b.in_view[4],
                                   b.in_view[5],  b.out_view[0], opt_out(b, 1), opt_out(b, 2), opt_out(b, 3),
                                   opt_out(b, 4)};
         set(a, "epsilon", x.epsilon);
         set(a, "momentum", x.momentum);
         set(a, "channels_last", x.channels_last);
         return batch_norm_stats_apply(x);
       }},
      {"BatchNormGradReduce",
       [](B b, A a) {
         BatchNormGradReduceArgs x{b.in_view[0], b.in_view[1], b.in_view[2], b.in_view[3], b.out_view[0]};
         set(a, "channels_last", x.channels_last);
         return batch_norm_grad_reduce(x);
       }},
      {"BatchNormGradApply",
       [](B b, A a) {
         BatchNormGradApplyArgs x{b.in_view[0], b.in_view[1], b.in_view[2],  b.in_view[3],
                                  b.in_view[4], b.in_view[5], b.out_view[0], opt_out(b, 1), opt_out(b, 2)};
         set(a, "channels_last", x.channels_last);
         return batch_norm_grad_apply(x);
       }},
  };
}

// Attribute values other than the defaults, per attribute name (each valid for every op that has
// the attribute, on kShape).
std::vector<double> other_values(std::string_view attr) {
  if (attr == "alpha") return {1.0, 0.25};
  if (attr == "axis") return {0, 2, -2};
  if (attr == "epsilon") return {1e-3};
  if (attr == "momentum") return {0.5};
  if (attr == "channels_last") return {1};
  return {};  // stash_type and training_mode have one valid value in these calls
}

class TypedApi : public ::testing::TestWithParam<Typed> {};

// Typed call, by-name call with every attribute spelled out, and by-name call with only the
// non-default ones: the same status and bitwise the same outputs.
void compare(const Typed& t, const OpSchema& op, const oracle::Attrs& overrides, const CallSpec& spec,
             const std::string& what) {
  SCOPED_TRACE(t.op + " " + what);
  CallSpec sparse = spec;
  sparse.attrs.clear();
  for (const auto& [k, v] : spec.attrs) {
    const int i = op.find_attribute(k);
    if (overrides.count(k) || (i >= 0 && op.attributes[i].required)) sparse.attrs.emplace_back(k, v);
  }
  CallBuffers typed(spec), full(spec), by_default(sparse);
  const Status st = t.call(typed, overrides), sf = full.run(), sd = by_default.run();
  ASSERT_TRUE(st.is_ok()) << "typed: " << st.to_string();
  ASSERT_TRUE(sf.is_ok()) << "by name: " << sf.to_string();
  ASSERT_TRUE(sd.is_ok()) << "by name, defaults: " << sd.to_string();
  for (std::size_t o = 0; o < spec.out.size(); ++o) {
    if (!spec.out[o].present) continue;
    EXPECT_EQ(typed.unwritten_element(o), "");
    EXPECT_TRUE(typed.output_bytes(o) == full.output_bytes(o)) << op.outputs[o].name << ": typed differs from run";
    EXPECT_TRUE(by_default.output_bytes(o) == full.output_bytes(o))
        << op.outputs[o].name << ": run with schema defaults differs from run with them spelled out";
  }
  EXPECT_EQ(typed.changed_guards(), "");
}

TEST_P(TypedApi, SameResultsAsRunByName) {
  const Typed& t = GetParam();
  const OpSchema* op = find_op(t.op);
  ASSERT_NE(op, nullptr);
  std::vector<oracle::Attrs> attr_sets = {{}};
  for (const AttrSchema& a : op->attributes)
    for (double v : other_values(a.name)) attr_sets.push_back({{std::string(a.name), v}});
  for (const oracle::Attrs& overrides : attr_sets) {
    std::string what = "defaults";
    if (!overrides.empty()) what = overrides.begin()->first + "=" + std::to_string(overrides.begin()->second);
    CallSpec spec;
    try {
      spec = valid_call(*op, kShape, op->signatures[0], overrides, 3);
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
    compare(t, *op, overrides, spec, what);
    // Optional arguments left out: std::nullopt in the struct, nullptr by name.
    for (std::size_t i = 0; i < op->inputs.size(); ++i)
      if (op->inputs[i].optional) {
        CallSpec c = spec;
        c.in[i].present = false;
        compare(t, *op, overrides, c, what + ", without " + std::string(op->inputs[i].name));
      }
    for (std::size_t o = 0; o < op->outputs.size(); ++o)
      if (op->outputs[o].optional) {
        CallSpec c = spec;
        c.out[o].present = false;
        compare(t, *op, overrides, c, what + ", without " + std::string(op->outputs[o].name));
      }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryOp, TypedApi, ::testing::ValuesIn(typed_entry_points()),
                         [](const ::testing::TestParamInfo<Typed>& p) { return p.param.op; });

TEST(TypedApiCoverage, EveryOpHasExactlyOneTypedEntryPoint) {
  std::multiset<std::string> typed;
  for (const Typed& t : typed_entry_points()) typed.insert(t.op);
  for (const OpSchema& s : op_schemas()) EXPECT_EQ(typed.count(std::string(s.name)), 1u) << s.name;
  EXPECT_EQ(typed.size(), op_schemas().size());
}

// ---- attribute defaults --------------------------------------------------------------------------

float schema_default(const char* op, const char* attr) {
  const OpSchema* s = find_op(op);
  return static_cast<float>(s->attributes[s->find_attribute(attr)].default_value);
}

TEST(AttributeDefaults, ArgsStructsAgreeWithTheSchema) {
  EXPECT_EQ(QuickGeluGradArgs{}.alpha, schema_default("QuickGeluGrad", "alpha"));
  EXPECT_EQ(QuickGeluGradArgs{}.alpha, 1.702f);
  EXPECT_EQ(QuickGeluArgs{}.alpha, schema_default("QuickGelu", "alpha"));
  EXPECT_EQ(LeakyReluGradArgs{}.alpha, schema_default("LeakyReluGrad", "alpha"));
  EXPECT_EQ(LeakyReluGradArgs{}.alpha, 0.01f);
  EXPECT_EQ(LeakyReluArgs{}.alpha, schema_default("LeakyRelu", "alpha"));
  EXPECT_EQ(SoftmaxGradArgs{}.axis, 1);
  EXPECT_EQ(SoftmaxGradArgs{}.axis, schema_default("SoftmaxGrad", "axis"));
  EXPECT_EQ(LogSoftmaxGradArgs{}.axis, schema_default("LogSoftmaxGrad", "axis"));
  EXPECT_EQ(SoftmaxGrad13Args{}.axis, -1);
  EXPECT_EQ(SoftmaxGrad13Args{}.axis, schema_default("SoftmaxGrad_13", "axis"));
  EXPECT_EQ(LogSoftmaxGrad13Args{}.axis, schema_default("LogSoftmaxGrad_13", "axis"));
  EXPECT_EQ(SoftmaxArgs{}.axis, schema_default("Softmax", "axis"));
  EXPECT_EQ(SoftmaxArgs{}.axis, schema_default("LogSoftmax", "axis"));
  EXPECT_EQ(Softmax13Args{}.axis, schema_default("Softmax_13", "axis"));
  EXPECT_EQ(Softmax13Args{}.axis, schema_default("LogSoftmax_13", "axis"));
  EXPECT_EQ(LayerNormGradArgs{}.axis, schema_default("LayerNormalizationGrad", "axis"));
  EXPECT_EQ(InvertibleLayerNormGradArgs{}.axis, schema_default("InvertibleLayerNormalizationGrad", "axis"));
  EXPECT_EQ(RmsNormGradArgs{}.axis, schema_default("SimplifiedLayerNormalizationGrad", "axis"));
  EXPECT_EQ(LayerNormArgs{}.axis, schema_default("LayerNormalization", "axis"));
  EXPECT_EQ(LayerNormArgs{}.epsilon, schema_default("LayerNormalization", "epsilon"));
  EXPECT_EQ(LayerNormArgs{}.stash_type, schema_default("LayerNormalization", "stash_type"));
  EXPECT_EQ(RmsNormArgs{}.axis, schema_default("SimplifiedLayerNormalization", "axis"));
  EXPECT_EQ(RmsNormArgs{}.epsilon, schema_default("SimplifiedLayerNormalization", "epsilon"));
  EXPECT_EQ(RmsNormArgs{}.stash_type, schema_default("SimplifiedLayerNormalization", "stash_type"));
  EXPECT_EQ(BatchNormTrainingArgs{}.epsilon, schema_default("BatchNormInternal", "epsilon"));
  EXPECT_EQ(BatchNormTrainingArgs{}.momentum, schema_default("BatchNormInternal", "momentum"));
  EXPECT_EQ(BatchNormTrainingArgs{}.channels_last, schema_default("BatchNormInternal", "channels_last") != 0);
  EXPECT_EQ(BatchNormGradArgs{}.channels_last, schema_default("BatchNormalizationGrad", "channels_last") != 0);
  EXPECT_EQ(BatchNormGradArgs{}.epsilon, 1e-5f);  // the schema has none: ORT requires it
}

// Runs `op` by name on one set of inputs with the given attributes; returns output 0's bytes, or
// nothing if the call failed.
std::optional<std::vector<std::byte>> output_with(const CallSpec& spec,
                                                  std::vector<std::pair<std::string, double>> attrs) {
  CallSpec c = spec;
  c.attrs = std::move(attrs);
  CallBuffers b(c);
  if (const Status s = b.run(); !s) return std::nullopt;
  return b.output_bytes(0);
}

// An attribute left out takes the schema default: the same bytes as the default spelled out, and
// different bytes from another value, so the attribute is really read. (For the LayerNorm axis,
// another value changes the shapes the call needs: there the other value must be rejected.)
void expect_default(const char* op_name, const char* attr, double dflt, double other, bool other_invalid = false) {
  SCOPED_TRACE(std::string(op_name) + " " + attr);
  const OpSchema* op = find_op(op_name);
  CallSpec spec;
  try {
    spec = valid_call(*op, kShape, op->signatures[0], {}, 5);
  } catch (const std::exception& e) {
    FAIL() << e.what();
  }
  const auto omitted = output_with(spec, {});
  ASSERT_TRUE(omitted.has_value());
  const auto spelled = output_with(spec, {{attr, dflt}});
  ASSERT_TRUE(spelled.has_value());
  EXPECT_TRUE(*omitted == *spelled) << "omitted differs from " << dflt;
  const auto changed = output_with(spec, {{attr, other}});
  if (other_invalid) {
    EXPECT_FALSE(changed.has_value()) << attr << " = " << other << " should not fit these shapes";
  } else {
    ASSERT_TRUE(changed.has_value());
    EXPECT_FALSE(*omitted == *changed) << "the attribute makes no difference";
  }
}

TEST(AttributeDefaults, UsedWhenNotGiven) {
  expect_default("QuickGeluGrad", "alpha", 1.702, 1.0);
  expect_default("QuickGelu", "alpha", 1.702, 1.0);
  expect_default("LeakyReluGrad", "alpha", 0.01, 0.5);
  expect_default("LeakyRelu", "alpha", 0.01, 0.5);
  // The opset 1-12 names default to axis 1 (coerced to 2-D there), the _13 names to -1.
  for (const char* op : {"SoftmaxGrad", "LogSoftmaxGrad", "Softmax", "LogSoftmax"}) {
    expect_default(op, "axis", 1, -1);
    expect_default(op, "axis", 1, 0);
  }
  for (const char* op : {"SoftmaxGrad_13", "LogSoftmaxGrad_13", "Softmax_13", "LogSoftmax_13"}) {
    expect_default(op, "axis", -1, 1);
    expect_default(op, "axis", -1, 0);
  }
  for (const char* op : {"LayerNormalizationGrad", "InvertibleLayerNormalizationGrad",
                         "SimplifiedLayerNormalizationGrad", "LayerNormalization", "SimplifiedLayerNormalization"})
    expect_default(op, "axis", -1, 1, true);
  expect_default("LayerNormalization", "epsilon", static_cast<float>(1e-5), 0.5);
  expect_default("SimplifiedLayerNormalization", "epsilon", static_cast<float>(1e-5), 0.5);
  expect_default("BatchNormInternal", "epsilon", static_cast<float>(1e-5), 0.5);
}

// ---- names ---------------------------------------------------------------------------------------

TEST(ByName, UnknownOperatorIsRejected) {
  const float x[2] = {1, 2};
  float y[2] = {7, 7};
  const TensorView vx = TensorView::of(x, {2}), vy = TensorView::of(y, {2});
  const TensorView* in[] = {&vx};
  const TensorView* out[] = {&vy};
  for (const char* name : {"NoSuchOp", "", "gelu", "GELU", "Gelu ", "GeluGrad_13", "ai.onnx::Relu"}) {
    const Status s = run(name, in, out);
    EXPECT_EQ(s.code(), StatusCode::invalid_argument) << "'" << name << "'";
    EXPECT_NE(s.message().find("'" + std::string(name) + "'"), std::string::npos) << s.message();
    EXPECT_EQ(y[0], 7);
    EXPECT_EQ(y[1], 7);
  }
  // The same call under a real name works, so the rejections above were about the name.
  EXPECT_TRUE(run("Relu", in, out).is_ok());
  EXPECT_EQ(y[0], 1);
  EXPECT_EQ(y[1], 2);
}

// ---- the op table --------------------------------------------------------------------------------

// The gradient ops come first, then their forwards, and the gradient names are the table's own:
// ORT's names end in "Grad" (or "Grad_dX"), forwards never carry it. The count comes from the table,
// so that adding an op needs no edit here; the ORT gradient ops gradops started with must stay.
TEST(OpTable, GradientOpsFirstThenTheForwards) {
  const std::set<std::string> ort_gradients = {
      "GeluGrad", "FastGeluGrad", "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "ReluGrad", "SigmoidGrad",
      "TanhGrad", "QuickGeluGrad", "LeakyReluGrad", "SoftmaxGrad", "SoftmaxGrad_13", "LogSoftmaxGrad",
      "LogSoftmaxGrad_13", "LayerNormalizationGrad", "InvertibleLayerNormalizationGrad",
      "SimplifiedLayerNormalizationGrad", "BatchNormalizationGrad"};
  std::set<std::string> grads;
  std::size_t forwards = 0;
  bool seen_forward = false;
  for (const OpSchema& s : op_schemas()) {
    if (s.gradient) {
      EXPECT_FALSE(seen_forward) << s.name << " comes after a forward op";
      grads.insert(std::string(s.name));
      EXPECT_EQ(s.domain, "com.microsoft") << s.name;
      EXPECT_NE(s.name.find("Grad"), std::string_view::npos) << s.name;
    } else {
      seen_forward = true;
      ++forwards;
      // gradops' own BatchNormGradReduce/Apply are halves of a gradient, not ORT gradient ops.
      if (s.origin == OpOrigin::onnxruntime) EXPECT_EQ(s.name.find("Grad"), std::string_view::npos) << s.name;
    }
  }
  EXPECT_EQ(grads.size() + forwards, op_schemas().size());
  EXPECT_GE(forwards, 1u);
  for (const std::string& name : ort_gradients) EXPECT_EQ(grads.count(name), 1u) << name;
}

TEST(OpTable, IdsNamesAndLookup) {
  const auto ops = op_schemas();
  ASSERT_EQ(ops.size(), static_cast<std::size_t>(kNumOps));
  std::set<std::string_view> names;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const OpSchema& s = ops[i];
    EXPECT_EQ(static_cast<std::size_t>(s.id), i) << s.name;
    EXPECT_EQ(&op_schema(s.id), &s) << s.name;
    EXPECT_EQ(find_op(s.name), &s) << s.name;
    EXPECT_TRUE(names.insert(s.name).second) << "duplicate name " << s.name;
    EXPECT_FALSE(s.summary.empty()) << s.name;
    EXPECT_GE(s.since_version, 1) << s.name;
    if (s.origin == OpOrigin::onnxruntime)
      EXPECT_TRUE(s.domain == "com.microsoft" || s.domain.empty()) << s.name;
    else
      EXPECT_EQ(s.domain, "gradops") << s.name;
    EXPECT_STRNE(op_family_name(s.family), "?") << s.name;
  }
  EXPECT_EQ(find_op("NoSuchOp"), nullptr);
}

TEST(OpTable, ArgumentsAttributesSignaturesAliases) {
  for (const OpSchema& s : op_schemas()) {
    SCOPED_TRACE(std::string(s.name));
    const std::size_t nv = s.type_vars.size();
    ASSERT_TRUE(nv == 1 || nv == 3 || nv == 4);
    ASSERT_GE(s.inputs.size(), 1u);
    ASSERT_LE(s.inputs.size(), static_cast<std::size_t>(kMaxArgs));
    ASSERT_GE(s.outputs.size(), 1u);
    ASSERT_LE(s.outputs.size(), static_cast<std::size_t>(kMaxArgs));
    ASSERT_LE(s.attributes.size(), static_cast<std::size_t>(kMaxAttrs));

    // Required arguments precede optional ones, so trailing optionals can be left out.
    for (auto args : {s.inputs, s.outputs}) {
      bool optional_seen = false;
      std::set<std::string_view> arg_names;
      for (const ArgSchema& a : args) {
        EXPECT_FALSE(optional_seen && !a.optional) << "required '" << a.name << "' after an optional argument";
        optional_seen = optional_seen || a.optional;
        EXPECT_LT(a.type_var, nv) << a.name;
        EXPECT_FALSE(a.name.empty());
        EXPECT_TRUE(arg_names.insert(a.name).second) << "duplicate argument " << a.name;
        EXPECT_TRUE(!a.extension || a.optional) << "an extension must be optional to keep ORT's arity: " << a.name;
      }
    }
    EXPECT_FALSE(s.outputs[0].optional);
    EXPECT_EQ(s.num_required_inputs(),
              std::count_if(s.inputs.begin(), s.inputs.end(), [](const ArgSchema& a) { return !a.optional; }));
    EXPECT_EQ(s.num_required_outputs(),
              std::count_if(s.outputs.begin(), s.outputs.end(), [](const ArgSchema& a) { return !a.optional; }));

    // Every type variable is carried by some argument.
    for (std::size_t v = 0; v < nv; ++v) {
      bool used = false;
      for (auto args : {s.inputs, s.outputs})
        for (const ArgSchema& a : args) used = used || a.type_var == v;
      EXPECT_TRUE(used) << "type variable " << s.type_vars[v] << " is carried by no argument";
    }

    // Signatures: non-empty, distinct over the op's type variables, each of known dtypes; the
    // single-type ops take all four dtypes.
    ASSERT_FALSE(s.signatures.empty());
    std::set<std::vector<DType>> sigs;
    for (const TypeSignature& t : s.signatures) {
      std::vector<DType> used(t.types.begin(), t.types.begin() + static_cast<std::ptrdiff_t>(nv));
      for (DType d : used) EXPECT_LE(static_cast<int>(d), static_cast<int>(DType::bf16));
      EXPECT_TRUE(sigs.insert(used).second) << "duplicate signature";
    }
    if (nv == 1) EXPECT_EQ(sigs.size(), kAllDTypes.size());

    // Attributes: distinct names, findable; INT defaults integral; only a required one lacks a
    // default.
    for (std::size_t i = 0; i < s.attributes.size(); ++i) {
      const AttrSchema& a = s.attributes[i];
      EXPECT_EQ(s.find_attribute(a.name), static_cast<int>(i)) << a.name;
      if (a.type == AttrType::int64) EXPECT_EQ(a.default_value, std::nearbyint(a.default_value)) << a.name;
      EXPECT_FALSE(a.doc.empty()) << a.name;
    }
    EXPECT_EQ(s.find_attribute("no_such_attribute"), -1);

    // Alias rules name real arguments of the same type variable.
    for (const AliasRule& r : s.aliases) {
      ASSERT_GE(r.output, 0);
      ASSERT_LT(static_cast<std::size_t>(r.output), s.outputs.size());
      ASSERT_GE(r.input, 0);
      ASSERT_LT(static_cast<std::size_t>(r.input), s.inputs.size());
      EXPECT_EQ(s.outputs[r.output].type_var, s.inputs[r.input].type_var);
    }
  }
  // The one required attribute, as ORT has it.
  int required = 0;
  for (const OpSchema& s : op_schemas())
    for (const AttrSchema& a : s.attributes) required += a.required;
  EXPECT_EQ(required, 1);
  const OpSchema* bn = find_op("BatchNormalizationGrad");
  EXPECT_TRUE(bn->attributes[bn->find_attribute("epsilon")].required);
}

TEST(OpTable, InPlaceRulesAreExactlyTheDocumentedOnes) {
  // docs/semantics.md A6: dX may be dY (elementwise grads); BatchNormInternal's running stats may
  // be its input statistics (ORT's Alias(3,1), Alias(4,2)), and so may BatchNormStatsApply's.
  // Nothing else.
  for (const OpSchema& s : op_schemas()) {
    SCOPED_TRACE(std::string(s.name));
    const bool elementwise_grad = s.gradient && s.family == OpFamily::activation;
    if (elementwise_grad) {
      ASSERT_EQ(s.aliases.size(), 1u);
      EXPECT_EQ(s.aliases[0].output, 0);
      EXPECT_EQ(s.aliases[0].input, 0);
    } else if (s.name == "BatchNormInternal" || s.name == "BatchNormStatsApply") {
      ASSERT_EQ(s.aliases.size(), 2u);
      EXPECT_EQ(s.outputs[s.aliases[0].output].name, "running_mean");
      EXPECT_EQ(s.inputs[s.aliases[0].input].name, "input_mean");
      EXPECT_EQ(s.outputs[s.aliases[1].output].name, "running_var");
      EXPECT_EQ(s.inputs[s.aliases[1].input].name, "input_var");
    } else {
      EXPECT_TRUE(s.aliases.empty());
    }
  }
}

}  // namespace
}  // namespace gradops::testing
