// The oracle checked against itself (docs/design.md §7, item 2): for every gradient op, its float64
// reference must equal the derivative of L = sum(dY * forward(inputs)) with respect to each
// differentiable input of the forward op, estimated by finite differences of the oracle's own
// forward. Statistics (LayerNorm's mean and inverse std, BatchNorm's saved mean and inverse std)
// are recomputed by the forward from the perturbed input, so the estimate is the full derivative,
// which is what the gradient formulas give when the saved statistics are the true ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gradops/schema.hpp"
#include "oracle/oracle.hpp"
#include "harness/call_buffers.hpp"

namespace gradops::oracle {
namespace {

// Where a gradient op's input comes from.
struct Source {
  enum Kind { dy, fwd_input, fwd_output } kind;
  int index = 0;
};
constexpr Source kDy{Source::dy, 0};
constexpr Source in(int i) { return {Source::fwd_input, i}; }
constexpr Source out(int i) { return {Source::fwd_output, i}; }

struct Pair {
  std::string label;  // the test's name
  std::string forward, grad;
  std::vector<int64_t> shape;
  Attrs fwd_attrs, grad_attrs;  // overrides of the schema defaults
  std::vector<Source> grad_inputs;
  std::vector<int> wrt;            // grad output o is dL/d(forward input wrt[o])
  std::vector<int> drop_inputs;    // forward inputs to leave out (FastGelu without its bias)
  double kink_margin = 0;          // keep |x| at least this far from 0 (Relu, LeakyRelu)
};

void PrintTo(const Pair& p, std::ostream* os) { *os << p.label; }

// Test names allow only letters, digits and '_': "M" stands for minus.
std::string number_label(int64_t a) { return a < 0 ? "M" + std::to_string(-a) : std::to_string(a); }
std::string axis_label(int64_t a) { return "axis" + number_label(a); }
std::string milli_label(double v) { return number_label(std::lround(v * 1000)); }

std::vector<Pair> pairs() {
  std::vector<Pair> p;
  const std::vector<int64_t> s = {3, 7};
  p.push_back({"GeluGrad", "Gelu", "GeluGrad", s, {}, {}, {kDy, in(0)}, {0}});
  p.push_back({"FastGeluGrad", "FastGelu", "FastGeluGrad", s, {}, {}, {kDy, in(0)}, {0}, {1}});
  p.push_back({"BiasGeluGrad_dX", "BiasGelu", "BiasGeluGrad_dX", s, {}, {}, {kDy, in(0), in(1)}, {0, 1}});
  p.push_back({"BiasFastGeluGrad_dX", "FastGelu", "BiasFastGeluGrad_dX", s, {}, {}, {kDy, in(0), in(1)}, {0, 1}});
  p.push_back({"ReluGrad", "Relu", "ReluGrad", s, {}, {}, {kDy, in(0)}, {0}, {}, 0.05});
  p.push_back({"SigmoidGrad", "Sigmoid", "SigmoidGrad", s, {}, {}, {kDy, out(0)}, {0}});
  p.push_back({"TanhGrad", "Tanh", "TanhGrad", s, {}, {}, {kDy, out(0)}, {0}});
  for (double alpha : {1.702, 1.0, -0.5, 3.0}) {
    p.push_back({"QuickGeluGrad_alpha" + milli_label(alpha), "QuickGelu", "QuickGeluGrad", s, {{"alpha", alpha}},
                 {{"alpha", alpha}}, {kDy, in(0)}, {0}});
  }
  for (double alpha : {0.01, 0.3, 0.0}) {
    p.push_back({"LeakyReluGrad_alpha" + milli_label(alpha), "LeakyRelu",
                 "LeakyReluGrad", s, {{"alpha", alpha}}, {{"alpha", alpha}}, {kDy, out(0)}, {0}, {}, 0.05});
  }
  const std::vector<int64_t> s3 = {2, 3, 4};
  for (const char* f : {"Softmax", "LogSoftmax"})
    for (int64_t a : {0, 1, 2, -1}) {
      const std::string g = std::string(f) + "Grad";
      p.push_back({g + "_" + axis_label(a), f, g, s3, {{"axis", double(a)}}, {{"axis", double(a)}}, {kDy, out(0)}, {0}});
    }
  for (const char* f : {"Softmax_13", "LogSoftmax_13"})
    for (int64_t a : {0, 1, 2, -1, -3}) {
      const std::string base(f, std::string_view(f).size() - 3);
      const std::string g = base + "Grad_13";
      p.push_back({g + "_" + axis_label(a), f, g, s3, {{"axis", double(a)}}, {{"axis", double(a)}}, {kDy, out(0)}, {0}});
    }
  for (int64_t a : {-1, 1, 0}) {
    const Attrs ax = {{"axis", double(a)}};
    p.push_back({"LayerNormalizationGrad_" + axis_label(a), "LayerNormalization", "LayerNormalizationGrad", s3, ax,
                 ax, {kDy, in(0), in(1), out(1), out(2)}, {0, 1, 2}});
    p.push_back({"InvertibleLayerNormalizationGrad_" + axis_label(a), "LayerNormalization",
                 "InvertibleLayerNormalizationGrad", s3, ax, ax, {kDy, out(0), in(1), in(2), out(2)}, {0, 1, 2}});
    p.push_back({"SimplifiedLayerNormalizationGrad_" + axis_label(a), "SimplifiedLayerNormalization",
                 "SimplifiedLayerNormalizationGrad", s3, ax, ax, {kDy, in(0), in(1), out(1)}, {0, 1}});
  }
  const std::vector<std::vector<int64_t>> bn_shapes = {{4, 3}, {2, 3, 4}, {2, 3, 2, 2}};
  for (int last : {0, 1})
    for (const auto& shape : bn_shapes) {
      std::string l = std::string("BatchNormalizationGrad_") + (last ? "NHWC" : "NCHW") + "_rank" +
                      std::to_string(shape.size());
      const Attrs fa = {{"channels_last", double(last)}, {"epsilon", 1e-5}};
      p.push_back({l, "BatchNormInternal", "BatchNormalizationGrad", shape, fa, fa,
                   {kDy, in(0), in(1), out(3), out(4)}, {0, 1, 2}});
    }
  return p;
}

// L = sum(dY * forward(inputs)[0]), accumulated in long double so that only the forward's own
// rounding limits the finite differences.
long double loss(const Pair& p, const Tensors& fwd_in, const Attrs& attrs, const Tensor& dy) {
  const Tensors y = reference(p.forward, fwd_in, attrs);
  long double l = 0;
  for (std::size_t e = 0; e < dy.v.size(); ++e) l += static_cast<long double>(dy.v[e]) * y[0]->v[e];
  return l;
}

class OracleGradient : public ::testing::TestWithParam<Pair> {};

TEST_P(OracleGradient, MatchesFiniteDifferencesOfTheForward) {
  const Pair& p = GetParam();
  const OpSchema* fwd = find_op(p.forward);
  const OpSchema* grad = find_op(p.grad);
  ASSERT_TRUE(fwd && grad);
  const Attrs fa = testing::full_attributes(*fwd, p.fwd_attrs);
  const Attrs ga = testing::full_attributes(*grad, p.grad_attrs);

  for (uint64_t seed : {1, 2}) {
    SCOPED_TRACE(p.label + " seed " + std::to_string(seed));
    Rng rng(seed);
    const std::vector<DType> f64(fwd->inputs.size(), DType::f64);
    Tensors x;
    try {
      x = make_inputs(p.forward, p.shape, fa, f64, rng);
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
    x.resize(fwd->inputs.size());
    for (int d : p.drop_inputs) x[d].reset();
    if (p.kink_margin > 0)
      for (double& v : x[0]->v) v = v >= 0 ? v + p.kink_margin : v - p.kink_margin;

    Tensors y;
    try {
      y = reference(p.forward, x, fa);
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
    Tensor dy(y[0]->shape);
    fill_uniform(dy, DType::f64, -1, 1, rng);

    Tensors gin;
    for (const Source& s : p.grad_inputs) {
      if (s.kind == Source::dy) gin.push_back(dy);
      else if (s.kind == Source::fwd_input) gin.push_back(x[s.index]);
      else gin.push_back(y[s.index]);
    }
    Tensors g;
    try {
      g = reference(p.grad, gin, ga);
    } catch (const std::exception& e) {
      FAIL() << e.what();
    }
    ASSERT_GE(g.size(), p.wrt.size());

    for (std::size_t o = 0; o < p.wrt.size(); ++o) {
      const int k = p.wrt[o];
      ASSERT_TRUE(g[o].has_value());
      ASSERT_EQ(g[o]->shape, x[k]->shape) << grad->outputs[o].name << " vs " << fwd->inputs[k].name;
      double gmax = 0;
      for (double v : g[o]->v) gmax = std::max(gmax, std::fabs(v));
      ASSERT_GT(gmax, 0) << grad->outputs[o].name << " is all zeros: the check would prove nothing";
      for (std::size_t e = 0; e < x[k]->v.size(); ++e) {
        // Fourth-order central differences with h = 1e-3: truncation ~h^4 |L'''''| and rounding
        // ~1e-16 |L| / h both stay near 1e-12, so 1e-8 relative is a real check (the formulas
        // agree to ~1e-11; a gradient off by 1e-6 relative fails).
        const double x0 = x[k]->v[e], h = 1e-3 * std::max(1.0, std::fabs(x0));
        Tensors xs = x;
        auto at = [&](double t) {
          xs[k]->v[e] = x0 + t * h;
          return loss(p, xs, fa, dy);
        };
        const long double fd = (8 * (at(1) - at(-1)) - (at(2) - at(-2))) / (12 * static_cast<long double>(h));
        const double want = g[o]->v[e];
        const double tol = 1e-8 * std::fabs(want) + 1e-11 * (1 + gmax);
        EXPECT_NEAR(static_cast<double>(fd), want, tol)
            << grad->outputs[o].name << "[" << e << "] = d L / d " << fwd->inputs[k].name << "[" << e << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryGradient, OracleGradient, ::testing::ValuesIn(pairs()),
                         [](const ::testing::TestParamInfo<Pair>& i) { return i.param.label; });

// Every gradient op of the table is paired with its forward above.
TEST(OracleGradient, EveryGradientOpIsCovered) {
  const std::vector<Pair> all = pairs();
  for (const OpSchema& s : op_schemas()) {
    if (!s.gradient) continue;
    EXPECT_TRUE(std::any_of(all.begin(), all.end(), [&](const Pair& p) { return p.grad == s.name; })) << s.name;
  }
}

}  // namespace
}  // namespace gradops::oracle
