// Oracle for the activation family: textbook formulas in float64 (long double where a formula
// cancels), straight from docs/semantics.md.
#include <algorithm>
#include <cmath>

#include "oracle/oracle.hpp"

namespace gradops::oracle {
namespace {

constexpr long double kPi = 3.141592653589793238462643383279502884L;

bool is_grad(std::string_view op) { return op.size() > 4 && op.find("Grad") != std::string_view::npos; }
bool has_bias(std::string_view op) {
  return op == "BiasGeluGrad_dX" || op == "BiasFastGeluGrad_dX" || op == "BiasGelu" || op == "FastGelu";
}
bool is_activation(std::string_view op) {
  static constexpr std::string_view kOps[] = {
      "GeluGrad", "FastGeluGrad", "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "ReluGrad", "SigmoidGrad",
      "TanhGrad", "QuickGeluGrad", "LeakyReluGrad", "Gelu", "FastGelu", "BiasGelu", "QuickGelu", "Relu",
      "Sigmoid", "Tanh", "LeakyRelu"};
  return std::find(std::begin(kOps), std::end(kOps), op) != std::end(kOps);
}
double attr(const Attrs& a, const char* name) {
  auto it = a.find(name);
  return it == a.end() ? 0.0 : it->second;
}

}  // namespace

double sigmoid(double x) { return static_cast<double>(1.0L / (1.0L + std::exp(-static_cast<long double>(x)))); }

double gelu(double x) {
  const long double lx = x;
  return static_cast<double>(lx * 0.5L * std::erfc(-lx / std::sqrt(2.0L)));
}
double gelu_grad(double x) {
  if (std::isinf(x)) return x > 0 ? 1.0 : 0.0;  // the limits; x·φ(x) would be inf·0
  const long double lx = x;
  const long double cdf = 0.5L * std::erfc(-lx / std::sqrt(2.0L));
  const long double pdf = std::exp(-0.5L * lx * lx) / std::sqrt(2.0L * kPi);
  return static_cast<double>(cdf + lx * pdf);
}
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
double fast_gelu(double x) {
  const long double lx = x, u = std::sqrt(2.0L / kPi) * (lx + 0.044715L * lx * lx * lx);
  return static_cast<double>(lx / (1.0L + std::exp(-2.0L * u)));  // 0.5(1 + tanh u) = sigmoid(2u)
}
double fast_gelu_grad(double x) {
  const long double lx = x, k = std::sqrt(2.0L / kPi);
  const long double u = k * (lx + 0.044715L * lx * lx * lx);
  if (std::fabs(u) > 5000) return u > 0 ? 1.0 : 0.0;
  // 0.5 (1 + tanh u) = sigmoid(2u) and 1 - tanh^2 u = 4 sigmoid(2u) sigmoid(-2u): identities that
  // keep the negative tail free of cancellation.
  const long double half_one_plus_t = 1.0L / (1.0L + std::exp(-2.0L * u));
  const long double sech2 = 4.0L * half_one_plus_t / (1.0L + std::exp(2.0L * u));
  return static_cast<double>(half_one_plus_t + 0.5L * lx * sech2 * k * (1.0L + 3.0L * 0.044715L * lx * lx));
}
double quick_gelu(double x, double alpha) {
  const long double v = static_cast<long double>(alpha) * x;
  return static_cast<double>(x / (1.0L + std::exp(-v)));
}
double quick_gelu_grad(double x, double alpha) {
  const long double v = static_cast<long double>(alpha) * x;
  const long double s = 1.0L / (1.0L + std::exp(-v)), one_minus_s = 1.0L / (1.0L + std::exp(v));
  return static_cast<double>(s * (1.0L + v * one_minus_s));
}

bool make_activation_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs&,
                            std::span<const DType> dt, Rng& rng, Tensors& out) {
  if (!is_activation(op)) return false;
  const std::vector<int64_t> s(shape.begin(), shape.end());
  const bool grad = is_grad(op);
  int i = 0;
  if (grad) {
    Tensor dy(s);
    fill_uniform(dy, dt[i++], -2, 2, rng);
    out.push_back(std::move(dy));
  }
  Tensor x(s);
  if (op == "SigmoidGrad" || op == "Sigmoid") {
    // Y of a sigmoid lies in (0, 1)
    fill_uniform(x, dt[i], op == "Sigmoid" ? -8 : 0.001, op == "Sigmoid" ? 8 : 0.999, rng);
  } else if (op == "TanhGrad") {
    fill_uniform(x, dt[i], -0.999, 0.999, rng);
  } else if (op == "LeakyReluGrad") {
    fill_uniform(x, dt[i], -3, 3, rng);  // Y of a LeakyRelu with alpha >= 0: any sign
  } else {
    fill_uniform(x, dt[i], -6, 6, rng);
  }
  ++i;
  out.push_back(std::move(x));
  if (has_bias(op)) {
    Tensor b({s.empty() ? 0 : s.back()});
    fill_uniform(b, dt[i], -1, 1, rng);
    out.push_back(std::move(b));
  }
  return true;
}

bool activation_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out) {
  if (!is_activation(op)) return false;
  const bool grad = is_grad(op);
  const Tensor* dy = grad ? &*in[0] : nullptr;
  const Tensor& x = *in[grad ? 1 : 0];
  const int bias_in = grad ? 2 : 1;
  const Tensor* b = (has_bias(op) && in.size() > static_cast<std::size_t>(bias_in) && in[bias_in]) ? &*in[bias_in] : nullptr;
  const double alpha = attr(attrs, "alpha");
  const int64_t n = x.numel(), cols = b ? b->numel() : 0;
  Tensor r(x.shape);
  auto z = [&](int64_t i) { return b ? x.v[i] + b->v[i % cols] : x.v[i]; };
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad ? dy->v[i] : 0.0, v = x.v[i];
    double y;
    if (op == "GeluGrad") y = g * gelu_grad(v);
    else if (op == "FastGeluGrad") y = g * fast_gelu_grad(v);
    else if (op == "BiasGeluGrad_dX") y = g * gelu_grad(z(i));
    else if (op == "BiasFastGeluGrad_dX") y = g * fast_gelu_grad(z(i));
    else if (op == "ReluGrad") y = v > 0 ? g : 0.0;
    else if (op == "SigmoidGrad") y = g * v * (1 - v);
    else if (op == "TanhGrad") y = g * (1 - v * v);
    else if (op == "QuickGeluGrad") y = g * quick_gelu_grad(v, alpha);
    else if (op == "LeakyReluGrad") y = v > 0 ? g : alpha * g;
    else if (op == "Gelu") y = gelu(v);
    else if (op == "FastGelu") y = fast_gelu(z(i));
    else if (op == "BiasGelu") y = gelu(z(i));
    else if (op == "QuickGelu") y = quick_gelu(v, alpha);
    else if (op == "Relu") y = std::isnan(v) ? v : v > 0 ? v : 0.0;  // Relu propagates NaN (docs/ops)
    else if (op == "Sigmoid") y = sigmoid(v);
    else if (op == "Tanh") y = std::tanh(v);
    else if (op == "LeakyRelu") y = v > 0 ? v : alpha * v;
    else return false;
    r.v[i] = y;
  }
  out.push_back(std::move(r));
  if (op == "BiasGeluGrad_dX" || op == "BiasFastGeluGrad_dX") {
    Tensor db({cols});
    const int64_t rows = cols ? n / cols : 0;
    for (int64_t j = 0; j < cols; ++j) {
      long double s = 0;
      for (int64_t rr = 0; rr < rows; ++rr) s += out[0]->v[rr * cols + j];
      db.v[j] = static_cast<double>(s);
    }
    out.push_back(std::move(db));
  }
  return true;
}

}  // namespace gradops::oracle
