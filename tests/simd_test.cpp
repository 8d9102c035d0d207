// The CPU kernels on every SIMD target this CPU supports (forced one at a time), and the vector
// transcendentals in ulps against a long double reference over dense samples of their domains.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <random>

#include "cpu/simd.hpp"
#include "support/checker.hpp"

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

INSTANTIATE_TEST_SUITE_P(Targets, SimdTarget, ::testing::ValuesIn(targets()),
                         [](const auto& info) { return info.param; });

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

}  // namespace
}  // namespace gradops::check
