// What the BatchNorm tests (batch_norm_test.cpp, batch_norm_split_test.cpp) share: host storage
// in any dtype for calls made by hand, and bitwise comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "harness/checker.hpp"

namespace gradops::check {

inline int64_t count_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Host storage in any dtype, for calls made by hand.
struct Stored {
  DType t;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;
  Stored(DType type, std::vector<int64_t> s)
      : t(type), shape(std::move(s)), bytes(static_cast<std::size_t>(count_of(shape)) * dtype_size(type)) {}
  Stored(DType type, const oracle::Tensor& v) : Stored(type, v.shape) {
    for (int64_t i = 0; i < count_of(shape); ++i) set(i, v.v[i]);
  }
  TensorView view() { return TensorView(bytes.data(), t, std::span<const int64_t>(shape)); }
  void set(int64_t i, double v) {
    std::byte* p = bytes.data() + i * dtype_size(t);
    switch (t) {
      case DType::f32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DType::f64: std::memcpy(p, &v, 8); break;
      case DType::f16: { const half h(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
      case DType::bf16: { const bfloat16 h(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    }
  }
  double get(int64_t i) const {
    const std::byte* p = bytes.data() + i * dtype_size(t);
    switch (t) {
      case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
      case DType::f64: { double d; std::memcpy(&d, p, 8); return d; }
      case DType::f16: { half h; std::memcpy(&h, p, 2); return static_cast<float>(h); }
      case DType::bf16: { bfloat16 h; std::memcpy(&h, p, 2); return static_cast<float>(h); }
    }
    return 0;
  }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<std::size_t>(count_of(shape)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = get(static_cast<int64_t>(i));
    return v;
  }
};

inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  // memcmp's pointers must not be null even for zero bytes, and an empty vector's data() may be.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

}  // namespace gradops::check
