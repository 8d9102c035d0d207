// The C ABI: descriptors in, gradops::run, a status code and a thread-local message out.
#include "gradops/gradops.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "ops/op_call.hpp"

static_assert(GRADOPS_MAX_RANK == gradops::kMaxRank);
static_assert(GRADOPS_MAX_ARGS == gradops::kMaxArgs);
static_assert(GRADOPS_MAX_TYPE_VARS == std::tuple_size_v<decltype(gradops::TypeSignature::types)>);
static_assert(static_cast<int>(GRADOPS_INTERNAL) == static_cast<int>(gradops::StatusCode::internal));
static_assert(GRADOPS_DTYPE_BF16 == static_cast<int>(gradops::DType::bf16));
static_assert(GRADOPS_DEVICE_CUDA == static_cast<int>(gradops::DeviceType::cuda));

namespace {

using gradops::Status;
using gradops::StatusCode;

// A fixed buffer rather than a std::string so that recording an error can never itself fail.
thread_local char g_last_error[2048];

gradops_status to_c(StatusCode code) { return static_cast<gradops_status>(code); }

gradops_status record(gradops_status code, const char* message) noexcept {
  if (code == GRADOPS_OK)
    g_last_error[0] = '\0';  // success is every call's path: no formatting
  else
    std::snprintf(g_last_error, sizeof g_last_error, "%s", message);
  return code;
}
gradops_status record(const Status& s) noexcept { return record(to_c(s.code()), s.message().c_str()); }
gradops_status ok() noexcept { return record(GRADOPS_OK, ""); }

// Runs f(), which returns a gradops::Status, through the library's one exception boundary and
// records the outcome: nothing may unwind into C.
template <class F>
gradops_status guarded(std::string_view what, F&& f) noexcept {
  return record(gradops::detail::guarded(what, std::forward<F>(f)));
}

Status invalid(std::string message) { return Status(StatusCode::invalid_argument, std::move(message)); }

// The op table's strings are string literals, so their views end in a NUL and pass to C as is.
const char* c_str(std::string_view s) { return s.data(); }

const gradops::OpSchema* op_at(int32_t op, const char* fn) {
  if (op >= 0 && op < gradops::kNumOps) return &gradops::op_schemas()[static_cast<std::size_t>(op)];
  char m[160];
  std::snprintf(m, sizeof m, "%s: operator number %d is out of range [0, %d)", fn, static_cast<int>(op),
                gradops::kNumOps);
  record(GRADOPS_INVALID_ARGUMENT, m);
  return nullptr;
}

gradops_status index_error(const char* fn, const gradops::OpSchema& op, const char* what, int32_t index,
                           std::size_t count) {
  char m[256];
  std::snprintf(m, sizeof m, "%s: %.*s has %zu %s; index %d is out of range", fn, static_cast<int>(op.name.size()),
                op.name.data(), count, what, static_cast<int>(index));
  return record(GRADOPS_INVALID_ARGUMENT, m);
}

// One call's descriptors, converted and checked for what the C side can get wrong that a
// TensorView cannot express (codes out of range, shape pointers, strides).
struct Call {
  const gradops::OpSchema* op = nullptr;
  std::array<gradops::TensorView, gradops::kMaxArgs> in_views{}, out_views{};
  std::array<const gradops::TensorView*, gradops::kMaxArgs> in{}, out{};
  std::array<gradops::Attribute, gradops::kMaxAttrs * 2> attrs{};
  std::size_t num_in = 0, num_out = 0, num_attrs = 0;
};

Status convert_tensor(const gradops::OpSchema& op, const char* role, std::string_view name, const gradops_tensor& t,
                      gradops::TensorView* v) {
  // Messages are built only when a check fails: a call that passes allocates nothing here.
  auto who = [&] { return std::string(op.name) + ": " + role + " '" + std::string(name) + "'"; };
  if (t.rank < 0 || t.rank > GRADOPS_MAX_RANK)
    return invalid(who() + " has rank " + std::to_string(t.rank) + ", expected 0 to " +
                   std::to_string(GRADOPS_MAX_RANK));
  if (t.rank > 0 && !t.shape) return invalid(who() + " has rank " + std::to_string(t.rank) + " but a NULL shape");
  if (t.dtype < GRADOPS_DTYPE_F32 || t.dtype > GRADOPS_DTYPE_BF16)
    return invalid(who() + " has an unknown dtype code " + std::to_string(t.dtype));
  if (t.device.type != GRADOPS_DEVICE_CPU && t.device.type != GRADOPS_DEVICE_CUDA)
    return invalid(who() + " has an unknown device type " + std::to_string(t.device.type));
  const std::span<const int64_t> shape(t.shape, static_cast<std::size_t>(t.rank));
  // The dense strides of a tensor with elements all fit in int64. The dims of an empty one (or of
  // one too large, which gradops::run rejects by name) may multiply past it: the running product
  // stops there rather than overflow, and the outer strides go unchecked (they address nothing).
  if (t.strides) {
    int64_t expect = 1;
    for (int d = t.rank - 1; d >= 0; --d) {
      if (shape[d] != 1 && t.strides[d] != expect) {
        std::string s = "[";
        for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.strides[i]);
        return invalid(who() + " has strides " + s + "] that are not dense row-major; gradops needs contiguous "
                       "tensors (pass NULL strides for a dense one)");
      }
      if (__builtin_mul_overflow(expect, std::max<int64_t>(shape[d], 0), &expect)) break;
    }
  }
  // Constructed in place: a temporary copied into *v read its dims back with wide loads across
  // the narrow stores that had just written them, a stalled store forward per load (a fifth of a
  // tiny Gelu call in perf).
  std::construct_at(v, t.data, static_cast<gradops::DType>(t.dtype), shape,
                    gradops::Device{static_cast<gradops::DeviceType>(t.device.type), t.device.index});
  return {};
}

Status convert(const char* op_name, const gradops_tensor* const* inputs, size_t num_inputs,
               const gradops_tensor* const* outputs, size_t num_outputs, const gradops_attribute* attributes,
               size_t num_attributes, Call* c) {
  if (!op_name) return invalid("op_name is NULL");
  c->op = gradops::find_op(op_name);
  if (!c->op) return invalid("unknown operator '" + std::string(op_name) + "'");
  const gradops::OpSchema& op = *c->op;
  auto prefix = [&] { return std::string(op.name) + ": "; };  // only on failure
  if (num_inputs > op.inputs.size())
    return invalid(prefix() + std::to_string(num_inputs) + " inputs given, expected at most " +
                   std::to_string(op.inputs.size()));
  if (num_outputs > op.outputs.size())
    return invalid(prefix() + std::to_string(num_outputs) + " outputs given, expected at most " +
                   std::to_string(op.outputs.size()));
  if (num_inputs && !inputs)
    return invalid(prefix() + "inputs is NULL but num_inputs is " + std::to_string(num_inputs));
  if (num_outputs && !outputs)
    return invalid(prefix() + "outputs is NULL but num_outputs is " + std::to_string(num_outputs));
  if (num_attributes && !attributes)
    return invalid(prefix() + "attributes is NULL but num_attributes is " + std::to_string(num_attributes));
  // More attributes than any op has can only be a mistake (duplicates or unknown names); keep the
  // bound so the storage stays fixed, and let gradops::run name the problem when it is smaller.
  if (num_attributes > c->attrs.size())
    return invalid(prefix() + std::to_string(num_attributes) + " attributes given; this op takes " +
                   std::to_string(op.attributes.size()));
  for (size_t i = 0; i < num_inputs; ++i) {
    if (!inputs[i]) continue;
    if (Status s = convert_tensor(op, "input", op.inputs[i].name, *inputs[i], &c->in_views[i]); !s) return s;
    c->in[i] = &c->in_views[i];
  }
  for (size_t i = 0; i < num_outputs; ++i) {
    if (!outputs[i]) continue;
    if (Status s = convert_tensor(op, "output", op.outputs[i].name, *outputs[i], &c->out_views[i]); !s) return s;
    c->out[i] = &c->out_views[i];
  }
  for (size_t i = 0; i < num_attributes; ++i) {
    if (!attributes[i].name) return invalid(prefix() + "attribute " + std::to_string(i) + " has a NULL name");
    c->attrs[i] = {attributes[i].name, attributes[i].value};
  }
  c->num_in = num_inputs;
  c->num_out = num_outputs;
  c->num_attrs = num_attributes;
  return {};
}

// The C allocator behind gradops::WorkspaceAllocator: same shape, C device struct.
void* c_allocate(void* user, gradops::Device d, std::size_t bytes) {
  const auto* a = static_cast<const gradops_allocator*>(user);
  return a->allocate(a->user, gradops_device{static_cast<int32_t>(d.type), d.index}, bytes);
}
void c_deallocate(void* user, gradops::Device d, void* p, std::size_t bytes) {
  const auto* a = static_cast<const gradops_allocator*>(user);
  if (a->deallocate) a->deallocate(a->user, gradops_device{static_cast<int32_t>(d.type), d.index}, p, bytes);
}

struct CContext {
  gradops::Context ctx;
  gradops::WorkspaceAllocator alloc;
  explicit CContext(const gradops_context* c) {
    if (!c) return;
    ctx.num_threads = c->num_threads;
    ctx.cuda_stream = c->cuda_stream;
    if (c->allocator && c->allocator->allocate) {
      alloc = {c_allocate, c_deallocate, const_cast<gradops_allocator*>(c->allocator)};
      ctx.allocator = &alloc;
    }
  }
};

gradops_arg_info arg_info(const gradops::OpSchema& op, const gradops::ArgSchema& a) {
  return {c_str(a.name), c_str(op.type_vars[a.type_var]), c_str(a.doc), a.type_var, a.optional, a.extension};
}

}  // namespace

extern "C" {

const char* gradops_status_string(gradops_status code) GRADOPS_NOEXCEPT {
  // A C caller may pass any int (the header promises "unknown" outside the enum), but reading a C++
  // enum holding a value outside its range is undefined behaviour (UBSan: "load of value 42, which
  // is not a valid value for type 'gradops_status'"): compare its bits instead.
  std::underlying_type_t<gradops_status> bits;
  std::memcpy(&bits, &code, sizeof bits);
  const auto v = static_cast<long long>(bits);
  if (v < GRADOPS_OK || v > GRADOPS_INTERNAL) return "unknown";
  return gradops::status_code_name(static_cast<StatusCode>(v));
}

const char* gradops_last_error(void) GRADOPS_NOEXCEPT { return g_last_error; }

const char* gradops_dtype_name(int32_t dtype) GRADOPS_NOEXCEPT {
  if (dtype < GRADOPS_DTYPE_F32 || dtype > GRADOPS_DTYPE_BF16) return "unknown";
  return gradops::dtype_name(static_cast<gradops::DType>(dtype));
}

gradops_status gradops_run(const char* op_name, const gradops_tensor* const* inputs, size_t num_inputs,
                           const gradops_tensor* const* outputs, size_t num_outputs,
                           const gradops_attribute* attributes, size_t num_attributes,
                           const gradops_context* ctx) GRADOPS_NOEXCEPT {
  return guarded(op_name ? op_name : "gradops_run", [&] {
    Call c;
    if (Status s = convert(op_name, inputs, num_inputs, outputs, num_outputs, attributes, num_attributes, &c); !s)
      return s;
    const CContext cc(ctx);
    // gradops::run without its second lookup of the op by name (and second guard).
    return gradops::detail::run_op(*c.op, {c.in.data(), c.num_in}, {c.out.data(), c.num_out},
                                   {c.attrs.data(), c.num_attrs}, cc.ctx);
  });
}

gradops_status gradops_implementation_name(const char* op_name, const gradops_tensor* const* inputs,
                                           size_t num_inputs, const gradops_tensor* const* outputs,
                                           size_t num_outputs, const gradops_attribute* attributes,
                                           size_t num_attributes, const gradops_context* ctx, char* name,
                                           size_t capacity) GRADOPS_NOEXCEPT {
  return guarded(op_name ? op_name : "gradops_implementation_name", [&] {
    if (!name || capacity == 0) return invalid("gradops_implementation_name: name is NULL or capacity is 0");
    name[0] = '\0';
    Call c;
    if (Status s = convert(op_name, inputs, num_inputs, outputs, num_outputs, attributes, num_attributes, &c); !s)
      return s;
    const CContext cc(ctx);
    std::string impl;
    const Status s = gradops::implementation_name(c.op->name, {c.in.data(), c.num_in}, {c.out.data(), c.num_out},
                                                  {c.attrs.data(), c.num_attrs}, cc.ctx, &impl);
    if (s) std::snprintf(name, capacity, "%s", impl.c_str());
    return s;
  });
}

gradops_status gradops_infer_output_shapes(const char* op_name, const gradops_tensor* const* inputs,
                                           size_t num_inputs, const gradops_attribute* attributes,
                                           size_t num_attributes, int64_t* output_dims, int32_t* output_ranks,
                                           int32_t* output_dtypes, size_t num_outputs) GRADOPS_NOEXCEPT {
  return guarded(op_name ? op_name : "gradops_infer_output_shapes", [&] {
    Call c;
    if (Status s = convert(op_name, inputs, num_inputs, nullptr, 0, attributes, num_attributes, &c); !s) return s;
    const gradops::OpSchema& op = *c.op;
    if (num_outputs < op.outputs.size())
      return invalid(std::string(op.name) + ": num_outputs is " + std::to_string(num_outputs) + ", the op has " +
                     std::to_string(op.outputs.size()) + " outputs");
    if (!output_dims || !output_ranks)
      return invalid(std::string(op.name) + ": output_dims or output_ranks is NULL");
    std::array<gradops::TensorSpec, gradops::kMaxArgs> specs{};
    if (Status s = gradops::infer_output_shapes(op.name, {c.in.data(), c.num_in}, {c.attrs.data(), c.num_attrs},
                                                specs);
        !s)
      return s;
    for (std::size_t o = 0; o < num_outputs; ++o) {
      const bool has = o < op.outputs.size();
      output_ranks[o] = has ? specs[o].rank : -1;
      if (output_dtypes) output_dtypes[o] = has ? static_cast<int32_t>(specs[o].dtype) : -1;
      for (int d = 0; d < GRADOPS_MAX_RANK; ++d)
        output_dims[o * GRADOPS_MAX_RANK + static_cast<std::size_t>(d)] = has && d < specs[o].rank ? specs[o].dims[d] : 0;
    }
    return Status{};
  });
}

gradops_status gradops_supports(int32_t op, int32_t device_type, const int32_t* dtypes, size_t num_dtypes,
                                int32_t* supported) GRADOPS_NOEXCEPT {
  return guarded("gradops_supports", [&] {
    if (!supported) return invalid("gradops_supports: supported is NULL");
    *supported = 0;
    if (op < 0 || op >= gradops::kNumOps)
      return invalid("gradops_supports: operator number " + std::to_string(op) + " is out of range [0, " +
                     std::to_string(gradops::kNumOps) + ")");
    const gradops::OpSchema& s = gradops::op_schemas()[static_cast<std::size_t>(op)];
    if (device_type != GRADOPS_DEVICE_CPU && device_type != GRADOPS_DEVICE_CUDA)
      return invalid("gradops_supports: unknown device type " + std::to_string(device_type));
    const auto device = static_cast<gradops::DeviceType>(device_type);
    if (!dtypes && num_dtypes == 0) {
      *supported = gradops::supports(s.id, device);
      return Status{};
    }
    if (!dtypes || num_dtypes != s.type_vars.size())
      return invalid("gradops_supports: " + std::string(s.name) + " has " + std::to_string(s.type_vars.size()) +
                     " type variables; dtypes must hold that many (or be NULL with num_dtypes 0 for any signature)");
    gradops::TypeSignature sig{};
    for (std::size_t v = 0; v < num_dtypes; ++v) {
      if (dtypes[v] < GRADOPS_DTYPE_F32 || dtypes[v] > GRADOPS_DTYPE_BF16)
        return invalid("gradops_supports: dtypes[" + std::to_string(v) + "] is an unknown dtype code " +
                       std::to_string(dtypes[v]));
      sig.types[v] = static_cast<gradops::DType>(dtypes[v]);
    }
    *supported = gradops::supports(s.id, sig, device);
    return Status{};
  });
}

int32_t gradops_op_count(void) GRADOPS_NOEXCEPT { return gradops::kNumOps; }

const char* gradops_op_name(int32_t op) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_name");
  if (!s) return nullptr;
  ok();
  return c_str(s->name);
}

int32_t gradops_op_find(const char* name) GRADOPS_NOEXCEPT {
  if (name)
    if (const gradops::OpSchema* s = gradops::find_op(name)) {
      ok();
      return static_cast<int32_t>(s->id);
    }
  char m[256];
  std::snprintf(m, sizeof m, "gradops_op_find: unknown operator '%.200s'", name ? name : "(NULL)");
  record(GRADOPS_INVALID_ARGUMENT, m);
  return -1;
}

gradops_status gradops_op_get_info(int32_t op, gradops_op_info* info) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_info");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (!info) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_info: info is NULL");
  *info = {c_str(s->name),
           c_str(s->domain),
           gradops::op_family_name(s->family),
           c_str(s->summary),
           s->since_version,
           s->gradient,
           static_cast<int32_t>(s->inputs.size()),
           static_cast<int32_t>(s->outputs.size()),
           static_cast<int32_t>(s->attributes.size()),
           static_cast<int32_t>(s->type_vars.size()),
           static_cast<int32_t>(s->signatures.size()),
           static_cast<int32_t>(s->aliases.size()),
           gradops::op_origin_name(s->origin)};
  return ok();
}

gradops_status gradops_op_get_input(int32_t op, int32_t index, gradops_arg_info* info) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_input");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (index < 0 || static_cast<std::size_t>(index) >= s->inputs.size())
    return index_error("gradops_op_get_input", *s, "inputs", index, s->inputs.size());
  if (!info) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_input: info is NULL");
  *info = arg_info(*s, s->inputs[index]);
  return ok();
}

gradops_status gradops_op_get_output(int32_t op, int32_t index, gradops_arg_info* info) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_output");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (index < 0 || static_cast<std::size_t>(index) >= s->outputs.size())
    return index_error("gradops_op_get_output", *s, "outputs", index, s->outputs.size());
  if (!info) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_output: info is NULL");
  *info = arg_info(*s, s->outputs[index]);
  return ok();
}

gradops_status gradops_op_get_attribute(int32_t op, int32_t index, gradops_attribute_info* info) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_attribute");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (index < 0 || static_cast<std::size_t>(index) >= s->attributes.size())
    return index_error("gradops_op_get_attribute", *s, "attributes", index, s->attributes.size());
  if (!info) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_attribute: info is NULL");
  const gradops::AttrSchema& a = s->attributes[index];
  *info = {c_str(a.name),
           c_str(a.doc),
           a.default_value,
           a.type == gradops::AttrType::int64 ? GRADOPS_ATTRIBUTE_INT : GRADOPS_ATTRIBUTE_FLOAT,
           a.required,
           a.extension};
  return ok();
}

gradops_status gradops_op_get_type_var(int32_t op, int32_t index, const char** name) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_type_var");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (index < 0 || static_cast<std::size_t>(index) >= s->type_vars.size())
    return index_error("gradops_op_get_type_var", *s, "type variables", index, s->type_vars.size());
  if (!name) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_type_var: name is NULL");
  *name = c_str(s->type_vars[index]);
  return ok();
}

gradops_status gradops_op_get_signature(int32_t op, int32_t index,
                                        int32_t dtypes[GRADOPS_MAX_TYPE_VARS]) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_signature");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (index < 0 || static_cast<std::size_t>(index) >= s->signatures.size())
    return index_error("gradops_op_get_signature", *s, "signatures", index, s->signatures.size());
  if (!dtypes) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_signature: dtypes is NULL");
  for (std::size_t v = 0; v < GRADOPS_MAX_TYPE_VARS; ++v)
    dtypes[v] = v < s->type_vars.size() ? static_cast<int32_t>(s->signatures[index].types[v]) : -1;
  return ok();
}

gradops_status gradops_op_get_alias(int32_t op, int32_t index, int32_t* output, int32_t* input) GRADOPS_NOEXCEPT {
  const gradops::OpSchema* s = op_at(op, "gradops_op_get_alias");
  if (!s) return GRADOPS_INVALID_ARGUMENT;
  if (index < 0 || static_cast<std::size_t>(index) >= s->aliases.size())
    return index_error("gradops_op_get_alias", *s, "alias rules", index, s->aliases.size());
  if (!output || !input) return record(GRADOPS_INVALID_ARGUMENT, "gradops_op_get_alias: output or input is NULL");
  *output = s->aliases[index].output;
  *input = s->aliases[index].input;
  return ok();
}

}  // extern "C"
