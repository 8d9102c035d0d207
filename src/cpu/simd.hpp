// Which SIMD target the CPU kernels run on.
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace gradops::cpu {

// The Highway target the dispatched kernels use now ("AVX3", "AVX2", "SSE4", "EMU128"; "AVX3+BF16"
// where AVX-512 rounds to bf16 with the CPU's conversion; "none" if no target is compiled in).
const char* simd_target_name();

// Restricts dispatch to targets no better than `name` ("avx512", "avx2", "sse4", "portable");
// returns false for an unknown name or one the CPU cannot run. Also read once from the
// GRADOPS_CPU_TARGET environment variable before the first kernel runs.
bool force_simd_target(std::string_view name);

// Every target compiled in and supported by this CPU, best first, as the names force_simd_target
// accepts ("avx512", "avx2", "sse4", "portable").
int supported_simd_targets(const char** names, int capacity);

// The vector transcendentals the kernels use, on the current target, lane by lane over n
// values (for the ulp tests).
enum class VectorMath { erfc, exp, exp_for_16bit, tanh, log };
void eval_vector_math(VectorMath f, const float* in, float* out, int64_t n);
void eval_vector_math(VectorMath f, const double* in, double* out, int64_t n);

// The kernels' 16-bit conversions on the current target, over n values (for the tests): f32 ->
// bf16 and f32 -> f16 rounding, and f16 -> f32 widening, on the bits of the 16-bit values.
void narrow_to_bf16(const float* in, uint16_t* out, int64_t n);
void narrow_to_half(const float* in, uint16_t* out, int64_t n);
void widen_half(const uint16_t* in, float* out, int64_t n);

// Output size in bytes from which kernels write with non-temporal stores: an eighth of the
// last-level cache as the OS reports it (4 MiB when it reports none). Below it a result stays in
// cache for whatever reads it next; above it a normal store costs an extra read of each line
// (write-allocate) and evicts inputs still to be read, while the cache is shared with the other
// cores and would not keep the output anyway.
int64_t stream_min_bytes();

// Replaces that threshold (tests use 0 to run every kernel's streaming path on small tensors); a
// negative value restores the default.
void set_stream_min_bytes(int64_t bytes);

// Bytes a kernel can read and expect to find again in the L2 for a second pass over them: three
// quarters of the L2 the OS reports (512 KiB when it reports none). The softmax kernels on a
// middle axis fold a slab and park exp values only where they fit it: 768 KiB of Zen 4's 1 MiB
// holds a whole [1000, 96] f32 slab of both gradient inputs. It decides only where data is read
// again, never a reduction order, so a machine-dependent value cannot change results.
int64_t l2_reuse_bytes();

// The last-level cache that CPU 0 shares with its neighbours, as the OS's cache topology gives it
// (/sys/devices/system/cpu/cpu0/cache): a Zen 4 CCD's 32 MiB, not the package total that
// sysconf reports (384 MiB on a 12-CCD EPYC). Falls back to sysconf, then to 32 MiB. Like
// l2_reuse_bytes it decides where data is read again, never a reduction order.
int64_t llc_bytes();

// Whether the AVX-512 target rounds f32 to bf16 with the CPU's AVX512-BF16 conversion (where the
// CPU has it) instead of integer arithmetic. Both round to nearest even and quiet NaNs; the
// instruction flushes subnormal inputs to zero, so vectors holding one take the integer path.
bool native_bf16();

// Turns the AVX512-BF16 conversion off (tests run both paths) or back on where the CPU has it;
// returns native_bf16().
bool set_native_bf16(bool on);
extern std::atomic<bool> g_native_bf16;  // what native_bf16() reads, for the kernels' inner loops

// Called by every dispatching entry point before its first kernel.
void apply_simd_target_from_environment();

}  // namespace gradops::cpu
