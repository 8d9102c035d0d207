#include "core/workspace.hpp"

#include <cstdint>
#include <new>
#include <string>

namespace gradops::detail {
namespace {

void* host_allocate(void*, Device, std::size_t bytes) {
  return ::operator new(bytes, std::align_val_t{64}, std::nothrow);
}
void host_deallocate(void*, Device, void* p, std::size_t) { ::operator delete(p, std::align_val_t{64}); }

// Small host scratch comes from a per-thread block instead: on tiny tensors an aligned malloc and
// free of a few KiB (which also consolidates the heap) was a tenth of a whole call.
constexpr std::size_t kSmallBytes = 16 * 1024;

struct SmallBlock {
  alignas(64) unsigned char bytes[kSmallBytes];
  bool busy = false;  // held by a live Workspace of this thread (a kernel may hold two)
};

thread_local SmallBlock t_small;

// user: the allocating thread's block, so that the release finds it from any thread.
void* small_allocate(void* user, Device, std::size_t bytes) {
  auto* block = static_cast<SmallBlock*>(user);
  // The heap where the block is taken, too small, or (a loader not honouring the TLS alignment)
  // not 64-byte aligned.
  if (block->busy || bytes > kSmallBytes || reinterpret_cast<std::uintptr_t>(block->bytes) % 64 != 0)
    return host_allocate(nullptr, Device::cpu(), bytes);
  block->busy = true;
  return block->bytes;
}
void small_deallocate(void* user, Device, void* p, std::size_t bytes) {
  auto* block = static_cast<SmallBlock*>(user);
  if (p == block->bytes) {
    block->busy = false;
    return;
  }
  host_deallocate(nullptr, Device::cpu(), p, bytes);
}

}  // namespace

// Defined by the CUDA backend when it is built (stream-ordered allocations on `cuda_stream`);
// returns false otherwise.
bool default_device_allocator(Device device, void* cuda_stream, WorkspaceAllocator* out);

Status Workspace::allocate(const Context& ctx, Device device, std::size_t bytes, std::string_view op) {
  if (ctx.allocator && ctx.allocator->allocate) {
    alloc_ = *ctx.allocator;
  } else if (device.type == DeviceType::cpu) {
    alloc_ = {small_allocate, small_deallocate, &t_small};
  } else if (!default_device_allocator(device, ctx.cuda_stream, &alloc_)) {
    return Status(StatusCode::unimplemented, std::string(op) + ": no allocator for this device");
  }
  device_ = device;
  bytes_ = bytes;
  ptr_ = bytes ? alloc_.allocate(alloc_.user, device, bytes) : nullptr;
  if (bytes && !ptr_)
    return Status(StatusCode::out_of_memory,
                  std::string(op) + ": could not allocate " + std::to_string(bytes) + " bytes of scratch");
  return {};
}

Workspace::~Workspace() {
  if (ptr_ && alloc_.deallocate) alloc_.deallocate(alloc_.user, device_, ptr_, bytes_);
}

}  // namespace gradops::detail
