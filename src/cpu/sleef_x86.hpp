// The SLEEF 3.x vector functions gradops calls. sleef.h declares its AVX2 and AVX-512 variants
// only when the whole translation unit is compiled for those ISAs; gradops compiles one source
// for several ISAs (Highway's per-function targets), so it declares the few it needs itself,
// each with the target it is built for: clang rejects passing a 256- or 512-bit vector to a
// function declared without that ISA (the calling convention would differ).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define GRADOPS_SLEEF_TARGET(isa) __attribute__((target(isa)))
extern "C" {
GRADOPS_SLEEF_TARGET("sse4.1") __m128 Sleef_erfcf4_u15sse4(__m128);
GRADOPS_SLEEF_TARGET("sse4.1") __m128d Sleef_erfcd2_u15sse4(__m128d);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256 Sleef_erfcf8_u15avx2(__m256);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256d Sleef_erfcd4_u15avx2(__m256d);
GRADOPS_SLEEF_TARGET("avx512f") __m512 Sleef_erfcf16_u15avx512f(__m512);
GRADOPS_SLEEF_TARGET("avx512f") __m512d Sleef_erfcd8_u15avx512f(__m512d);
GRADOPS_SLEEF_TARGET("sse4.1") __m128 Sleef_expf4_u10sse4(__m128);
GRADOPS_SLEEF_TARGET("sse4.1") __m128d Sleef_expd2_u10sse4(__m128d);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256 Sleef_expf8_u10avx2(__m256);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256d Sleef_expd4_u10avx2(__m256d);
GRADOPS_SLEEF_TARGET("avx512f") __m512 Sleef_expf16_u10avx512f(__m512);
GRADOPS_SLEEF_TARGET("avx512f") __m512d Sleef_expd8_u10avx512f(__m512d);
GRADOPS_SLEEF_TARGET("sse4.1") __m128 Sleef_tanhf4_u10sse4(__m128);
GRADOPS_SLEEF_TARGET("sse4.1") __m128d Sleef_tanhd2_u10sse4(__m128d);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256 Sleef_tanhf8_u10avx2(__m256);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256d Sleef_tanhd4_u10avx2(__m256d);
GRADOPS_SLEEF_TARGET("avx512f") __m512 Sleef_tanhf16_u10avx512f(__m512);
GRADOPS_SLEEF_TARGET("avx512f") __m512d Sleef_tanhd8_u10avx512f(__m512d);
GRADOPS_SLEEF_TARGET("sse4.1") __m128 Sleef_logf4_u10sse4(__m128);
GRADOPS_SLEEF_TARGET("sse4.1") __m128d Sleef_logd2_u10sse4(__m128d);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256 Sleef_logf8_u10avx2(__m256);
GRADOPS_SLEEF_TARGET("avx2,fma") __m256d Sleef_logd4_u10avx2(__m256d);
GRADOPS_SLEEF_TARGET("avx512f") __m512 Sleef_logf16_u10avx512f(__m512);
GRADOPS_SLEEF_TARGET("avx512f") __m512d Sleef_logd8_u10avx512f(__m512d);
}
#undef GRADOPS_SLEEF_TARGET
#endif
