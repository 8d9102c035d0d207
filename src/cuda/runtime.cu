// The CUDA backend's runtime glue: the default scratch allocator (stream-ordered, on the context's
// stream), CUDA errors as statuses, and cached device properties and cluster occupancy.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/workspace.hpp"
#include "cuda/common.cuh"

namespace gradops::cuda {

Status status_of(cudaError_t e, std::string_view op, std::string_view what) {
  if (e == cudaSuccess) return {};
  (void)cudaGetLastError();
  return Status(StatusCode::device_error, std::string(op) + ": CUDA error in " + std::string(what) + ": " +
                                              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

Status current_device(std::string_view op, DeviceInfo* out) {
  int ordinal = 0;
  if (Status s = status_of(cudaGetDevice(&ordinal), op, "cudaGetDevice"); !s) return s;
  constexpr int kDevices = 64;
  static std::mutex mu;
  static DeviceInfo cache[kDevices];
  static bool known[kDevices];
  std::lock_guard<std::mutex> lock(mu);
  if (ordinal < kDevices && known[ordinal]) {
    *out = cache[ordinal];
    return {};
  }
  DeviceInfo d;
  d.ordinal = ordinal;
  int cluster = 0;
  const struct {
    int* dst;
    cudaDeviceAttr attr;
    const char* name;
  } attrs[] = {
      {&d.sm_count, cudaDevAttrMultiProcessorCount, "cudaDeviceGetAttribute(MultiProcessorCount)"},
      {&d.max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor,
       "cudaDeviceGetAttribute(MaxThreadsPerMultiProcessor)"},
      {&d.compute_major, cudaDevAttrComputeCapabilityMajor, "cudaDeviceGetAttribute(ComputeCapabilityMajor)"},
      {&d.l2_bytes, cudaDevAttrL2CacheSize, "cudaDeviceGetAttribute(L2CacheSize)"},
      {&cluster, cudaDevAttrClusterLaunch, "cudaDeviceGetAttribute(ClusterLaunch)"},
  };
  for (const auto& a : attrs)
    if (Status s = status_of(cudaDeviceGetAttribute(a.dst, a.attr, ordinal), op, a.name); !s) return s;
  d.cluster_launch = cluster != 0;
  if (ordinal < kDevices) {
    cache[ordinal] = d;
    known[ordinal] = true;
  }
  *out = d;
  return {};
}

Status allow_dynamic_smem(std::string_view op, const void* kernel, const DeviceInfo& dev, std::size_t bytes) {
  constexpr std::size_t kDefault = 48 * 1024;  // static and dynamic together, without the opt-in
  if (bytes == 0) return {};
  struct Allowed {
    bool asked = false;
    std::size_t static_bytes = 0, dynamic = 0;
  };
  using Key = std::pair<std::uintptr_t, int>;
  const Key key{reinterpret_cast<std::uintptr_t>(kernel), dev.ordinal};
  // What this thread has seen allowed stays allowed (the limit never falls), so every launch
  // after a thread's first for a kernel and size takes no lock.
  thread_local std::map<Key, std::size_t> seen;
  if (const auto it = seen.find(key); it != seen.end() && it->second >= bytes) return {};
  static std::mutex mu;
  static std::map<Key, Allowed> allowed;
  std::lock_guard<std::mutex> lock(mu);  // held across the driver calls: the limit never falls
  Allowed& now = allowed[key];
  if (!now.asked) {
    cudaFuncAttributes attr{};
    if (Status s = status_of(cudaFuncGetAttributes(&attr, kernel), op, "cudaFuncGetAttributes"); !s) return s;
    now.asked = true;
    now.static_bytes = attr.sharedSizeBytes;
  }
  if (bytes + now.static_bytes > kDefault && now.dynamic < bytes) {
    if (Status s = status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  static_cast<int>(bytes)),
                             op, "cudaFuncSetAttribute(MaxDynamicSharedMemorySize)");
        !s)
      return s;
    now.dynamic = bytes;
  }
  std::size_t& mine = seen[key];
  mine = std::max(mine, bytes);
  return {};
}

Status resident_clusters(std::string_view op, const void* kernel, const DeviceInfo& dev, int size, int threads,
                         int* clusters, std::size_t smem) {
  *clusters = 0;
  if (!dev.cluster_launch || size < 1) return {};
  using Key = std::tuple<std::uintptr_t, int, int, int, std::size_t>;
  static std::mutex mu;
  static std::map<Key, int> cache;
  const Key key{reinterpret_cast<std::uintptr_t>(kernel), dev.ordinal, size, threads, smem};
  {
    std::lock_guard<std::mutex> lock(mu);
    if (const auto it = cache.find(key); it != cache.end()) {
      *clusters = it->second;
      return {};
    }
  }
  cudaFuncAttributes attr{};
  if (Status s = status_of(cudaFuncGetAttributes(&attr, kernel), op, "cudaFuncGetAttributes"); !s) return s;
  int n = 0;
  if (attr.binaryVersion >= 90) {
    if (size > 8)
      if (Status s = status_of(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1), op,
                               "cudaFuncSetAttribute(NonPortableClusterSizeAllowed)");
          !s)
        return s;
    if (Status s = allow_dynamic_smem(op, kernel, dev, smem); !s) return s;
    cudaLaunchAttribute cluster;
    cudaLaunchConfig_t cfg = cluster_config(dim3(static_cast<unsigned>(size)), dim3(static_cast<unsigned>(threads)),
                                            size, smem, nullptr, &cluster);
    cfg.attrs = &cluster;  // a cluster of one is still asked as a cluster
    cfg.numAttrs = 1;
    // An invalid cluster size is an answer (none fit), and its error is cleared so that no later
    // call reports it.
    const cudaError_t e = cudaOccupancyMaxActiveClusters(&n, kernel, &cfg);
    if (e == cudaErrorInvalidClusterSize) {
      (void)cudaGetLastError();
      n = 0;
    } else if (Status s = status_of(e, op, "cudaOccupancyMaxActiveClusters"); !s) {
      return s;
    }
  }
  std::lock_guard<std::mutex> lock(mu);
  cache.emplace(key, n);
  *clusters = n;
  return {};
}

namespace {

// Stream-ordered scratch: freed on the same stream after the kernels that use it, so neither side
// waits for the device. The allocation comes from the stream's device's default memory pool.
void* allocate_on_stream(void* stream, Device, std::size_t bytes) {
  void* p = nullptr;
  if (cudaMallocAsync(&p, bytes, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void free_on_stream(void* stream, Device, void* p, std::size_t) {
  if (cudaFreeAsync(p, static_cast<cudaStream_t>(stream)) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace
}  // namespace gradops::cuda

namespace gradops::detail {

bool default_device_allocator(Device device, void* cuda_stream, WorkspaceAllocator* out) {
  if (device.type != DeviceType::cuda) return false;
  *out = {cuda::allocate_on_stream, cuda::free_on_stream, cuda_stream};
  return true;
}

Status check_cuda_device(std::string_view op, Device device) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status(StatusCode::device_error, std::string(op) + ": no usable CUDA device for a cuda:" +
                                                std::to_string(device.index) + " tensor (cudaGetDeviceCount: " +
                                                cudaGetErrorName(e) + ", " + cudaGetErrorString(e) + ")");
  }
  if (device.index >= count)
    return Status(StatusCode::invalid_argument, std::string(op) + ": tensors are on cuda:" +
                                                    std::to_string(device.index) + " but this machine has " +
                                                    std::to_string(count) + " CUDA device(s)");
  return {};
}

}  // namespace gradops::detail
