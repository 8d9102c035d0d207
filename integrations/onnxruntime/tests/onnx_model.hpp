// Serialized ONNX models for the tests, written with a few lines of protobuf wire format (ORT
// 1.29's model-editing API resolves a graph before the session's custom-op domains are in place,
// so it cannot build graphs of custom operators).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace gradops::ort_test {

struct OnnxValue {
  std::string name;
  int elem_type;  // TensorProto.DataType, the same codes as ONNXTensorElementDataType
  std::vector<int64_t> shape;
};

struct OnnxAttr {
  std::string name;
  bool is_float;  // FLOAT, else INT
  double value;
};

struct OnnxNode {
  std::string op, domain;
  std::vector<std::string> inputs, outputs;  // "" is an absent optional
  std::vector<OnnxAttr> attrs;
};

struct OnnxGraph {
  std::vector<OnnxValue> inputs, outputs;
  std::vector<OnnxNode> nodes;
  std::vector<std::pair<std::string, std::vector<int64_t>>> int64_initializers;  // 1-D
};

// The protobuf wire format, as much of it as ONNX's ModelProto needs.
class Proto {
 public:
  Proto& varint(int field, uint64_t v) {
    key(field, 0);
    return raw(v);
  }
  Proto& f32(int field, float f) {
    key(field, 5);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int b = 0; b < 4; ++b) bytes_ += static_cast<char>(u >> (8 * b));
    return *this;
  }
  Proto& bytes(int field, std::string_view s) {
    key(field, 2);
    raw(s.size());
    bytes_ += s;
    return *this;
  }
  Proto& message(int field, const Proto& m) { return bytes(field, m.bytes_); }
  const std::string& str() const { return bytes_; }

 private:
  void key(int field, int wire) { raw(static_cast<uint64_t>(field) << 3 | static_cast<uint64_t>(wire)); }
  Proto& raw(uint64_t v) {
    for (; v >= 0x80; v >>= 7) bytes_ += static_cast<char>(v | 0x80);
    bytes_ += static_cast<char>(v);
    return *this;
  }
  std::string bytes_;
};

// ValueInfoProto{name, TypeProto{tensor_type{elem_type, shape}}}.
inline Proto onnx_value_info(const OnnxValue& v) {
  Proto shape;
  for (int64_t d : v.shape) shape.message(1, Proto().varint(1, static_cast<uint64_t>(d)));
  Proto tensor;
  tensor.varint(1, static_cast<uint64_t>(v.elem_type)).message(2, shape);
  Proto info;
  info.bytes(1, v.name).message(2, Proto().message(1, tensor));
  return info;
}

// A serialized ModelProto: IR version 8, opsets "" 17 and com.microsoft 1.
inline std::string onnx_model(const OnnxGraph& g) {
  Proto graph;
  int k = 0;
  for (const OnnxNode& n : g.nodes) {
    Proto node;
    for (const std::string& s : n.inputs) node.bytes(1, s);
    for (const std::string& s : n.outputs) node.bytes(2, s);
    node.bytes(3, "node" + std::to_string(k++)).bytes(4, n.op).bytes(7, n.domain);
    for (const OnnxAttr& a : n.attrs) {
      Proto attr;
      attr.bytes(1, a.name);
      if (a.is_float) {
        attr.f32(2, static_cast<float>(a.value)).varint(20, 1);  // AttributeProto.FLOAT
      } else {
        attr.varint(3, static_cast<uint64_t>(static_cast<int64_t>(a.value))).varint(20, 2);  // INT
      }
      node.message(5, attr);
    }
    graph.message(1, node);
  }
  graph.bytes(2, "graph");
  for (const auto& [name, values] : g.int64_initializers) {
    Proto t;
    t.varint(1, values.size()).varint(2, 7).bytes(8, name);  // 1-D, INT64
    t.bytes(9, std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int64_t)));
    graph.message(5, t);
  }
  for (const OnnxValue& v : g.inputs) graph.message(11, onnx_value_info(v));
  for (const OnnxValue& v : g.outputs) graph.message(12, onnx_value_info(v));
  Proto model;
  model.varint(1, 8).bytes(2, "gradops_onnxruntime_test");
  model.message(8, Proto().bytes(1, "").varint(2, 17)).message(8, Proto().bytes(1, "com.microsoft").varint(2, 1));
  model.message(7, graph);
  return model.str();
}

}  // namespace gradops::ort_test
