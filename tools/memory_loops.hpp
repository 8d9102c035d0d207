#pragma once
// The memory loops of the bench tool's copy reference, at the widest SIMD target the CPU has.
// Pointers must be aligned to the vector size (64 bytes does for every target).
#include <cstdint>

namespace gradops::cli {
void copy_loop(uint64_t* dst, const uint64_t* src, int64_t words);
void stream_copy(uint64_t* dst, const uint64_t* src, int64_t words);
void stream_add(uint64_t* c, const uint64_t* a, const uint64_t* b, int64_t words);  // c = a + b
}  // namespace gradops::cli
