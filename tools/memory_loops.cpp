// The loops of the bench tool's copy reference (bench.cpp, measure_copy), compiled for every SIMD
// target that gradops' kernels are and dispatched at run time the same way, so the reference moves
// memory with the vector width the kernels use (on AVX-512 machines 512-bit stores move ~10% more
// than 128-bit ones).
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memory_loops.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "memory_loops.hpp"

HWY_BEFORE_NAMESPACE();
namespace gradops::cli::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// kStream: non-temporal stores, as gradops' elementwise kernels use on large outputs; otherwise
// ordinary stores, which read each destination line into the cache before writing it.
template <bool kStream>
void Copy(uint64_t* HWY_RESTRICT dst, const uint64_t* HWY_RESTRICT src, int64_t words) {
  const hn::ScalableTag<uint64_t> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + n <= words; i += n) {
    if constexpr (kStream) hn::Stream(hn::Load(d, src + i), d, dst + i);
    else hn::Store(hn::Load(d, src + i), d, dst + i);
  }
  for (; i < words; ++i) dst[i] = src[i];
  if constexpr (kStream) hwy::FlushStream();
}
void CopyLoop(uint64_t* HWY_RESTRICT dst, const uint64_t* HWY_RESTRICT src, int64_t words) {
  Copy<false>(dst, src, words);
}
void StreamCopy(uint64_t* HWY_RESTRICT dst, const uint64_t* HWY_RESTRICT src, int64_t words) {
  Copy<true>(dst, src, words);
}

// c = a + b with non-temporal stores: two reads per write, the stream mix of most gradient ops.
void StreamAdd(uint64_t* HWY_RESTRICT c, const uint64_t* HWY_RESTRICT a, const uint64_t* HWY_RESTRICT b,
               int64_t words) {
  const hn::ScalableTag<uint64_t> d;
  const int64_t n = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + n <= words; i += n) hn::Stream(hn::Add(hn::Load(d, a + i), hn::Load(d, b + i)), d, c + i);
  for (; i < words; ++i) c[i] = a[i] + b[i];
  hwy::FlushStream();
}

}  // namespace gradops::cli::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace gradops::cli {
HWY_EXPORT(CopyLoop);
HWY_EXPORT(StreamCopy);
HWY_EXPORT(StreamAdd);

void copy_loop(uint64_t* dst, const uint64_t* src, int64_t words) { HWY_DYNAMIC_DISPATCH(CopyLoop)(dst, src, words); }
void stream_copy(uint64_t* dst, const uint64_t* src, int64_t words) {
  HWY_DYNAMIC_DISPATCH(StreamCopy)(dst, src, words);
}
void stream_add(uint64_t* c, const uint64_t* a, const uint64_t* b, int64_t words) {
  HWY_DYNAMIC_DISPATCH(StreamAdd)(c, a, b, words);
}
}  // namespace gradops::cli
#endif
