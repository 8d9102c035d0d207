// The CPU kernels on every SIMD target this CPU supports (forced one at a time), and the vector
// transcendentals in ulps against a long double reference over dense samples of their domains.
#include <gtest/gtest.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/simd.hpp"
#include "harness/checker.hpp"

namespace gradops::check {
namespace {

std::vector<std::string> targets() {
  const char* names[8];
  const int n = cpu::supported_simd_targets(names, 8);
  return {names, names + n};
}

class SimdTarget : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ASSERT_TRUE(cpu::force_simd_target(GetParam())) << GetParam(); }
  void TearDown() override { cpu::force_simd_target(targets().front()); }
};

// Every op and signature on the given shapes, half of them on misaligned buffers.
void every_op_matches_the_oracle(const std::string& target, const std::vector<std::vector<int64_t>>& shapes) {
  uint64_t seed = 100;
  for (const OpSchema& op : op_schemas()) {
    for (const TypeSignature& sig : op.signatures) {
      for (const std::vector<int64_t>& shape : shapes) {
        Problem p;
        p.op = op.id;
        p.sig = sig;
        p.shape = shape;
        p.misaligned = seed % 2 == 1;
        p.seed = seed++;
        const Report r = run_case(p);
        EXPECT_TRUE(r.pass) << target << ": " << r.detail;
      }
    }
  }
}

// Small awkward shapes: vector bodies, tails, misalignment.
TEST_P(SimdTarget, EveryOpMatchesTheOracle) {
  every_op_matches_the_oracle(GetParam(), {{1, 1}, {3, 17}, {5, 33}, {2, 3, 40}});
}

// The non-temporal store paths, which large outputs take, forced on small tensors: rows long
// enough for an aligning head, paired whole vectors and a tail, on both base alignments.
TEST_P(SimdTarget, EveryOpMatchesTheOracleWithStreamingStores) {
  cpu::set_stream_min_bytes(0);
  every_op_matches_the_oracle(GetParam(), {{1, 1}, {3, 17}, {4, 131}, {3, 2, 77}, {2, 1000}});
  cpu::set_stream_min_bytes(-1);
}

// The softmax family on a non-last axis, whose layouts depend on the target's lane count (inner
// sizes folded into whole vectors below four vectors or where their least common multiple with
// the lanes is at most 64 vectors, blocks of columns otherwise): narrow, odd, lane-width and wide
// inner sizes with partial tails, through normal and non-temporal stores.
TEST_P(SimdTarget, SoftmaxNonLastAxisMatchesTheOracle) {
  uint64_t seed = 300;
  for (bool stream : {false, true}) {
    cpu::set_stream_min_bytes(stream ? 0 : -1);
    for (OpId id : {OpId::SoftmaxGrad_13, OpId::LogSoftmaxGrad_13, OpId::Softmax_13, OpId::LogSoftmax_13})
      for (const TypeSignature& sig : op_schema(id).signatures)
        for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
                 {3, 7, 2}, {2, 33, 3}, {1, 2, 17}, {2, 9, 16}, {2, 6, 64}, {2, 5, 96}, {2, 5, 100}, {3, 40, 67}, {2, 3, 1000}}) {
          Problem p;
          p.op = id;
          p.sig = sig;
          p.shape = shape;
          p.attrs = {{"axis", 1.0}};
          p.misaligned = seed % 2 == 1;
          p.seed = seed++;
          const Report r = run_case(p);
          EXPECT_TRUE(r.pass) << GetParam() << (stream ? " streaming: " : ": ") << r.detail;
        }
  }
  cpu::set_stream_min_bytes(-1);
}

// Streamed softmax rows are written as one run: a row's last partial stream unit goes out with the
// next row's first. Rows whose starts fall anywhere in a line, on both base alignments, split over
// 1 and 3 threads (at most one range per 32K elements begun, so 2 or 3 of them; the joins stop at
// each range's end): the oracle's values, and the same bits either way.
TEST_P(SimdTarget, SoftmaxRowsStreamedAsOneRunAnyThreadCount) {
  cpu::set_stream_min_bytes(0);
  uint64_t seed = 700;
  for (OpId id : {OpId::SoftmaxGrad_13, OpId::LogSoftmaxGrad_13, OpId::Softmax_13, OpId::LogSoftmax_13})
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{800, 131}, {1100, 64}, {100, 1000}})
        for (bool misaligned : {false, true}) {
          Problem p;
          p.op = id;
          p.sig = sig;
          p.shape = shape;
          p.misaligned = misaligned;
          p.seed = seed++;
          p.threads = 1;
          const Report one = run_case(p);
          p.threads = 3;
          const Report three = run_case(p);
          EXPECT_TRUE(one.pass && three.pass) << GetParam() << ": " << one.detail << three.detail;
          EXPECT_EQ(one.outputs, three.outputs) << GetParam() << ": " << describe(p);
        }
  cpu::set_stream_min_bytes(-1);
}

// The same for the LayerNorm gradients, whose joined unit also adds two rows (possibly of two
// chunks) into the dscale/dbias partial rows: rows of 33 to 1000 columns, many chunks, 1 and 3
// threads, both base alignments; the oracle's values, and the same bits for every thread count and
// either alignment.
TEST_P(SimdTarget, LayerNormGradRowsStreamedAsOneRunAnyThreadCount) {
  cpu::set_stream_min_bytes(0);
  uint64_t seed = 900;
  for (OpId id : {OpId::LayerNormalizationGrad, OpId::SimplifiedLayerNormalizationGrad,
                  OpId::InvertibleLayerNormalizationGrad})
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{800, 131}, {700, 33}, {600, 64}, {150, 1000}}) {
        std::vector<std::vector<double>> first;
        for (bool misaligned : {false, true})
          for (int threads : {1, 3}) {
            Problem p;
            p.op = id;
            p.sig = sig;
            p.shape = shape;
            p.misaligned = misaligned;
            p.seed = seed;
            p.threads = threads;
            const Report r = run_case(p);
            EXPECT_TRUE(r.pass) << GetParam() << ": " << r.detail;
            if (first.empty()) first = r.outputs;
            else EXPECT_EQ(first, r.outputs) << GetParam() << ": " << describe(p);
          }
        ++seed;
      }
  cpu::set_stream_min_bytes(-1);
}

// BatchNorm's fused NCHW ops (enough channels for blocks of whole channels) write each run from a
// stream store's boundary, a run then starting with the end of the channel before, except where a
// thread's channels begin and end: planes of 1,024 positions and more, and the columns form of
// shorter ones (a sample's block of channels a run; no heads where a channel is shorter than a
// stream store, 2x100x9). Runs that start anywhere in a line (odd sizes, three bases), a plane cut
// into segments, 1 to 3 threads: the oracle's values, and the same bits for every thread count and
// base.
TEST_P(SimdTarget, BatchNormFusedRunsStreamedAnyBaseAnyThreadCount) {
  cpu::set_stream_min_bytes(0);
  uint64_t seed = 1100;
  for (OpId id : {OpId::BatchNormalizationGrad, OpId::BatchNormInternal})
    for (DType t : {DType::f32, DType::bf16, DType::f64})
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
               {2, 12, 1031}, {2, 13, 1152}, {1, 12, 8211}, {3, 12, 67}, {2, 13, 100}, {5, 24, 49}, {2, 100, 9}}) {
        std::vector<std::vector<double>> first;
        for (int misalign : {-1, 0, 12})
          for (int threads : {1, 2, 3}) {
            Problem p;
            p.op = id;
            p.sig = {{t, t, t == DType::f64 ? DType::f64 : DType::f32}};
            p.shape = shape;
            p.attrs = {{"channels_last", 0.0}};
            if (id == OpId::BatchNormalizationGrad) p.attrs["epsilon"] = 1e-5;
            p.misaligned = misalign >= 0;
            p.misalign_bytes = std::max(misalign, 0);
            p.seed = seed;
            p.threads = threads;
            const Report r = run_case(p);
            EXPECT_TRUE(r.pass) << GetParam() << ": " << describe(p) << ": " << r.detail;
            if (first.empty()) first = r.outputs;
            else EXPECT_EQ(first, r.outputs) << GetParam() << ": " << describe(p);
          }
        ++seed;
      }
  cpu::set_stream_min_bytes(-1);
}

INSTANTIATE_TEST_SUITE_P(Targets, SimdTarget, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return info.param; });

// The same without the AVX512-BF16 conversion, where the AVX-512 target would use it: the integer
// rounding path (skipped on other targets and on CPUs without the instruction).
TEST_P(SimdTarget, EveryOpMatchesTheOracleWithoutNativeBf16) {
  if (GetParam() != "avx512" || !cpu::native_bf16()) GTEST_SKIP() << "no AVX512-BF16 conversion on this target";
  cpu::set_native_bf16(false);
  every_op_matches_the_oracle(GetParam(), {{1, 1}, {3, 17}, {5, 33}, {2, 3, 40}});
  cpu::set_stream_min_bytes(0);
  every_op_matches_the_oracle(GetParam(), {{4, 131}, {2, 1000}});
  cpu::set_stream_min_bytes(-1);
  cpu::set_native_bf16(true);
}

// Every 61st f32 bit pattern: both signs, normal, subnormal, inf and NaN, in every binade.
std::vector<float> every_61st_f32() {
  std::vector<float> v;
  for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 61) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  return v;
}

// f32 -> bf16 as the kernels round it, on every target and (on AVX-512) both conversion paths,
// against the exact scalar conversion: every 61st bit pattern of both signs (normal, subnormal,
// inf, NaN) and ties to even.
TEST_P(SimdTarget, Bf16RoundingIsExact) {
  std::vector<float> in = every_61st_f32();
  for (uint32_t b : {0x3f808000u, 0x3f818000u, 0x00008000u, 0x00018000u, 0x807fffffu, 0x7f7fffffu, 0x7f7f8000u})
    for (int k = 0; k < 16; ++k) in.push_back(std::bit_cast<float>(b));
  for (bool native : {true, false}) {
    cpu::set_native_bf16(native);
    std::vector<uint16_t> out(in.size());
    cpu::narrow_to_bf16(in.data(), out.data(), static_cast<int64_t>(in.size()));
    int64_t wrong = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const bfloat16 want(in[i]);
      uint16_t want_bits;
      std::memcpy(&want_bits, &want, 2);
      const bool both_nan = std::isnan(in[i]) && (out[i] & 0x7fffu) > 0x7f80u && (out[i] & 0x40u);
      if (out[i] != want_bits && !both_nan && wrong++ < 5)
        ADD_FAILURE() << GetParam() << (native ? " native" : " integer") << ": bits " << std::hex
                      << std::bit_cast<uint32_t>(in[i]) << " -> " << out[i] << ", want " << want_bits;
    }
    EXPECT_EQ(wrong, 0) << GetParam() << (native ? " native" : " integer");
  }
  cpu::set_native_bf16(true);
}

// f16 <-> f32 as the kernels convert, on every target, against the exact scalar conversions: every
// f16 bit pattern widened (normal, subnormal, inf, NaN: targets without F16C convert in software),
// and every 61st f32 bit pattern plus ties and the overflow edge rounded to f16.
TEST_P(SimdTarget, HalfConversionsAreExact) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> wide(all.size());
  cpu::widen_half(all.data(), wide.data(), static_cast<int64_t>(all.size()));
  int64_t wrong = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    half h;
    std::memcpy(&h, &all[b], 2);
    const float want = static_cast<float>(h);
    const bool same = std::isnan(want) ? std::isnan(wide[b]) : std::bit_cast<uint32_t>(wide[b]) == std::bit_cast<uint32_t>(want);
    if (!same && wrong++ < 5)
      ADD_FAILURE() << GetParam() << ": f16 bits " << std::hex << b << " -> " << wide[b] << ", want " << want;
  }
  EXPECT_EQ(wrong, 0) << GetParam() << " widening";

  std::vector<float> in = every_61st_f32();
  // Halfway cases (1 + 2^-11, 1 + 3 * 2^-11), the largest finite and the overflow threshold (65520).
  for (float v : {1.00048828125f, 1.00146484375f, 65504.0f, 65519.99f, 65520.0f, 5.96046448e-8f, 2.98023224e-8f})
    for (float s : {1.0f, -1.0f}) in.push_back(s * v);
  std::vector<uint16_t> out(in.size());
  cpu::narrow_to_half(in.data(), out.data(), static_cast<int64_t>(in.size()));
  wrong = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const half want(in[i]);
    uint16_t want_bits;
    std::memcpy(&want_bits, &want, 2);
    const bool both_nan = std::isnan(in[i]) && (out[i] & 0x7fffu) > 0x7c00u;
    if (out[i] != want_bits && !both_nan && wrong++ < 5)
      ADD_FAILURE() << GetParam() << ": f32 bits " << std::hex << std::bit_cast<uint32_t>(in[i]) << " -> " << out[i]
                    << ", want " << want_bits;
  }
  EXPECT_EQ(wrong, 0) << GetParam() << " rounding";
}

// Distance in units in the last place of T at the reference value.
template <class T>
double ulps(T got, long double ref) {
  if (std::isnan(ref)) return std::isnan(got) ? 0 : INFINITY;
  const T r = static_cast<T>(ref);
  if (std::isinf(r)) return got == r ? 0 : INFINITY;
  const T ulp = std::nextafter(std::fabs(r), std::numeric_limits<T>::infinity()) - std::fabs(r);
  return static_cast<double>(std::fabs(static_cast<long double>(got) - ref) / ulp);
}

struct MathCase {
  cpu::VectorMath f;
  const char* name;
  long double (*ref)(long double);
  double lo, hi;
  double max_ulp;  // SLEEF's documented bound plus the reference's rounding
};

const MathCase kMath[] = {
    {cpu::VectorMath::erfc, "erfc", [](long double x) { return std::erfc(x); }, -9, 9.5, 2.0},
    {cpu::VectorMath::exp, "exp", [](long double x) { return std::exp(x); }, -87, 88, 1.5},
    {cpu::VectorMath::tanh, "tanh", [](long double x) { return std::tanh(x); }, -10, 10, 1.5},
    {cpu::VectorMath::log, "log", [](long double x) { return std::log(x); }, 1e-30, 1e30, 1.5},
};

// The portable target uses the C library, whose documented bounds are looser.
double bound(const MathCase& m, const std::string& target) { return target == "portable" ? 4.0 : m.max_ulp; }

TEST_P(SimdTarget, VectorMathF32Ulps) {
  for (const MathCase& m : kMath) {
    // Every 97th float bit pattern in [lo, hi] (both signs as the range says), results above
    // the subnormal range.
    std::vector<float> in;
    for (uint32_t bits = 0; bits < 0x7f800000u; bits += 97) {
      float v;
      std::memcpy(&v, &bits, 4);
      for (float s : {v, -v})
        if (s >= m.lo && s <= m.hi) in.push_back(s);
    }
    std::vector<float> out(in.size());
    cpu::eval_vector_math(m.f, in.data(), out.data(), static_cast<int64_t>(in.size()));
    double worst = 0;
    float at = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const long double ref = m.ref(in[i]);
      if (std::fabs(ref) < FLT_MIN) continue;
      const double u = ulps(out[i], ref);
      if (u > worst) worst = u, at = in[i];
    }
    EXPECT_LE(worst, bound(m, GetParam())) << m.name << " f32 worst at x = " << at;
  }
}

// exp of every x in `in`, with `base` appended in every lane rotation (each edge in every lane
// position): NaN stays NaN, results below T's normal range are within one subnormal step, the rest
// within the target's bound in ulps.
template <class T>
void expect_exp(std::vector<T> in, const std::vector<T>& base, const std::string& target) {
  for (std::size_t shift = 0; shift <= 16; ++shift)
    for (std::size_t i = 0; i < base.size(); ++i) in.push_back(base[(i + shift) % base.size()]);
  std::vector<T> out(in.size());
  cpu::eval_vector_math(cpu::VectorMath::exp, in.data(), out.data(), static_cast<int64_t>(in.size()));
  double worst = 0;
  T at = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const T x = in[i];
    const long double ref = std::exp(static_cast<long double>(x));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(out[i])) << "exp(NaN)";
    } else if (std::fabs(ref) < std::numeric_limits<T>::min()) {
      EXPECT_LE(std::fabs(out[i] - ref), std::numeric_limits<T>::denorm_min()) << "exp(" << x << ")";
    } else if (const double u = ulps(out[i], ref); u > worst) {
      worst = u, at = x;
    }
  }
  EXPECT_LE(worst, bound(kMath[1], target)) << "exp worst at x = " << at << " (" << sizeof(T) * 8 << "-bit)";
}

// exp's edges in f32 lanes: overflow to inf, underflow through the subnormals to 0, infinities, NaN.
TEST_P(SimdTarget, VectorExpF32Edges) {
  const float inf = std::numeric_limits<float>::infinity();
  expect_exp<float>({}, {inf, -inf, std::nanf(""), 1e30f, -1e30f, 88.8f, 200.0f, -104.5f, -100.0f, -95.0f, -88.0f,
                         -87.3f, 0.0f, -0.0f, 1e-30f},
                    GetParam());
}

// The exp of 16-bit outputs: t = x log2(e) is rounded once and log2(e) is an f32, which carry
// up to 1.25 |x| ulp into the result, and f = t - floor(t) and the polynomial's last rounding up to
// 2 ulp where the result is just below 1: each element is held to 2 + 1.25 |x| ulp (subnormal
// results in subnormal steps); the edges as exp's. Every 97th float bit pattern in [-104, 88].
TEST_P(SimdTarget, VectorExpFor16BitF32) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in = {inf, -inf, std::nanf(""), 1e30f, -1e30f, 88.8f, 200.0f, -104.5f, -1e-30f, 1e-30f,
                           0.0f, -0.0f, -0.5f, 0.5f, -1.0f, 1.0f};
  for (uint32_t bits = 0; bits < 0x7f800000u; bits += 97) {
    float v;
    std::memcpy(&v, &bits, 4);
    for (float s : {v, -v})
      if (s >= -104.0f && s <= 88.0f) in.push_back(s);
  }
  std::vector<float> out(in.size());
  cpu::eval_vector_math(cpu::VectorMath::exp_for_16bit, in.data(), out.data(), static_cast<int64_t>(in.size()));
  double worst = 0;  // ulps past 1.25 |x|
  float at = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float x = in[i];
    const long double ref = std::exp(static_cast<long double>(x));
    if (std::isnan(x)) {
      EXPECT_TRUE(std::isnan(out[i])) << "exp(NaN)";
    } else if (ref < std::numeric_limits<float>::denorm_min() / 2) {
      EXPECT_EQ(out[i], 0.0f) << "exp(" << x << ")";
    } else if (const double u = ulps(out[i], ref) - 1.25 * std::fabs(x); u > worst) {
      worst = u, at = x;
    }
  }
  EXPECT_LE(worst, std::max(2.0, bound(kMath[1], GetParam()))) << "worst at x = " << at;
}

TEST_P(SimdTarget, VectorMathF64Ulps) {
  std::mt19937_64 rng(5);
  for (const MathCase& m : kMath) {
    std::vector<double> in(1 << 19);
    if (m.f == cpu::VectorMath::log) {
      std::uniform_real_distribution<double> e(std::log(m.lo), std::log(m.hi));
      for (double& v : in) v = std::exp(e(rng));
    } else {
      std::uniform_real_distribution<double> u(m.lo, m.hi);
      for (double& v : in) v = u(rng);
    }
    std::vector<double> out(in.size());
    cpu::eval_vector_math(m.f, in.data(), out.data(), static_cast<int64_t>(in.size()));
    double worst = 0;
    double at = 0;
    for (std::size_t i = 0; i < in.size(); ++i) {
      const long double ref = m.ref(in[i]);
      if (std::fabs(ref) < DBL_MIN) continue;
      const double u = ulps(out[i], ref);
      if (u > worst) worst = u, at = in[i];
    }
    EXPECT_LE(worst, bound(m, GetParam())) << m.name << " f64 worst at x = " << at;
  }
}

// f64 exp over its whole finite range, and its edges (overflow past 709.78, underflow through the
// subnormals to 0 below -745.13, the infinities, NaN).
TEST_P(SimdTarget, VectorExpF64RangeAndEdges) {
  const double inf = std::numeric_limits<double>::infinity();
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-745.5, 710.0);
  std::vector<double> in(1 << 18);
  for (double& v : in) v = u(rng);
  expect_exp<double>(std::move(in),
                     {inf, -inf, std::nan(""), 1e300, -1e300, 709.78, 709.79, 1100.0, 2000.0, -708.3, -708.4,
                      -720.0, -744.0, -745.1, -745.2, -1100.0, -2e3, 0.0, -0.0, 1e-300, 0.5, -0.5},
                     GetParam());
}

}  // namespace
}  // namespace gradops::check
