// Implementation lists: for each family an ordered array of rows; the first row whose device
// matches, that implements the call's (op, signature), and whose declines() accepts the descriptor
// runs. GRADOPS_VERBOSE=dispatch prints which ran and why earlier ones declined.
//
// A row's `implements` is the static truth behind supports(), implementations() and `gradops
// list`: a backend that covers only some ops or signatures of a family says which here, and
// dispatch never offers it anything else. Adding a backend or a kernel is adding a row.
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string_view>

#include "gradops/context.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"
#include "gradops/types.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {

// True when a row implements `op` with `signature` (the call's matched op-table signature).
using ImplementsFn = bool (*)(OpId op, const TypeSignature& signature);

template <class Desc>
struct Impl {
  const char* name;  // "cpu:simd", "cuda:warp_per_row", ...: names one kernel choice
  DeviceType device;
  // nullptr accepts every call it implements; otherwise returns nullptr to accept or the reason it
  // declines this call (sizes, alignment, ...).
  const char* (*declines)(const Desc&);
  Status (*run)(const Desc&, const Context&);
  // nullptr: every op and every signature of the family.
  ImplementsFn implements = nullptr;
  // The SIMD target the row runs on for this processor ("AVX3"), shown after its name in the
  // dispatch log and by implementation_name; nullptr where the row has none.
  const char* (*target)() = nullptr;
};

// The part of a row that does not depend on the descriptor: what the static queries read.
struct RowInfo {
  const char* name;
  DeviceType device;
  ImplementsFn implements;

  bool covers(OpId op, const TypeSignature& sig, DeviceType d) const {
    return device == d && (!implements || implements(op, sig));
  }
};

template <class Desc, std::size_t N>
constexpr std::array<RowInfo, N> row_infos(const Impl<Desc> (&impls)[N]) {
  std::array<RowInfo, N> r{};
  for (std::size_t i = 0; i < N; ++i) r[i] = {impls[i].name, impls[i].device, impls[i].implements};
  return r;
}

// Each family's rows (src/ops/<family>.cpp), and the family's by OpFamily (src/ops/run.cpp).
std::span<const RowInfo> activation_rows();
std::span<const RowInfo> softmax_rows();
std::span<const RowInfo> layer_norm_rows();
std::span<const RowInfo> batch_norm_rows();
std::span<const RowInfo> family_rows(OpFamily f);

// The CPU backend's SIMD target for this processor (src/cpu/simd.cpp): CPU rows' `target`.
const char* cpu_simd_target();

bool verbose_dispatch();
// `target`, when given, is printed after the row's name: "cpu:simd [AVX3]".
void log_dispatch(std::string_view op, const char* impl, const char* verdict, const char* target = nullptr);

// A dry run, set for the calling thread by implementation_name() and infer_output_shapes().
// Dispatch is the last step of every op layer, so a call that reaches it has been validated in
// full, and no tensor data has been read or written. validate_only stops there; otherwise the row
// that would run is recorded instead of run.
struct Resolution {
  bool validate_only = false;
  const char* impl = nullptr;
  const char* target = nullptr;
};
inline Resolution*& resolution_slot() noexcept {
  static thread_local Resolution* slot = nullptr;  // this thread's; nullptr: calls run normally
  return slot;
}

template <class Desc>
Status dispatch(std::span<const Impl<Desc>> impls, const OpCall& c, const Desc& desc, const Context& ctx) {
  Resolution* const dry = resolution_slot();
  if (dry && dry->validate_only) return {};
  const bool verbose = verbose_dispatch();
  const std::string_view op = c.op->name;
  const TypeSignature sig{c.types};
  const Impl<Desc>* last_declined = nullptr;
  const char* last_why = nullptr;
  for (const Impl<Desc>& impl : impls) {
    if (impl.device != c.device.type) continue;
    // The SIMD target's name only where it is printed or reported: finding it asks the CPU (CPUID,
    // which traps to the hypervisor in a VM), tens of microseconds that a small call must not pay.
    const char* target = impl.target && (verbose || dry) ? impl.target() : nullptr;
    if (impl.implements && !impl.implements(c.op->id, sig)) {
      if (verbose) log_dispatch(op, impl.name, "does not implement this op and signature", target);
      continue;
    }
    if (const char* why = impl.declines ? impl.declines(desc) : nullptr) {
      if (verbose) log_dispatch(op, impl.name, why, target);
      last_declined = &impl;
      last_why = why;
      continue;
    }
    if (dry) {
      if (verbose) log_dispatch(op, impl.name, "selected (not run: implementation_name)", target);
      if (!dry->impl) {  // an op that dispatches twice reports its first
        dry->impl = impl.name;
        dry->target = target;
      }
      return {};
    }
    if (verbose) log_dispatch(op, impl.name, "runs", target);
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
                                                 device_type_name(c.device.type) + " tensors (" + last_declined->name +
                                                 " " + last_why + ")");
  return Status(StatusCode::unimplemented,
                std::string(op) + ": no implementation for " + device_type_name(c.device.type) +
                    " tensors in this build" +
                    (c.device.type == DeviceType::cuda && !have_cuda ? " (gradops was built without CUDA)" : ""));
}

}  // namespace gradops::detail
