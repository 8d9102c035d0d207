// Scratch memory from the Context's allocator (or the default one), released on scope exit.
#pragma once

#include <cstddef>

#include "gradops/context.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace();

  // Allocates `bytes` (64-byte aligned) on `device`; out_of_memory names `op` on failure.
  Status allocate(const Context& ctx, Device device, std::size_t bytes, std::string_view op);
  template <class T>
  T* as() const noexcept { return static_cast<T*>(ptr_); }

 private:
  WorkspaceAllocator alloc_{};
  Device device_{};
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace gradops::detail
