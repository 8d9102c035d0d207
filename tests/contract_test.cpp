// The op layer's contract as the outside sees it: infer_output_shapes against the oracle's output
// shapes for every op and signature, and the static support query (supports, implementations,
// hence `gradops list`) against what actually runs: every op, every signature, every device type.
// Where this build or machine cannot run a device (CUDA without a visible GPU, or a build without
// the backend), the call is resolved with implementation_name instead, which reads no tensor data.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "harness/call_buffers.hpp"
#include "harness/checker.hpp"

#if GRADOPS_TEST_CUDA
#include <cuda_runtime.h>
#endif

namespace gradops::testing {
namespace {

#if GRADOPS_TEST_CUDA
constexpr bool kCudaBuild = true;
#else
constexpr bool kCudaBuild = false;
#endif

bool gpu_visible() {
#if GRADOPS_TEST_CUDA
  static const bool visible = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    (void)cudaGetLastError();
    return ok;
  }();
  return visible;
#else
  return false;
#endif
}

std::string sig_name(const OpSchema& op, const TypeSignature& s) {
  std::string r;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) r += std::string(v ? "," : "") + dtype_name(s.types[v]);
  return r;
}

std::vector<int64_t> main_shape(const OpSchema& op) {
  return op.family == OpFamily::layer_norm ? std::vector<int64_t>{2, 3, 5} : std::vector<int64_t>{2, 3, 4};
}

// ---- infer_output_shapes ------------------------------------------------------------------------

// Every op, every signature, a few attribute settings: the shapes the oracle gives every output,
// and the dtypes the signature gives them.
TEST(InferOutputShapes, MatchTheOracleForEveryOpAndSignature) {
  int checked = 0;
  for (const OpSchema& op : op_schemas()) {
    std::vector<oracle::Attrs> variants = {{}};
    if (op.find_attribute("axis") >= 0) variants = {{{"axis", 1}}, {{"axis", -1}}, {{"axis", 0}}};
    if (op.find_attribute("channels_last") >= 0) variants.push_back({{"channels_last", 1}});
    for (const TypeSignature& sig : op.signatures)
      for (const oracle::Attrs& attrs : variants) {
        SCOPED_TRACE(std::string(op.name) + " (" + sig_name(op, sig) + ")");
        const CallSpec spec = valid_call(op, main_shape(op), sig, attrs);
        CallBuffers b(spec);
        // Shapes come from the inputs alone: data pointers need not be set.
        std::vector<TensorView> in(b.in_view);
        std::vector<const TensorView*> in_ptr;
        for (std::size_t i = 0; i < in.size(); ++i) {
          in[i].data = nullptr;
          in_ptr.push_back(b.in_ptr[i] ? &in[i] : nullptr);
        }
        std::vector<TensorSpec> out(kMaxArgs);
        const Status s = infer_output_shapes(op.name, in_ptr, b.attrs, out);
        ASSERT_TRUE(s) << s.to_string();
        for (std::size_t o = 0; o < op.outputs.size(); ++o) {
          SCOPED_TRACE(std::string(op.outputs[o].name));
          ASSERT_TRUE(spec.out[o].present) << "the oracle gives every output";
          EXPECT_EQ(std::vector<int64_t>(out[o].shape().begin(), out[o].shape().end()), spec.out[o].shape);
          // A type variable no input carries (InvertibleLayerNormalizationGrad's T, the forwards'
          // U) has no answer in the inputs: the first matching signature's is documented.
          bool carried = false;
          for (const ArgSchema& i : op.inputs) carried = carried || i.type_var == op.outputs[o].type_var;
          if (carried) EXPECT_EQ(out[o].dtype, spec.out[o].dtype);
        }
        // The inferred shapes make a call that runs.
        EXPECT_TRUE(b.run()) << b.run().to_string();
        ++checked;
      }
  }
  EXPECT_GT(checked, 3 * 32);
}

TEST(InferOutputShapes, ValidatesLikeRunAndWritesNothingOnFailure) {
  const OpSchema& op = *find_op("LayerNormalizationGrad");
  CallSpec spec = valid_call(op, {4, 6}, op.signatures[0]);
  spec.in[2].shape = {5};  // scale: 5 values for 6 columns
  CallBuffers b(spec);
  std::vector<TensorSpec> out(kMaxArgs);
  out[0].rank = 7;
  const Status s = infer_output_shapes(op.name, b.in_ptr, b.attrs, out);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("'scale' has shape [5]"), std::string::npos) << s.message();
  EXPECT_EQ(out[0].rank, 7) << "nothing written on failure";

  const Status axis = infer_output_shapes(op.name, b.in_ptr, std::vector<Attribute>{{"axis", 5}}, out);
  EXPECT_EQ(axis.code(), StatusCode::invalid_argument);
  EXPECT_NE(axis.message().find("attribute 'axis'"), std::string::npos) << axis.message();

  std::vector<TensorSpec> too_few(1);
  const CallBuffers ok(valid_call(op, {4, 6}, op.signatures[0]));
  EXPECT_EQ(infer_output_shapes(op.name, ok.in_ptr, ok.attrs, too_few).code(), StatusCode::invalid_argument);
  EXPECT_EQ(infer_output_shapes("NoSuchOp", ok.in_ptr, ok.attrs, out).code(), StatusCode::invalid_argument);
}

// A valid call whose device this build has no kernel for still gets its shapes.
TEST(InferOutputShapes, DoNotNeedAKernel) {
  const OpSchema& op = *find_op("LayerNormalizationGrad");
  CallSpec spec = valid_call(op, {4, 6}, op.signatures[0]);
  for (ArgSpec& a : spec.in) a.device = Device::cuda();
  CallBuffers b(spec);
  std::vector<TensorSpec> out(kMaxArgs);
  ASSERT_TRUE(infer_output_shapes(op.name, b.in_ptr, b.attrs, out));
  EXPECT_EQ(std::vector<int64_t>(out[0].shape().begin(), out[0].shape().end()), (std::vector<int64_t>{4, 6}));
}

// ---- supports / implementations ------------------------------------------------------------------

struct Case {
  const OpSchema* op;
  TypeSignature sig;
  DeviceType device;
};

std::string describe(const Case& c) {
  return std::string(c.op->name) + " (" + sig_name(*c.op, c.sig) + ") on " + device_type_name(c.device);
}

// Where the device can run here: run the call against the oracle. Else resolve it.
TEST(Supports, TellsExactlyWhatRunsOnEveryDevice) {
  int ran = 0, resolved = 0, supported = 0;
  for (const OpSchema& op : op_schemas())
    for (const TypeSignature& sig : op.signatures)
      for (DeviceType device : {DeviceType::cpu, DeviceType::cuda}) {
        const Case c{&op, sig, device};
        SCOPED_TRACE(describe(c));
        const bool claimed = supports(op.id, sig, device);
        const std::vector<std::string> rows = implementations(op.id, sig, device);
        EXPECT_EQ(claimed, !rows.empty());
        supported += claimed;
        const bool can_run = device == DeviceType::cpu || (device == DeviceType::cuda && gpu_visible());
        if (can_run) {
          check::Problem p;
          p.op = op.id;
          p.sig = sig;
          p.shape = main_shape(op);
          p.device = device == DeviceType::cpu ? Device::cpu() : Device::cuda();
          const check::Report r = check::run_case(p);
          if (claimed) {
            EXPECT_TRUE(r.status) << r.status.to_string();
            EXPECT_TRUE(r.pass) << r.detail;
          } else {
            EXPECT_EQ(r.status.code(), StatusCode::unimplemented) << r.status.to_string();
          }
          ++ran;
        }
        // The row dispatch picks is one of the rows the static query lists.
        CallSpec spec = valid_call(op, main_shape(op), sig);
        for (ArgSpec& a : spec.in) a.device = Device{device, 0};
        for (ArgSpec& a : spec.out) a.device = Device{device, 0};
        const CallBuffers b(spec);
        std::string name;
        const Status s = implementation_name(op.name, b.in_ptr, b.out_ptr, b.attrs, {}, &name);
        if (device == DeviceType::cuda && kCudaBuild && !gpu_visible()) {
          // Resolving checks the device first, as running does: without a usable one both say so,
          // and the static query above is what tells a host where an op could run.
          EXPECT_EQ(s.code(), StatusCode::device_error) << s.to_string();
        } else if (claimed) {
          ASSERT_TRUE(s) << s.to_string();
          const std::string row = name.substr(0, name.find(" ["));
          EXPECT_NE(std::find(rows.begin(), rows.end(), row), rows.end()) << name;
        } else {
          EXPECT_EQ(s.code(), StatusCode::unimplemented) << s.to_string();
        }
        ++resolved;
      }
  EXPECT_GT(ran, 0);
  EXPECT_GT(resolved, ran - 1);
  EXPECT_GT(supported, 0);
}

TEST(Supports, AnySignatureAndUnlistedSignatures) {
  for (const OpSchema& op : op_schemas()) {
    SCOPED_TRACE(std::string(op.name));
    EXPECT_TRUE(supports(op.id, DeviceType::cpu)) << "the CPU backend covers every op";
    bool any_cuda = false;
    for (const TypeSignature& sig : op.signatures) any_cuda = any_cuda || supports(op.id, sig, DeviceType::cuda);
    EXPECT_EQ(supports(op.id, DeviceType::cuda), any_cuda);
  }
#if !defined(GRADOPS_HAVE_CUDA) && !GRADOPS_TEST_CUDA
  for (const OpSchema& op : op_schemas()) EXPECT_FALSE(supports(op.id, DeviceType::cuda)) << op.name;
#endif
  // (f32, f64, f32) is no LayerNorm signature; entries past an op's type variables are ignored.
  EXPECT_FALSE(supports(OpId::LayerNormalizationGrad, TypeSignature{{DType::f32, DType::f64, DType::f32}},
                        DeviceType::cpu));
  EXPECT_TRUE(supports(OpId::GeluGrad, TypeSignature{{DType::bf16, DType::f64, DType::f16}}, DeviceType::cpu));
  EXPECT_FALSE(supports(static_cast<OpId>(kNumOps), DeviceType::cpu));
}

// ---- origin ---------------------------------------------------------------------------------------

TEST(OpOrigin, OrtOpsKeepOrtDomains) {
  for (const OpSchema& op : op_schemas()) {
    SCOPED_TRACE(std::string(op.name));
    if (op.origin == OpOrigin::onnxruntime)
      EXPECT_TRUE(op.domain == "com.microsoft" || op.domain.empty());
    else
      EXPECT_NE(op.domain, "com.microsoft") << "gradops' own ops are not ORT's";
  }
  EXPECT_STREQ(op_origin_name(OpOrigin::onnxruntime), "onnxruntime");
  EXPECT_STREQ(op_origin_name(OpOrigin::gradops), "gradops");
}

}  // namespace
}  // namespace gradops::testing
