// Element loads and stores: every storage type is read into its compute type (f32 for
// f16/bf16/f32, f64 for f64) and each output is rounded to its storage type once.
#pragma once

#include <cstring>
#include <type_traits>

#include "gradops/types.hpp"

namespace gradops::cpu {

template <class T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A tensor's base pointer may have any alignment (types.hpp), so p + i need not be aligned for T:
// the bytes go through memcpy (one plain load or store after optimization), never through a T
// lvalue, which would be undefined behaviour at such an address.
template <class T>
inline T load_unaligned(const T* p, int64_t i) {
  T v;
  std::memcpy(&v, p + i, sizeof(T));
  return v;
}
template <class T>
inline void store_unaligned(T* p, int64_t i, T v) {
  std::memcpy(p + i, &v, sizeof(T));
}

template <class A, class T>
inline A load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return static_cast<A>(static_cast<float>(load_unaligned(p, i)));
  else
    return static_cast<A>(load_unaligned(p, i));
}

template <class T, class A>
inline void store(T* p, int64_t i, A v) {
  if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    store_unaligned(p, i, T(static_cast<float>(v)));
  else
    store_unaligned(p, i, static_cast<T>(v));
}

// Calls f(T{}) with the storage type named by dt.
template <class F>
decltype(auto) visit_dtype(DType dt, F&& f) {
  switch (dt) {
    case DType::f64: return f(double{});
    case DType::f16: return f(half{});
    case DType::bf16: return f(bfloat16{});
    case DType::f32: break;
  }
  return f(float{});
}

}  // namespace gradops::cpu
