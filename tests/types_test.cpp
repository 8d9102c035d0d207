// The vocabulary types: half and bfloat16 conversions (exhaustive in the 16-bit direction, checked
// against the oracle's independent rounding in the other), Status, dtype names, TensorView sizes.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#include "gradops/status.hpp"
#include "gradops/types.hpp"
#include "oracle/oracle.hpp"

// Counts every allocation of this program, so that tests can prove a code path allocates nothing.
namespace {
std::atomic<long> g_allocations{0};
}  // namespace
void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace gradops {
namespace {

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The value of a half bit pattern, decoded from the IEEE 754 binary16 layout directly.
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0x1f) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(man, -24);
  else v = std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}
double bf16_value(uint16_t b) {
  const int sign = b >> 15, exp = (b >> 7) & 0xff, man = b & 0x7f;
  double v;
  if (exp == 0xff) v = man ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else if (exp == 0) v = std::ldexp(man, -133);
  else v = std::ldexp(128 + man, exp - 134);
  return sign ? -v : v;
}

std::string hex(uint32_t u) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", u);
  return b;
}

// Same value, same sign of zero, or both NaN.
bool same(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b && std::signbit(a) == std::signbit(b);
}

// ---- 16 bits -> float -> 16 bits, every pattern ----------------------------------------------------

TEST(Half, EveryBitPatternToFloatIsExactAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = half::to_float(h);
    ASSERT_TRUE(same(f, half_value(h))) << std::hex << b;
    ASSERT_EQ(float_to_bits(static_cast<float>(half::from_bits(h))), float_to_bits(f)) << std::hex << b;
    const uint16_t back = half::from_float(f);
    if (std::isnan(f)) {
      // NaN stays NaN with its sign and payload; the result is quiet.
      ASSERT_EQ(back, h | 0x0200) << std::hex << b;
    } else {
      ASSERT_EQ(back, h) << std::hex << b;
      ASSERT_EQ(half(f).bits, h);
    }
  }
}

TEST(BFloat16, EveryBitPatternToFloatIsExactAndRoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const auto h = static_cast<uint16_t>(b);
    const float f = bfloat16::to_float(h);
    ASSERT_TRUE(same(f, bf16_value(h))) << std::hex << b;
    ASSERT_EQ(float_to_bits(f), b << 16) << std::hex << b;
    const uint16_t back = bfloat16::from_float(f);
    if (std::isnan(f)) {
      ASSERT_EQ(back, h | 0x0040) << std::hex << b;
    } else {
      ASSERT_EQ(back, h) << std::hex << b;
      ASSERT_EQ(bfloat16(f).bits, h);
    }
  }
}

// ---- float -> 16 bits against the oracle's rounding -----------------------------------------------

// from_float(f) must be the oracle's round-to-nearest-even of f (NaN: a quiet NaN of the same sign).
template <class H>
::testing::AssertionResult rounds_like_oracle(float f, DType t) {
  const uint16_t got = H::from_float(f);
  const double v = H::to_float(got);
  if (std::isnan(f)) {
    if (std::isnan(v) && std::signbit(v) == std::signbit(f)) return ::testing::AssertionSuccess();
  } else if (same(v, oracle::round_to(t, f))) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << dtype_name(t) << " of float " << hex(float_to_bits(f)) << " (" << f
                                       << ") gave " << hex(got) << " = " << v << ", expected "
                                       << oracle::round_to(t, f);
}

TEST(Half, FloatSampleRoundsLikeTheOracle) {
  // Every 251st pattern: covers every exponent, both signs, NaNs and infinities.
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) ASSERT_TRUE(rounds_like_oracle<half>(bits_to_float(uint32_t(u)), DType::f16));
  // Dense over the half-subnormal range and the smallest normals, where the rounding position moves.
  for (uint32_t u = 0x33000000u; u <= 0x39000000u; u += 7) {
    ASSERT_TRUE(rounds_like_oracle<half>(bits_to_float(u), DType::f16));
    ASSERT_TRUE(rounds_like_oracle<half>(bits_to_float(u | 0x80000000u), DType::f16));
  }
}

TEST(BFloat16, FloatSampleRoundsLikeTheOracle) {
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251)
    ASSERT_TRUE(rounds_like_oracle<bfloat16>(bits_to_float(uint32_t(u)), DType::bf16));
  // Float subnormals are bfloat16 subnormals too: dense there.
  for (uint32_t u = 0; u <= 0x01000000u; u += 3) {
    ASSERT_TRUE(rounds_like_oracle<bfloat16>(bits_to_float(u), DType::bf16));
    ASSERT_TRUE(rounds_like_oracle<bfloat16>(bits_to_float(u | 0x80000000u), DType::bf16));
  }
}

// Around every halfway point between neighbouring 16-bit values: the midpoint itself goes to the
// even neighbour, one float ulp either side goes to the nearer one.
template <class H>
void check_halfway_cases(DType t, uint16_t max_finite) {
  for (uint32_t b = 0; b < max_finite; ++b) {
    for (uint32_t sign : {0u, 0x8000u}) {
      const auto lo = static_cast<uint16_t>(b | sign), hi = static_cast<uint16_t>((b + 1) | sign);
      const float flo = H::to_float(lo), fhi = H::to_float(hi);
      const float mid = static_cast<float>((static_cast<double>(flo) + fhi) / 2);
      ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(flo) + fhi) / 2) << "midpoint not exact in float";
      const uint16_t even = (lo & 1) ? hi : lo;
      ASSERT_EQ(H::from_float(mid), even) << dtype_name(t) << " midpoint of 0x" << std::hex << lo << ", 0x" << hi;
      const float below = std::nextafter(mid, flo), above = std::nextafter(mid, fhi);
      ASSERT_EQ(H::from_float(below), lo) << dtype_name(t) << " just inside 0x" << std::hex << lo;
      ASSERT_EQ(H::from_float(above), hi) << dtype_name(t) << " just inside 0x" << std::hex << hi;
      ASSERT_EQ(H::from_float(flo), lo);
      ASSERT_TRUE(rounds_like_oracle<H>(mid, t));
      ASSERT_TRUE(rounds_like_oracle<H>(below, t));
      ASSERT_TRUE(rounds_like_oracle<H>(above, t));
    }
  }
}

TEST(Half, HalfwayCasesRoundToEven) { check_halfway_cases<half>(DType::f16, 0x7bff); }
TEST(BFloat16, HalfwayCasesRoundToEven) { check_halfway_cases<bfloat16>(DType::bf16, 0x7f7f); }

TEST(Half, OverflowThresholdAndSpecialValues) {
  // 65504 is the largest half; 65520 is halfway to 65536 = 2^16 and rounds (to even) to infinity.
  EXPECT_EQ(half::from_float(65504.0f), 0x7bff);
  EXPECT_EQ(half::from_float(std::nextafter(65520.0f, 0.0f)), 0x7bff);
  EXPECT_EQ(half::from_float(65520.0f), 0x7c00);
  EXPECT_EQ(half::from_float(-65520.0f), 0xfc00);
  EXPECT_EQ(half::from_float(1e10f), 0x7c00);
  EXPECT_EQ(half::from_float(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(half::from_float(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_EQ(half::from_float(-0.0f), 0x8000);
  EXPECT_EQ(half::from_float(0.0f), 0x0000);
  // The smallest subnormal 2^-24; half of it ties to even (zero), a hair more rounds up.
  EXPECT_EQ(half::from_float(0x1p-24f), 0x0001);
  EXPECT_EQ(half::from_float(0x1p-25f), 0x0000);
  EXPECT_EQ(half::from_float(-0x1p-25f), 0x8000);
  EXPECT_EQ(half::from_float(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(half::from_float(0x1.8p-24f), 0x0002);  // 1.5 ulp: tie, to even
  EXPECT_EQ(half::from_float(0x1p-14f), 0x0400);    // the smallest normal
  EXPECT_EQ(half::from_float(1.0f), 0x3c00);
  EXPECT_EQ(half::from_float(-2.0f), 0xc000);
  const uint16_t qnan = half::from_float(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(qnan & 0x7c00, 0x7c00);
  EXPECT_NE(qnan & 0x03ff, 0);
  // A signaling float NaN whose payload sits only in the low bits must not become infinity.
  const uint16_t snan = half::from_float(bits_to_float(0x7f800001u));
  EXPECT_TRUE(std::isnan(half::to_float(snan))) << std::hex << snan;
}

TEST(BFloat16, OverflowThresholdAndSpecialValues) {
  const float max = bfloat16::to_float(0x7f7f);
  EXPECT_EQ(bfloat16::from_float(max), 0x7f7f);
  EXPECT_EQ(bfloat16::from_float(bits_to_float(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(bfloat16::from_float(bits_to_float(0x7f7f8000u)), 0x7f80);  // halfway to 2^128: even is inf
  EXPECT_EQ(bfloat16::from_float(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(bfloat16::from_float(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(bfloat16::from_float(-0.0f), 0x8000);
  EXPECT_EQ(bfloat16::from_float(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16::from_float(bits_to_float(0x3f808000u)), 0x3f80);  // tie, to even (down)
  EXPECT_EQ(bfloat16::from_float(bits_to_float(0x3f818000u)), 0x3f82);  // tie, to even (up)
  const uint16_t snan = bfloat16::from_float(bits_to_float(0x7f800001u));
  EXPECT_TRUE(std::isnan(bfloat16::to_float(snan))) << std::hex << snan;
  EXPECT_TRUE(std::isnan(bfloat16::to_float(bfloat16::from_float(-std::numeric_limits<float>::quiet_NaN()))));
}

// ---- Status ------------------------------------------------------------------------------------

TEST(Status, OkAllocatesNothing) {
  const long before = g_allocations.load();
  {
    Status a;
    Status b = Status::ok();
    Status c = a;
    c = b;
    Status d(StatusCode::ok, {});
    EXPECT_TRUE(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
    EXPECT_TRUE(static_cast<bool>(a));
    EXPECT_EQ(a.code(), StatusCode::ok);
    EXPECT_TRUE(a.message().empty());
  }
  EXPECT_EQ(g_allocations.load(), before);
  // The counter works: an error status allocates.
  { Status e(StatusCode::internal, "x"); }
  EXPECT_GT(g_allocations.load(), before);
  EXPECT_LE(sizeof(Status), 2 * sizeof(void*));
}

TEST(Status, CodeMessageAndText) {
  const Status s(StatusCode::invalid_argument, "GeluGrad: 'X' has shape [2], expected [3]");
  EXPECT_FALSE(s.is_ok());
  EXPECT_FALSE(static_cast<bool>(s));
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_EQ(s.message(), "GeluGrad: 'X' has shape [2], expected [3]");
  EXPECT_EQ(s.to_string(), "invalid_argument: GeluGrad: 'X' has shape [2], expected [3]");
  EXPECT_EQ(Status().to_string(), "ok");
  const Status copy = s;
  EXPECT_EQ(copy.code(), s.code());
  EXPECT_EQ(copy.message(), s.message());
  // A status built with code ok is ok, whatever the message.
  EXPECT_TRUE(Status(StatusCode::ok, "ignored").is_ok());
  EXPECT_TRUE(Status(StatusCode::ok, "ignored").message().empty());

  EXPECT_STREQ(status_code_name(StatusCode::ok), "ok");
  EXPECT_STREQ(status_code_name(StatusCode::invalid_argument), "invalid_argument");
  EXPECT_STREQ(status_code_name(StatusCode::unimplemented), "unimplemented");
  EXPECT_STREQ(status_code_name(StatusCode::out_of_memory), "out_of_memory");
  EXPECT_STREQ(status_code_name(StatusCode::device_error), "device_error");
  EXPECT_STREQ(status_code_name(StatusCode::internal), "internal");
  EXPECT_EQ(Status(StatusCode::device_error, "m").to_string(), "device_error: m");
}

// ---- dtypes and devices ------------------------------------------------------------------------

TEST(DType, NamesSizesAndParsing) {
  EXPECT_STREQ(dtype_name(DType::f32), "f32");
  EXPECT_STREQ(dtype_name(DType::f64), "f64");
  EXPECT_STREQ(dtype_name(DType::f16), "f16");
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(dtype_size(DType::f32), 4u);
  EXPECT_EQ(dtype_size(DType::f64), 8u);
  EXPECT_EQ(dtype_size(DType::f16), 2u);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_EQ(kAllDTypes.size(), 4u);
  EXPECT_EQ(dtype_of<float>::value, DType::f32);
  EXPECT_EQ(dtype_of<double>::value, DType::f64);
  EXPECT_EQ(dtype_of<half>::value, DType::f16);
  EXPECT_EQ(dtype_of<bfloat16>::value, DType::bf16);

  const std::pair<const char*, DType> names[] = {
      {"f32", DType::f32},  {"float32", DType::f32}, {"float", DType::f32},   {"f64", DType::f64},
      {"float64", DType::f64}, {"double", DType::f64}, {"f16", DType::f16}, {"float16", DType::f16},
      {"half", DType::f16}, {"bf16", DType::bf16},   {"bfloat16", DType::bf16}};
  for (const auto& [n, t] : names) {
    DType got = t == DType::f32 ? DType::f64 : DType::f32;
    EXPECT_TRUE(parse_dtype(n, &got)) << n;
    EXPECT_EQ(got, t) << n;
  }
  for (DType t : kAllDTypes) {  // every name parses back
    DType got{};
    EXPECT_TRUE(parse_dtype(dtype_name(t), &got));
    EXPECT_EQ(got, t);
  }
  for (const char* bad : {"", "F32", "fp32", "f8", "int32", "bfloat", "f32 ", "float16x"}) {
    DType got = DType::bf16;
    EXPECT_FALSE(parse_dtype(bad, &got)) << "'" << bad << "'";
    EXPECT_EQ(got, DType::bf16) << "a failed parse must not write";
  }
  EXPECT_STREQ(device_type_name(DeviceType::cpu), "cpu");
  EXPECT_STREQ(device_type_name(DeviceType::cuda), "cuda");
  EXPECT_TRUE(Device::cuda(1) == Device::cuda(1));
  EXPECT_FALSE(Device::cuda(0) == Device::cuda(1));
  EXPECT_FALSE(Device::cpu() == Device::cuda(0));
}

// ---- TensorView sizes --------------------------------------------------------------------------

TEST(TensorView, NumelAndNbytes) {
  const float dummy = 0;
  const auto view = [&](std::initializer_list<int64_t> s, DType t) { return TensorView(&dummy, t, s); };
  EXPECT_EQ(view({}, DType::f32).numel(), 1);  // a scalar
  EXPECT_EQ(view({}, DType::f64).nbytes(), 8);
  EXPECT_EQ(view({2, 3, 5}, DType::f32).numel(), 30);
  EXPECT_EQ(view({2, 3, 5}, DType::f16).nbytes(), 60);
  EXPECT_EQ(view({2, 3, 5}, DType::f64).nbytes(), 240);
  EXPECT_EQ(view({4, 0, 7}, DType::f32).numel(), 0);
  // A zero dim makes the product 0 even when the other dims alone would overflow.
  EXPECT_EQ(view({int64_t{1} << 62, 0, int64_t{1} << 62}, DType::f64).numel(), 0);
  EXPECT_EQ(view({int64_t{1} << 62, 0, int64_t{1} << 62}, DType::f64).nbytes(), 0);
  // Element count overflow.
  EXPECT_EQ(view({int64_t{1} << 32, int64_t{1} << 31}, DType::f32).numel(), -1);
  EXPECT_EQ(view({int64_t{1} << 32, int64_t{1} << 31}, DType::f32).nbytes(), -1);
  EXPECT_EQ(view({int64_t{1} << 40, int64_t{1} << 40, 2}, DType::f16).numel(), -1);
  // The count fits, the bytes do not.
  EXPECT_EQ(view({int64_t{1} << 31, int64_t{1} << 31}, DType::f32).numel(), int64_t{1} << 62);
  EXPECT_EQ(view({int64_t{1} << 31, int64_t{1} << 31}, DType::f32).nbytes(), -1);
  EXPECT_EQ(view({int64_t{1} << 31, int64_t{1} << 31}, DType::f16).nbytes(), -1);  // 2^63
  EXPECT_EQ(view({int64_t{1} << 30, int64_t{1} << 31}, DType::f16).nbytes(), int64_t{1} << 62);
  EXPECT_EQ(view({int64_t{1} << 30, int64_t{1} << 31}, DType::f64).nbytes(), -1);
  EXPECT_EQ(view({std::numeric_limits<int64_t>::max()}, DType::f32).numel(), std::numeric_limits<int64_t>::max());
  EXPECT_EQ(view({std::numeric_limits<int64_t>::max()}, DType::f32).nbytes(), -1);
  // Negative dims.
  EXPECT_EQ(view({3, -1}, DType::f32).numel(), -1);
  EXPECT_EQ(view({0, -1}, DType::f32).numel(), -1);
  EXPECT_EQ(view({-1}, DType::f32).nbytes(), -1);
  // Ranks above kMaxRank are kept as the count, and have no size.
  const std::vector<int64_t> nine(kMaxRank + 1, 1);
  const TensorView big(&dummy, DType::f32, std::span<const int64_t>(nine));
  EXPECT_EQ(big.rank, kMaxRank + 1);
  EXPECT_EQ(big.shape().size(), static_cast<std::size_t>(kMaxRank));
  EXPECT_EQ(big.numel(), -1);
  EXPECT_EQ(big.nbytes(), -1);

  const double d[6] = {};
  const TensorView t = TensorView::of(d, {2, 3}, Device::cuda(1));
  EXPECT_EQ(t.dtype, DType::f64);
  EXPECT_EQ(t.rank, 2);
  EXPECT_EQ(t.dim(0), 2);
  EXPECT_EQ(t.dim(1), 3);
  EXPECT_EQ(t.shape().size(), 2u);
  EXPECT_TRUE(t.device == Device::cuda(1));
  EXPECT_EQ(t.data, static_cast<const void*>(d));
}

}  // namespace
}  // namespace gradops
