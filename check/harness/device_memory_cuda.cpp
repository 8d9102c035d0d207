// Device memory for the harness in builds with the CUDA backend. Test code: plain cudaMalloc and
// synchronous copies. A failure throws (the tests report it as a failure, the gradops tool as an
// error), except in release, which runs in destructors and only reports.
#include <cuda_runtime.h>

#include <cstdio>
#include <stdexcept>
#include <string>

#include "harness/checker.hpp"

namespace gradops::check {
namespace {

std::string describe(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

void require(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  (void)cudaGetLastError();
  throw std::runtime_error(std::string("test harness: ") + what + " failed: " + describe(e));
}

void* allocate(std::size_t bytes) {
  void* p = nullptr;
  require(cudaMalloc(&p, bytes ? bytes : 1), "cudaMalloc");
  return p;
}
void release(void* p) {
  if (const cudaError_t e = cudaFree(p); e != cudaSuccess)
    std::fprintf(stderr, "test harness: cudaFree failed: %s\n", describe(e).c_str());
}
void to_device(void* dst, const void* src, std::size_t bytes) {
  require(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), "cudaMemcpy to the device");
}
void to_host(void* dst, const void* src, std::size_t bytes) {
  require(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy to the host");
}
void synchronize() { require(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

bool usable(int ordinal, std::string* reason) {
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    *reason = "no usable CUDA driver or device: " + describe(e);
    return false;
  }
  if (ordinal >= count) {
    *reason = "there is no CUDA device " + std::to_string(ordinal) + " (" + std::to_string(count) + " visible)";
    return false;
  }
  if (const cudaError_t e = cudaSetDevice(ordinal); e != cudaSuccess) {
    (void)cudaGetLastError();
    *reason = "CUDA device " + std::to_string(ordinal) + " cannot be used: " + describe(e);
    return false;
  }
  return true;
}

constexpr DeviceMemory kCuda = {allocate, release, to_device, to_host, synchronize, usable};

}  // namespace

const DeviceMemory* device_memory(DeviceType t) { return t == DeviceType::cuda ? &kCuda : nullptr; }

}  // namespace gradops::check
