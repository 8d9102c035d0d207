// The softmax family on a middle axis (axis 1 of a 3-D f32 or bf16 tensor), through the C ABI: each
// shape's output is checked against a float64 formula computed here, then the op and a 2-thread
// copy of the same bytes are timed in alternation. Prints the share of the copy (the bytes model:
// inputs read once and the output written once, against the copy's read + write).
// lab/cpu/NOTES.md, section 15.
//
//   cmake --preset bench && cmake --build build/bench --target gradops
//   g++ -O2 -mavx512f -fopenmp -Iinclude lab/cpu/axis_lab.cpp build/bench/libgradops.a -lhwy -lsleef -o /tmp/axis_lab
//   /tmp/axis_lab [REPEATS] [op=SoftmaxGrad_13|LogSoftmaxGrad_13|Softmax_13|LogSoftmax_13] [bf16] [OUTERxAXISxINNER ...]
#include <gradops/gradops.h>
#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>

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

// Two threads, each copying its half with glibc's memcpy (non-temporal only above its threshold,
// 190 MB a call on the reference machine) or with a non-temporal loop; the copy is the faster.
void memcpy2(char* dst, const char* src, size_t bytes) {
#pragma omp parallel num_threads(2)
  {
    const size_t half = bytes / 2, t = static_cast<size_t>(omp_get_thread_num());
    const size_t b0 = t * half, b1 = t ? bytes : half;
    std::memcpy(dst + b0, src + b0, b1 - b0);
  }
}
// 64-byte aligned, as PyTorch's and numpy's large CPU buffers are; HUGE=1 asks for transparent
// huge pages (where the kernel's policy is madvise, only asked-for buffers get them). MIS=B moves
// every tensor's base B bytes past the boundary (glibc's malloc gives large buffers 16).
template <class T>
struct Buffer {
  T* p;
  explicit Buffer(size_t n, bool tensor = true) {
    const size_t bytes = (n * sizeof(T) + (2u << 20) - 1) / (2u << 20) * (2u << 20);
    base = static_cast<char*>(std::aligned_alloc(std::getenv("HUGE") ? 2u << 20 : 64, bytes + 64));
    if (std::getenv("HUGE")) madvise(base, bytes + 64, MADV_HUGEPAGE);
    std::memset(base, 0, bytes + 64);
    p = reinterpret_cast<T*>(base + (tensor && std::getenv("MIS") ? std::atoi(std::getenv("MIS")) : 0));
  }
  ~Buffer() { std::free(base); }
  char* base;
  T* data() { return p; }
  T& operator[](int64_t i) { return p[i]; }
};

}  // namespace

int main(int argc, char** argv) {
  const int repeats = argc > 1 ? std::atoi(argv[1]) : 7;
  std::string op = "SoftmaxGrad_13";
  bool bf16 = false;
  std::vector<std::string> shapes;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("op=", 0) == 0) op = a.substr(3);
    else if (a == "bf16") bf16 = true;
    else shapes.push_back(a);
  }
  if (shapes.empty()) shapes = {"1024x16x4096", "1024x1000x96", "16384x1000x3", "1024x32768x2", "256x32768x8"};
  const bool log = op == "LogSoftmaxGrad_13" || op == "LogSoftmax_13";
  const bool forward = op == "Softmax_13" || op == "LogSoftmax_13";
  const int tensors = forward ? 2 : 3;
  std::mt19937_64 rng(12345);
  for (const std::string& s : shapes) {
    int64_t shape[3];
    if (std::sscanf(s.c_str(), "%ldx%ldx%ld", &shape[0], &shape[1], &shape[2]) != 3) return std::fprintf(stderr, "bad shape %s\n", s.c_str()), 2;
    const int64_t outer = shape[0], n = shape[1], inner = shape[2], count = outer * n * inner;
    Buffer<float> y(count), dy(count), dx(count);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < count; ++i) y[i] = forward ? 4 * u(rng) : log ? -std::abs(u(rng)) * 4 : std::abs(u(rng)) / n, dy[i] = u(rng);
    // bf16: the tensors hold the inputs rounded to bf16 (the check's float copies get the rounded
    // values), and the output is widened for the check.
    Buffer<uint16_t> y16(bf16 ? count : 0), dy16(bf16 ? count : 0), dx16(bf16 ? count : 0);
    for (int64_t i = 0; bf16 && i < count; ++i) y16[i] = to_bf16(y[i]), dy16[i] = to_bf16(dy[i]), y[i] = from_bf16(y16[i]), dy[i] = from_bf16(dy16[i]);
    const int32_t dt = bf16 ? GRADOPS_DTYPE_BF16 : GRADOPS_DTYPE_F32;
    gradops_tensor tdy{bf16 ? static_cast<void*>(dy16.data()) : dy.data(), {GRADOPS_DEVICE_CPU, 0}, 3, dt, shape, nullptr};
    gradops_tensor ty{bf16 ? static_cast<void*>(y16.data()) : y.data(), {GRADOPS_DEVICE_CPU, 0}, 3, dt, shape, nullptr};
    gradops_tensor tdx{bf16 ? static_cast<void*>(dx16.data()) : dx.data(), {GRADOPS_DEVICE_CPU, 0}, 3, dt, shape, nullptr};
    const gradops_tensor* in[2] = {forward ? &ty : &tdy, &ty};
    const gradops_tensor* out[1] = {&tdx};
    const gradops_attribute axis{"axis", 1};
    const gradops_context ctx{2, nullptr, nullptr};
    auto run = [&] { return gradops_run(op.c_str(), in, forward ? 1 : 2, out, 1, &axis, 1, &ctx); };
    if (run() != GRADOPS_OK) return std::fprintf(stderr, "%s: %s\n", op.c_str(), gradops_last_error()), 1;
    for (int64_t i = 0; bf16 && i < count; ++i) dx[i] = from_bf16(dx16[i]);
    // float64: dx = y (dy - sum(y dy)); log: dx = dy - exp(y) sum(dy). Forwards (x in y):
    // exp(x - max) / sum and x - max - log(sum).
    double worst = 0;
    for (int64_t o = 0; o < outer; o += std::max<int64_t>(1, outer / 64))
      for (int64_t i = 0; i < inner; ++i) {
        double sum = 0, scale = 0, m = -INFINITY;
        for (int64_t r = 0; r < n && forward; ++r) m = std::max(m, double(y[(o * n + r) * inner + i]));
        for (int64_t r = 0; r < n && forward; ++r) sum += std::exp(y[(o * n + r) * inner + i] - m);
        for (int64_t r = 0; r < n && !forward; ++r) {
          const int64_t k = (o * n + r) * inner + i;
          sum += log ? double(dy[k]) : double(y[k]) * dy[k];
          scale += std::abs(log ? double(dy[k]) : double(y[k]) * dy[k]);
        }
        for (int64_t r = 0; r < n; ++r) {
          const int64_t k = (o * n + r) * inner + i;
          double want, bound;
          if (forward) {
            want = log ? y[k] - m - std::log(sum) : std::exp(y[k] - m) / sum;
            bound = log ? std::abs(y[k] - m) + std::abs(std::log(sum)) + 1 : want;
          } else {
            want = log ? dy[k] - std::exp(double(y[k])) * sum : y[k] * (dy[k] - sum);
            bound = log ? std::exp(double(y[k])) * scale + std::abs(dy[k]) : std::abs(y[k]) * (std::abs(dy[k]) + scale);
          }
          worst = std::max(worst, std::abs(dx[k] - want) / (bound + 1e-30));
        }
      }
    if (!(worst < (bf16 ? 1e-2 : 1e-5)) && !std::getenv("NOCHECK")) return std::fprintf(stderr, "%s %s: off by %g of its bound\n", op.c_str(), s.c_str(), worst), 1;
    const size_t bytes = count * (bf16 ? 2 : 4);
    const size_t copy_bytes = bytes * tensors / 2;  // the op's tensors, half read and half written
    Buffer<char> src(copy_bytes, false), dst(copy_bytes, false);
    memcpy2(dst.data(), src.data(), copy_bytes);
    stream2(dst.data(), src.data(), copy_bytes);
    std::vector<double> top, tcopy;
    for (int k = 0; k < repeats; ++k) {
      double t0 = now();
      run();
      top.push_back(now() - t0);
      t0 = now();
      memcpy2(dst.data(), src.data(), copy_bytes);
      const double t1 = now();
      stream2(dst.data(), src.data(), copy_bytes);
      tcopy.push_back(std::min(t1 - t0, now() - t1));
    }
    const double gbs = double(tensors) * bytes / median(top) / 1e9, copy = 2.0 * copy_bytes / median(tcopy) / 1e9;
    std::printf("%-18s %-4s %-14s checked (%.1e of bound)  %8.0f us  %5.1f GB/s  copy %5.1f GB/s  share %.3f\n", op.c_str(),
                bf16 ? "bf16" : "f32", s.c_str(), worst, median(top) * 1e6, gbs, copy, gbs / copy);
  }
  return 0;
}
