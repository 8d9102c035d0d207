// Device memory for the harness in builds with the CUDA backend. Test code: plain cudaMalloc and
// synchronous copies; a failure here is a broken test machine, reported and fatal.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "harness/checker.hpp"

namespace gradops::check {
namespace {

void require(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "test harness: %s failed: %s (%s)\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  std::abort();
}

void* allocate(std::size_t bytes) {
  void* p = nullptr;
  require(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
void release(void* p) { require(cudaFree(p), "cudaFree"); }
void to_device(void* dst, const void* src, std::size_t bytes) {
  require(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
void to_host(void* dst, const void* src, std::size_t bytes) {
  require(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
void synchronize() { require(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

constexpr DeviceMemory kCuda = {allocate, release, to_device, to_host, synchronize};

}  // namespace

const DeviceMemory* device_memory(DeviceType t) { return t == DeviceType::cuda ? &kCuda : nullptr; }

}  // namespace gradops::check
