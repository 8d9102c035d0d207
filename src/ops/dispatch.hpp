// Implementation lists: for each family an ordered array of implementations; the first whose
// device matches and whose supports() accepts the descriptor runs. GRADOPS_VERBOSE=dispatch
// prints which ran and why earlier ones declined.
#pragma once

#include <span>
#include <string_view>

#include "gradops/context.hpp"
#include "gradops/status.hpp"
#include "gradops/types.hpp"

namespace gradops::detail {

template <class Desc>
struct Impl {
  const char* name;  // "cpu:scalar", "cuda:warp_per_row", ...
  DeviceType device;
  // nullptr accepts everything; otherwise returns nullptr to accept or the reason it declines.
  const char* (*declines)(const Desc&);
  Status (*run)(const Desc&, const Context&);
};

bool verbose_dispatch();
void log_dispatch(std::string_view op, const char* impl, const char* verdict);

// While implementation_name() resolves a call, dispatch() records the implementation it would run
// here instead of running it. Dispatch is the last step of every op layer, so a resolved call has
// been validated in full and no tensor data has been read or written.
struct Resolution {
  const char* impl = nullptr;
};
inline Resolution*& resolution_slot() noexcept {
  static thread_local Resolution* slot = nullptr;  // this thread's; nullptr: calls run normally
  return slot;
}

template <class Desc>
Status dispatch(std::span<const Impl<Desc>> impls, std::string_view op, Device device, const Desc& desc,
                const Context& ctx) {
  const bool verbose = verbose_dispatch();
  const Impl<Desc>* last_declined = nullptr;
  const char* last_why = nullptr;
  for (const Impl<Desc>& impl : impls) {
    if (impl.device != device.type) continue;
    if (const char* why = impl.declines ? impl.declines(desc) : nullptr) {
      if (verbose) log_dispatch(op, impl.name, why);
      last_declined = &impl;
      last_why = why;
      continue;
    }
    if (Resolution* r = resolution_slot()) {
      if (verbose) log_dispatch(op, impl.name, "selected (not run: implementation_name)");
      if (!r->impl) r->impl = impl.name;  // an op that dispatches twice reports its first
      return {};
    }
    if (verbose) log_dispatch(op, impl.name, "runs");
    return impl.run(desc, ctx);
  }
#if defined(GRADOPS_HAVE_CUDA)
  constexpr bool have_cuda = true;
#else
  constexpr bool have_cuda = false;
#endif
  // Every implementation of the device declined: the last one's reason (a pointer not aligned to
  // its element size, say) is the one no implementation could get past.
  if (last_declined)
    return Status(StatusCode::unimplemented, std::string(op) + ": no implementation for these " +
                                                 device_type_name(device.type) + " tensors (" + last_declined->name +
                                                 " " + last_why + ")");
  return Status(StatusCode::unimplemented,
                std::string(op) + ": no implementation for " + device_type_name(device.type) +
                    " tensors in this build" +
                    (device.type == DeviceType::cuda && !have_cuda ? " (gradops was built without CUDA)" : ""));
}

}  // namespace gradops::detail
