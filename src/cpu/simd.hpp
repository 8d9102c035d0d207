// Which SIMD target the CPU kernels run on.
#pragma once

#include <cstdint>
#include <string_view>

namespace gradops::cpu {

// The Highway target the dispatched kernels use now ("AVX3", "AVX2", "SSE4", "EMU128").
const char* simd_target_name();

// Restricts dispatch to targets no better than `name` ("avx512", "avx2", "sse4", "portable");
// returns false for an unknown name or one the CPU cannot run. Also read once from the
// GRADOPS_CPU_TARGET environment variable before the first kernel runs.
bool force_simd_target(std::string_view name);

// Every target compiled in and supported by this CPU, best first ("AVX3", "AVX2", ...), as the
// names force_simd_target accepts ("avx512", "avx2", "sse4", "portable").
int supported_simd_targets(const char** names, int capacity);

// Called by every dispatching entry point before its first kernel.
void apply_simd_target_from_environment();

}  // namespace gradops::cpu
