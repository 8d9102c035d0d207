// Context: the per-call execution environment (threads, CUDA stream, scratch allocator).
#pragma once

#include <cstddef>

#include "gradops/types.hpp"

namespace gradops {

// Scratch memory for kernels that need it (dscale/dbias partials, channel sums). Replaceable so
// that hosts (ONNX Runtime, PyTorch) can hand in their own caching allocators. Plain function
// pointers so that the C ABI can pass the same thing.
struct WorkspaceAllocator {
  // Returns nullptr on failure. Memory must be usable on `device` and aligned to 64 bytes.
  void* (*allocate)(void* user, Device device, std::size_t bytes) = nullptr;
  void (*deallocate)(void* user, Device device, void* ptr, std::size_t bytes) = nullptr;
  void* user = nullptr;
};

struct Context {
  // CPU threads to use; 0 means the OpenMP default (all cores unless OMP_NUM_THREADS says less).
  // Results never depend on it.
  int num_threads = 0;
  // cudaStream_t for CUDA tensors; nullptr is the legacy default stream.
  void* cuda_stream = nullptr;
  // nullptr: gradops' default allocator (aligned new on CPU, cudaMallocAsync on the stream).
  const WorkspaceAllocator* allocator = nullptr;
};

}  // namespace gradops
