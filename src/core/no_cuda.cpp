// Linked when gradops is built without CUDA.
#include "gradops/context.hpp"

namespace gradops::detail {
bool default_device_allocator(Device, void*, WorkspaceAllocator*) { return false; }
}  // namespace gradops::detail
