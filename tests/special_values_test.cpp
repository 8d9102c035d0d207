// Special values through every op, dtype signature and device of the build (on the CPU, every SIMD
// target this CPU runs, each with its own conversions and vector math): NaN, +-Inf, +-0,
// the smallest and largest subnormals and the largest finite values of each dtype, placed in the
// first vector, the middle and the tail of each input, must come out as the float64 oracle says
// (NaN where it gives NaN, the same infinity where it gives one, within the op's tolerance
// elsewhere, with the expected value rounded to the output's dtype).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/simd.hpp"
#include "harness/checker.hpp"

namespace gradops::testing {
namespace {

using check::Problem;

double max_finite(DType t) {
  switch (t) {
    case DType::f64: return std::numeric_limits<double>::max();
    case DType::f32: return std::numeric_limits<float>::max();
    case DType::f16: return 65504.0;
    case DType::bf16: return 3.3895313892515355e38;  // (2 - 2^-7) * 2^127
  }
  return 0;
}
// 2^-(bias + mantissa bits - 1): the smallest subnormal; the largest is the smallest normal less it.
double min_subnormal(DType t) {
  switch (t) {
    case DType::f64: return std::numeric_limits<double>::denorm_min();
    case DType::f32: return std::numeric_limits<float>::denorm_min();
    case DType::f16: return std::ldexp(1.0, -24);
    case DType::bf16: return std::ldexp(1.0, -133);
  }
  return 0;
}
double min_normal(DType t) {
  switch (t) {
    case DType::f64: return std::numeric_limits<double>::min();
    case DType::f32: return std::numeric_limits<float>::min();
    case DType::f16: return std::ldexp(1.0, -14);
    case DType::bf16: return std::ldexp(1.0, -126);
  }
  return 0;
}

struct Special {
  const char* name;
  double (*value)(DType);
};
const Special kSpecials[] = {
    {"NaN", [](DType) { return std::numeric_limits<double>::quiet_NaN(); }},
    {"+inf", [](DType) { return std::numeric_limits<double>::infinity(); }},
    {"-inf", [](DType) { return -std::numeric_limits<double>::infinity(); }},
    {"+0", [](DType) { return 0.0; }},
    {"-0", [](DType) { return -0.0; }},
    {"min subnormal", min_subnormal},
    {"-max subnormal", [](DType t) { return -(min_normal(t) - min_subnormal(t)); }},
    {"max finite", max_finite},
    {"-max finite", [](DType t) { return -max_finite(t); }},
};

// The main shape per family: 37 columns leave a tail after whole vectors of every width (4, 8 or
// 16 f32 lanes, 2 to 8 f64 lanes).
std::vector<int64_t> shape_for(const OpSchema& op) {
  return op.family == OpFamily::batch_norm ? std::vector<int64_t>{2, 3, 37} : std::vector<int64_t>{3, 37};
}

// Where the special value goes in a tensor of n elements: the first vector, the middle, the tail.
std::vector<int64_t> positions(int64_t n) {
  if (n <= 2) return {0, n - 1};
  return {0, n / 2 + 1, n - 1};
}

// got (as stored) against the float64 reference rounded to the output dtype, NaN- and inf-aware.
// An overflow that the tolerance straddles (expected just below the largest finite value, got
// infinity, or the reverse) passes.
bool agrees(double got, double exact, DType t, const check::Tolerance& tol, std::string* why) {
  const double want = oracle::round_to(t, exact);
  std::ostringstream s;
  s.precision(17);
  s << "got " << got << ", expected " << want << " (exact " << exact << ")";
  *why = s.str();
  if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
  if (std::isinf(want) || std::isinf(got)) {
    if (got == want) return true;
    const double other = std::isinf(got) ? exact : got, lim = max_finite(t);
    const bool same_sign = std::signbit(got) == std::signbit(exact);
    return same_sign && std::isfinite(other) && std::fabs(other) + tol.abs + tol.rel * std::fabs(other) >= lim;
  }
  return std::fabs(got - want) <= tol.abs + tol.rel * std::fabs(exact);
}

// Where the cases run: the CPU once per SIMD target (best first), then the GPU if there is one.
struct Where {
  Device device;
  std::string simd_target;  // empty for a GPU
};
std::vector<Where> places() {
  std::vector<Where> w;
  const char* names[8];
  const int n = cpu::supported_simd_targets(names, 8);
  for (int i = 0; i < n; ++i) w.push_back({Device::cpu(), names[i]});
#if defined(GRADOPS_HAVE_CUDA)
  // Only where a driver and a device are there: without them the harness cannot even allocate.
  std::string why;
  if (const check::DeviceMemory* m = check::device_memory(DeviceType::cuda); m && m->usable(0, &why))
    w.push_back({Device::cuda(0), {}});
#endif
  return w;
}

// Deviations from the oracle found by this test and not fixed yet (docs/robustness.md lists them):
// they are counted and reported as skipped, never as passed.
const char* known_deviation(const OpSchema& op, std::string_view input, const Special& sp, DType in_type) {
  const std::string s = sp.name;
  const bool subnormal = s == "min subnormal" || s == "-max subnormal", inf = s == "+inf" || s == "-inf";
  if (op.id == OpId::InvertibleLayerNormalizationGrad && input == "scale" && subnormal)
    return "(Y - bias) / scale overflows for a subnormal scale where the oracle's products do not";
  const bool bn_grad = op.id == OpId::BatchNormalizationGrad || op.id == OpId::BatchNormGradReduce ||
                       op.id == OpId::BatchNormGradApply;
  if (bn_grad && (input == "scale" || input == "variance" || input == "inv_std") && inf)
    return "the per-channel coefficients meet inf*0 where the oracle's formula gives +-inf or NaN the other way";
  if (op.id == OpId::BatchNormGradApply && input == "sums" && subnormal)
    return "a subnormal count (the contract's count is a whole number) rounds to 0 in an f32 compute type";
  const bool max_finite = s == "max finite" || s == "-max finite";
  if ((op.family == OpFamily::layer_norm || op.family == OpFamily::batch_norm) && max_finite)
    return "sums of squares and products of the largest finite values overflow the compute type";
  if (op.id == OpId::QuickGeluGrad && max_finite) return "alpha*x overflows: v*(1 - s) is inf*0";
  return nullptr;
}

class SpecialValues : public ::testing::TestWithParam<std::string> {};

TEST_P(SpecialValues, PropagateAsTheOracleSays) {
  const OpSchema& op = *find_op(GetParam());
  int cases = 0, failures = 0, known = 0;
  std::string known_reasons;
  const std::vector<Where> where_all = places();
  for (const Where& place : where_all) {
    if (!place.simd_target.empty() && !cpu::force_simd_target(place.simd_target)) {
      ADD_FAILURE() << "cannot force SIMD target " << place.simd_target;
      continue;
    }
    for (const TypeSignature& sig : op.signatures)
      for (std::size_t input = 0; input < op.inputs.size(); ++input)
        for (const Special& sp : kSpecials) {
          Problem p;
          p.op = op.id;
          p.sig = sig;
          p.shape = shape_for(op);
          p.device = place.device;
          p.misalign_bytes = 0;
          const DType in_type = check::input_dtype(p, static_cast<int>(input));
          const double v = sp.value(in_type);
          oracle::Tensors edited;
          p.edit_inputs = [&](oracle::Tensors& in) {
            if (input < in.size() && in[input])
              for (int64_t at : positions(in[input]->numel())) in[input]->v[static_cast<std::size_t>(at)] = v;
            edited = in;
          };
          check::Case c(p);
          if (input >= edited.size() || !edited[input]) continue;  // an optional input the oracle leaves out
          ++cases;
          const oracle::Tensors expected = oracle::reference(op.name, edited, check::full_attrs(p));
          c.poison_outputs();
          const char* deviation = known_deviation(op, op.inputs[input].name, sp, in_type);
          if (deviation) {
            ++known;
            if (known_reasons.find(deviation) == std::string::npos) known_reasons += std::string(" ") + deviation + ";";
            continue;
          }
          const Status s = c.run();
          const std::string where = check::describe(p) + " on " + device_type_name(place.device.type) +
                                    (place.simd_target.empty() ? "" : " (" + place.simd_target + ")") + ", " + sp.name +
                                    " in '" + std::string(op.inputs[input].name) + "'";
          if (!s) {
            ADD_FAILURE() << where << ": " << s.to_string();
            ++failures;
            continue;
          }
          const check::Report r = c.compare();
          for (std::size_t o = 0; o < r.outputs.size(); ++o) {
            if (r.outputs[o].empty() || o >= expected.size() || !expected[o]) continue;
            const DType out_type = check::output_dtype(p, static_cast<int>(o));
            const check::Tolerance tol = check::tolerance(p, static_cast<int>(o));
            for (std::size_t e = 0; e < r.outputs[o].size(); ++e) {
              std::string why;
              if (agrees(r.outputs[o][e], expected[o]->v[e], out_type, tol, &why)) continue;
              if (++failures <= 20)
                ADD_FAILURE() << where << ": " << op.outputs[o].name << "[" << e << "] " << why;
              break;
            }
          }
        }
  }
  if (!where_all.empty() && !where_all.front().simd_target.empty())
    cpu::force_simd_target(where_all.front().simd_target);  // the best target again
  EXPECT_GT(cases, 0);
  RecordProperty("cases", cases);
  RecordProperty("known_deviations_skipped", known);
  if (known > 0 && failures == 0)
    GTEST_SKIP() << known << " of " << cases << " cases skipped as known deviations:" << known_reasons
                 << " (the other " << cases - known << " passed)";
}

std::vector<std::string> all_ops() {
  std::vector<std::string> r;
  for (const OpSchema& s : op_schemas()) r.emplace_back(s.name);
  return r;
}

INSTANTIATE_TEST_SUITE_P(AllOps, SpecialValues, ::testing::ValuesIn(all_ops()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace gradops::testing
