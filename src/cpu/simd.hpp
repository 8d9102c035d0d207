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

// The vector transcendentals the kernels use, on the current target, lane by lane over n
// values (for the ulp tests).
enum class VectorMath { erfc, exp, tanh, log };
void eval_vector_math(VectorMath f, const float* in, float* out, int64_t n);
void eval_vector_math(VectorMath f, const double* in, double* out, int64_t n);

// Called by every dispatching entry point before its first kernel.
void apply_simd_target_from_environment();

}  // namespace gradops::cpu
