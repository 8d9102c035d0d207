// The library in a host that, like Python, links neither gradops nor OpenMP: ORT releases the
// library with the last session that uses it, while OpenMP's worker threads (from libgomp, which
// the library brought in) are still alive. Sessions come and go several times, each running a
// kernel large enough to use those threads; the process must neither crash nor change results.
// This executable links only ONNX Runtime and GoogleTest, on purpose.
#include <gtest/gtest.h>
#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "onnx_model.hpp"

namespace gradops::ort_test {
namespace {

TEST(OrtLibraryLifetime, SessionsComeAndGo) {
  // Read by libgomp when the library brings it in: several worker threads that keep spinning
  // inside libgomp after each parallel region, so that unloading it under them cannot go unseen.
  setenv("OMP_NUM_THREADS", "4", 1);
  setenv("OMP_WAIT_POLICY", "active", 1);
  Ort::Env env(ORT_LOGGING_LEVEL_FATAL, "gradops_lifetime_test");
  constexpr int64_t kRows = 512, kCols = 1024;
  const std::vector<int64_t> shape{kRows, kCols};
  OnnxGraph g;
  g.inputs = {{"dY", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, shape}, {"X", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, shape}};
  g.outputs = {{"dX", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, shape}};
  g.nodes = {{"GeluGrad", "com.microsoft", {"dY", "X"}, {"dX"}, {}}};
  const std::string model = onnx_model(g);

  // GeluGrad at X = 0 is exactly dY / 2 (Phi(0) = 1/2, and 0 * phi(0) = 0).
  std::vector<float> dy(kRows * kCols), x(kRows * kCols, 0.0f), dx(kRows * kCols);
  for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i % 97) - 48.0f;
  const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  const char* in_names[] = {"dY", "X"};
  const char* out_names[] = {"dX"};
  for (int round = 0; round < 8; ++round) {
    std::fill(dx.begin(), dx.end(), -1.0f);
    {
      Ort::SessionOptions options;
      options.RegisterCustomOpsLibrary(GRADOPS_ORT_LIBRARY_PATH);
      Ort::Session session(env, model.data(), model.size(), options);
      Ort::Value in[] = {
          Ort::Value::CreateTensor<float>(cpu, dy.data(), dy.size(), shape.data(), shape.size()),
          Ort::Value::CreateTensor<float>(cpu, x.data(), x.size(), shape.data(), shape.size())};
      Ort::Value out = Ort::Value::CreateTensor<float>(cpu, dx.data(), dx.size(), shape.data(), shape.size());
      session.Run(Ort::RunOptions{nullptr}, in_names, in, 2, out_names, &out, 1);
    }  // the last session using the library goes, while OpenMP's threads still spin
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (std::size_t i = 0; i < dy.size(); ++i) ASSERT_EQ(dx[i], dy[i] / 2) << "round " << round << ", dX[" << i << "]";
  }
}

}  // namespace
}  // namespace gradops::ort_test
