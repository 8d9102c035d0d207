// Host storage of a tensor in its own dtype, and the element conversions behind it: what the
// harness, the tests that build calls by hand and the CUDA tests' uploads all store and read, so
// that f16/bf16 rounding is written once (the library's own half and bfloat16 types, which the
// tests check against the oracle's rounding in types_test).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <utility>
#include <vector>

#include "gradops/types.hpp"
#include "oracle/oracle.hpp"

namespace gradops::check {

// Stores v, rounded to t (to nearest, ties to even), at p.
inline void store(DType t, std::byte* p, double v) {
  switch (t) {
    case DType::f32: { const float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
    case DType::f64: std::memcpy(p, &v, 8); break;
    case DType::f16: { const half h(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
    case DType::bf16: { const bfloat16 h(static_cast<float>(v)); std::memcpy(p, &h, 2); break; }
  }
}
// The value of type t stored at p, exactly.
inline double load(DType t, const std::byte* p) {
  switch (t) {
    case DType::f32: { float f; std::memcpy(&f, p, 4); return f; }
    case DType::f64: { double d; std::memcpy(&d, p, 8); return d; }
    case DType::f16: { half h; std::memcpy(&h, p, 2); return static_cast<float>(h); }
    case DType::bf16: { bfloat16 h; std::memcpy(&h, p, 2); return static_cast<float>(h); }
  }
  return 0;
}

inline int64_t element_count(std::span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// A dense tensor in host memory, stored in its dtype. New storage holds `fill` in every byte (0xFF,
// a NaN in every dtype, poisons an output the call must write).
struct HostTensor {
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> bytes;

  HostTensor(DType t, std::vector<int64_t> s, std::byte fill = std::byte{0})
      : dtype(t), shape(std::move(s)), bytes(static_cast<std::size_t>(count()) * dtype_size(t), fill) {}
  // Holds `values` (row-major, one per element), each rounded to t.
  HostTensor(DType t, std::vector<int64_t> s, const std::vector<double>& values) : HostTensor(t, std::move(s)) {
    set(values);
  }
  HostTensor(DType t, const oracle::Tensor& x) : HostTensor(t, x.shape, x.v) {}

  int64_t count() const { return element_count(shape); }
  TensorView view() const { return TensorView(bytes.data(), dtype, std::span<const int64_t>(shape)); }
  void set(int64_t i, double v) { store(dtype, bytes.data() + i * dtype_size(dtype), v); }
  void set(const std::vector<double>& values) {
    const int64_t n = std::min<int64_t>(count(), static_cast<int64_t>(values.size()));
    for (int64_t i = 0; i < n; ++i) set(i, values[static_cast<std::size_t>(i)]);
  }
  double get(int64_t i) const { return load(dtype, bytes.data() + i * dtype_size(dtype)); }
  std::vector<double> values() const {
    std::vector<double> v(static_cast<std::size_t>(count()));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = get(static_cast<int64_t>(i));
    return v;
  }
};

}  // namespace gradops::check
