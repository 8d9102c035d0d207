// OpCall: one call of an operator after the checks that every op shares (arity, attributes,
// dtypes against the signatures, devices, null data, size overflow, aliasing). Each family's
// op-layer file turns it into that family's descriptor and checks the shape rules.
#pragma once

#include <array>
#include <exception>
#include <new>
#include <string>

#include "gradops/context.hpp"
#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"

namespace gradops::detail {

struct OpCall {
  const OpSchema* op = nullptr;
  std::array<const TensorView*, kMaxArgs> in{};   // nullptr: optional input absent
  std::array<const TensorView*, kMaxArgs> out{};  // nullptr: optional output not wanted
  std::array<double, kMaxAttrs> attr{};           // by schema index, defaults filled in
  std::array<DType, 4> types{};                   // the matched signature, by type variable
  Device device{};                                // the device of every tensor

  const TensorView& input(int i) const { return *in[i]; }
  const TensorView& output(int i) const { return *out[i]; }
  bool has_input(int i) const { return in[i] != nullptr; }
  bool has_output(int i) const { return out[i] != nullptr; }
  // The attribute's value (the default when the call did not give it), or `absent` when the op has
  // no attribute of that name: a family asking every op of the family for "alpha" gets `absent`
  // from those that have none, never a read outside the array.
  double attribute(std::string_view name, double absent = 0) const {
    const int i = op->find_attribute(name);
    return i >= 0 ? attr[static_cast<std::size_t>(i)] : absent;
  }
  TypeSignature signature() const { return TypeSignature{types}; }
  std::string_view in_name(int i) const { return op->inputs[i].name; }
  std::string_view out_name(int i) const { return op->outputs[i].name; }
};

// "[2, 3, 4]"
std::string shape_string(std::span<const int64_t> shape);

// invalid_argument with "<op>: <message>".
Status invalid(const OpCall& c, const std::string& message);
// invalid_argument "<op>: <what> has shape [..], expected [..]" when the shapes differ.
Status require_same_shape(const OpCall& c, std::string_view what, const TensorView& t,
                          std::string_view ref_name, const TensorView& ref);
// Normalizes axis into [0, rank) or fails naming the op and the attribute.
Status normalize_axis(const OpCall& c, int64_t axis, int rank, int* out);
// Product of dims [begin, end).
int64_t dims_product(const TensorView& t, int begin, int end);

// ok when `device` (a CUDA device) is usable: device_error without a working driver or device,
// invalid_argument for an ordinal past the device count. ok in a build without CUDA, whose dispatch
// then reports the call as unimplemented. (src/cuda/runtime.cu, src/core/no_cuda.cpp)
Status check_cuda_device(std::string_view op, Device device);

// Family entry points (src/ops/<family>.cpp): shape rules, descriptor, dispatch.
Status run_activation(const OpCall& c, const Context& ctx);
Status run_softmax(const OpCall& c, const Context& ctx);
Status run_layer_norm(const OpCall& c, const Context& ctx);
Status run_batch_norm(const OpCall& c, const Context& ctx);

// The shared checks, then the family. Entry for the per-op functions, `run` and the C ABI.
Status run_op(const OpSchema& op, std::span<const TensorView* const> inputs,
              std::span<const TensorView* const> outputs, std::span<const Attribute> attributes,
              const Context& ctx);

// out_of_memory, made when the library loads, so that returning it needs no memory.
const Status& out_of_memory_status() noexcept;

// The one exception boundary of the C++ API (the C ABI goes through it too): runs f(), which
// returns a Status, and turns anything it throws into one naming `what`.
template <class F>
Status guarded(std::string_view what, F&& f) noexcept {
  try {
    try {
      return f();
    } catch (const std::bad_alloc&) {
      return Status(StatusCode::out_of_memory, std::string(what) + ": out of host memory");
    } catch (const std::exception& e) {
      return Status(StatusCode::internal, std::string(what) + ": " + e.what());
    } catch (...) {
      return Status(StatusCode::internal, std::string(what) + ": unknown exception");
    }
  } catch (...) {
    return out_of_memory_status();  // building the message itself failed: no memory left for it
  }
}

}  // namespace gradops::detail
