// Linked when gradops is built without CUDA.
#include <string_view>

#include "gradops/context.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {
bool default_device_allocator(Device, void*, WorkspaceAllocator*) { return false; }
Status check_cuda_device(std::string_view, Device) { return {}; }
}  // namespace gradops::detail
