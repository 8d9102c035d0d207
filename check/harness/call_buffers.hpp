// A call of any operator built from the op table and the oracle, with every buffer owned here and
// fenced by guard bytes: the cross-cutting tests (bad input, typed API) describe a call as data,
// change one thing, run it, and check that no byte outside what the call may write has changed.
#pragma once

#include <cstddef>
#include <cstring>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "harness/host_tensor.hpp"
#include "oracle/oracle.hpp"

namespace gradops::testing {

struct ArgSpec {
  bool present = false;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  Device device = Device::cpu();
};

// Everything that defines a call; tests copy it and change one field.
struct CallSpec {
  const OpSchema* op = nullptr;
  std::vector<ArgSpec> in, out;
  std::vector<std::pair<std::string, double>> attrs;  // passed to `run` as given, in this order
  std::vector<std::vector<double>> in_values;         // the oracle's inputs, for the valid shapes
};

inline int64_t count_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Every attribute of the op with its default (a required one gets `required_value`), then the
// overrides.
inline oracle::Attrs full_attributes(const OpSchema& op, const oracle::Attrs& overrides, double required_value = 1e-5) {
  oracle::Attrs a;
  for (const AttrSchema& s : op.attributes) a[std::string(s.name)] = s.required ? required_value : s.default_value;
  for (const auto& [k, v] : overrides) a[k] = v;
  for (const AttrSchema& s : op.attributes)  // FLOAT attributes reach the library as f32
    if (s.type == AttrType::float32) a[std::string(s.name)] = static_cast<float>(a[std::string(s.name)]);
  return a;
}

// A valid call of `op` on main shape `shape` with signature `sig`: inputs from the oracle, every
// output (optional ones too) in the shape the oracle gives it. Throws if the oracle lacks the op.
inline CallSpec valid_call(const OpSchema& op, const std::vector<int64_t>& shape, const TypeSignature& sig,
                           const oracle::Attrs& overrides = {}, uint64_t seed = 1) {
  CallSpec c;
  c.op = &op;
  const oracle::Attrs attrs = full_attributes(op, overrides);
  for (const auto& [k, v] : attrs) c.attrs.emplace_back(k, v);
  std::vector<DType> in_types;
  for (const ArgSchema& a : op.inputs) in_types.push_back(sig.types[a.type_var]);
  oracle::Rng rng(seed);
  const oracle::Tensors inputs = oracle::make_inputs(op.name, shape, attrs, in_types, rng);
  const oracle::Tensors outputs = oracle::reference(op.name, inputs, attrs);
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    ArgSpec a;
    a.dtype = in_types[i];
    if (i < inputs.size() && inputs[i]) {
      a.present = true;
      a.shape = inputs[i]->shape;
      c.in_values.push_back(inputs[i]->v);
    } else {
      c.in_values.emplace_back();
    }
    c.in.push_back(a);
  }
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    ArgSpec a;
    a.dtype = sig.types[op.outputs[o].type_var];
    if (o < outputs.size() && outputs[o]) {
      a.present = true;
      a.shape = outputs[o]->shape;
    }
    c.out.push_back(a);
  }
  return c;
}

using check::store;

// The byte every untouched location must hold: varies with the position so that a shifted or
// partial write shows.
inline std::byte pattern_byte(std::size_t buffer, std::size_t i) {
  return static_cast<std::byte>((0x5Au + 37u * buffer + 13u * i) & 0xFFu);
}

// Owned storage for a CallSpec. Each tensor's data lies between kGuard bytes of pattern on both
// sides; inputs hold the oracle's values (cycled when a test changed the shape), outputs and
// guards hold the pattern.
class CallBuffers {
 public:
  static constexpr std::size_t kGuard = 64;

  explicit CallBuffers(const CallSpec& spec) : spec_(spec) {
    const std::size_t ni = spec.in.size(), no = spec.out.size();
    in_store_.resize(ni);
    out_store_.resize(no);
    in_view.resize(ni);
    out_view.resize(no);
    in_ptr.assign(ni, nullptr);
    out_ptr.assign(no, nullptr);
    for (std::size_t i = 0; i < ni; ++i) {
      const ArgSpec& a = spec.in[i];
      if (!a.present) continue;
      auto& s = in_store_[i];
      make(s, a, i);
      const std::vector<double>& v = spec.in_values[i];
      const int64_t n = count_of(a.shape);
      for (int64_t e = 0; e < n; ++e)
        store(a.dtype, s.data() + kGuard + e * dtype_size(a.dtype),
              v.empty() ? 0.5 : v[static_cast<std::size_t>(e) % v.size()]);
      in_view[i] = TensorView(s.data() + kGuard, a.dtype, std::span<const int64_t>(a.shape), a.device);
      in_ptr[i] = &in_view[i];
    }
    for (std::size_t o = 0; o < no; ++o) {
      const ArgSpec& a = spec.out[o];
      if (!a.present) continue;
      make(out_store_[o], a, ni + o);
      out_view[o] = TensorView(out_store_[o].data() + kGuard, a.dtype, std::span<const int64_t>(a.shape), a.device);
      out_ptr[o] = &out_view[o];
    }
    in_snapshot_ = in_store_;
    out_snapshot_ = out_store_;
    for (const auto& [k, v] : spec_.attrs) attrs.push_back({k, v});
  }
  CallBuffers(const CallBuffers&) = delete;
  CallBuffers& operator=(const CallBuffers&) = delete;

  Status run(const Context& ctx = {}) const { return gradops::run(spec_.op->name, in_ptr, out_ptr, attrs, ctx); }

  // An extra region for overlap tests: `bytes` of pattern, compared like the others.
  std::byte* arena(std::size_t bytes) {
    arena_.resize(bytes + 2 * kGuard);
    for (std::size_t i = 0; i < arena_.size(); ++i) arena_[i] = pattern_byte(99, i);
    return arena_.data() + kGuard;
  }
  // Call after filling the arena with whatever the test placed there.
  void snapshot_arena() { arena_snapshot_ = arena_; }

  // Empty if no byte changed in any buffer or guard; else where the first change is.
  std::string changed_bytes() const {
    auto diff = [](const std::vector<std::vector<std::byte>>& now, const std::vector<std::vector<std::byte>>& then,
                   const char* role, const std::vector<ArgSchema>& names) -> std::string {
      for (std::size_t b = 0; b < now.size(); ++b)
        for (std::size_t i = 0; i < now[b].size(); ++i)
          if (now[b][i] != then[b][i])
            return std::string(role) + " '" + std::string(names[b].name) + "' byte " +
                   std::to_string(static_cast<long long>(i) - static_cast<long long>(kGuard)) + " changed";
      return {};
    };
    const std::vector<ArgSchema> ins(spec_.op->inputs.begin(), spec_.op->inputs.end());
    const std::vector<ArgSchema> outs(spec_.op->outputs.begin(), spec_.op->outputs.end());
    if (std::string d = diff(in_store_, in_snapshot_, "input", ins); !d.empty()) return d;
    if (std::string d = diff(out_store_, out_snapshot_, "output", outs); !d.empty()) return d;
    for (std::size_t i = 0; i < arena_.size() && i < arena_snapshot_.size(); ++i)
      if (arena_[i] != arena_snapshot_[i]) return "overlap region byte " + std::to_string(i) + " changed";
    return {};
  }

  // The bytes of output o's data (not its guards).
  std::vector<std::byte> output_bytes(std::size_t o) const {
    const auto& s = out_store_[o];
    return {s.begin() + kGuard, s.end() - kGuard};
  }
  // Whether every byte of output o's data differs from the pattern somewhere, element by element:
  // empty if each element was written, else the first element still holding the pattern.
  std::string unwritten_element(std::size_t o) const {
    const auto& s = out_store_[o];
    const std::size_t es = dtype_size(spec_.out[o].dtype), n = (s.size() - 2 * kGuard) / es;
    for (std::size_t e = 0; e < n; ++e)
      if (std::memcmp(s.data() + kGuard + e * es, out_snapshot_[o].data() + kGuard + e * es, es) == 0)
        return std::string(spec_.op->outputs[o].name) + "[" + std::to_string(e) + "]";
    return {};
  }
  // Guards of every buffer unchanged (a valid call may write only its outputs' data).
  std::string changed_guards() const {
    for (std::size_t b = 0; b < out_store_.size(); ++b) {
      const auto& s = out_store_[b];
      if (s.empty()) continue;
      for (std::size_t i = 0; i < kGuard; ++i)
        if (s[i] != out_snapshot_[b][i] || s[s.size() - 1 - i] != out_snapshot_[b][s.size() - 1 - i])
          return "guard of output '" + std::string(spec_.op->outputs[b].name) + "' changed";
    }
    for (std::size_t b = 0; b < in_store_.size(); ++b)
      if (in_store_[b] != in_snapshot_[b]) return "input '" + std::string(spec_.op->inputs[b].name) + "' changed";
    return {};
  }

  std::vector<TensorView> in_view, out_view;
  std::vector<const TensorView*> in_ptr, out_ptr;
  std::vector<Attribute> attrs;

 private:
  void make(std::vector<std::byte>& s, const ArgSpec& a, std::size_t id) {
    s.resize(static_cast<std::size_t>(count_of(a.shape)) * dtype_size(a.dtype) + 2 * kGuard);
    for (std::size_t i = 0; i < s.size(); ++i) s[i] = pattern_byte(id, i);
  }

  CallSpec spec_;  // owns the attribute names that `attrs` points into
  std::vector<std::vector<std::byte>> in_store_, out_store_, in_snapshot_, out_snapshot_;
  std::vector<std::byte> arena_, arena_snapshot_;
};

}  // namespace gradops::testing
