// The checks every op shares, in the order a user would want to hear about them, and the hand-off
// to the op's family. Nothing here or in a family's op layer writes to an output.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>

#include "gradops/ops.hpp"
#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {
namespace {

std::string signature_string(const OpSchema& op, const TypeSignature& s) {
  std::string r = "(";
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) {
    if (v) r += ", ";
    r += dtype_name(s.types[v]);
  }
  return r + ")";
}

std::string allowed_signatures(const OpSchema& op) {
  std::string r;
  for (const TypeSignature& s : op.signatures) r += (r.empty() ? "" : " ") + signature_string(op, s);
  return r;
}

std::string number_string(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

// v rounded to f32 (to nearest, ties to even) as a double, without the out-of-range conversion
// that C++ leaves undefined: beyond the largest float, halfway to the next power of two rounds up
// to infinity.
double as_f32(double v) {
  const double fmax = std::numeric_limits<float>::max();
  if (std::fabs(v) <= fmax) return static_cast<double>(static_cast<float>(v));
  const double halfway = fmax + std::ldexp(1.0, 103);  // the largest float plus half its ulp
  if (std::fabs(v) < halfway) return std::copysign(fmax, v);
  return std::copysign(std::numeric_limits<double>::infinity(), v);
}

// "a finite value >= 0", "a value in [0, 1]", "1": the schema's range in words.
std::string range_string(const AttrSchema& s) {
  const double fmax = std::numeric_limits<float>::max();
  const bool lo = s.min > -fmax, hi = s.max < fmax;
  if (s.type == AttrType::int64 && s.min == s.max) return number_string(s.min);
  if (!lo && !hi) return s.type == AttrType::int64 ? "an integer" : "a finite value";
  const std::string kind = s.type == AttrType::int64 ? "an integer" : "a finite value";
  if (!hi) return kind + (s.min_open ? " > " : " >= ") + number_string(s.min);
  if (!lo) return kind + (s.max_open ? " < " : " <= ") + number_string(s.max);
  return std::string(s.type == AttrType::int64 ? "an integer" : "a value") + " in " + (s.min_open ? "(" : "[") +
         number_string(s.min) + ", " + number_string(s.max) + (s.max_open ? ")" : "]");
}

// Every attribute is checked here, once, for every op and every entry point: the name must be one
// the op has (a misspelling must not silently run with the default), each given once, of its type,
// within the range the op table documents.
Status check_attributes(OpCall& c, std::span<const Attribute> attributes) {
  const OpSchema& op = *c.op;
  std::array<bool, kMaxAttrs> given{};
  for (std::size_t i = 0; i < op.attributes.size(); ++i) c.attr[i] = op.attributes[i].default_value;
  for (const Attribute& a : attributes) {
    const int i = op.find_attribute(a.name);
    if (i < 0) {
      std::string known;
      for (const AttrSchema& s : op.attributes) known += (known.empty() ? "" : ", ") + std::string(s.name);
      return invalid(c, "unknown attribute '" + std::string(a.name) + "' (this op takes " +
                            (known.empty() ? std::string("none") : known) + ")");
    }
    const AttrSchema& s = op.attributes[i];
    // Built only on failure: the success path of a small call should not allocate.
    auto who = [&] { return "attribute '" + std::string(a.name) + "'"; };
    if (given[i]) return invalid(c, who() + " is given twice");
    given[i] = true;
    if (std::isnan(a.value)) return invalid(c, who() + " is NaN, expected " + range_string(s) + " (" + std::string(s.doc) + ")");
    double v = a.value;
    if (s.type == AttrType::int64) {
      if (!(std::nearbyint(v) == v) || std::fabs(v) > 9.0e15)
        return invalid(c, who() + " must be an integer, got " + number_string(v));
    } else {
      v = as_f32(v);  // FLOAT attributes are f32
    }
    if (!s.in_range(v) || std::isinf(v))
      return invalid(c, who() + " is " + number_string(a.value) +
                            (v != a.value && !std::isinf(v) ? " (" + number_string(v) + " as f32)" : std::string()) +
                            (std::isinf(v) && !std::isinf(a.value) ? " (infinite as f32)" : std::string()) +
                            ", expected " + range_string(s) + " (" + std::string(s.doc) + ")");
    c.attr[i] = v;
  }
  for (std::size_t i = 0; i < op.attributes.size(); ++i)
    if (op.attributes[i].required && !given[i])
      return invalid(c, "required attribute '" + std::string(op.attributes[i].name) + "' is missing");
  return {};
}

Status check_tensor(const OpCall& c, const char* role, std::string_view name, const TensorView& t,
                    bool shapes_only) {
  auto who = [&] { return std::string(role) + " '" + std::string(name) + "'"; };  // only on failure
  if (t.rank < 0 || t.rank > kMaxRank)
    return invalid(c, who() + " has rank " + std::to_string(t.rank) + ", expected 0 to " +
                          std::to_string(kMaxRank));
  if (static_cast<unsigned>(t.dtype) > static_cast<unsigned>(DType::bf16))
    return invalid(c, who() + " has an unknown dtype code " + std::to_string(static_cast<int>(t.dtype)));
  for (int d = 0; d < t.rank; ++d)
    if (t.dims[d] < 0)
      return invalid(c, who() + " has a negative dimension: shape " + shape_string(t.shape()));
  if (t.nbytes() < 0)
    return invalid(c, who() + " with shape " + shape_string(t.shape()) +
                          " has more elements than fit in 64-bit byte offsets");
  if (!shapes_only && t.data == nullptr && t.numel() > 0)
    return invalid(c, who() + " has null data but " + std::to_string(t.numel()) + " elements");
  if (t.device.type != DeviceType::cpu && t.device.type != DeviceType::cuda)
    return invalid(c, who() + " has an unknown device type");
  if (t.device.type == DeviceType::cpu && t.device.index != 0)
    return invalid(c, who() + " is on cpu:" + std::to_string(t.device.index) + "; the CPU device index must be 0");
  if (t.device.type == DeviceType::cuda && t.device.index < 0)
    return invalid(c, who() + " is on cuda:" + std::to_string(t.device.index) +
                          "; a CUDA device index must be >= 0");
  return {};
}

bool overlaps(const TensorView& a, const TensorView& b) {
  const int64_t na = a.nbytes(), nb = b.nbytes();
  if (na <= 0 || nb <= 0 || !(a.device == b.device)) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a.data), pb = reinterpret_cast<uintptr_t>(b.data);
  return pa < pb + static_cast<uintptr_t>(nb) && pb < pa + static_cast<uintptr_t>(na);
}

bool alias_allowed(const OpSchema& op, int out, int in, const TensorView& o, const TensorView& i) {
  for (const AliasRule& r : op.aliases)
    if (r.output == out && r.input == in)
      return o.data == i.data && o.dtype == i.dtype && o.nbytes() == i.nbytes();
  return false;
}

Status check_aliasing(const OpCall& c) {
  const OpSchema& op = *c.op;
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    if (!c.out[o]) continue;
    for (std::size_t i = 0; i < op.inputs.size(); ++i) {
      if (!c.in[i] || !overlaps(*c.out[o], *c.in[i])) continue;
      if (alias_allowed(op, static_cast<int>(o), static_cast<int>(i), *c.out[o], *c.in[i])) continue;
      return invalid(c, "output '" + std::string(c.out_name(o)) + "' overlaps input '" +
                            std::string(c.in_name(i)) + "'" +
                            (op.aliases.empty() ? std::string()
                                                : std::string(" (only the exact same buffer is allowed "
                                                              "for the documented in-place pairs)")));
    }
    for (std::size_t o2 = 0; o2 < o; ++o2)
      if (c.out[o2] && overlaps(*c.out[o], *c.out[o2]))
        return invalid(c, "outputs '" + std::string(c.out_name(o2)) + "' and '" +
                              std::string(c.out_name(o)) + "' overlap");
  }
  return {};
}

Status check_types(OpCall& c) {
  const OpSchema& op = *c.op;
  constexpr int kUnset = -1;
  // One slot per type variable a signature can hold (T, T1, T2 and the split's S).
  constexpr std::size_t kVars = std::tuple_size_v<decltype(TypeSignature::types)>;
  std::array<int, kVars> var;
  var.fill(kUnset);
  std::array<std::string_view, kVars> first{};
  auto visit = [&](const ArgSchema& a, const TensorView* t) -> Status {
    if (!t) return {};
    int& v = var[a.type_var];
    if (v == kUnset) {
      v = static_cast<int>(t->dtype);
      first[a.type_var] = a.name;
    } else if (v != static_cast<int>(t->dtype)) {
      return invalid(c, "'" + std::string(a.name) + "' has dtype " + dtype_name(t->dtype) + " but '" +
                            std::string(first[a.type_var]) + "' (same type " +
                            std::string(op.type_vars[a.type_var]) + ") has " +
                            dtype_name(static_cast<DType>(v)));
    }
    return {};
  };
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    if (Status s = visit(op.inputs[i], c.in[i]); !s) return s;
  for (std::size_t i = 0; i < op.outputs.size(); ++i)
    if (Status s = visit(op.outputs[i], c.out[i]); !s) return s;
  // Type variables that only optional, absent tensors carry (U of a forward LayerNorm without
  // statistics) match any signature.
  for (const TypeSignature& s : op.signatures) {
    bool match = true;
    for (std::size_t v = 0; v < op.type_vars.size(); ++v)
      match = match && (var[v] == kUnset || var[v] == static_cast<int>(s.types[v]));
    if (match) {
      c.types = s.types;
      return {};
    }
  }
  // Name the tensor that set each type variable, so the message points at the arguments.
  std::string got;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v)
    got += std::string(v ? ", " : "") + std::string(op.type_vars[v]) + " = " +
           (var[v] == kUnset ? std::string("any")
                             : std::string(dtype_name(static_cast<DType>(var[v]))) + " from '" +
                                   std::string(first[v]) + "'");
  std::string vars;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) vars += std::string(v ? ", " : "") + std::string(op.type_vars[v]);
  return invalid(c, "dtype combination (" + got + ") is not supported; allowed (" + vars +
                        "): " + allowed_signatures(op));
}

}  // namespace

std::string shape_string(std::span<const int64_t> shape) {
  std::string r = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) r += (i ? ", " : "") + std::to_string(shape[i]);
  return r + "]";
}

Status invalid(const OpCall& c, const std::string& message) {
  return Status(StatusCode::invalid_argument, std::string(c.op->name) + ": " + message);
}

Status require_same_shape(const OpCall& c, std::string_view what, const TensorView& t,
                          std::string_view ref_name, const TensorView& ref) {
  bool same = t.rank == ref.rank;
  for (int d = 0; same && d < t.rank; ++d) same = t.dims[d] == ref.dims[d];
  if (same) return {};
  return invalid(c, "'" + std::string(what) + "' has shape " + shape_string(t.shape()) + ", expected " +
                        shape_string(ref.shape()) + " (the shape of '" + std::string(ref_name) + "')");
}

Status normalize_axis(const OpCall& c, int64_t axis, int rank, int* out) {
  if (axis < -rank || axis >= rank)
    return invalid(c, "attribute 'axis' is " + std::to_string(axis) + ", expected a value in [" +
                          std::to_string(-rank) + ", " + std::to_string(rank - 1) + "] for rank " +
                          std::to_string(rank));
  *out = static_cast<int>(axis < 0 ? axis + rank : axis);
  return {};
}

int64_t dims_product(const TensorView& t, int begin, int end) {
  // A validated tensor with elements has a product that fits in int64, and so has every part of
  // it; only an empty tensor's other dims can multiply past it, and with no elements 0 is as good a
  // count as any.
  int64_t p = 1;
  for (int d = begin; d < end; ++d)
    if (__builtin_mul_overflow(p, t.dims[d], &p)) return 0;
  return p;
}

namespace {

// How much of a call prepare() checks: everything, or (infer_output_shapes) the inputs alone,
// without their data pointers.
enum class Check : uint8_t { call, inputs_only };

Status prepare(OpCall& c, const OpSchema& op, std::span<const TensorView* const> inputs,
               std::span<const TensorView* const> outputs, std::span<const Attribute> attributes, Check check) {
  c.op = &op;
  const bool shapes_only = check == Check::inputs_only;
  if (inputs.size() > op.inputs.size())
    return invalid(c, std::to_string(inputs.size()) + " inputs given, expected at most " +
                          std::to_string(op.inputs.size()));
  if (outputs.size() > op.outputs.size())
    return invalid(c, std::to_string(outputs.size()) + " outputs given, expected at most " +
                          std::to_string(op.outputs.size()));
  for (std::size_t i = 0; i < inputs.size(); ++i) c.in[i] = inputs[i];
  for (std::size_t i = 0; i < outputs.size(); ++i) c.out[i] = outputs[i];
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    if (!c.in[i] && !op.inputs[i].optional)
      return invalid(c, "required input '" + std::string(op.inputs[i].name) + "' is missing");
  if (!shapes_only)
    for (std::size_t i = 0; i < op.outputs.size(); ++i)
      if (!c.out[i] && !op.outputs[i].optional)
        return invalid(c, "required output '" + std::string(op.outputs[i].name) + "' is missing");
  if (Status s = check_attributes(c, attributes); !s) return s;

  bool have_device = false;
  std::string device_owner;
  auto check_all = [&](const char* role, std::span<const ArgSchema> schema,
                       const std::array<const TensorView*, kMaxArgs>& ts) -> Status {
    for (std::size_t i = 0; i < schema.size(); ++i) {
      if (!ts[i]) continue;
      if (Status s = check_tensor(c, role, schema[i].name, *ts[i], shapes_only); !s) return s;
      if (!have_device) {
        c.device = ts[i]->device;
        device_owner = schema[i].name;
        have_device = true;
      } else if (!(ts[i]->device == c.device)) {
        auto where = [](Device d) {
          return std::string(device_type_name(d.type)) + ":" + std::to_string(d.index);
        };
        return invalid(c, std::string(role) + " '" + std::string(schema[i].name) + "' is on " +
                              where(ts[i]->device) + " but '" + device_owner + "' is on " + where(c.device) +
                              "; all tensors of a call must be on one device");
      }
    }
    return {};
  };
  if (Status s = check_all("input", op.inputs, c.in); !s) return s;
  if (Status s = check_all("output", op.outputs, c.out); !s) return s;
  if (Status s = check_types(c); !s) return s;
  if (shapes_only) return {};  // shapes need neither data, outputs nor a driver
  if (Status s = check_aliasing(c); !s) return s;
  // Running and resolving (implementation_name) must agree: a CUDA call without a usable driver or
  // with an ordinal past the device count fails the same way in both, before any dispatch.
  if (c.device.type == DeviceType::cuda)
    if (Status s = check_cuda_device(op.name, c.device); !s) return s;
  return {};
}

Status run_family(const OpCall& c, const Context& ctx) {
  switch (c.op->family) {
    case OpFamily::activation: return run_activation(c, ctx);
    case OpFamily::softmax: return run_softmax(c, ctx);
    case OpFamily::layer_norm: return run_layer_norm(c, ctx);
    case OpFamily::batch_norm: return run_batch_norm(c, ctx);
  }
  return Status(StatusCode::internal, std::string(c.op->name) + ": unknown op family");
}

// Sets a dry run for this thread and restores the caller's on the way out.
class DryRun {
 public:
  explicit DryRun(Resolution* r) : outer_(resolution_slot()) { resolution_slot() = r; }
  ~DryRun() { resolution_slot() = outer_; }
  DryRun(const DryRun&) = delete;
  DryRun& operator=(const DryRun&) = delete;

 private:
  Resolution* outer_;
};

// The shape of output `o` by its rule (ArgSchema::shape). Out-of-range axes give some shape here;
// the family's checks then reject the call with their own message.
TensorSpec output_spec(const OpCall& c, int o) {
  const ArgSchema& a = c.op->outputs[static_cast<std::size_t>(o)];
  const TensorView& src = c.input(a.shape.input);
  TensorSpec t;
  t.dtype = c.types[a.type_var];
  t.rank = std::min(src.rank, kMaxRank);
  for (int d = 0; d < t.rank; ++d) t.dims[d] = src.dims[d];
  if (a.shape.kind == ShapeRule::channel_sums) {
    t.rank = 1;
    t.dims[0] = src.rank == 1 ? 2 * src.dims[0] + 1 : 1;  // another shape is rejected by the family
  }
  if (a.shape.kind == ShapeRule::rows_of_input) {
    const double axis = c.attribute("axis", -1);
    const int64_t first = axis < 0 ? static_cast<int64_t>(axis) + t.rank : static_cast<int64_t>(axis);
    for (int d = 0; d < t.rank; ++d)
      if (d >= first) t.dims[d] = 1;
  }
  return t;
}

}  // namespace

std::span<const RowInfo> family_rows(OpFamily f) {
  switch (f) {
    case OpFamily::activation: return activation_rows();
    case OpFamily::softmax: return softmax_rows();
    case OpFamily::layer_norm: return layer_norm_rows();
    case OpFamily::batch_norm: return batch_norm_rows();
  }
  return {};
}

Status run_op(const OpSchema& op, std::span<const TensorView* const> inputs,
              std::span<const TensorView* const> outputs, std::span<const Attribute> attributes,
              const Context& ctx) {
  OpCall c;
  if (Status s = prepare(c, op, inputs, outputs, attributes, Check::call); !s) return s;
  return run_family(c, ctx);
}

}  // namespace gradops::detail

namespace gradops {
namespace {

// The op table's signature equal to `sig` in the op's type variables, or nullptr.
const TypeSignature* listed_signature(const OpSchema& op, const TypeSignature& sig) {
  for (const TypeSignature& s : op.signatures) {
    bool same = true;
    for (std::size_t v = 0; v < op.type_vars.size(); ++v) same = same && s.types[v] == sig.types[v];
    if (same) return &s;
  }
  return nullptr;
}

Status unknown_op(std::string_view op_name) {
  return Status(StatusCode::invalid_argument, "unknown operator '" + std::string(op_name) + "'");
}

}  // namespace

Status run(std::string_view op_name, std::span<const TensorView* const> inputs,
           std::span<const TensorView* const> outputs, std::span<const Attribute> attributes,
           const Context& ctx) {
  return detail::guarded(op_name, [&] {
    const OpSchema* op = find_op(op_name);
    if (!op) return unknown_op(op_name);
    return detail::run_op(*op, inputs, outputs, attributes, ctx);
  });
}

Status implementation_name(std::string_view op_name, std::span<const TensorView* const> inputs,
                           std::span<const TensorView* const> outputs, std::span<const Attribute> attributes,
                           const Context& ctx, std::string* name) {
  return detail::guarded(op_name, [&] {
    name->clear();
    detail::Resolution resolution;
    Status s;
    {
      const detail::DryRun dry(&resolution);
      s = run(op_name, inputs, outputs, attributes, ctx);  // catches everything
    }
    if (s && resolution.impl) {
      *name = resolution.impl;
      // As the dispatch log names it: the SIMD target chosen for this processor, where the row has one.
      if (resolution.target) *name += std::string(" [") + resolution.target + "]";
    }
    return s;
  });
}

Status infer_output_shapes(std::string_view op_name, std::span<const TensorView* const> inputs,
                           std::span<const Attribute> attributes, std::span<TensorSpec> outputs) {
  return detail::guarded(op_name, [&] {
    const OpSchema* op = find_op(op_name);
    if (!op) return unknown_op(op_name);
    detail::OpCall c;
    if (Status s = detail::prepare(c, *op, inputs, {}, attributes, detail::Check::inputs_only); !s) return s;
    if (outputs.size() < op->outputs.size())
      return detail::invalid(c, "room for " + std::to_string(outputs.size()) + " output shapes, the op has " +
                                    std::to_string(op->outputs.size()) + " outputs");
    // Every output at its inferred shape, then the family's shape rules over the whole call.
    std::array<TensorSpec, kMaxArgs> specs{};
    std::array<TensorView, kMaxArgs> views{};
    for (std::size_t o = 0; o < op->outputs.size(); ++o) {
      specs[o] = detail::output_spec(c, static_cast<int>(o));
      views[o] = TensorView(nullptr, specs[o].dtype, specs[o].shape(), c.device);
      c.out[o] = &views[o];
    }
    detail::Resolution validate;
    validate.validate_only = true;
    Status s;
    {
      const detail::DryRun dry(&validate);
      s = detail::run_family(c, Context{});
    }
    if (!s) return s;
    std::copy(specs.begin(), specs.begin() + static_cast<std::ptrdiff_t>(op->outputs.size()), outputs.begin());
    return Status{};
  });
}

bool supports(OpId op, const TypeSignature& signature, DeviceType device) noexcept {
  if (static_cast<int>(op) >= kNumOps) return false;
  const OpSchema& s = op_schema(op);
  const TypeSignature* sig = listed_signature(s, signature);
  if (!sig) return false;
  for (const detail::RowInfo& r : detail::family_rows(s.family))
    if (r.covers(op, *sig, device)) return true;
  return false;
}

bool supports(OpId op, DeviceType device) noexcept {
  if (static_cast<int>(op) >= kNumOps) return false;
  for (const TypeSignature& sig : op_schema(op).signatures)
    if (supports(op, sig, device)) return true;
  return false;
}

std::vector<std::string> implementations(OpId op, const TypeSignature& signature, DeviceType device) {
  std::vector<std::string> names;
  if (static_cast<int>(op) >= kNumOps) return names;
  const OpSchema& s = op_schema(op);
  const TypeSignature* sig = listed_signature(s, signature);
  if (!sig) return names;
  for (const detail::RowInfo& r : detail::family_rows(s.family))
    if (r.covers(op, *sig, device)) names.emplace_back(r.name);
  return names;
}

}  // namespace gradops
