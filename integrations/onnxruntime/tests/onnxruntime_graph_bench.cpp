// Times the MLP block's backward graph (ort_test_support.hpp) in stock ONNX Runtime with gradops'
// custom-op library, on three placements:
//   cpu        the CPU provider (every thread);
//   cuda       the CUDA provider with gradops' CUDA kernels;
//   cuda+cpu   the CUDA provider, with gradops' CUDA kernels withheld (GRADOPS_ORT_CUDA=0): ORT runs
//              gradops' nodes on the CPU provider and copies around them.
// Inputs and outputs are bound where each session wants them (device memory for the CUDA sessions),
// so a run is the graph alone; ORT synchronizes its stream at the end of each run. The CUDA
// placements need ORT's CUDA provider (GRADOPS_ORT_CUDA_PROVIDER or next to the runtime) and a GPU.
//
//   onnxruntime_graph_bench [N D H [runs [json]]]     defaults: 8192 1024 4096 20
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "ort_test_support.hpp"

namespace gradops::ort_test {
namespace {

struct Result {
  std::string placement;
  double median_ms = 0, p10_ms = 0, p90_ms = 0;
};

// Median, 10th and 90th percentile of `runs` timed runs after three warm-up runs.
// `device`: the memory the inputs and outputs are bound in (nullptr: the host's).
Result time_graph(const std::string& placement, const MlpBackward& m, Ort::SessionOptions options, int runs,
                  const OrtMemoryInfo* device) {
  Ort::Session session = make_session(m.graph, std::move(options), true);
  const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  Ort::IoBinding binding(session);
  // Device tensors refer to the allocator they came from: it must outlive them (declared first).
  std::optional<Ort::Allocator> allocator;
  if (device) allocator.emplace(session, device);
  std::vector<Ort::Value> keep;  // bound values must outlive the runs
  for (std::size_t i = 0; i < m.inputs.size(); ++i) {
    const Tensor& t = m.inputs[i];
    Ort::Value host = Ort::Value::CreateTensor(cpu, const_cast<std::byte*>(t.bytes.data()), t.bytes.size(),
                                               t.shape.data(), t.shape.size(), ort_type(t.dtype));
    if (!device) {
      keep.push_back(std::move(host));
    } else {
      Ort::Value dev = Ort::Value::CreateTensor(*allocator, t.shape.data(), t.shape.size(), ort_type(t.dtype));
      std::vector<Ort::Value> src, dst;
      src.push_back(std::move(host));
      dst.push_back(std::move(dev));
      Ort::ThrowOnError(env().CopyTensors(src, dst, nullptr));
      keep.push_back(std::move(dst[0]));
    }
    binding.BindInput(m.graph.inputs[i].name.c_str(), keep.back());
  }
  for (const Arg& o : m.graph.outputs) binding.BindOutput(o.name.c_str(), device ? device : static_cast<const OrtMemoryInfo*>(cpu));
  const Ort::RunOptions run_options;
  std::vector<double> ms;
  for (int r = 0; r < runs + 3; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    session.Run(run_options, binding);
    binding.SynchronizeOutputs();
    const auto t1 = std::chrono::steady_clock::now();
    if (r >= 3) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) { return ms[static_cast<std::size_t>(q * static_cast<double>(ms.size() - 1) + 0.5)]; };
  return {placement, at(0.5), at(0.1), at(0.9)};
}

int main_impl(int argc, char** argv) {
  const int64_t N = argc > 1 ? std::atoll(argv[1]) : 8192, D = argc > 2 ? std::atoll(argv[2]) : 1024,
                H = argc > 3 ? std::atoll(argv[3]) : 4096;
  const int runs = argc > 4 ? std::atoi(argv[4]) : 20;
  const char* json_path = argc > 5 ? argv[5] : nullptr;
  const DType t = DType::f32;
  const MlpBackward m = mlp_backward(t, N, D, H, false);

  std::vector<Result> results;
  {
    Ort::SessionOptions o;  // every thread
    results.push_back(time_graph("cpu", m, std::move(o), runs, nullptr));
  }
  const char* env_path = std::getenv("GRADOPS_ORT_CUDA_PROVIDER");
  const std::string provider = env_path && *env_path ? env_path : GRADOPS_ORT_CUDA_PROVIDER_DEFAULT;
  std::optional<Ort::ConstEpDevice> device;
  if (std::filesystem::exists(provider)) {
    try {
      env().RegisterExecutionProviderLibrary("gradops_bench_cuda", provider);
      for (const Ort::ConstEpDevice& d : env().GetEpDevices())
        if (std::string(d.EpName()) == "CUDAExecutionProvider") device = d;
    } catch (const Ort::Exception& e) {
      std::printf("ONNX Runtime could not load its CUDA provider: %s\n", e.what());
    }
  }
  if (device) {
    auto cuda = [&] {
      Ort::SessionOptions o;
      o.AppendExecutionProvider_V2(env(), {*device}, std::unordered_map<std::string, std::string>{});
      return o;
    };
    const Ort::ConstMemoryInfo memory = device->GetMemoryInfo(OrtDeviceMemoryType_DEFAULT);
    results.push_back(time_graph("cuda", m, cuda(), runs, memory));
    std::fprintf(stderr, "cpu %.3f ms, cuda %.3f ms\n", results[0].median_ms, results[1].median_ms);
    setenv("GRADOPS_ORT_CUDA", "0", 1);
    results.push_back(time_graph("cuda+cpu", m, cuda(), runs, memory));
    unsetenv("GRADOPS_ORT_CUDA");
  } else {
    std::printf("no usable CUDA provider at %s: CPU only\n", provider.c_str());
  }

  std::printf("MLP backward graph, f32, N=%lld D=%lld H=%lld, %d runs each\n", static_cast<long long>(N),
              static_cast<long long>(D), static_cast<long long>(H), runs);
  std::printf("%-10s %12s %22s %10s\n", "placement", "median ms", "p10-p90 ms", "x cpu");
  for (const Result& r : results)
    std::printf("%-10s %12.3f %10.3f-%-11.3f %10.2f\n", r.placement.c_str(), r.median_ms, r.p10_ms, r.p90_ms,
                results[0].median_ms / r.median_ms);
  if (json_path) {
    std::ofstream j(json_path);
    j << "{\"graph\": \"mlp_backward\", \"dtype\": \"f32\", \"N\": " << N << ", \"D\": " << D << ", \"H\": " << H
      << ", \"runs\": " << runs << ", \"results\": [";
    for (std::size_t i = 0; i < results.size(); ++i)
      j << (i ? ", " : "") << "{\"placement\": \"" << results[i].placement << "\", \"median_ms\": "
        << results[i].median_ms << ", \"p10_ms\": " << results[i].p10_ms << ", \"p90_ms\": " << results[i].p90_ms
        << "}";
    j << "]}\n";
  }
  return 0;
}

}  // namespace
}  // namespace gradops::ort_test

int main(int argc, char** argv) {
  try {
    return gradops::ort_test::main_impl(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "onnxruntime_graph_bench: %s\n", e.what());
    return 1;
  }
}
