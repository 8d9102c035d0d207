#include "support/checker.hpp"

#include <cmath>
#include <cstring>
#include <sstream>

namespace gradops::check {
namespace {

// Storage for one tensor: 64-byte aligned base, optionally offset by one element.
struct Buffer {
  std::vector<std::byte> bytes;
  std::size_t offset = 0;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;

  Buffer(DType t, std::vector<int64_t> s, bool misaligned) : dtype(t), shape(std::move(s)) {
    const std::size_t es = dtype_size(t);
    bytes.resize(static_cast<std::size_t>(count()) * es + 64 + es);
    const auto base = reinterpret_cast<uintptr_t>(bytes.data());
    offset = ((64 - base % 64) % 64) + (misaligned ? es : 0);
  }
  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  void* data() { return bytes.data() + offset; }
  TensorView view(Device dev) { return TensorView(data(), dtype, std::span<const int64_t>(shape), dev); }

  void set(int64_t i, double v) {
    std::byte* p = static_cast<std::byte*>(data()) + i * dtype_size(dtype);
    switch (dtype) {
      case DType::f32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DType::f64: std::memcpy(p, &v, 8); break;
      case DType::f16: { const half h(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DType::bf16: { const bfloat16 h(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    }
  }
  double get(int64_t i) {
    const std::byte* p = static_cast<const std::byte*>(data()) + i * dtype_size(dtype);
    switch (dtype) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
      case DType::f64: { double d; std::memcpy(&d, p, 8); return d; }
      case DType::f16: { half h; std::memcpy(&h, p, 2); return static_cast<float>(h); }
      case DType::bf16: { bfloat16 h; std::memcpy(&h, p, 2); return static_cast<float>(h); }
    }
    return 0;
  }
  // Every byte 0xFF: a NaN in every float format, so an unwritten element cannot pass.
  void poison() { std::memset(data(), 0xFF, static_cast<std::size_t>(count()) * dtype_size(dtype)); }
};

bool within(double actual, double expected, const Tolerance& tol, double* err, double* bound) {
  *bound = tol.abs + tol.rel * std::fabs(expected);
  if (std::isnan(expected) || std::isnan(actual)) {
    *err = std::isnan(expected) && std::isnan(actual) ? 0 : INFINITY;
    return std::isnan(expected) && std::isnan(actual);
  }
  if (std::isinf(expected) || std::isinf(actual)) {
    *err = actual == expected ? 0 : INFINITY;
    return actual == expected;
  }
  *err = std::fabs(actual - expected);
  return *err <= *bound;
}

}  // namespace

DType input_dtype(const Problem& p, int i) {
  const OpSchema& op = op_schema(p.op);
  return p.sig.types[op.inputs[i].type_var];
}
DType output_dtype(const Problem& p, int i) {
  const OpSchema& op = op_schema(p.op);
  return p.sig.types[op.outputs[i].type_var];
}

oracle::Attrs full_attrs(const Problem& p) {
  oracle::Attrs a;
  for (const AttrSchema& s : op_schema(p.op).attributes) a[std::string(s.name)] = s.default_value;
  for (const auto& [k, v] : p.attrs) a[k] = v;
  for (const AttrSchema& s : op_schema(p.op).attributes)  // FLOAT attributes are f32, as gradops sees them
    if (s.type == AttrType::float32) a[std::string(s.name)] = static_cast<float>(a[std::string(s.name)]);
  return a;
}

std::string describe(const Problem& p) {
  const OpSchema& op = op_schema(p.op);
  std::ostringstream s;
  s << op.name << " (";
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) s << (v ? "," : "") << dtype_name(p.sig.types[v]);
  s << ") [";
  for (std::size_t i = 0; i < p.shape.size(); ++i) s << (i ? "," : "") << p.shape[i];
  s << "]";
  for (const auto& [k, v] : p.attrs) s << " " << k << "=" << v;
  if (p.misaligned) s << " misaligned";
  if (p.inplace) s << " inplace";
  if (p.threads) s << " threads=" << p.threads;
  return s.str();
}

Report run_case(const Problem& p) {
  Report r;
  const OpSchema& op = op_schema(p.op);
  const oracle::Attrs attrs = full_attrs(p);
  oracle::Rng rng(p.seed);

  std::vector<DType> in_types;
  for (std::size_t i = 0; i < op.inputs.size(); ++i) in_types.push_back(input_dtype(p, static_cast<int>(i)));
  const oracle::Tensors inputs = oracle::make_inputs(op.name, p.shape, attrs, in_types, rng);
  const oracle::Tensors expected = oracle::reference(op.name, inputs, attrs);

  std::vector<std::optional<Buffer>> in_buf(op.inputs.size()), out_buf(op.outputs.size());
  std::vector<TensorView> in_view(op.inputs.size()), out_view(op.outputs.size());
  std::vector<const TensorView*> in_ptr(op.inputs.size(), nullptr), out_ptr(op.outputs.size(), nullptr);
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    if (i >= inputs.size() || !inputs[i]) continue;
    in_buf[i].emplace(in_types[i], inputs[i]->shape, p.misaligned);
    for (int64_t e = 0; e < inputs[i]->numel(); ++e) in_buf[i]->set(e, inputs[i]->v[e]);
    in_view[i] = in_buf[i]->view(p.device);
    in_ptr[i] = &in_view[i];
  }
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    const bool skip = o < p.skip_output.size() && p.skip_output[o];
    if (skip || o >= expected.size() || !expected[o]) continue;
    out_buf[o].emplace(output_dtype(p, static_cast<int>(o)), expected[o]->shape, p.misaligned);
    out_buf[o]->poison();
    out_view[o] = out_buf[o]->view(p.device);
    out_ptr[o] = &out_view[o];
  }
  if (p.inplace) out_view[0].data = in_view[0].data;  // the caller checked the alias rule applies

  std::vector<Attribute> attr_list;
  for (const auto& [k, v] : attrs) attr_list.push_back({k, v});
  Context ctx;
  ctx.num_threads = p.threads;
  r.status = run(op.name, in_ptr, out_ptr, attr_list, ctx);
  if (!r.status) {
    r.detail = r.status.to_string();
    return r;
  }

  r.pass = true;
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    if (!out_ptr[o]) {
      r.outputs.emplace_back();
      continue;
    }
    Buffer& b = (p.inplace && o == 0) ? *in_buf[0] : *out_buf[o];
    const Tolerance tol = tolerance(p, static_cast<int>(o));
    std::vector<double> got(static_cast<std::size_t>(b.count()));
    for (int64_t e = 0; e < b.count(); ++e) {
      got[e] = b.get(e);
      double err, bound;
      const bool ok = within(got[e], expected[o]->v[e], tol, &err, &bound);
      const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
      if (ratio > r.worst_ratio || (!ok && r.pass)) {
        r.worst_ratio = ratio;
        r.max_error = err;
        r.tolerance = bound;
        r.worst = std::string(op.outputs[o].name) + "[" + std::to_string(e) + "]";
      }
      if (!ok && r.pass) {
        r.pass = false;
        std::ostringstream s;
        s.precision(17);
        s << describe(p) << ": " << op.outputs[o].name << "[" << e << "] = " << got[e] << ", expected "
          << expected[o]->v[e] << " (error " << err << " > tolerance " << bound << ")";
        r.detail = s.str();
      }
    }
    r.outputs.push_back(std::move(got));
  }
  return r;
}

}  // namespace gradops::check
