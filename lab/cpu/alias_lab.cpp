// Lab: does the page offset of a kernel's scratch arrays, relative to its inputs, change its speed?
// The BatchNorm NHWC reduction adds each row into per-thread column accumulators (a load and a
// store per vector) while it loads x and dy, and the LayerNorm write pass does the same with its
// dscale/dbias partial rows. A load whose address matches an in-flight store's in its low 12 bits
// waits for that store (4K aliasing), so the distance between the scratch and the inputs modulo
// 4096 could decide the speed. The workspace comes from a Context allocator that hands out an arena
// at a chosen offset; the inputs sit at page boundaries, as large allocations do.
//
// Checks: the output at offset 0 against a float64 reference, and every other offset's output
// bitwise against offset 0's (the scratch address cannot change results). Then times each offset
// (median of repeats) for BatchNormalizationGrad NHWC and LayerNormalizationGrad with dscale/dbias.
//
// Build and run:
//   g++ -O2 -std=c++20 -fopenmp -Iinclude lab/cpu/alias_lab.cpp build/release/libgradops.so \
//       -Wl,-rpath,build/release -o /tmp/alias_lab
//   /tmp/alias_lab [threads (default 2)] [repeats (default 9)]
#include <gradops/gradops.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

namespace {

using namespace gradops;

// Page-aligned buffer of n floats.
struct Buf {
  float* p = nullptr;
  explicit Buf(size_t n) { p = static_cast<float*>(std::aligned_alloc(4096, (n * 4 + 4095) / 4096 * 4096)); }
  ~Buf() { std::free(p); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
};

// The arena allocator: every request gets arena + offset (a multiple of 64), one at a time.
struct Arena {
  char* base = nullptr;
  size_t size = 0, offset = 0;
  bool busy = false;
};
void* arena_alloc(void* user, Device, size_t bytes) {
  auto* a = static_cast<Arena*>(user);
  if (a->busy || a->offset + bytes > a->size) return nullptr;
  a->busy = true;
  return a->base + a->offset;
}
void arena_free(void* user, Device, void*, size_t) { static_cast<Arena*>(user)->busy = false; }

template <class F>
double median_ms(F&& f, int repeats) {
  std::vector<double> t;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 9;
  Arena arena;
  arena.size = size_t{64} << 20;
  arena.base = static_cast<char*>(std::aligned_alloc(4096, arena.size));
  const WorkspaceAllocator alloc{arena_alloc, arena_free, &arena};
  Context ctx;
  ctx.num_threads = threads;
  ctx.allocator = &alloc;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;

  // BatchNormalizationGrad, NHWC 16x56x56x256 f32.
  const int64_t N = 16, H = 56, W = 56, C = 256, M = N * H * W;
  const size_t n = static_cast<size_t>(M * C);
  Buf x(n), dy(n), dx(n), ref_dx(n);
  std::vector<float> scale(C), mean(C), istd(C), dscale(C), dbias(C);
  for (size_t i = 0; i < n; ++i) x.p[i] = nd(rng), dy.p[i] = nd(rng);
  for (int64_t c = 0; c < C; ++c) scale[c] = 1.0f + 0.01f * c, mean[c] = 0.1f, istd[c] = 0.9f;
  const int64_t shape[] = {N, H, W, C}, cshape[] = {C};
  BatchNormGradArgs bn{TensorView(dy.p, DType::f32, shape), TensorView(x.p, DType::f32, shape),
                       TensorView(scale.data(), DType::f32, cshape), TensorView(mean.data(), DType::f32, cshape),
                       TensorView(istd.data(), DType::f32, cshape), TensorView(dx.p, DType::f32, shape),
                       TensorView(dscale.data(), DType::f32, cshape), TensorView(dbias.data(), DType::f32, cshape)};
  bn.channels_last = true;

  // LayerNormalizationGrad, 16384x1024 f32 with dscale/dbias.
  const int64_t R = 16384, K = 1024;
  const size_t m = static_cast<size_t>(R * K);
  Buf lx(m), ldy(m), ldx(m), lref(m);
  std::vector<float> lscale(K), lmean(R), listd(R), ldscale(K), ldbias(K);
  for (size_t i = 0; i < m; ++i) lx.p[i] = nd(rng), ldy.p[i] = nd(rng);
  for (int64_t k = 0; k < K; ++k) lscale[k] = 1.0f + 0.001f * k;
  for (int64_t r = 0; r < R; ++r) lmean[r] = 0.01f, listd[r] = 1.0f;
  const int64_t lshape[] = {R, K}, kshape[] = {K}, rshape[] = {R, 1};
  LayerNormGradArgs ln{TensorView(ldy.p, DType::f32, lshape), TensorView(lx.p, DType::f32, lshape),
                       TensorView(lscale.data(), DType::f32, kshape), TensorView(lmean.data(), DType::f32, rshape),
                       TensorView(listd.data(), DType::f32, rshape), TensorView(ldx.p, DType::f32, lshape),
                       TensorView(ldscale.data(), DType::f32, kshape), TensorView(ldbias.data(), DType::f32, kshape)};

  // Check at offset 0: BatchNorm dx against float64 for a sample of channels, LayerNorm dx for a
  // sample of rows.
  arena.offset = 0;
  if (Status s = batch_norm_grad(bn, ctx); !s.is_ok()) return std::printf("bn: %s\n", s.message().c_str()), 1;
  if (Status s = layer_norm_grad(ln, ctx); !s.is_ok()) return std::printf("ln: %s\n", s.message().c_str()), 1;
  double worst = 0;
  for (int64_t c = 0; c < C; c += 37) {
    double s1 = 0, s2 = 0;
    for (int64_t i = 0; i < M; ++i) {
      const double g = dy.p[i * C + c], xh = (x.p[i * C + c] - double(mean[c])) * istd[c];
      s1 += g, s2 += g * xh;
    }
    for (int64_t i = 0; i < M; i += 101) {
      const double xh = (x.p[i * C + c] - double(mean[c])) * istd[c];
      const double ref = double(scale[c]) * istd[c] * (dy.p[i * C + c] - s1 / M - xh * s2 / M);
      worst = std::max(worst, std::fabs(dx.p[i * C + c] - ref) / (1e-3 + std::fabs(ref)));
    }
  }
  for (int64_t r = 0; r < R; r += 997) {
    double s1 = 0, s2 = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double g = double(ldy.p[r * K + k]) * lscale[k], xh = (lx.p[r * K + k] - double(lmean[r])) * listd[r];
      s1 += g, s2 += g * xh;
    }
    for (int64_t k = 0; k < K; ++k) {
      const double g = double(ldy.p[r * K + k]) * lscale[k], xh = (lx.p[r * K + k] - double(lmean[r])) * listd[r];
      const double ref = listd[r] * (g - s1 / K - xh * s2 / K);
      worst = std::max(worst, std::fabs(ldx.p[r * K + k] - ref) / (1e-3 + std::fabs(ref)));
    }
  }
  std::printf("check at offset 0: worst relative error %.2e (limit 1e-4)\n", worst);
  if (!(worst <= 1e-4)) return 1;
  std::memcpy(ref_dx.p, dx.p, n * 4);
  std::memcpy(lref.p, ldx.p, m * 4);

  std::printf("threads %d, repeats %d; BatchNormalizationGrad NHWC %lldx%lldx%lldx%lld, LayerNormalizationGrad "
              "%lldx%lld (dscale, dbias), f32\n",
              threads, repeats, (long long)N, (long long)H, (long long)W, (long long)C, (long long)R, (long long)K);
  std::printf("%8s %12s %12s\n", "offset", "bn ms", "ln ms");
  for (size_t off = 0; off < 4096; off += 256) {
    arena.offset = off;
    std::memset(dx.p, 0xff, n * 4);
    std::memset(ldx.p, 0xff, m * 4);
    (void)batch_norm_grad(bn, ctx);
    (void)layer_norm_grad(ln, ctx);
    if (std::memcmp(dx.p, ref_dx.p, n * 4) || std::memcmp(ldx.p, lref.p, m * 4))
      return std::printf("offset %zu: results differ from offset 0\n", off), 1;
    const double bms = median_ms([&] { (void)batch_norm_grad(bn, ctx); }, repeats);
    const double lms = median_ms([&] { (void)layer_norm_grad(ln, ctx); }, repeats);
    std::printf("%8zu %12.2f %12.2f\n", off, bms, lms);
  }
  return 0;
}
