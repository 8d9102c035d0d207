// Activation family, CPU kernels (portable scalar code, multithreaded).
//
// Accuracy: functions with transcendentals are evaluated in double for f32 and f64 inputs and in
// float for f16/bf16, then rounded once; this keeps f32 GeluGrad accurate in relative terms down
// the negative tail and across the zero of the GELU derivative near x = -0.75. Cancellation-free
// forms throughout: Phi(x) = erfc(-x/sqrt2)/2, 0.5(1 + tanh u) = sigmoid(2u), 1 - y^2 = (1-y)(1+y).
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/workspace.hpp"
#include "cpu/convert.hpp"
#include "cpu/parallel.hpp"
#include "ops/activation.hpp"

namespace gradops::cpu {
namespace {

using detail::ActivationDesc;

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kInvSqrt2Pi = 0.39894228040143267794;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kFastGeluGamma = 0.044715;
constexpr int64_t kGrain = 1 << 15;  // elements per thread below which we stay on one thread

template <class A> A sigmoid(A v) { return A(1) / (A(1) + std::exp(-v)); }

template <class A> A normcdf(A x) { return A(0.5) * std::erfc(-x * A(kSqrtHalf)); }
template <class A> A gelu(A x) { return x * normcdf(x); }
template <class A> A gelu_derivative(A x) {
  return normcdf(x) + x * A(kInvSqrt2Pi) * std::exp(A(-0.5) * x * x);
}

// FastGelu: y = z * s with s = sigmoid(2u), u = sqrt(2/pi) (z + gamma z^3).
template <class A> A fast_gelu_u(A z) { return A(kSqrt2OverPi) * (z + A(kFastGeluGamma) * z * z * z); }
template <class A> A fast_gelu(A z) { return z * sigmoid(A(2) * fast_gelu_u(z)); }
template <class A> A fast_gelu_derivative(A z) {
  const A u2 = A(2) * fast_gelu_u(z);
  const A s = sigmoid(u2), w = s * sigmoid(-u2);  // w = s (1 - s) = (1 - tanh^2 u) / 4
  if (w == A(0)) return s;  // saturated; avoids inf * 0 for huge |z|
  return s + A(2) * z * A(kSqrt2OverPi) * (A(1) + A(3 * kFastGeluGamma) * z * z) * w;
}

template <class A> A quick_gelu_derivative(A x, A alpha) {
  const A v = alpha * x;
  const A s = sigmoid(v);
  return s * (A(1) + v * sigmoid(-v));  // sigmoid(-v) = 1 - s without cancellation
}

// Compute type: double for transcendental f32 work, else the storage type's compute type.
template <class T, bool kTranscendental>
using acc_t = std::conditional_t<kTranscendental && std::is_same_v<T, float>, double, compute_t<T>>;

template <class T>
void run_typed(const ActivationDesc& d, const Context& ctx) {
  const T* dy = static_cast<const T*>(d.dy);
  const T* x = static_cast<const T*>(d.x);
  const T* b = static_cast<const T*>(d.bias);
  T* out = static_cast<T*>(d.out);
  const int64_t n = d.count, cols = d.cols;

  // Elementwise f(i) -> value in A, stored once.
  auto elementwise = [&](auto tag, auto&& f) {
    using A = decltype(tag);
    parallel_for(n, kGrain, ctx, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) store(out, i, static_cast<A>(f(i)));
    });
  };
  using AT = acc_t<T, true>;    // transcendental
  using AS = acc_t<T, false>;   // simple
  const AT alpha_t = static_cast<AT>(d.alpha);
  const AS alpha_s = static_cast<AS>(d.alpha);
  auto ld = [](const T* p, int64_t i, auto tag) { return load<decltype(tag)>(p, i); };

  switch (d.op) {
    case OpId::GeluGrad:
      return elementwise(AT{}, [&](int64_t i) { return ld(dy, i, AT{}) * gelu_derivative(ld(x, i, AT{})); });
    case OpId::FastGeluGrad:
      return elementwise(AT{}, [&](int64_t i) { return ld(dy, i, AT{}) * fast_gelu_derivative(ld(x, i, AT{})); });
    case OpId::ReluGrad:
      return elementwise(AS{}, [&](int64_t i) { return ld(x, i, AS{}) > AS(0) ? ld(dy, i, AS{}) : AS(0); });
    case OpId::SigmoidGrad:
      return elementwise(AS{}, [&](int64_t i) {
        const AS y = ld(x, i, AS{});
        return ld(dy, i, AS{}) * y * (AS(1) - y);
      });
    case OpId::TanhGrad:
      return elementwise(AS{}, [&](int64_t i) {
        const AS y = ld(x, i, AS{});
        return ld(dy, i, AS{}) * ((AS(1) - y) * (AS(1) + y));
      });
    case OpId::QuickGeluGrad:
      return elementwise(AT{}, [&](int64_t i) {
        return ld(dy, i, AT{}) * quick_gelu_derivative(ld(x, i, AT{}), alpha_t);
      });
    case OpId::LeakyReluGrad:
      return elementwise(AS{}, [&](int64_t i) {
        const AS g = ld(dy, i, AS{});
        return ld(x, i, AS{}) > AS(0) ? g : alpha_s * g;
      });
    case OpId::Gelu:
      return elementwise(AT{}, [&](int64_t i) { return gelu(ld(x, i, AT{})); });
    case OpId::Relu:
      return elementwise(AS{}, [&](int64_t i) {
        const AS v = ld(x, i, AS{});
        return v > AS(0) || v != v ? v : AS(0);  // NaN propagates
      });
    case OpId::Sigmoid:
      return elementwise(AT{}, [&](int64_t i) { return sigmoid(ld(x, i, AT{})); });
    case OpId::Tanh:
      return elementwise(AT{}, [&](int64_t i) { return std::tanh(ld(x, i, AT{})); });
    case OpId::LeakyRelu:
      return elementwise(AS{}, [&](int64_t i) {
        const AS v = ld(x, i, AS{});
        return v > AS(0) ? v : alpha_s * v;
      });
    case OpId::QuickGelu:
      return elementwise(AT{}, [&](int64_t i) {
        const AT v = ld(x, i, AT{});
        return v * sigmoid(alpha_t * v);
      });
    case OpId::FastGelu:
      if (!b) return elementwise(AT{}, [&](int64_t i) { return fast_gelu(ld(x, i, AT{})); });
      return elementwise(AT{}, [&](int64_t i) { return fast_gelu(ld(x, i, AT{}) + ld(b, i % cols, AT{})); });
    case OpId::BiasGelu:
      return elementwise(AT{}, [&](int64_t i) { return gelu(ld(x, i, AT{}) + ld(b, i % cols, AT{})); });
    default:
      break;
  }
}

// BiasGeluGrad_dX / BiasFastGeluGrad_dX: dx row by row; dB from fixed chunks of rows, each summed
// in row order, then the chunk partials summed in chunk order: the same bits for any thread count.
template <class T>
Status run_bias_grad(const ActivationDesc& d, const Context& ctx) {
  using A = acc_t<T, true>;
  const T* dy = static_cast<const T*>(d.dy);
  const T* x = static_cast<const T*>(d.x);
  const T* b = static_cast<const T*>(d.bias);
  T* dx = static_cast<T*>(d.out);
  T* db = static_cast<T*>(d.db);
  const int64_t cols = d.cols, rows = cols ? d.count / cols : 0;
  const bool exact = d.op == OpId::BiasGeluGrad_dX;

  auto row_kernel = [&](int64_t r, A* acc) {
    const int64_t base = r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const A z = load<A>(x, base + j) + load<A>(b, j);
      const A g = load<A>(dy, base + j) * (exact ? gelu_derivative(z) : fast_gelu_derivative(z));
      store(dx, base + j, g);
      if (acc) acc[j] += g;
    }
  };
  if (!db) {
    parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)), ctx,
                 [&](int64_t r0, int64_t r1) {
                   for (int64_t r = r0; r < r1; ++r) row_kernel(r, nullptr);
                 });
    return {};
  }
  // Chunks of ~kGrain elements (at least one row): the count depends on the shape only.
  const int64_t chunk_rows = std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1));
  const int64_t chunks = chunk_count(rows, chunk_rows);
  detail::Workspace ws;
  const std::size_t bytes = sizeof(A) * static_cast<std::size_t>(std::max<int64_t>(chunks, 1) * cols);
  if (Status s = ws.allocate(ctx, Device::cpu(), bytes, "Bias gelu grad"); !s) return s;
  A* partial = ws.as<A>();
  parallel_for(chunks, 1, ctx, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      A* acc = partial + c * cols;
      std::fill(acc, acc + cols, A(0));
      const int64_t r1 = std::min(rows, (c + 1) * chunk_rows);
      for (int64_t r = c * chunk_rows; r < r1; ++r) row_kernel(r, acc);
    }
  });
  parallel_for(cols, 4096, ctx, [&](int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; ++j) {
      A s = 0;
      for (int64_t c = 0; c < chunks; ++c) s += partial[c * cols + j];
      store(db, j, s);
    }
  });
  return {};
}

}  // namespace
}  // namespace gradops::cpu

namespace gradops::detail {

Status cpu_activation(const ActivationDesc& d, const Context& ctx) {
  return cpu::visit_dtype(d.dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    if (d.op == OpId::BiasGeluGrad_dX || d.op == OpId::BiasFastGeluGrad_dX) return cpu::run_bias_grad<T>(d, ctx);
    cpu::run_typed<T>(d, ctx);
    return {};
  });
}

}  // namespace gradops::detail
