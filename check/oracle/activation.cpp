// Oracle for the activation family: textbook formulas in float64 (long double where a formula
// cancels), straight from docs/semantics.md.
#include <cmath>

#include "oracle/oracle.hpp"

namespace gradops::oracle {
namespace {

constexpr long double kPi = 3.141592653589793238462643383279502884L;

bool is_grad(std::string_view op) { return op.size() > 4 && op.find("Grad") != std::string_view::npos; }
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

namespace {

// One row per op: everything the oracle and the tolerances know of it, so that an op is added in
// one place. v is the op's main input (X, or Y where the op reads the forward output), plus B for
// the bias forms; g is dY (gradients only).
struct ActivationOp {
  std::string_view name;
  bool bias;           // takes a bias input B (broadcast along the last axis; FastGelu's is optional)
  double lo, hi;       // the main input's draws: U(lo, hi)
  double k;            // roundings times the formula's amplification of the compute type's error
  double (*formula)(double g, double v, double alpha);
};

// k (docs/tolerances.md): the GELU family's erfc argument error is amplified by x^2 (inputs reach
// |x| = 7 with the bias); sigmoid/tanh forms by a few; a product or a select rounds once or twice.
// Draws: a sigmoid's Y lies in (0, 1), a tanh's in (-1, 1); a LeakyRelu's Y (alpha >= 0) has
// either sign.
constexpr ActivationOp kOps[] = {
    {"GeluGrad", false, -6, 6, 128, [](double g, double v, double) { return g * gelu_grad(v); }},
    {"FastGeluGrad", false, -6, 6, 128, [](double g, double v, double) { return g * fast_gelu_grad(v); }},
    {"BiasGeluGrad_dX", true, -6, 6, 128, [](double g, double v, double) { return g * gelu_grad(v); }},
    {"BiasFastGeluGrad_dX", true, -6, 6, 128, [](double g, double v, double) { return g * fast_gelu_grad(v); }},
    {"ReluGrad", false, -6, 6, 8, [](double g, double v, double) { return v > 0 ? g : 0.0; }},
    {"SigmoidGrad", false, 0.001, 0.999, 8, [](double g, double v, double) { return g * v * (1 - v); }},
    {"TanhGrad", false, -0.999, 0.999, 8, [](double g, double v, double) { return g * (1 - v * v); }},
    {"QuickGeluGrad", false, -6, 6, 32, [](double g, double v, double a) { return g * quick_gelu_grad(v, a); }},
    {"LeakyReluGrad", false, -3, 3, 8, [](double g, double v, double a) { return v > 0 ? g : a * g; }},
    {"Gelu", false, -6, 6, 128, [](double, double v, double) { return gelu(v); }},
    {"FastGelu", true, -6, 6, 128, [](double, double v, double) { return fast_gelu(v); }},
    {"BiasGelu", true, -6, 6, 128, [](double, double v, double) { return gelu(v); }},
    {"QuickGelu", false, -6, 6, 32, [](double, double v, double a) { return quick_gelu(v, a); }},
    // Relu propagates NaN (docs/ops)
    {"Relu", false, -6, 6, 8, [](double, double v, double) { return std::isnan(v) ? v : v > 0 ? v : 0.0; }},
    {"Sigmoid", false, -8, 8, 32, [](double, double v, double) { return sigmoid(v); }},
    {"Tanh", false, -6, 6, 32, [](double, double v, double) { return std::tanh(v); }},
    {"LeakyRelu", false, -6, 6, 8, [](double, double v, double a) { return v > 0 ? v : a * v; }},
};

const ActivationOp* find_activation(std::string_view op) {
  for (const ActivationOp& a : kOps)
    if (a.name == op) return &a;
  return nullptr;
}

}  // namespace

double activation_amplification(std::string_view op) {
  const ActivationOp* a = find_activation(op);
  return a ? a->k : 0.0;
}

bool make_activation_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs&,
                            std::span<const DType> dt, Rng& rng, Tensors& out) {
  const ActivationOp* a = find_activation(op);
  if (!a) return false;
  const std::vector<int64_t> s(shape.begin(), shape.end());
  int i = 0;
  if (is_grad(op)) {
    Tensor dy(s);
    fill_uniform(dy, dt[i++], -2, 2, rng);
    out.push_back(std::move(dy));
  }
  Tensor x(s);
  fill_uniform(x, dt[i++], a->lo, a->hi, rng);
  out.push_back(std::move(x));
  if (a->bias) {
    Tensor b({s.empty() ? 0 : s.back()});
    fill_uniform(b, dt[i], -1, 1, rng);
    out.push_back(std::move(b));
  }
  return true;
}

bool activation_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out) {
  const ActivationOp* a = find_activation(op);
  if (!a) return false;
  const bool grad = is_grad(op);
  const Tensor* dy = grad ? &*in[0] : nullptr;
  const Tensor& x = *in[grad ? 1 : 0];
  const std::size_t bias_in = grad ? 2 : 1;
  const Tensor* b = (a->bias && in.size() > bias_in && in[bias_in]) ? &*in[bias_in] : nullptr;
  const double alpha = attr(attrs, "alpha");
  const int64_t n = x.numel(), cols = b ? b->numel() : 0;
  Tensor r(x.shape);
  for (int64_t i = 0; i < n; ++i)
    r.v[i] = a->formula(grad ? dy->v[i] : 0.0, b ? x.v[i] + b->v[i % cols] : x.v[i], alpha);
  out.push_back(std::move(r));
  if (grad && a->bias) {  // dB: the column sums of dX
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
