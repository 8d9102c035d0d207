// Element types, devices and tensor views.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <span>
#include <string_view>

namespace gradops {

// ---------------------------------------------------------------------------------------------
// 16-bit storage types. Conversions to float are exact; conversions from float round to nearest,
// ties to even, keep NaN a (quiet) NaN and overflow to infinity, as IEEE 754 requires.

namespace detail {
inline uint32_t float_bits(float f) noexcept {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) noexcept {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

struct half {
  uint16_t bits = 0;

  half() = default;
  explicit half(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }
  static half from_bits(uint16_t b) noexcept {
    half h;
    h.bits = b;
    return h;
  }

  static uint16_t from_float(float f) noexcept {
    const uint32_t x = detail::float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) {  // inf or NaN
      return static_cast<uint16_t>(sign | 0x7c00u | (ax > 0x7f800000u ? 0x0200u | ((ax >> 13) & 0x3ffu) : 0u));
    }
    if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to >= 65520: inf
    if (ax < 0x38800000u) {  // below the smallest normal half (2^-14): subnormal or zero
      // Add 0.5 (in float) so the float adder does the round-to-nearest-even at bit 2^-24.
      const float shifted = detail::bits_float(ax) + 0.5f;
      return static_cast<uint16_t>(sign | (detail::float_bits(shifted) - 0x3f000000u));
    }
    // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even.
    const uint32_t odd = (ax >> 13) & 1u;
    const uint32_t r = ax + 0xc8000fffu + odd;  // (-(127-15) << 23) + 0xfff + odd
    return static_cast<uint16_t>(sign | (r >> 13));
  }

  static float to_float(uint16_t h) noexcept {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return detail::bits_float(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in float
      const float v = static_cast<float>(man) * 5.9604644775390625e-08f;
      return detail::bits_float(sign | detail::float_bits(v));
    }
    return detail::bits_float(sign | ((exp + 112u) << 23) | (man << 13));
  }
};

struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) noexcept : bits(from_float(f)) {}
  explicit operator float() const noexcept { return to_float(bits); }
  static bfloat16 from_bits(uint16_t b) noexcept {
    bfloat16 h;
    h.bits = b;
    return h;
  }

  static uint16_t from_float(float f) noexcept {
    const uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
    const uint32_t odd = (x >> 16) & 1u;
    return static_cast<uint16_t>((x + 0x7fffu + odd) >> 16);  // overflow carries into inf, as it should
  }
  static float to_float(uint16_t b) noexcept { return detail::bits_float(static_cast<uint32_t>(b) << 16); }
};

static_assert(sizeof(half) == 2 && sizeof(bfloat16) == 2);

// ---------------------------------------------------------------------------------------------

enum class DType : uint8_t { f32 = 0, f64 = 1, f16 = 2, bf16 = 3 };
inline constexpr std::array<DType, 4> kAllDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16};

constexpr std::size_t dtype_size(DType t) noexcept {
  return t == DType::f64 ? 8 : t == DType::f32 ? 4 : 2;
}
// "f32", "f64", "f16", "bf16"
const char* dtype_name(DType t) noexcept;
// Parses the names above (and "float32", "float", "double", "float16", "half", "bfloat16").
bool parse_dtype(std::string_view name, DType* out) noexcept;

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<half> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bf16; };

// ---------------------------------------------------------------------------------------------

enum class DeviceType : uint8_t { cpu = 0, cuda = 1 };

struct Device {
  DeviceType type = DeviceType::cpu;
  int index = 0;  // CUDA ordinal; 0 for the CPU

  static constexpr Device cpu() noexcept { return {}; }
  static constexpr Device cuda(int ordinal = 0) noexcept { return {DeviceType::cuda, ordinal}; }
  friend constexpr bool operator==(Device a, Device b) noexcept {
    return a.type == b.type && a.index == b.index;
  }
};
const char* device_type_name(DeviceType t) noexcept;  // "cpu", "cuda"

// ---------------------------------------------------------------------------------------------

inline constexpr int kMaxRank = 8;

// A non-owning view of a dense, row-major tensor. The base pointer may have any alignment.
// Inputs are only read through it; outputs are written.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  Device device{};
  int rank = 0;
  std::array<int64_t, kMaxRank> dims{};

  TensorView() = default;
  // Ranks above kMaxRank are kept as the count so that validation can reject them by name.
  TensorView(const void* p, DType t, std::span<const int64_t> shape, Device dev = Device::cpu()) noexcept
      : data(const_cast<void*>(p)), dtype(t), device(dev), rank(static_cast<int>(shape.size())), dims(dims_of(shape)) {}
  TensorView(const void* p, DType t, std::initializer_list<int64_t> shape, Device dev = Device::cpu()) noexcept
      : TensorView(p, t, std::span<const int64_t>(shape.begin(), shape.size()), dev) {}

  template <class T>
  static TensorView of(const T* p, std::initializer_list<int64_t> shape, Device dev = Device::cpu()) noexcept {
    return TensorView(p, dtype_of<T>::value, shape, dev);
  }

  std::span<const int64_t> shape() const noexcept {
    return {dims.data(), static_cast<std::size_t>(rank < kMaxRank ? rank : kMaxRank)};
  }
  int64_t dim(int i) const noexcept { return dims[i]; }
  // Each dim written once (zeros past the rank): zeroing the array and then copying the shape over
  // it made later wide reads of the dims wait on store forwarding (a third of a tiny call's time).
  static std::array<int64_t, kMaxRank> dims_of(std::span<const int64_t> shape) noexcept {
    std::array<int64_t, kMaxRank> d;
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = i < shape.size() ? shape[i] : 0;
    return d;
  }
  // Product of the dims, or -1 if a dim is negative or the product does not fit in int64.
  int64_t numel() const noexcept;
  // numel() * element size, or -1 on overflow.
  int64_t nbytes() const noexcept;
};

}  // namespace gradops
