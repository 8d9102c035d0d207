// The LayerNorm gradients on buffers placed as users' are, through the C ABI: f32 or bf16 rows
// x cols, every tensor's base MIS bytes past a cache line (glibc's malloc, and so numpy, gives large
// buffers 16). Each call's X_grad, scale_grad and bias_grad are checked against float64 formulas
// computed here (from the same mean and inv_std inputs), then the op and a 2-thread copy of the same
// bytes are timed in alternation. Prints the share of the copy (the bytes model: dY and X read once,
// X_grad written once). lab/cpu/NOTES.md, section 17.
//
//   cmake --preset bench && cmake --build build/bench --target gradops
//   g++ -O2 -mavx512f -fopenmp -Iinclude lab/cpu/ln_mis_lab.cpp build/bench/libgradops.a -lhwy -lsleef -o /tmp/ln_mis_lab
//   MIS=16 /tmp/ln_mis_lab [REPEATS] [op=LayerNormalizationGrad|SimplifiedLayerNormalizationGrad|InvertibleLayerNormalizationGrad] [bf16] [ROWSxCOLS ...]
#include <gradops/gradops.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "lab_timing.hpp"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// 64-byte aligned; MIS=B moves the base B bytes past the boundary (tensors only, not the copy's).
struct Buffer {
  char* base;
  void* p;
  Buffer(size_t bytes, bool tensor) {
    base = static_cast<char*>(std::aligned_alloc(64, (bytes + 127) / 64 * 64));
    std::memset(base, 0, (bytes + 127) / 64 * 64);
    p = base + (tensor && std::getenv("MIS") ? std::atoi(std::getenv("MIS")) : 0);
  }
  ~Buffer() { std::free(base); }
};

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 9;
  std::string op = "LayerNormalizationGrad";
  bool bf16 = false;
  std::vector<std::string> shapes;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("op=", 0) == 0) op = a.substr(3);
    else if (a == "bf16") bf16 = true;
    else shapes.push_back(a);
  }
  if (shapes.empty()) shapes = {"262144x128", "65536x512", "32768x1000", "16384x2050"};
  const bool rms = op == "SimplifiedLayerNormalizationGrad", inv = op == "InvertibleLayerNormalizationGrad";
  const size_t es = bf16 ? 2 : 4;
  const int32_t dt = bf16 ? GRADOPS_DTYPE_BF16 : GRADOPS_DTYPE_F32;
  std::mt19937_64 rng(12345);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const std::string& s : shapes) {
    int64_t shape[2];
    if (std::sscanf(s.c_str(), "%ldx%ld", &shape[0], &shape[1]) != 2) return std::fprintf(stderr, "bad shape %s\n", s.c_str()), 2;
    const int64_t rows = shape[0], cols = shape[1], count = rows * cols;
    // Values as the op sees them (bf16: rounded), in float for the check.
    std::vector<float> dy(count), src(count), scale(cols), bias(cols), mean(rows), istd(rows);
    for (int64_t j = 0; j < cols; ++j) scale[j] = 0.5f + std::abs(u(rng)), bias[j] = u(rng);
    for (int64_t i = 0; i < rows; ++i) mean[i] = 2 * u(rng), istd[i] = 0.5f + std::abs(u(rng));
    auto round = [&](float f) { return bf16 ? from_bf16(to_bf16(f)) : f; };
    for (int64_t j = 0; j < cols; ++j) scale[j] = round(scale[j]), bias[j] = round(bias[j]);
    for (int64_t i = 0; i < count; ++i) dy[i] = round(u(rng)), src[i] = round(mean[i / cols] + 2 * u(rng));
    Buffer bdy(count * es, true), bsrc(count * es, true), bdx(count * es, true), bscale(cols * es, true),
        bbias(cols * es, true), bds(cols * es, true), bdb(cols * es, true), bmean(rows * 4, true), bistd(rows * 4, true);
    auto fill = [&](Buffer& b, const std::vector<float>& v) {
      for (size_t i = 0; i < v.size(); ++i)
        if (bf16) static_cast<uint16_t*>(b.p)[i] = to_bf16(v[i]);
        else static_cast<float*>(b.p)[i] = v[i];
    };
    fill(bdy, dy), fill(bsrc, src), fill(bscale, scale), fill(bbias, bias);
    std::memcpy(bmean.p, mean.data(), rows * 4), std::memcpy(bistd.p, istd.data(), rows * 4);
    auto read = [&](const Buffer& b, int64_t i) {
      return bf16 ? from_bf16(static_cast<const uint16_t*>(b.p)[i]) : static_cast<const float*>(b.p)[i];
    };
    const int64_t one = cols, stat = rows;
    gradops_tensor tdy{bdy.p, {GRADOPS_DEVICE_CPU, 0}, 2, dt, shape, nullptr};
    gradops_tensor tsrc{bsrc.p, {GRADOPS_DEVICE_CPU, 0}, 2, dt, shape, nullptr};
    gradops_tensor tdx{bdx.p, {GRADOPS_DEVICE_CPU, 0}, 2, dt, shape, nullptr};
    gradops_tensor tscale{bscale.p, {GRADOPS_DEVICE_CPU, 0}, 1, dt, &one, nullptr};
    gradops_tensor tbias{bbias.p, {GRADOPS_DEVICE_CPU, 0}, 1, dt, &one, nullptr};
    gradops_tensor tds{bds.p, {GRADOPS_DEVICE_CPU, 0}, 1, dt, &one, nullptr};
    gradops_tensor tdb{bdb.p, {GRADOPS_DEVICE_CPU, 0}, 1, dt, &one, nullptr};
    const int64_t stat_shape[2] = {stat, 1};
    gradops_tensor tmean{bmean.p, {GRADOPS_DEVICE_CPU, 0}, 2, GRADOPS_DTYPE_F32, stat_shape, nullptr};
    gradops_tensor tistd{bistd.p, {GRADOPS_DEVICE_CPU, 0}, 2, GRADOPS_DTYPE_F32, stat_shape, nullptr};
    std::vector<const gradops_tensor*> in{&tdy, &tsrc, &tscale};
    if (inv) in.push_back(&tbias);
    else if (!rms) in.push_back(&tmean);
    in.push_back(&tistd);
    std::vector<const gradops_tensor*> out{&tdx, &tds};
    if (!rms) out.push_back(&tdb);
    const gradops_context ctx{2, nullptr, nullptr};
    auto run = [&] {
      return gradops_run(op.c_str(), in.data(), static_cast<int>(in.size()), out.data(), static_cast<int>(out.size()),
                         nullptr, 0, &ctx);
    };
    if (run() != GRADOPS_OK) return std::fprintf(stderr, "%s: %s\n", op.c_str(), gradops_last_error()), 1;
    // float64: g = dy scale, xhat = (x - mu) r [RMSNorm: x r; invertible: (y - bias) / scale],
    // dx = r (g - mean(g) - xhat mean(g xhat)) [RMSNorm: no mean(g)]; dscale = sum dy xhat, dbias = sum dy.
    double worst = 0, worst_cols = 0;
    std::vector<double> ds(cols, 0.0), db(cols, 0.0), xh(cols);
    for (int64_t i = 0; i < rows; ++i) {
      double s1 = 0, s2 = 0, gmax = 0;
      const double r = istd[i];
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t k = i * cols + j;
        xh[j] = inv ? (double(src[k]) - bias[j]) / scale[j] : rms ? src[k] * r : (double(src[k]) - mean[i]) * r;
        const double g = double(dy[k]) * scale[j];
        s1 += g, s2 += g * xh[j], gmax = std::max(gmax, std::abs(g));
        ds[j] += dy[k] * xh[j], db[j] += dy[k];
      }
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t k = i * cols + j;
        const double g = double(dy[k]) * scale[j];
        const double want = r * (g - (rms ? 0 : s1 / cols) - xh[j] * s2 / cols);
        const double bound = r * (gmax + std::abs(s1 / cols) + std::abs(xh[j] * s2 / cols)) + 1e-30;
        worst = std::max(worst, std::abs(read(bdx, k) - want) / bound);
      }
    }
    for (int64_t j = 0; j < cols; ++j) {
      worst_cols = std::max(worst_cols, std::abs(read(bds, j) - ds[j]) / (std::abs(ds[j]) + 1e-3 * rows));
      if (!rms) worst_cols = std::max(worst_cols, std::abs(read(bdb, j) - db[j]) / (std::abs(db[j]) + 1e-3 * rows));
    }
    const double tol = bf16 ? 1e-2 : 1e-5;
    if (!(worst < tol && worst_cols < tol))
      return std::fprintf(stderr, "%s %s: dx off by %g, dscale/dbias by %g of their bounds\n", op.c_str(), s.c_str(), worst,
                          worst_cols), 1;
    const size_t bytes = count * es, copy_bytes = bytes * 3 / 2;  // dY, X read and X_grad written: half of each copy
    Buffer src_copy(copy_bytes, false), dst_copy(copy_bytes, false);
    stream2(static_cast<char*>(dst_copy.p), static_cast<char*>(src_copy.p), copy_bytes);
    std::vector<double> top, tcopy;
    for (int k = 0; k < repeats; ++k) {
      double t0 = now();
      run();
      top.push_back(now() - t0);
      t0 = now();
      stream2(static_cast<char*>(dst_copy.p), static_cast<char*>(src_copy.p), copy_bytes);
      tcopy.push_back(now() - t0);
    }
    const double gbs = 3.0 * bytes / median(top) / 1e9, copy = 2.0 * copy_bytes / median(tcopy) / 1e9;
    std::printf("%-34s %-4s MIS=%-3s %-11s checked (%.1e, %.1e)  %8.0f us  %5.1f GB/s  copy %5.1f GB/s  share %.3f\n",
                op.c_str(), bf16 ? "bf16" : "f32", std::getenv("MIS") ? std::getenv("MIS") : "0", s.c_str(), worst,
                worst_cols, median(top) * 1e6, gbs, copy, gbs / copy);
  }
  return 0;
}
