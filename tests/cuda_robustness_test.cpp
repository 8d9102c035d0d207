// The CUDA backend under stress: several host threads on several streams at once give the bits of
// a serial run; a failing scratch allocation (an allocator that returns NULL, a cudaMalloc far past
// the device's memory) is out_of_memory naming the op, with the CUDA error state left clean; a
// device ordinal past the device count is rejected alike by running and by resolving. Every test
// reports SKIPPED where no GPU is visible. scripts/cuda_sanitize.sh runs these and the CUDA tests
// under compute-sanitizer.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_support.hpp"

namespace gradops::check {
namespace {

using CudaRobustness = Cuda;  // reports SKIPPED where no GPU is visible

// One problem per op that has a CUDA implementation in this build, on shapes with a tail, some of
// them misaligned.
std::vector<Problem> cuda_problems() {
  std::vector<Problem> r;
  uint64_t seed = 1;
  for (const OpSchema& op : op_schemas())
    for (std::size_t s = 0; s < op.signatures.size(); ++s) {
      Problem p;
      p.op = op.id;
      p.sig = op.signatures[s];
      p.shape = op.family == OpFamily::batch_norm ? std::vector<int64_t>{4, 3, 129} : std::vector<int64_t>{67, 1031};
      p.misaligned = s % 2 == 1;
      p.seed = seed++;
      p.device = Device::cuda(0);
      std::string impl;
      if (Case(p).implementation(&impl).is_ok()) r.push_back(p);
    }
  return r;
}

bool same_bits(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t o = 0; o < a.size(); ++o)
    if (a[o].size() != b[o].size() || (!a[o].empty() && std::memcmp(a[o].data(), b[o].data(), a[o].size() * sizeof(double)) != 0))
      return false;
  return true;
}

TEST_F(CudaRobustness, ThreadsOnStreamsGiveTheSerialBits) {
  const std::vector<Problem> problems = cuda_problems();
  ASSERT_FALSE(problems.empty()) << "no op has a CUDA implementation in this build";
  std::vector<std::vector<std::vector<double>>> serial;
  for (const Problem& p : problems) {
    const Report r = run_case(p);
    ASSERT_TRUE(r.pass) << r.detail;
    serial.push_back(r.outputs);
  }
  constexpr int kThreads = 4, kRounds = 3;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      // A blocking stream: the harness's synchronous copies on the legacy stream order with it.
      const Stream owned(cudaStreamDefault);
      if (!owned.stream) {
        errors[t] = "cudaStreamCreateWithFlags failed";
        return;
      }
      cudaStream_t stream = owned.stream;
      for (int round = 0; round < kRounds && errors[t].empty(); ++round)
        for (std::size_t i = 0; i < problems.size(); ++i) {
          // Each thread walks the list from another place, so that different ops overlap.
          const std::size_t k = (i + static_cast<std::size_t>(t) * problems.size() / kThreads) % problems.size();
          Problem p = problems[k];
          p.cuda_stream = stream;
          Case c(p);
          c.poison_outputs();
          const Status s = c.run();
          if (!s) {
            errors[t] = describe(p) + ": " + s.to_string();
            break;
          }
          if (cudaStreamSynchronize(stream) != cudaSuccess) {
            errors[t] = describe(p) + ": cudaStreamSynchronize failed";
            break;
          }
          const Report r = c.compare();
          if (!same_bits(r.outputs, serial[k])) {
            errors[t] = describe(p) + ": thread " + std::to_string(t) + " round " + std::to_string(round) +
                        " differs from the serial run";
            break;
          }
        }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

void* no_memory(void*, Device, std::size_t) { return nullptr; }
void* huge_cuda_malloc(void*, Device, std::size_t bytes) {
  void* p = nullptr;
  // Far past any GPU's memory: cudaMalloc fails with cudaErrorMemoryAllocation.
  if (cudaMalloc(&p, bytes + (std::size_t{1} << 50)) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}
void cuda_release(void*, Device, void* p, std::size_t) { cudaFree(p); }

TEST_F(CudaRobustness, FailingDeviceAllocationIsOutOfMemory) {
  const WorkspaceAllocator failing{no_memory, nullptr, nullptr};
  const WorkspaceAllocator huge{huge_cuda_malloc, cuda_release, nullptr};
  int oom = 0;
  for (const WorkspaceAllocator* a : {&failing, &huge})
    for (Problem p : cuda_problems()) {
      p.allocator = a;
      Case c(p);
      c.poison_outputs();
      const Status s = c.run();
      EXPECT_EQ(cudaGetLastError(), cudaSuccess) << describe(p) << ": a CUDA error was left behind";
      if (s.is_ok()) {
        const Report r = c.compare();  // an op that needs no scratch must still be right
        EXPECT_TRUE(r.pass) << r.detail;
        continue;
      }
      ++oom;
      EXPECT_EQ(s.code(), StatusCode::out_of_memory) << describe(p) << ": " << s.to_string();
      const std::string name(op_schema(p.op).name);
      EXPECT_EQ(s.message().rfind(name + ": ", 0), 0u) << s.message();
      // The next call with the default allocator works: nothing sticky was left.
      p.allocator = nullptr;
      const Report again = run_case(p);
      EXPECT_TRUE(again.pass) << again.detail;
    }
  EXPECT_GT(oom, 0) << "no CUDA op asked for scratch: the allocation failure path went untested";
}

TEST_F(CudaRobustness, OrdinalPastTheDeviceCountIsRejected) {
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  Problem p = cuda_problems().at(0);
  p.device = Device::cuda(n);
  Case c(p);
  std::string impl;
  const Status resolved = c.implementation(&impl);
  const Status ran = c.run();
  EXPECT_EQ(resolved.code(), StatusCode::invalid_argument) << resolved.to_string();
  EXPECT_EQ(ran.code(), StatusCode::invalid_argument) << ran.to_string();
}

}  // namespace
}  // namespace gradops::check
