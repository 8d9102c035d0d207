// libgradops_onnxruntime.so inside stock ONNX Runtime (the pinned 1.29, or GRADOPS_ORT_ROOT's):
// - every registered operator and dtype signature: a one-node model gives, bit for bit, the outputs
//   of gradops' own API on the same inputs;
// - attribute defaults and values, and every combination of optional outputs, as the schema says;
// - bad inputs and bad attributes come back as ORT errors carrying gradops' message;
// - the library registers no name stock ORT has, and refuses a runtime older than it needs;
// - a transformer MLP block's backward graph, wired as ORT's gradient builder wires it, against the
//   float64 oracle.
// Models are serialized ONNX (onnx_model.hpp), loaded from memory.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "ort_test_support.hpp"

namespace gradops::ort_test {
namespace {

// Runs `c` through ORT (library loaded) and through gradops, and expects the same bytes in every
// output the node has. `skip` is set instead when this build of gradops cannot run the call: then
// ORT must report gradops' own message.
void expect_same_as_gradops(const Call& c, std::string* skip) {
  std::vector<std::optional<Tensor>> ref;
  const Status st = run_gradops(c, c.attrs, &ref);
  const GraphSpec g = one_node(c);
  if (!st.is_ok()) {
    ASSERT_EQ(st.code(), StatusCode::unimplemented) << describe(c) << ": " << st.to_string();
    try {
      Ort::Session session = make_session(g, true);
      run_session(session, g, c.inputs);
      FAIL() << describe(c) << ": ORT ran a call that gradops reports as unimplemented";
    } catch (const Ort::Exception& e) {
      EXPECT_NE(std::string(e.what()).find(st.message()), std::string::npos) << e.what();
    }
    *skip = "gradops: " + st.to_string();
    return;
  }
  Ort::Session session = make_session(g, true);
  const std::vector<Tensor> got = run_session(session, g, c.inputs);
  std::size_t k = 0;
  for (std::size_t o = 0; o < c.outputs.size(); ++o) {
    if (!c.outputs[o]) continue;
    ASSERT_LT(k, got.size());
    const std::string diff = first_difference(c.outputs[o]->name, got[k++], *ref[o]);
    EXPECT_TRUE(diff.empty()) << describe(c) << ": " << diff;
  }
}

// ---- every operator and dtype signature -----------------------------------------------------------

std::vector<Signature> all_signatures(bool with_optional_outputs_only = false) {
  std::vector<Signature> r;
  for (const OpSchema& op : op_schemas()) {
    if (!registered(op)) continue;
    if (with_optional_outputs_only && op.num_required_outputs() == static_cast<int>(op.outputs.size())) continue;
    for (const TypeSignature& s : op.signatures)
      if (selectable(op, s)) r.push_back({op.id, s});
  }
  return r;
}

std::string signature_name(const testing::TestParamInfo<Signature>& info) { return test_name(info.param); }

class OrtSignature : public testing::TestWithParam<Signature> {};

TEST_P(OrtSignature, MatchesGradopsBitwise) {
  const OpSchema& op = op_schema(GetParam().op);
  const auto c = make_call(op.id, GetParam().sig, shape_for(op), required_attrs(op), 17);
  if (!c) GTEST_SKIP() << "the float64 oracle has no " << op.name << " yet";
  std::string skip;
  ASSERT_NO_FATAL_FAILURE(expect_same_as_gradops(*c, &skip));
  if (!skip.empty()) GTEST_SKIP() << skip;
}

INSTANTIATE_TEST_SUITE_P(Registered, OrtSignature, testing::ValuesIn(all_signatures()), signature_name);

class OrtOptionalOutputs : public testing::TestWithParam<Signature> {};

// Every subset of the optional outputs left out, as "" in the node and (when trailing) omitted.
TEST_P(OrtOptionalOutputs, MatchGradopsBitwise) {
  const OpSchema& op = op_schema(GetParam().op);
  std::vector<int> optional;
  for (std::size_t o = 0; o < op.outputs.size(); ++o)
    if (op.outputs[o].optional) optional.push_back(static_cast<int>(o));
  const auto full = make_call(op.id, GetParam().sig, shape_for(op), required_attrs(op), 23);
  if (!full) GTEST_SKIP() << "the float64 oracle has no " << op.name << " yet";
  for (unsigned mask = 1; mask < (1u << optional.size()); ++mask) {
    for (bool omit_trailing : {true, false}) {
      Call c = *full;
      c.omit_trailing = omit_trailing;
      for (std::size_t j = 0; j < optional.size(); ++j)
        if (mask & (1u << j)) c.outputs[optional[j]].reset();
      std::string skip;
      ASSERT_NO_FATAL_FAILURE(expect_same_as_gradops(c, &skip));
      if (!skip.empty()) GTEST_SKIP() << skip;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, OrtOptionalOutputs, testing::ValuesIn(all_signatures(true)), signature_name);

// A signature ORT cannot select (its output-only type differs from what the inputs imply) is not
// registered: a graph that declares it fails to load with ORT's type error instead of running.
TEST(OrtSignatureLimits, OutputOnlyTypeFollowsTheInputs) {
  int checked = 0;
  for (const OpSchema& op : op_schemas()) {
    if (!registered(op)) continue;
    for (const TypeSignature& sig : op.signatures) {
      if (selectable(op, sig)) continue;
      const auto c = make_call(op.id, sig, shape_for(op), required_attrs(op), 5);
      if (!c) GTEST_SKIP() << "the float64 oracle has no " << op.name << " yet";
      try {
        make_session(one_node(*c), true);
        ADD_FAILURE() << describe(*c) << ": ORT accepted a signature the library does not register";
      } catch (const Ort::Exception& e) {
        EXPECT_NE(std::string(e.what()).find("Type Error"), std::string::npos) << e.what();
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);  // InvertibleLayerNormalizationGrad (f32, f32, f16) and (f16, f32, f32)
}

// ---- attributes ---------------------------------------------------------------------------------------

// A value other than the default for each attribute, valid for shape_for(op); nullopt where only
// one value is valid (BatchNormInternal's training_mode).
std::optional<double> other_value(const OpSchema& op, const AttrSchema& a) {
  if (a.name == "alpha") return a.default_value == 1.702 ? 1.0 : 0.2;
  if (a.name == "axis") return a.default_value == -1 ? 1 : static_cast<double>(shape_for(op).size()) - 1;
  if (a.name == "epsilon") return 0.1;
  if (a.name == "momentum") return 0.5;
  if (a.name == "channels_last") return 1;
  return std::nullopt;
}

struct Named {
  OpId op;
};
void PrintTo(const Named& n, std::ostream* os) { *os << op_schema(n.op).name; }

std::vector<Named> ops_with_attributes() {
  std::vector<Named> r;
  for (const OpSchema& op : op_schemas())
    if (registered(op) && !op.attributes.empty()) r.push_back({op.id});
  return r;
}

class OrtAttributes : public testing::TestWithParam<Named> {};

// A node without an optional attribute computes what gradops computes with the schema's default
// spelled out; a node with another value computes what gradops computes with that value, which
// differs from the default's result (so the value reached the kernel).
TEST_P(OrtAttributes, DefaultsAndValues) {
  const OpSchema& op = op_schema(GetParam().op);
  const TypeSignature sig = op.signatures[0];
  for (const AttrSchema& a : op.attributes) {
    SCOPED_TRACE(std::string(op.name) + " attribute " + std::string(a.name));
    const std::vector<NodeAttr> base = required_attrs(op);
    if (!a.required) {
      const auto c = make_call(op.id, sig, shape_for(op), base, 31);
      if (!c) GTEST_SKIP() << "the float64 oracle has no " << op.name << " yet";
      std::vector<std::optional<Tensor>> ref;
      std::vector<NodeAttr> spelled = base;
      spelled.push_back({std::string(a.name), a.type, a.default_value});
      const Status st = run_gradops(*c, spelled, &ref);
      if (st.code() == StatusCode::unimplemented) GTEST_SKIP() << st.to_string();
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      const GraphSpec g = one_node(*c);
      Ort::Session session = make_session(g, true);
      const std::vector<Tensor> got = run_session(session, g, c->inputs);
      for (std::size_t o = 0; o < got.size(); ++o)
        EXPECT_EQ(first_difference(c->outputs[o]->name, got[o], *ref[o]), "") << describe(*c);
    }
    const std::optional<double> other = other_value(op, a);
    if (!other) continue;
    std::vector<NodeAttr> attrs = base;
    attrs.erase(std::remove_if(attrs.begin(), attrs.end(), [&](const NodeAttr& n) { return n.name == a.name; }),
                attrs.end());
    attrs.push_back({std::string(a.name), a.type, *other});
    const auto c = make_call(op.id, sig, shape_for(op), attrs, 37);
    if (!c) GTEST_SKIP() << "the float64 oracle has no " << op.name << " yet";
    std::string skip;
    ASSERT_NO_FATAL_FAILURE(expect_same_as_gradops(*c, &skip));
    if (!skip.empty()) GTEST_SKIP() << skip;
    // Attributes accepted only because ORT's graphs carry them (AttrSchema::read) change nothing.
    if (!a.read) continue;
    std::vector<std::optional<Tensor>> with_value, with_default;
    ASSERT_TRUE(run_gradops(*c, attrs, &with_value).is_ok());
    const Status st = run_gradops(*c, base, &with_default);
    bool differs = !st.is_ok();
    for (std::size_t o = 0; o < with_value.size() && !differs; ++o)
      differs = with_value[o]->bytes != with_default[o]->bytes;
    EXPECT_TRUE(differs) << describe(*c) << ": the result does not depend on '" << a.name << "'";
  }
}

std::string named(const testing::TestParamInfo<Named>& info) { return std::string(op_schema(info.param.op).name); }

INSTANTIATE_TEST_SUITE_P(Registered, OrtAttributes, testing::ValuesIn(ops_with_attributes()), named);

// ---- errors -----------------------------------------------------------------------------------------

// Fills with a fixed nonzero pattern: error cases only need valid numbers.
Tensor filled(DType t, std::vector<int64_t> shape) {
  Tensor r(t, std::move(shape));
  for (int64_t i = 0; i < r.count(); ++i) r.set(i, 0.25 + 0.125 * static_cast<double>(i % 7));
  return r;
}

struct BadCall {
  std::string name;
  OpId op;
  std::vector<std::vector<int64_t>> input_shapes;
  std::vector<NodeAttr> attrs;
};
void PrintTo(const BadCall& b, std::ostream* os) { *os << b.name; }

std::vector<BadCall> bad_calls() {
  const auto f = AttrType::float32, i = AttrType::int64;
  return {
      {"GeluGradShapeMismatch", OpId::GeluGrad, {{3, 4}, {3, 5}}, {}},
      {"BiasGeluGradBiasLength", OpId::BiasGeluGrad_dX, {{3, 5}, {3, 5}, {4}}, {}},
      {"BiasGeluGradBiasRank", OpId::BiasFastGeluGrad_dX, {{3, 5}, {3, 5}, {1, 5}}, {}},
      {"LeakyReluGradNegativeAlpha", OpId::LeakyReluGrad, {{3, 5}, {3, 5}}, {{"alpha", f, -0.5}}},
      {"SoftmaxGradAxisOutOfRange", OpId::SoftmaxGrad_13, {{3, 5}, {3, 5}}, {{"axis", i, 2}}},
      {"LayerNormGradScaleLength", OpId::LayerNormalizationGrad, {{4, 8}, {4, 8}, {7}, {4, 1}, {4, 1}}, {}},
      {"BatchNormGradScaleLength", OpId::BatchNormalizationGrad, {{2, 3, 4}, {2, 3, 4}, {4}, {3}, {3}},
       {{"epsilon", f, 1e-5}}},
  };
}

class OrtErrors : public testing::TestWithParam<BadCall> {};

// The run fails with gradops' invalid_argument message, and ORT's status says INVALID_ARGUMENT.
TEST_P(OrtErrors, CarryGradopsMessage) {
  const BadCall& b = GetParam();
  const OpSchema& op = op_schema(b.op);
  Call c{&op, {}, {}, b.attrs};
  for (std::size_t k = 0; k < b.input_shapes.size(); ++k)
    c.inputs.push_back(filled(op.signatures[0].types[op.inputs[k].type_var], b.input_shapes[k]));
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    const std::size_t like = o == 0 ? 0 : op.inputs.size() - 1;  // shapes only matter to a valid call
    c.outputs.push_back(Arg{"out_" + std::string(op.outputs[o].name),
                            op.signatures[0].types[op.outputs[o].type_var], b.input_shapes[like]});
  }
  std::vector<std::optional<Tensor>> ref;
  const Status st = run_gradops(c, c.attrs, &ref);
  if (st.code() == StatusCode::unimplemented) GTEST_SKIP() << st.to_string();
  ASSERT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  const GraphSpec g = one_node(c);
  try {
    Ort::Session session = make_session(g, true);
    run_session(session, g, c.inputs);
    FAIL() << "ORT ran " << b.name;
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find(st.message()), std::string::npos)
        << "ORT: " << e.what() << "\ngradops: " << st.message();
    EXPECT_EQ(e.GetOrtErrorCode(), ORT_INVALID_ARGUMENT) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, OrtErrors, testing::ValuesIn(bad_calls()),
                         [](const testing::TestParamInfo<BadCall>& i) { return i.param.name; });

// Session creation fails on attributes the kernel cannot take: a missing required one, or one of
// the wrong type (which would otherwise run silently with the default).
void expect_creation_error(OpId id, const std::vector<NodeAttr>& attrs, const std::string& message) {
  const OpSchema& op = op_schema(id);
  Call c{&op, {}, {}, attrs};
  for (std::size_t k = 0; k < op.inputs.size(); ++k)
    c.inputs.push_back(filled(op.signatures[0].types[op.inputs[k].type_var], {2, 3, 4}));
  c.outputs.push_back(Arg{"out", op.signatures[0].types[op.outputs[0].type_var], {2, 3, 4}});
  try {
    make_session(one_node(c), true);
    FAIL() << "ORT created a session for " << op.name;
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
  }
}

TEST(OrtAttributeErrors, MissingRequiredAttributeFailsKernelCreation) {
  expect_creation_error(OpId::BatchNormalizationGrad, {},
                        "BatchNormalizationGrad: required attribute 'epsilon' is missing");
}

TEST(OrtAttributeErrors, WrongAttributeTypeFailsKernelCreation) {
  expect_creation_error(OpId::QuickGeluGrad, {{"alpha", AttrType::int64, 1}},
                        "QuickGeluGrad: attribute 'alpha' must be a FLOAT attribute");
  expect_creation_error(OpId::SoftmaxGrad_13, {{"axis", AttrType::float32, 1}},
                        "SoftmaxGrad_13: attribute 'axis' must be an INT attribute");
}

// ---- names ------------------------------------------------------------------------------------------

// Stock ORT knows none of the names the library registers, so the library overrides no kernel.
TEST(OrtNames, StockOrtHasNoneOfTheRegisteredOps) {
  for (const OpSchema& op : op_schemas()) {
    if (!registered(op)) continue;
    auto c = make_call(op.id, op.signatures[0], shape_for(op), required_attrs(op), 3);
    Call bare{&op, {}, {}, required_attrs(op)};
    if (!c) {  // no oracle yet: any inputs do, the session must not even be created
      for (std::size_t k = 0; k < op.inputs.size(); ++k)
        bare.inputs.push_back(filled(op.signatures[0].types[op.inputs[k].type_var], {2, 3}));
      bare.outputs.push_back(Arg{"out", op.signatures[0].types[op.outputs[0].type_var], {2, 3}});
      c = bare;
    }
    try {
      make_session(one_node(*c), false);
      ADD_FAILURE() << "stock ORT has an operator named " << op.name;
    } catch (const Ort::Exception& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(op.name)), std::string::npos) << e.what();
    }
  }
}

// The forward companions stay ORT's: loading the library changes none of their results.
TEST(OrtNames, ForwardOpsStayOrts) {
  int checked = 0;
  for (const OpSchema& op : op_schemas()) {
    // gradops' own operators are in no ORT domain: nothing of ORT's to compare them with.
    if (registered(op) || op.origin == OpOrigin::gradops) continue;
    std::string name(op.name);
    if (name.ends_with("_13")) name.resize(name.size() - 3);  // the opset-13 form of an ONNX op
    Call c{&op, {}, {}, {}};
    for (std::size_t k = 0; k < op.inputs.size(); ++k)
      c.inputs.push_back(filled(DType::f32, k == 0 ? std::vector<int64_t>{4, 8} : std::vector<int64_t>{8}));
    c.outputs.push_back(Arg{"out", DType::f32, {4, 8}});
    for (std::size_t o = 1; o < op.outputs.size(); ++o) c.outputs.push_back(std::nullopt);
    GraphSpec g = one_node(c);
    g.nodes[0].op = name;
    for (int64_t i = 0; i < c.inputs[0].count(); ++i) c.inputs[0].set(i, std::sin(1.7 * static_cast<double>(i)) * 3);
    Ort::Session stock = make_session(g, false);
    Ort::Session with_library = make_session(g, true);
    const std::vector<Tensor> a = run_session(stock, g, c.inputs), b = run_session(with_library, g, c.inputs);
    EXPECT_EQ(a[0].bytes, b[0].bytes) << name << ": loading the library changed ORT's result";
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

// ---- the runtime version check -------------------------------------------------------------------

const OrtApiBase* real_api_base() { return OrtGetApiBase(); }

// A runtime that serves C API versions up to 17, as ONNX Runtime 1.17 does.
const OrtApi* ORT_API_CALL old_get_api(uint32_t version) NO_EXCEPTION {
  return version <= 17 ? real_api_base()->GetApi(version) : nullptr;
}
const char* ORT_API_CALL old_version() NO_EXCEPTION { return "1.17.3"; }

TEST(OrtLibrary, RefusesARuntimeOlderThanItNeeds) {
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(handle, nullptr) << dlerror();
  using Register = OrtStatus*(ORT_API_CALL*)(OrtSessionOptions*, const OrtApiBase*);
  auto reg = reinterpret_cast<Register>(dlsym(handle, "RegisterCustomOps"));
  ASSERT_NE(reg, nullptr);
  const OrtApiBase old{old_get_api, old_version};
  Ort::SessionOptions options;
  OrtStatus* s = reg(options, &old);
  ASSERT_NE(s, nullptr);
  const std::string message = Ort::GetApi().GetErrorMessage(s);
  Ort::GetApi().ReleaseStatus(s);
  EXPECT_NE(message.find("needs ONNX Runtime 1.18 or newer"), std::string::npos) << message;
  EXPECT_NE(message.find("1.17.3"), std::string::npos) << message;
  s = reg(options, real_api_base());  // the real runtime is new enough
  EXPECT_EQ(s, nullptr) << Ort::GetApi().GetErrorMessage(s);
  // Only the entry point is exported; gradops itself stays private to the library.
  EXPECT_EQ(dlsym(handle, "_ZN7gradops10op_schemasEv"), nullptr);
  dlclose(handle);
}

// ---- edge cases ORT 1.19.2 gets wrong (docs/semantics.md A5) ---------------------------------------

// An empty last dimension: onnxruntime-training divides by it in BiasGeluGrad_dX; here it is an
// empty result, and dB is an empty sum.
TEST(OrtEdgeCases, BiasGeluGradWithEmptyLastDimension) {
  const OpSchema& op = op_schema(OpId::BiasGeluGrad_dX);
  Call c{&op, {Tensor(DType::f32, {3, 0}), Tensor(DType::f32, {3, 0}), Tensor(DType::f32, {0})},
         {Arg{"dX", DType::f32, {3, 0}}, Arg{"dB", DType::f32, {0}}}, {}};
  std::string skip;
  ASSERT_NO_FATAL_FAILURE(expect_same_as_gradops(c, &skip));
  const GraphSpec g = one_node(c);
  Ort::Session session = make_session(g, true);
  const std::vector<Tensor> got = run_session(session, g, c.inputs);
  EXPECT_EQ(got[0].shape, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(got[1].shape, (std::vector<int64_t>{0}));
}

// A normalized size of 1, which onnxruntime-training's LayerNorm grads reject: x-hat is 0, so
// X_grad is exactly 0 and bias_grad the column sum of Y_grad.
TEST(OrtEdgeCases, LayerNormGradWithNormalizedSizeOne) {
  const OpSchema& op = op_schema(OpId::LayerNormalizationGrad);
  const auto c = make_call(op.id, op.signatures[0], {7, 1}, {}, 41);
  if (!c) GTEST_SKIP() << "the float64 oracle has no " << op.name << " yet";
  std::string skip;
  ASSERT_NO_FATAL_FAILURE(expect_same_as_gradops(*c, &skip));
  if (!skip.empty()) GTEST_SKIP() << skip;
  const GraphSpec g = one_node(*c);
  Ort::Session session = make_session(g, true);
  const std::vector<Tensor> got = run_session(session, g, c->inputs);
  double sum = 0;
  for (int64_t i = 0; i < 7; ++i) {
    EXPECT_EQ(got[0].get(i), 0.0) << "X_grad[" << i << "]";
    sum += c->inputs[0].get(i);
  }
  EXPECT_NEAR(got[2].get(0), sum, 1e-5 * (1 + std::fabs(sum)));
}

// ---- a transformer MLP block's backward graph -------------------------------------------------------

class OrtMlpBackward : public testing::TestWithParam<DType> {};

TEST_P(OrtMlpBackward, MatchesFloat64Oracle) {
  const DType t = GetParam();
  MlpBackward m;
  try {
    m = mlp_backward(t, 24, 32, 64, true);
  } catch (const std::invalid_argument& e) {
    GTEST_SKIP() << e.what();
  }
  // Skip, rather than fail, while this build of gradops cannot run one of the grads.
  for (const Call& c : m.grads) {
    std::vector<std::optional<Tensor>> r;
    const Status st = run_gradops(c, c.attrs, &r);
    if (st.code() == StatusCode::unimplemented) GTEST_SKIP() << st.to_string();
  }
  Ort::Session session = make_session(m.graph, true);
  const std::vector<Tensor> got = run_session(session, m.graph, m.inputs);

  // Each output within the worst-case rounding bound of a 64-term sum (64 ulp) relative to its
  // largest value. Observed: about 2 ulp of the scale in f32 and 3 in f64.
  const double rel = 64 * (t == DType::f64 ? 0x1p-53 : 0x1p-24);
  for (const MlpError& e : mlp_errors(m, got)) {
    EXPECT_LE(e.error_over_scale, rel) << e.worst;
    std::ostringstream ratio;
    ratio << std::scientific << std::setprecision(2) << e.error_over_scale;
    RecordProperty(e.output + "_error_over_scale", ratio.str());
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OrtMlpBackward, testing::Values(DType::f32, DType::f64),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace gradops::ort_test
