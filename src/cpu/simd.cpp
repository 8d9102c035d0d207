#include "cpu/simd.hpp"

#include <cstdlib>
#include <cstdio>

#include "hwy/highway.h"
#include "hwy/targets.h"

namespace gradops::cpu {
namespace {

struct Named {
  std::string_view name;
  int64_t target;
};
// HWY_TARGETS here is the set compiled into gradops (HWY_DISABLED_TARGETS applies).
constexpr Named kTargets[] = {
    {"avx512", HWY_AVX3}, {"avx2", HWY_AVX2}, {"sse4", HWY_SSE4}, {"portable", HWY_EMU128}};

int64_t available() { return hwy::SupportedTargets() & HWY_TARGETS; }

}  // namespace

const char* simd_target_name() {
  apply_simd_target_from_environment();
  const int64_t t = available();
  return t ? hwy::TargetName(t & -t) : "none";
}

bool force_simd_target(std::string_view name) {
  for (const Named& n : kTargets) {
    if (n.name != name) continue;
    if (!(n.target & HWY_TARGETS)) return false;
    hwy::SetSupportedTargetsForTest(0);  // back to what the CPU reports
    if (!(hwy::SupportedTargets() & n.target)) return false;
    // Keep `n.target` and everything worse (larger bits); drop the better ones.
    hwy::SetSupportedTargetsForTest(hwy::SupportedTargets() & ~(n.target - 1));
    hwy::GetChosenTarget().Update(hwy::SupportedTargets());
    return true;
  }
  return false;
}

int supported_simd_targets(const char** names, int capacity) {
  int n = 0;
  hwy::SetSupportedTargetsForTest(0);
  const int64_t all = hwy::SupportedTargets() & HWY_TARGETS;
  for (const Named& t : kTargets)
    if ((all & t.target) && n < capacity) names[n++] = t.name.data();
  return n;
}

void apply_simd_target_from_environment() {
  static const bool applied = [] {
    const char* want = std::getenv("GRADOPS_CPU_TARGET");
    if (want && *want && !force_simd_target(want))
      std::fprintf(stderr, "gradops: GRADOPS_CPU_TARGET=%s is not available on this CPU; ignored\n", want);
    return true;
  }();
  (void)applied;
}

}  // namespace gradops::cpu
