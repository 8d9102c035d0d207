#include "harness/checker.hpp"
#include "harness/host_tensor.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>

namespace gradops::check {

void FreeHost::operator()(std::byte* p) const noexcept { std::free(p); }

HostBytes allocate_host(std::size_t bytes) {
  constexpr std::size_t kHuge = std::size_t{2} << 20;
  const std::size_t align = bytes >= kHuge ? kHuge : 64, size = (std::max<std::size_t>(bytes, 1) + align - 1) / align * align;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(align, size));
  if (!p) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  if (align == kHuge) madvise(p, size, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
#endif
  std::memset(p, 0, size);
  return HostBytes(p);
}

namespace {

// Host storage for one tensor: 64-byte aligned base, optionally offset by one element; mirrored on
// the device when the problem runs on one.
struct Buffer {
  HostBytes bytes;
  std::size_t offset = 0;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const DeviceMemory* dev = nullptr;
  std::byte* dev_base = nullptr;

  Buffer(DType t, std::vector<int64_t> s, bool misaligned, int misalign_bytes, const DeviceMemory* d)
      : dtype(t), shape(std::move(s)), dev(d) {
    const std::size_t es = dtype_size(t), extra = es + static_cast<std::size_t>(misalign_bytes % 64);
    bytes = allocate_host(nbytes() + 64 + extra);
    const auto base = reinterpret_cast<uintptr_t>(bytes.get());
    offset = ((64 - base % 64) % 64) + (misaligned ? es : 0) + static_cast<std::size_t>(misalign_bytes % 64);
    if (dev) dev_base = static_cast<std::byte*>(dev->allocate(nbytes() + 64 + extra));
  }
  ~Buffer() {
    if (dev_base) dev->release(dev_base);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  int64_t count() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  std::size_t nbytes() const { return static_cast<std::size_t>(count()) * dtype_size(dtype); }
  std::byte* host() { return bytes.get() + offset; }
  // Device allocations are aligned at least as strongly as the host's 64 bytes; keep the offset's
  // misalignment part only.
  void* device_ptr() { return dev ? dev_base + offset % 64 : host(); }
  TensorView view(Device d) { return TensorView(device_ptr(), dtype, std::span<const int64_t>(shape), d); }
  void upload() {
    if (dev) dev->to_device(device_ptr(), host(), nbytes());
  }
  void download() {
    if (dev) dev->to_host(host(), device_ptr(), nbytes());
  }

  void set(int64_t i, double v) { store(dtype, host() + i * dtype_size(dtype), v); }
  double get(int64_t i) { return load(dtype, host() + i * dtype_size(dtype)); }
  void poison() {
    std::memset(host(), 0xFF, nbytes());
    upload();
  }
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

struct Case::Impl {
  Problem p;
  const OpSchema* op;
  oracle::Attrs attrs;
  oracle::Tensors expected;
  std::vector<std::unique_ptr<Buffer>> in_buf, out_buf;
  std::vector<TensorView> in_view, out_view;
  std::vector<const TensorView*> in_ptr, out_ptr;
  std::vector<Attribute> attr_list;
};

Case::Case(const Problem& p) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.p = p;
  m.op = &op_schema(p.op);
  const OpSchema& op = *m.op;
  m.attrs = full_attrs(p);
  oracle::Rng rng(p.seed);
  const DeviceMemory* dev = p.device.type == DeviceType::cpu ? nullptr : device_memory(p.device.type);

  std::vector<DType> in_types;
  for (std::size_t i = 0; i < op.inputs.size(); ++i) in_types.push_back(input_dtype(p, static_cast<int>(i)));
  oracle::Tensors inputs = oracle::make_inputs(op.name, p.shape, m.attrs, in_types, rng);
  if (p.edit_inputs) p.edit_inputs(inputs);
  m.expected = oracle::reference(op.name, inputs, m.attrs);

  m.in_buf.resize(op.inputs.size());
  m.out_buf.resize(op.outputs.size());
  m.in_view.resize(op.inputs.size());
  m.out_view.resize(op.outputs.size());
  m.in_ptr.assign(op.inputs.size(), nullptr);
  m.out_ptr.assign(op.outputs.size(), nullptr);
  for (std::size_t i = 0; i < op.inputs.size(); ++i) {
    if (i >= inputs.size() || !inputs[i]) continue;
    m.in_buf[i] = std::make_unique<Buffer>(in_types[i], inputs[i]->shape, p.misaligned, p.misalign_bytes, dev);
    for (int64_t e = 0; e < inputs[i]->numel(); ++e) m.in_buf[i]->set(e, inputs[i]->v[e]);
    m.in_buf[i]->upload();
    m.in_view[i] = m.in_buf[i]->view(p.device);
    m.in_ptr[i] = &m.in_view[i];
  }
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    const bool skip = o < p.skip_output.size() && p.skip_output[o];
    if (skip || o >= m.expected.size() || !m.expected[o]) continue;
    m.out_buf[o] = std::make_unique<Buffer>(output_dtype(p, static_cast<int>(o)), m.expected[o]->shape,
                                            p.misaligned, p.misalign_bytes, dev);
    m.out_view[o] = m.out_buf[o]->view(p.device);
    m.out_ptr[o] = &m.out_view[o];
  }
  if (p.inplace) m.out_view[0].data = m.in_view[0].data;  // the caller checked the alias rule applies
  for (const auto& [k, v] : m.attrs) m.attr_list.push_back({k, v});
}

namespace {
// The shape of each tensor of `p` as the oracle makes them (inputs, then outputs), for a main shape
// with `rows` rows.
std::vector<std::vector<int64_t>> tensor_shapes(const Problem& p, int64_t rows) {
  Problem q = p;
  q.shape[0] = rows;
  const OpSchema& op = op_schema(p.op);
  const oracle::Attrs attrs = full_attrs(q);
  std::vector<DType> in_types;
  for (std::size_t i = 0; i < op.inputs.size(); ++i) in_types.push_back(input_dtype(q, static_cast<int>(i)));
  oracle::Rng rng(1);
  const oracle::Tensors inputs = oracle::make_inputs(op.name, q.shape, attrs, in_types, rng);
  const oracle::Tensors outputs = oracle::reference(op.name, inputs, attrs);
  std::vector<std::vector<int64_t>> shapes;
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    shapes.push_back(i < inputs.size() && inputs[i] ? inputs[i]->shape : std::vector<int64_t>{});
  for (std::size_t o = 0; o < op.outputs.size(); ++o)
    shapes.push_back(o < outputs.size() && outputs[o] ? outputs[o]->shape : std::vector<int64_t>{});
  return shapes;
}
}  // namespace

std::unique_ptr<Case> Case::tiled(const Problem& p, const Case& checked) {
  const Impl& c = *checked.impl_;
  if (p.shape.empty() || c.p.shape.empty() || c.p.op != p.op || c.p.device != p.device)
    throw std::invalid_argument("Case::tiled: not the same op on the same device with rows");
  // Which dimension of each tensor follows the rows: the one that differs between 1 and 2 rows.
  const auto one = tensor_shapes(p, 1), two = tensor_shapes(p, 2);
  std::unique_ptr<Case> t(new Case());
  Impl& m = *t->impl_;
  m.p = p;
  m.p.misaligned = false;
  m.op = c.op;
  m.attrs = c.attrs;
  for (const auto& [k, v] : m.attrs) m.attr_list.push_back({k, v});  // names point into m.attrs
  const OpSchema& op = *m.op;
  const DeviceMemory* dev = p.device.type == DeviceType::cpu ? nullptr : device_memory(p.device.type);
  auto shape_at = [&](std::size_t k) {
    std::vector<int64_t> s = one[k];
    for (std::size_t d = 0; d < s.size(); ++d)
      if (two[k][d] != one[k][d]) s[d] = one[k][d] * p.shape[0];
    return s;
  };
  const std::size_t ni = op.inputs.size(), no = op.outputs.size();
  m.in_buf.resize(ni);
  m.out_buf.resize(no);
  m.in_view.resize(ni);
  m.out_view.resize(no);
  m.in_ptr.assign(ni, nullptr);
  m.out_ptr.assign(no, nullptr);
  for (std::size_t i = 0; i < ni; ++i) {
    if (!c.in_buf[i]) continue;
    const Buffer& from = *c.in_buf[i];
    auto& b = m.in_buf[i] = std::make_unique<Buffer>(from.dtype, shape_at(i), false, p.misalign_bytes, dev);
    const std::size_t n = b->nbytes(), period = from.nbytes();
    const std::byte* src = from.bytes.get() + from.offset;
    for (std::size_t at = 0; period && at < n; at += period) std::memcpy(b->host() + at, src, std::min(period, n - at));
    b->upload();
    m.in_view[i] = b->view(p.device);
    m.in_ptr[i] = &m.in_view[i];
  }
  for (std::size_t o = 0; o < no; ++o) {
    if (!c.out_buf[o]) continue;
    auto& b = m.out_buf[o] = std::make_unique<Buffer>(c.out_buf[o]->dtype, shape_at(ni + o), false, p.misalign_bytes, dev);
    m.out_view[o] = b->view(p.device);
    m.out_ptr[o] = &m.out_view[o];
  }
  if (p.inplace) m.out_view[0].data = m.in_view[0].data;
  return t;
}

Case::Case() : impl_(std::make_unique<Impl>()) {}

Case::~Case() = default;

const Problem& Case::problem() const { return impl_->p; }

void Case::poison_outputs() {
  for (auto& b : impl_->out_buf)
    if (b) b->poison();
}

Status Case::run() {
  Impl& m = *impl_;
  Context ctx;
  ctx.num_threads = m.p.threads;
  ctx.cuda_stream = m.p.cuda_stream;
  ctx.allocator = m.p.allocator;
  return gradops::run(m.op->name, m.in_ptr, m.out_ptr, m.attr_list, ctx);
}

Status Case::implementation(std::string* name) const {
  const Impl& m = *impl_;
  Context ctx;
  ctx.num_threads = m.p.threads;
  ctx.cuda_stream = m.p.cuda_stream;
  ctx.allocator = m.p.allocator;
  return gradops::implementation_name(m.op->name, m.in_ptr, m.out_ptr, m.attr_list, ctx, name);
}

Status Case::implementation(const oracle::Attrs& attrs, std::string* name) const {
  const Impl& m = *impl_;
  Context ctx;
  ctx.num_threads = m.p.threads;
  ctx.cuda_stream = m.p.cuda_stream;
  std::vector<Attribute> list;
  for (const auto& [k, v] : attrs) list.push_back({k, v});
  return gradops::implementation_name(m.op->name, m.in_ptr, m.out_ptr, list, ctx, name);
}

int64_t Case::bytes() const {
  int64_t b = 0;
  for (const auto& x : impl_->in_buf)
    if (x) b += static_cast<int64_t>(x->nbytes());
  for (std::size_t o = 0; o < impl_->out_buf.size(); ++o)
    if (impl_->out_buf[o] && !(impl_->p.inplace && o == 0)) b += static_cast<int64_t>(impl_->out_buf[o]->nbytes());
  return b;
}

Report Case::compare() const {
  Impl& m = *impl_;
  const OpSchema& op = *m.op;
  const DeviceMemory* dev = m.p.device.type == DeviceType::cpu ? nullptr : device_memory(m.p.device.type);
  if (dev) dev->synchronize();
  Report r;
  if (m.expected.empty()) {
    r.detail = describe(m.p) + ": a case made for timing only has no reference to compare with";
    return r;
  }
  r.pass = true;
  for (std::size_t o = 0; o < op.outputs.size(); ++o) {
    if (!m.out_ptr[o]) {
      r.outputs.emplace_back();
      continue;
    }
    Buffer& b = (m.p.inplace && o == 0) ? *m.in_buf[0] : *m.out_buf[o];
    b.download();
    const Tolerance tol = tolerance(m.p, static_cast<int>(o));
    std::vector<double> got(static_cast<std::size_t>(b.count()));
    for (int64_t e = 0; e < b.count(); ++e) {
      got[e] = b.get(e);
      double err, bound;
      const bool ok = within(got[e], m.expected[o]->v[e], tol, &err, &bound);
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
        s << describe(m.p) << ": " << op.outputs[o].name << "[" << e << "] = " << got[e] << ", expected "
          << m.expected[o]->v[e] << " (error " << err << " > tolerance " << bound << ")";
        r.detail = s.str();
      }
    }
    r.outputs.push_back(std::move(got));
  }
  return r;
}

Report run_case(const Problem& p) {
  Case c(p);
  c.poison_outputs();
  const Status s = c.run();
  if (!s) {
    Report r;
    r.status = s;
    r.detail = describe(p) + ": " + s.to_string();
    return r;
  }
  Report r = c.compare();
  r.status = s;
  return r;
}

DType input_dtype(const Problem& p, int i) { return p.sig.types[op_schema(p.op).inputs[i].type_var]; }
DType output_dtype(const Problem& p, int i) { return p.sig.types[op_schema(p.op).outputs[i].type_var]; }

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
  if (p.device.type != DeviceType::cpu) s << " " << device_type_name(p.device.type);
  if (p.misaligned) s << " misaligned";
  if (p.misalign_bytes) s << " +" << p.misalign_bytes << "B";
  if (p.inplace) s << " inplace";
  if (p.threads) s << " threads=" << p.threads;
  return s.str();
}

}  // namespace gradops::check
