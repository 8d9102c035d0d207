// f32 GeluGrad through the public API against a float64 formula on a dense grid of [-13, 13]:
// prints the worst relative and absolute errors. GRADOPS_CPU_TARGET=avx2|sse4|... picks the target.
//
//   g++ -O2 -std=c++20 -Iinclude lab/cpu/gelu_err.cpp build/release/libgradops.so \
//       -Wl,-rpath,$PWD/build/release -o /tmp/gelu_err && /tmp/gelu_err
#include <gradops/gradops.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

namespace {
double gelu_grad(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0)) + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * M_PI);
}
}  // namespace

int main() {
  using namespace gradops;
  const int n = 4000001;
  std::vector<float> x(n), dy(n, 1.0f), dx(n);
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(-13.0 + 26.0 * i / (n - 1));
  const int64_t shape[] = {n};
  TensorView vx(x.data(), DType::f32, shape), vdy(dy.data(), DType::f32, shape), vdx(dx.data(), DType::f32, shape);
  if (Status s = gelu_grad({vdy, vx, vdx}); !s.is_ok()) {
    std::printf("gelu_grad failed: %s\n", s.message().c_str());
    return 1;
  }
  double worst = 0, at = 0, worst_abs = 0;
  for (int i = 0; i < n; ++i) {
    const double ref = gelu_grad(x[i]);
    worst_abs = std::max(worst_abs, std::fabs(dx[i] - ref));
    if (ref == 0) continue;
    const double e = std::fabs(dx[i] - ref) / std::fabs(ref);
    if (e > worst) worst = e, at = x[i];
  }
  std::printf("GeluGrad f32 over [-13, 13]: worst relative error %.3g at x = %.7g, worst absolute %.3g\n", worst, at,
              worst_abs);
  return worst <= 1e-5 ? 0 : 1;
}
