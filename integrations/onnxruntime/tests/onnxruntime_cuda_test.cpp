// libgradops_onnxruntime.so with ONNX Runtime's CUDA execution provider, attached as ORT 1.22+
// attaches a plugin provider (RegisterExecutionProviderLibrary, GetEpDevices,
// SessionOptionsAppendExecutionProvider_V2):
// - every (operator, signature) that gradops runs on CUDA: a one-node model on the CUDA provider gives,
//   bit for bit, the outputs of gradops' own API on CUDA tensors;
// - the MLP block's backward graph runs on the CUDA provider with no host copies around gradops'
//   nodes (ORT's profile: no Memcpy node, every gradops node on the CUDA provider) and matches the
//   float64 oracle; with gradops' CUDA kernels withheld (GRADOPS_ORT_CUDA=0) ORT places those nodes
//   on the CPU provider, copies around them, and the answer is still right;
// - a failing call on the CUDA provider comes back as ORT's error with gradops' message.
// Skipped, with the reason, where the provider library (scripts/fetch_onnxruntime.sh --cuda), its
// CUDA libraries or a GPU are missing.
#include <gtest/gtest.h>
#include <onnxruntime_cxx_api.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ort_test_support.hpp"

namespace gradops::ort_test {
namespace {

constexpr const char* kCudaProvider = "CUDAExecutionProvider";

// The provider library: GRADOPS_ORT_CUDA_PROVIDER, or where the fetch script puts it.
std::string provider_path() {
  const char* p = std::getenv("GRADOPS_ORT_CUDA_PROVIDER");
  return p && *p ? p : GRADOPS_ORT_CUDA_PROVIDER_DEFAULT;
}

// The CUDA provider's device, registered with the environment once; or why there is none.
struct CudaProvider {
  std::optional<Ort::ConstEpDevice> device;
  std::string why_not;
};

const CudaProvider& cuda_provider() {
  static const CudaProvider p = [] {
    CudaProvider r;
    const std::string path = provider_path();
    if (!std::filesystem::exists(path)) {
      r.why_not = "no ONNX Runtime CUDA provider at " + path + " (scripts/fetch_onnxruntime.sh --cuda fetches it)";
      return r;
    }
    std::string reason;
    if (!check::device_memory(DeviceType::cuda) || !check::device_memory(DeviceType::cuda)->usable(0, &reason)) {
      r.why_not = "no usable GPU: " + reason;
      return r;
    }
    try {
      env().RegisterExecutionProviderLibrary("gradops_test_cuda", path);
    } catch (const Ort::Exception& e) {
      r.why_not = std::string("ONNX Runtime could not load its CUDA provider (are its CUDA libraries on "
                              "LD_LIBRARY_PATH?): ") + e.what();
      return r;
    }
    for (const Ort::ConstEpDevice& d : env().GetEpDevices())
      if (std::string(d.EpName()) == kCudaProvider) {
        r.device = d;
        break;
      }
    if (!r.device) r.why_not = "ONNX Runtime's CUDA provider reports no device";
    return r;
  }();
  return p;
}

// The CUDA provider with TF32 off: its MatMul (in the MLP graph) then rounds as f32 does, as the
// float64 check of the graph assumes.
Ort::SessionOptions cuda_options() {
  Ort::SessionOptions o;
  o.SetIntraOpNumThreads(1);
  o.AppendExecutionProvider_V2(env(), {*cuda_provider().device},
                               std::unordered_map<std::string, std::string>{{"use_tf32", "0"}});
  return o;
}

// ---- every operator and dtype signature gradops runs on CUDA ---------------------------------------

std::vector<Signature> cuda_signatures() {
  std::vector<Signature> r;
  for (const OpSchema& op : op_schemas()) {
    if (!registered(op)) continue;
    for (const TypeSignature& s : op.signatures)
      if (selectable(op, s) && supports(op.id, s, DeviceType::cuda)) r.push_back({op.id, s});
  }
  return r;
}

class OrtCudaSignature : public testing::TestWithParam<Signature> {};

TEST_P(OrtCudaSignature, MatchesGradopsOnCudaBitwise) {
  if (!cuda_provider().device) GTEST_SKIP() << cuda_provider().why_not;
  const OpSchema& op = op_schema(GetParam().op);
  // Rows long enough for the vector kernels, with a ragged tail.
  const std::vector<int64_t> shape = op.family == OpFamily::batch_norm ? std::vector<int64_t>{4, 8, 7, 9}
                                                                      : std::vector<int64_t>{6, 5, 131};
  const auto c = make_call(op.id, GetParam().sig, shape, required_attrs(op), 29);
  ASSERT_TRUE(c) << "the float64 oracle has no " << op.name;
  std::vector<std::optional<Tensor>> ref;
  const Status st = run_gradops(*c, c->attrs, &ref, Device::cuda(0));
  ASSERT_TRUE(st.is_ok()) << describe(*c) << ": " << st.to_string();
  const GraphSpec g = one_node(*c);
  Ort::Session session = make_session(g, cuda_options(), true);
  const std::vector<Tensor> got = run_session(session, g, c->inputs);
  ASSERT_EQ(got.size(), c->outputs.size());
  for (std::size_t o = 0; o < c->outputs.size(); ++o) {
    const std::string diff = first_difference(c->outputs[o]->name, got[o], *ref[o]);
    EXPECT_TRUE(diff.empty()) << describe(*c) << ": " << diff;
  }
}

INSTANTIATE_TEST_SUITE_P(Cuda, OrtCudaSignature, testing::ValuesIn(cuda_signatures()),
                         [](const testing::TestParamInfo<Signature>& info) { return test_name(info.param); });

// ---- the MLP backward graph, placement and host copies ------------------------------------------------

// Where ORT ran each node, from its profile: (op type, provider) per node event.
std::vector<std::pair<std::string, std::string>> placements(Ort::Session& session) {
  Ort::AllocatorWithDefaultOptions allocator;
  const std::string file = session.EndProfilingAllocated(allocator).get();
  std::ifstream in(file);
  const nlohmann::json events = nlohmann::json::parse(in);
  std::filesystem::remove(file);
  std::vector<std::pair<std::string, std::string>> r;
  for (const auto& e : events)
    if (e.value("cat", "") == "Node" && e.contains("args") && e["args"].contains("op_name"))
      r.emplace_back(e["args"]["op_name"].get<std::string>(), e["args"].value("provider", ""));
  return r;
}

struct MlpRun {
  std::vector<std::pair<std::string, std::string>> nodes;  // (op, provider) per profiled node
  std::vector<MlpError> errors;
};

MlpRun run_mlp(DType t) {
  const MlpBackward m = mlp_backward(t, 24, 32, 64, true);
  Ort::SessionOptions options = cuda_options();
  options.EnableProfiling("gradops_ort_cuda_profile");
  Ort::Session session = make_session(m.graph, std::move(options), true);
  const std::vector<Tensor> got = run_session(session, m.graph, m.inputs);
  return {placements(session), mlp_errors(m, got)};
}

bool is_gradops(const std::string& op) {
  return op == "SoftmaxGrad_13" || op == "BiasGeluGrad_dX" || op == "LayerNormalizationGrad";
}

class OrtCudaMlp : public testing::TestWithParam<DType> {};

TEST_P(OrtCudaMlp, RunsOnTheGpuWithoutHostCopiesAndMatchesTheOracle) {
  if (!cuda_provider().device) GTEST_SKIP() << cuda_provider().why_not;
  const DType t = GetParam();
  const MlpRun r = run_mlp(t);
  int ours = 0;
  for (const auto& [op, provider] : r.nodes) {
    EXPECT_EQ(op.rfind("Memcpy", 0), std::string::npos) << "a host copy in the graph: " << op;
    if (is_gradops(op)) {
      ++ours;
      EXPECT_EQ(provider, kCudaProvider) << op;
    }
  }
  EXPECT_EQ(ours, 3) << "gradops nodes in ORT's profile";
  const double rel = 64 * (t == DType::f64 ? 0x1p-53 : 0x1p-24);  // as the CPU test's bound
  for (const MlpError& e : r.errors) EXPECT_LE(e.error_over_scale, rel) << e.worst;
}

// With gradops' CUDA kernels withheld, its nodes fall back to the CPU provider: ORT copies around
// them (so the profile check above can see copies), and the answer is still right.
TEST_P(OrtCudaMlp, WithoutGradopsCudaKernelsFallsBackToTheCpu) {
  if (!cuda_provider().device) GTEST_SKIP() << cuda_provider().why_not;
  const DType t = GetParam();
  setenv("GRADOPS_ORT_CUDA", "0", 1);
  MlpRun r;
  try {
    r = run_mlp(t);
  } catch (...) {
    unsetenv("GRADOPS_ORT_CUDA");
    throw;
  }
  unsetenv("GRADOPS_ORT_CUDA");
  int ours = 0, copies = 0;
  for (const auto& [op, provider] : r.nodes) {
    copies += op.rfind("Memcpy", 0) == 0;
    if (is_gradops(op)) {
      ++ours;
      EXPECT_EQ(provider, "CPUExecutionProvider") << op;
    }
  }
  EXPECT_EQ(ours, 3);
  EXPECT_GT(copies, 0) << "ORT placed CPU nodes among CUDA ones without copying";
  const double rel = 64 * (t == DType::f64 ? 0x1p-53 : 0x1p-24);
  for (const MlpError& e : r.errors) EXPECT_LE(e.error_over_scale, rel) << e.worst;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, OrtCudaMlp, testing::Values(DType::f32, DType::f64),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

// ---- errors -----------------------------------------------------------------------------------------

// A call that gradops rejects, on the CUDA provider: ORT's error carries gradops' message.
TEST(OrtCudaErrors, CarryGradopsMessage) {
  if (!cuda_provider().device) GTEST_SKIP() << cuda_provider().why_not;
  const OpSchema& op = op_schema(OpId::LayerNormalizationGrad);
  const DType t = DType::f32;
  Call c{&op, {}, {}, {}};
  for (const std::vector<int64_t>& s : {std::vector<int64_t>{4, 8}, {4, 8}, {7}, {4, 1}, {4, 1}}) {
    Tensor x(t, s);
    for (int64_t i = 0; i < x.count(); ++i) x.set(i, 0.25 + 0.125 * (i % 5));
    c.inputs.push_back(x);
  }
  c.outputs = {Arg{"dX", t, {4, 8}}, Arg{"dScale", t, {8}}, Arg{"dBias", t, {8}}};
  std::vector<std::optional<Tensor>> ref;
  const Status st = run_gradops(c, c.attrs, &ref, Device::cuda(0));
  ASSERT_EQ(st.code(), StatusCode::invalid_argument) << st.to_string();
  const GraphSpec g = one_node(c);
  try {
    Ort::Session session = make_session(g, cuda_options(), true);
    run_session(session, g, c.inputs);
    FAIL() << "ORT ran a LayerNormalizationGrad whose scale has the wrong length";
  } catch (const Ort::Exception& e) {
    EXPECT_NE(std::string(e.what()).find(st.message()), std::string::npos)
        << "ORT: " << e.what() << "\ngradops: " << st.message();
    EXPECT_EQ(e.GetOrtErrorCode(), ORT_INVALID_ARGUMENT) << e.what();
  }
}

}  // namespace
}  // namespace gradops::ort_test
