// Oracle for the softmax family, straight from docs/semantics.md B4, in long double.
//
// Groups: with the axis normalized to a in [0, rank), the opset 1-12 names (SoftmaxGrad,
// LogSoftmaxGrad, Softmax, LogSoftmax) coerce the tensor to 2-D at a, so a group is a whole row
// of prod(shape[a:]) elements; the _13 names take the single dimension a. Either way the group of
// (o, i) holds the elements (o * len + k) * inner + i for k in [0, len).
//
// Data: forwards get x ~ U(-4, 4). Gradients get a realistic Y: the softmax (or log-softmax) of
// x ~ U(-4, 4) computed here in double and rounded to Y's dtype, and dY ~ U(-1, 1).
// check/harness/tolerance.cpp relies on these ranges.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "oracle/oracle.hpp"

namespace gradops::oracle {
namespace {

enum class Kind { softmax_grad, log_softmax_grad, softmax, log_softmax };

struct OpInfo {
  Kind kind;
  bool single_axis;  // _13: one dimension; else the 2-D coercion
};

bool lookup(std::string_view op, OpInfo* info) {
  struct Entry {
    std::string_view name;
    OpInfo info;
  };
  static constexpr Entry kOps[] = {
      {"SoftmaxGrad", {Kind::softmax_grad, false}},     {"SoftmaxGrad_13", {Kind::softmax_grad, true}},
      {"LogSoftmaxGrad", {Kind::log_softmax_grad, false}}, {"LogSoftmaxGrad_13", {Kind::log_softmax_grad, true}},
      {"Softmax", {Kind::softmax, false}},              {"Softmax_13", {Kind::softmax, true}},
      {"LogSoftmax", {Kind::log_softmax, false}},       {"LogSoftmax_13", {Kind::log_softmax, true}},
  };
  for (const Entry& e : kOps)
    if (e.name == op) {
      *info = e.info;
      return true;
    }
  return false;
}

struct Groups {
  int64_t outer = 0, len = 0, inner = 0;
  int64_t at(int64_t o, int64_t k, int64_t i) const { return (o * len + k) * inner + i; }
};

Groups groups(const OpInfo& info, const std::vector<int64_t>& shape, const Attrs& attrs) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const auto it = attrs.find("axis");
  const int64_t axis = it == attrs.end() ? (info.single_axis ? -1 : 1) : static_cast<int64_t>(it->second);
  if (axis < -rank || axis >= rank)
    throw std::invalid_argument("oracle: axis " + std::to_string(axis) + " out of range for rank " +
                                std::to_string(rank));
  const int64_t a = axis < 0 ? axis + rank : axis;
  auto prod = [&](int64_t b, int64_t e) {
    int64_t p = 1;
    for (int64_t d = b; d < e; ++d) p *= shape[d];
    return p;
  };
  Groups g;
  g.outer = prod(0, a);
  g.len = info.single_axis ? shape[a] : prod(a, rank);
  g.inner = info.single_axis ? prod(a + 1, rank) : 1;
  return g;
}

// Calls f(o, i) for every group.
template <class F>
void for_each_group(const Groups& g, F&& f) {
  for (int64_t o = 0; o < g.outer; ++o)
    for (int64_t i = 0; i < g.inner; ++i) f(o, i);
}

// out = softmax (or log-softmax) of x over each group, in R: long double for the reference,
// double (ample for inputs that are then rounded to their dtype, and faster) for making Y.
template <class R>
void forward(const Groups& g, bool log, const std::vector<double>& x, std::vector<R>& out) {
  out.assign(x.size(), R(0));
  for_each_group(g, [&](int64_t o, int64_t i) {
    R m = -std::numeric_limits<R>::infinity();
    for (int64_t k = 0; k < g.len; ++k) m = std::max<R>(m, x[g.at(o, k, i)]);
    R sum = 0;
    for (int64_t k = 0; k < g.len; ++k) {
      const int64_t e = g.at(o, k, i);
      out[e] = std::exp(static_cast<R>(x[e]) - m);
      sum += out[e];
    }
    const R lse = std::log(sum);
    for (int64_t k = 0; k < g.len; ++k) {
      const int64_t e = g.at(o, k, i);
      out[e] = log ? (static_cast<R>(x[e]) - m) - lse : out[e] / sum;
    }
  });
}

}  // namespace

bool make_softmax_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                         std::span<const DType> dt, Rng& rng, Tensors& out) {
  OpInfo info;
  if (!lookup(op, &info)) return false;
  const std::vector<int64_t> s(shape.begin(), shape.end());
  if (info.kind == Kind::softmax || info.kind == Kind::log_softmax) {
    Tensor x(s);
    fill_uniform(x, dt[0], -4, 4, rng);
    out.push_back(std::move(x));
    return true;
  }
  Tensor dy(s), y(s), x(s);
  fill_uniform(dy, dt[0], -1, 1, rng);
  fill_uniform(x, DType::f64, -4, 4, rng);
  forward(groups(info, s, attrs), info.kind == Kind::log_softmax_grad, x.v, y.v);
  for (double& v : y.v) v = round_to(dt[1], v);
  out.push_back(std::move(dy));
  out.push_back(std::move(y));
  return true;
}

bool softmax_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out) {
  OpInfo info;
  if (!lookup(op, &info)) return false;
  const bool grad = info.kind == Kind::softmax_grad || info.kind == Kind::log_softmax_grad;
  const Tensor& main = *in[grad ? 1 : 0];
  const Groups g = groups(info, main.shape, attrs);
  Tensor r(main.shape);
  if (!grad) {
    std::vector<long double> y;
    forward(g, info.kind == Kind::log_softmax, main.v, y);
    for (std::size_t e = 0; e < y.size(); ++e) r.v[e] = static_cast<double>(y[e]);
  } else {
    const std::vector<double>& dy = in[0]->v;
    const std::vector<double>& y = main.v;
    for_each_group(g, [&](int64_t o, int64_t i) {
      long double s = 0;
      for (int64_t k = 0; k < g.len; ++k) {
        const int64_t e = g.at(o, k, i);
        s += info.kind == Kind::softmax_grad ? static_cast<long double>(y[e]) * dy[e] : dy[e];
      }
      for (int64_t k = 0; k < g.len; ++k) {
        const int64_t e = g.at(o, k, i);
        const long double yv = y[e], gv = dy[e];
        // Softmax: dX = Y (dY - sum(Y dY)). LogSoftmax (Y the log-softmax output): dX = dY - exp(Y) sum(dY).
        r.v[e] = static_cast<double>(info.kind == Kind::softmax_grad ? yv * (gv - s) : gv - std::exp(yv) * s);
      }
    });
  }
  out.push_back(std::move(r));
  return true;
}

}  // namespace gradops::oracle
