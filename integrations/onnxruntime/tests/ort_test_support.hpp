// Shared by the ONNX Runtime tests and the graph benchmark: tensors in their storage dtype, one-node
// and multi-node models, sessions with the library loaded, gradops' own API on the same inputs, and
// the transformer MLP block's backward graph with its float64 reference.
#pragma once

#include <onnxruntime_cxx_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "harness/checker.hpp"
#include "harness/host_tensor.hpp"
#include "onnx_model.hpp"
#include "oracle/oracle.hpp"

namespace gradops::ort_test {

inline const char* const kLibrary = GRADOPS_ORT_LIBRARY_PATH;

inline Ort::Env& env() {
  // Failures reach the tests as exceptions; ORT's own log would only repeat them.
  static Ort::Env e(ORT_LOGGING_LEVEL_FATAL, "gradops_onnxruntime_test");
  return e;
}

// What the library registers: the gradient operators and BatchNormInternal,
inline bool registered(const OpSchema& op) {
  return op.origin == OpOrigin::onnxruntime && (op.gradient || op.id == OpId::BatchNormInternal);
}

// in every signature that ORT can tell apart by its input dtypes (ORT infers a custom op's output
// types from its inputs: InvertibleLayerNormalizationGrad's T, carried by X_grad alone, must equal V).
inline bool selectable(const OpSchema& op, const TypeSignature& sig) {
  for (const TypeSignature& earlier : op.signatures) {
    if (&earlier == &sig) return true;
    bool same_inputs = true;
    for (const ArgSchema& in : op.inputs)
      same_inputs = same_inputs && earlier.types[in.type_var] == sig.types[in.type_var];
    if (same_inputs) return false;
  }
  return true;
}

inline ONNXTensorElementDataType ort_type(DType t) {
  switch (t) {
    case DType::f32: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case DType::f64: return ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
    case DType::f16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case DType::bf16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
  }
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

inline std::string shape_string(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
  return r + "]";
}

// ---- tensors in their storage dtype ----------------------------------------------------------------

// Tensors in their storage dtype: the check harness's host tensor.
using Tensor = check::HostTensor;

// "dX[5] = 0.123 (ORT) vs 0.124 (gradops)", or "" when the bytes are the same.
inline std::string first_difference(const std::string& name, const Tensor& ort, const Tensor& ref) {
  if (ort.dtype != ref.dtype) return name + ": dtype " + dtype_name(ort.dtype) + " vs " + dtype_name(ref.dtype);
  if (ort.shape != ref.shape) return name + ": shape " + shape_string(ort.shape) + " vs " + shape_string(ref.shape);
  const std::size_t es = dtype_size(ort.dtype);
  for (int64_t i = 0; i < ort.count(); ++i)
    if (std::memcmp(ort.bytes.data() + i * es, ref.bytes.data() + i * es, es) != 0) {
      std::ostringstream s;
      s.precision(17);
      s << name << "[" << i << "] = " << ort.get(i) << " (ORT) vs " << ref.get(i) << " (gradops)";
      return s.str();
    }
  return "";
}

// ---- models ----------------------------------------------------------------------------------------

struct NodeAttr {
  std::string name;
  AttrType type;
  double value;
};

struct Arg {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

struct NodeSpec {
  std::string op, domain;
  std::vector<std::string> inputs, outputs;  // "" is an absent optional
  std::vector<NodeAttr> attrs;
};

struct GraphSpec {
  std::vector<Arg> inputs, outputs;
  std::vector<NodeSpec> nodes;
  std::vector<std::pair<std::string, std::vector<int64_t>>> int64_initializers;  // 1-D
};

// The serialized model of `g`.
inline std::string model_bytes(const GraphSpec& g) {
  OnnxGraph m;
  for (const Arg& a : g.inputs) m.inputs.push_back({a.name, static_cast<int>(ort_type(a.dtype)), a.shape});
  for (const Arg& a : g.outputs) m.outputs.push_back({a.name, static_cast<int>(ort_type(a.dtype)), a.shape});
  for (const NodeSpec& n : g.nodes) {
    OnnxNode node{n.op, n.domain, n.inputs, n.outputs, {}};
    for (const NodeAttr& a : n.attrs) node.attrs.push_back({a.name, a.type == AttrType::float32, a.value});
    m.nodes.push_back(std::move(node));
  }
  m.int64_initializers = g.int64_initializers;
  return onnx_model(m);
}

// A session for `g` with `options` (execution providers, profiling), the library loaded or not.
inline Ort::Session make_session(const GraphSpec& g, Ort::SessionOptions options, bool load_library) {
  const std::string bytes = model_bytes(g);
  if (load_library) options.RegisterCustomOpsLibrary(kLibrary);
  return Ort::Session(env(), bytes.data(), bytes.size(), options);
}

// ... on the CPU provider, one thread.
inline Ort::Session make_session(const GraphSpec& g, bool load_library) {
  Ort::SessionOptions options;
  options.SetIntraOpNumThreads(1);
  return make_session(g, std::move(options), load_library);
}

// Runs `session` on `inputs` (in the graph's input order); returns the graph's outputs.
inline std::vector<Tensor> run_session(Ort::Session& session, const GraphSpec& g, const std::vector<Tensor>& inputs) {
  static std::byte empty[8];  // a valid address for zero-byte tensors
  const Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);
  std::vector<Ort::Value> values;
  std::vector<const char*> in_names, out_names;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    void* data = t.bytes.empty() ? empty : const_cast<std::byte*>(t.bytes.data());
    values.push_back(Ort::Value::CreateTensor(cpu, data, t.bytes.size(), t.shape.data(), t.shape.size(),
                                              ort_type(t.dtype)));
    in_names.push_back(g.inputs[i].name.c_str());
  }
  for (const Arg& a : g.outputs) out_names.push_back(a.name.c_str());
  std::vector<Ort::Value> results = session.Run(Ort::RunOptions{nullptr}, in_names.data(), values.data(),
                                                values.size(), out_names.data(), out_names.size());
  std::vector<Tensor> out;
  for (std::size_t o = 0; o < results.size(); ++o) {
    const auto info = results[o].GetTensorTypeAndShapeInfo();
    Tensor t(g.outputs[o].dtype, info.GetShape());
    if (info.GetElementType() != ort_type(g.outputs[o].dtype))
      throw std::runtime_error(g.outputs[o].name + ": ORT returned element type " +
                               std::to_string(info.GetElementType()));
    if (!t.bytes.empty()) std::memcpy(t.bytes.data(), results[o].GetTensorRawData(), t.bytes.size());
    out.push_back(std::move(t));
  }
  return out;
}

// ---- one node of a registered operator ---------------------------------------------------------------

// One call: inputs in the schema's order, and for each output its dtype and shape, or nullopt
// where the node leaves it out.
struct Call {
  const OpSchema* op;
  std::vector<Tensor> inputs;
  std::vector<std::optional<Arg>> outputs;
  std::vector<NodeAttr> attrs;
  bool omit_trailing = true;  // absent outputs after the last one wanted are left off the node
};

inline GraphSpec one_node(const Call& c) {
  GraphSpec g;
  NodeSpec n{std::string(c.op->name), std::string(c.op->domain), {}, {}, c.attrs};
  for (std::size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string name = "in_" + std::string(c.op->inputs[i].name);
    g.inputs.push_back({name, c.inputs[i].dtype, c.inputs[i].shape});
    n.inputs.push_back(name);
  }
  std::size_t last = 0;
  for (std::size_t o = 0; o < c.outputs.size(); ++o)
    if (c.outputs[o]) last = o;
  for (std::size_t o = 0; o < c.outputs.size(); ++o) {
    if (!c.outputs[o]) {
      if (!(c.omit_trailing && o > last)) n.outputs.push_back("");
      continue;
    }
    g.outputs.push_back(*c.outputs[o]);
    n.outputs.push_back(c.outputs[o]->name);
  }
  g.nodes.push_back(std::move(n));
  return g;
}

inline std::vector<Attribute> gradops_attrs(const std::vector<NodeAttr>& attrs) {
  std::vector<Attribute> r;
  for (const NodeAttr& a : attrs) r.push_back({a.name, a.value});
  return r;
}

// gradops' own API on the same inputs, in host memory or on `device` (copies made there, the device
// synchronized and the outputs copied back); outputs poisoned first, with the shapes and dtypes of
// `c.outputs`.
inline Status run_gradops(const Call& c, const std::vector<NodeAttr>& attrs, std::vector<std::optional<Tensor>>* out,
                          Device device = Device::cpu()) {
  const check::DeviceMemory* dm = device.type == DeviceType::cpu ? nullptr : check::device_memory(device.type);
  if (device.type != DeviceType::cpu && !dm) throw std::runtime_error("this build has no memory for that device");
  std::vector<void*> buffers;
  struct Release {
    const check::DeviceMemory* dm;
    std::vector<void*>& buffers;
    ~Release() {
      for (void* p : buffers) dm->release(p);
    }
  } release{dm, buffers};
  auto place = [&](const Tensor& t) {
    if (!dm) return t.view();
    buffers.push_back(dm->allocate(t.bytes.size()));
    if (!t.bytes.empty()) dm->to_device(buffers.back(), t.bytes.data(), t.bytes.size());
    return TensorView(buffers.back(), t.dtype, std::span<const int64_t>(t.shape), device);
  };
  std::vector<const TensorView*> in_ptr, out_ptr;
  std::vector<TensorView> in_view, out_view;
  in_view.reserve(c.inputs.size());
  out_view.reserve(c.outputs.size());
  for (const Tensor& t : c.inputs) {
    in_view.push_back(place(t));
    in_ptr.push_back(&in_view.back());
  }
  out->assign(c.outputs.size(), std::nullopt);
  for (std::size_t o = 0; o < c.outputs.size(); ++o) {
    if (!c.outputs[o]) {
      out_ptr.push_back(nullptr);
      continue;
    }
    // 0xFF is NaN in every dtype: every element must be written.
    out->at(o).emplace(c.outputs[o]->dtype, c.outputs[o]->shape, std::byte{0xFF});
    out_view.push_back(place(*out->at(o)));
    out_ptr.push_back(&out_view.back());
  }
  const std::vector<Attribute> a = gradops_attrs(attrs);
  const Status st = run(c.op->name, in_ptr, out_ptr, a);
  if (dm) {
    dm->synchronize();
    for (std::size_t o = 0, k = 0; o < c.outputs.size(); ++o)
      if (c.outputs[o]) {
        Tensor& t = *out->at(o);
        if (!t.bytes.empty()) dm->to_host(t.bytes.data(), out_view[k].data, t.bytes.size());
        ++k;
      }
  }
  return st;
}

inline std::vector<int64_t> shape_for(const OpSchema& op) {
  switch (op.family) {
    case OpFamily::activation: return {3, 5, 17};
    case OpFamily::softmax: return {3, 5, 17};
    case OpFamily::layer_norm: return {6, 4, 33};
    case OpFamily::batch_norm: return {2, 3, 4, 5};
  }
  return {};
}

// The attributes a node must carry: the required ones (BatchNormalizationGrad's epsilon).
inline std::vector<NodeAttr> required_attrs(const OpSchema& op) {
  std::vector<NodeAttr> r;
  for (const AttrSchema& a : op.attributes)
    if (a.required) r.push_back({std::string(a.name), a.type, 1e-5});
  return r;
}

// A call with the oracle's inputs for `shape` and `attrs`, every output wanted, shaped as the
// oracle's reference outputs. nullopt if the oracle does not know the operator (yet).
inline std::optional<Call> make_call(OpId id, const TypeSignature& sig, const std::vector<int64_t>& shape,
                              const std::vector<NodeAttr>& attrs, uint64_t seed) {
  const OpSchema& op = op_schema(id);
  check::Problem p;
  p.op = id;
  p.sig = sig;
  p.shape = shape;
  for (const NodeAttr& a : attrs) p.attrs[a.name] = a.value;
  const oracle::Attrs full = check::full_attrs(p);
  std::vector<DType> in_types;
  for (std::size_t i = 0; i < op.inputs.size(); ++i) in_types.push_back(check::input_dtype(p, static_cast<int>(i)));
  oracle::Rng rng(seed);
  oracle::Tensors in, expected;
  try {
    in = oracle::make_inputs(op.name, shape, full, in_types, rng);
    expected = oracle::reference(op.name, in, full);
  } catch (const std::invalid_argument&) {
    return std::nullopt;
  }
  Call c{&op, {}, {}, attrs};
  for (std::size_t i = 0; i < op.inputs.size(); ++i) c.inputs.push_back(Tensor(in_types[i], *in[i]));
  for (std::size_t o = 0; o < op.outputs.size(); ++o)
    c.outputs.push_back(Arg{"out_" + std::string(op.outputs[o].name), check::output_dtype(p, static_cast<int>(o)),
                            expected[o]->shape});
  return c;
}

inline std::string describe(const Call& c) {
  std::string s = std::string(c.op->name) + " (";
  for (std::size_t i = 0; i < c.inputs.size(); ++i) s += std::string(i ? "," : "") + dtype_name(c.inputs[i].dtype);
  s += ") " + shape_string(c.inputs.empty() ? std::vector<int64_t>{} : c.inputs[0].shape);
  for (const NodeAttr& a : c.attrs) s += " " + a.name + "=" + std::to_string(a.value);
  return s;
}


// ---- (operator, signature) pairs as test parameters -------------------------------------------------

struct Signature {
  OpId op;
  TypeSignature sig;
};
// gtest prints parameters in failure messages; by default as a byte dump.
inline void PrintTo(const Signature& s, std::ostream* os) {
  const OpSchema& op = op_schema(s.op);
  *os << op.name;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) *os << (v ? "," : " ") << dtype_name(s.sig.types[v]);
}
// "LayerNormalizationGrad_f16_f32_f16": a test name.
inline std::string test_name(const Signature& s) {
  const OpSchema& op = op_schema(s.op);
  std::string r(op.name);
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) r += std::string("_") + dtype_name(s.sig.types[v]);
  return r;
}

// ---- a transformer MLP block's backward graph -------------------------------------------------------

// Forward: h = LayerNormalization(x; gamma, beta) -> z = h W1 -> a = BiasGelu(z, b1) -> o = a W2
// -> p = Softmax_13(o). Its backward, wired as ORT's gradient builder does (docs/semantics.md B7):
//   dO = SoftmaxGrad_13(dP, p); dA = dO W2^T; dZ = BiasGeluGrad_dX(dA, z, b1);
//   db1 = ReduceSum(dZ, axes 0, keepdims 0); dH = dZ W1^T;
//   dX, dgamma, dbeta = LayerNormalizationGrad(dH, x, gamma, mean, inv_std_dev)
// with the forward's attributes copied onto the grads (axis, epsilon, stash_type on the LayerNorm
// grad, which ignores the last two). N rows, model width D, hidden width H.
struct MlpBackward {
  GraphSpec graph;
  std::vector<Tensor> inputs;  // in graph.inputs' order, from the oracle's input generators
  // The float64 reference of dX, dGamma, dBeta and dB1 (graph.outputs' order), when asked for.
  std::vector<std::vector<double>> expected;
  // The gradops calls inside the graph on their reference inputs, to learn whether this build can
  // run them: (op, inputs, output shapes).
  std::vector<Call> grads;
};

inline std::vector<double> matmul_bt(const std::vector<double>& a, const std::vector<double>& b, int64_t n,
                                     int64_t k, int64_t m) {  // a [n, k] times b^T, b [m, k]
  std::vector<double> r(static_cast<std::size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j) {
      long double s = 0;
      for (int64_t t = 0; t < k; ++t) s += static_cast<long double>(a[i * k + t]) * b[j * k + t];
      r[i * m + j] = static_cast<double>(s);
    }
  return r;
}

// Throws std::invalid_argument where the oracle cannot make the inputs (or the reference).
inline MlpBackward mlp_backward(DType t, int64_t N, int64_t D, int64_t H, bool with_reference) {
  oracle::Rng rng(101);
  const oracle::Attrs axis_last{{"axis", -1}};
  const std::vector<DType> two(2, t), three(3, t), five(5, t);
  const oracle::Tensors soft = oracle::make_inputs("SoftmaxGrad_13", std::vector<int64_t>{N, D}, axis_last, two, rng);
  const oracle::Tensors gelu = oracle::make_inputs("BiasGeluGrad_dX", std::vector<int64_t>{N, H}, {}, three, rng);
  const oracle::Tensors norm =
      oracle::make_inputs("LayerNormalizationGrad", std::vector<int64_t>{N, D}, axis_last, five, rng);
  oracle::Tensor w1(std::vector<int64_t>{D, H}), w2(std::vector<int64_t>{H, D});
  oracle::fill_uniform(w1, t, -1 / std::sqrt(double(D)), 1 / std::sqrt(double(D)), rng);
  oracle::fill_uniform(w2, t, -1 / std::sqrt(double(H)), 1 / std::sqrt(double(H)), rng);
  const oracle::Tensor &dp = *soft[0], &p = *soft[1], &z = *gelu[1], &b1 = *gelu[2];
  const oracle::Tensor &x = *norm[1], &gamma = *norm[2], &mean = *norm[3], &inv_std = *norm[4];

  MlpBackward m;
  const auto f = AttrType::float32, i64 = AttrType::int64;
  GraphSpec& g = m.graph;
  g.inputs = {{"dP", t, dp.shape},     {"P", t, p.shape},         {"W2", t, w2.shape},
              {"Z", t, z.shape},       {"B1", t, b1.shape},       {"W1", t, w1.shape},
              {"X", t, x.shape},       {"Gamma", t, gamma.shape}, {"Mean", t, mean.shape},
              {"InvStdDev", t, inv_std.shape}};
  g.outputs = {{"dX", t, {N, D}}, {"dGamma", t, {D}}, {"dBeta", t, {D}}, {"dB1", t, {H}}};
  g.int64_initializers = {{"axes0", {0}}};
  g.nodes = {
      {"SoftmaxGrad_13", "com.microsoft", {"dP", "P"}, {"dO"}, {{"axis", i64, -1}}},
      {"Transpose", "", {"W2"}, {"W2t"}, {}},
      {"MatMul", "", {"dO", "W2t"}, {"dA"}, {}},
      {"BiasGeluGrad_dX", "com.microsoft", {"dA", "Z", "B1"}, {"dZ"}, {}},
      {"ReduceSum", "", {"dZ", "axes0"}, {"dB1"}, {{"keepdims", i64, 0}}},
      {"Transpose", "", {"W1"}, {"W1t"}, {}},
      {"MatMul", "", {"dZ", "W1t"}, {"dH"}, {}},
      {"LayerNormalizationGrad", "com.microsoft", {"dH", "X", "Gamma", "Mean", "InvStdDev"},
       {"dX", "dGamma", "dBeta"}, {{"axis", i64, -1}, {"epsilon", f, 1e-5}, {"stash_type", i64, 1}}},
  };
  for (const oracle::Tensor* v :
       std::initializer_list<const oracle::Tensor*>{&dp, &p, &w2, &z, &b1, &w1, &x, &gamma, &mean, &inv_std})
    m.inputs.push_back(Tensor(t, *v));
  if (!with_reference) return m;

  // The float64 reference of the whole chain, from the same inputs.
  oracle::Tensor da(std::vector<int64_t>{N, H}), dh(std::vector<int64_t>{N, D});
  const oracle::Tensors ref_o = oracle::reference("SoftmaxGrad_13", {dp, p}, axis_last);
  da.v = matmul_bt(ref_o[0]->v, w2.v, N, D, H);
  const oracle::Tensors ref_z = oracle::reference("BiasGeluGrad_dX", {da, z, b1}, {});
  dh.v = matmul_bt(ref_z[0]->v, w1.v, N, H, D);
  const oracle::Tensors ref_x = oracle::reference("LayerNormalizationGrad", {dh, x, gamma, mean, inv_std}, axis_last);
  std::vector<double> db1(static_cast<std::size_t>(H), 0.0);  // what ReduceSum computes, from dZ
  for (int64_t i = 0; i < N; ++i)
    for (int64_t j = 0; j < H; ++j) db1[j] += ref_z[0]->v[i * H + j];
  m.expected = {ref_x[0]->v, ref_x[1]->v, ref_x[2]->v, db1};

  auto grad = [&](OpId id, std::vector<Tensor> ins, const oracle::Tensors& outs) {
    Call c{&op_schema(id), std::move(ins), {}, {}};
    for (const auto& o : outs) c.outputs.push_back(Arg{"out", t, o->shape});
    m.grads.push_back(std::move(c));
  };
  grad(OpId::SoftmaxGrad_13, {m.inputs[0], m.inputs[1]}, ref_o);
  grad(OpId::BiasGeluGrad_dX, {Tensor(t, da), m.inputs[3], m.inputs[4]}, ref_z);
  grad(OpId::LayerNormalizationGrad, {Tensor(t, dh), m.inputs[6], m.inputs[7], m.inputs[8], m.inputs[9]}, ref_x);
  return m;
}

// The largest error of each output against the float64 reference, over the output's largest
// magnitude (errors scale with the output: the graph rounds every intermediate to the dtype, and its
// matmuls and reductions sum D to H terms). Throws if a reference is all zeros (a check of nothing).
struct MlpError {
  std::string output;
  double error_over_scale;
  std::string worst;  // "dX[12]: 0.1 vs 0.1000001 (float64 oracle)"
};
inline std::vector<MlpError> mlp_errors(const MlpBackward& m, const std::vector<Tensor>& got) {
  std::vector<MlpError> r;
  for (std::size_t o = 0; o < m.expected.size(); ++o) {
    const std::vector<double>& e = m.expected[o];
    const std::string& name = m.graph.outputs[o].name;
    if (o >= got.size() || got[o].count() != static_cast<int64_t>(e.size()))
      throw std::runtime_error(name + ": ORT returned no output or one of another size");
    double scale = 0, worst = 0;
    int64_t at = 0;
    for (double v : e) scale = std::max(scale, std::fabs(v));
    if (!(scale > 0)) throw std::runtime_error(name + " is all zeros: the check would prove nothing");
    for (int64_t k = 0; k < got[o].count(); ++k) {
      const double err = std::fabs(got[o].get(k) - e[k]);
      if (!(err <= worst)) worst = err, at = k;
    }
    std::ostringstream s;
    s.precision(17);
    s << name << "[" << at << "]: " << got[o].get(at) << " vs " << e[at] << " (float64 oracle); scale " << scale;
    r.push_back({name, worst / scale, s.str()});
  }
  return r;
}

}  // namespace gradops::ort_test
