// Blocker (cuda_blocker.hpp): host-mapped flags, polled by thread 0 of each block.
#include <chrono>
#include <thread>

#include "cuda_blocker.hpp"

namespace gradops::check {
namespace {

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void hold(volatile int* ctl, unsigned long long limit_ns) {
  extern __shared__ int keep[];  // only its size matters: one block a multiprocessor
  if (threadIdx.x == 0) {
    keep[0] = 0;
    ctl[2 + blockIdx.x] = 1;
    __threadfence_system();
    const unsigned long long t0 = now_ns();
    while (ctl[0] == 0) {
      if (now_ns() - t0 > limit_ns) {
        ctl[1] = 1;
        break;
      }
      __nanosleep(1000);
    }
  }
  __syncthreads();
}

// One block a multiprocessor: the most shared memory a block may opt into, more than half of a
// multiprocessor's on every architecture since Volta (H100 227 of 228 KiB, A100 163 of 164, Ada
// 99 of 100); 0 where the device will not say.
int hold_smem() {
  int dev = 0, bytes = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
    return 0;
  return bytes;
}

}  // namespace

Blocker::Blocker(int blocks, cudaStream_t stream, int limit_ms) : blocks_(blocks) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, sizeof(int) * (2 + blocks), cudaHostAllocMapped) != cudaSuccess) return;
  host_ = static_cast<volatile int*>(p);
  for (int i = 0; i < 2 + blocks; ++i) host_[i] = 0;
  void* dev = nullptr;
  const int smem = hold_smem();
  if (smem == 0 || cudaHostGetDevicePointer(&dev, p, 0) != cudaSuccess ||
      cudaFuncSetAttribute(hold, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
    return;
  hold<<<blocks, 32, smem, stream>>>(static_cast<volatile int*>(dev),
                                          static_cast<unsigned long long>(limit_ms) * 1000000ull);
}

Blocker::~Blocker() {
  if (!host_) return;
  host_[0] = 1;
  (void)cudaDeviceSynchronize();
  (void)cudaFreeHost(const_cast<int*>(host_));
}

bool Blocker::all_running(int ms) const {
  if (!host_) return false;
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    int started = 0;
    for (int b = 0; b < blocks_; ++b) started += host_[2 + b];
    if (started == blocks_) return true;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

bool Blocker::release() {
  if (!host_) return false;
  host_[0] = 1;
  return host_[1] == 0;
}

}  // namespace gradops::check
