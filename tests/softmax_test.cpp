// Softmax family against the float64 oracle: every op and dtype over the shape sweep and every
// axis, misaligned, thread-count invariance, a non-last axis against a transposition done by hand,
// the axis defaults of both conventions, the shape rules, and the oracle against finite
// differences of its own forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "harness/checker.hpp"
#include "harness/host_tensor.hpp"

namespace gradops::check {
namespace {

std::vector<OpId> softmax_ops() {
  std::vector<OpId> ops;
  for (const OpSchema& s : op_schemas())
    if (s.family == OpFamily::softmax) ops.push_back(s.id);
  return ops;
}

bool single_axis(OpId id) {
  return id == OpId::SoftmaxGrad_13 || id == OpId::LogSoftmaxGrad_13 || id == OpId::Softmax_13 ||
         id == OpId::LogSoftmax_13;
}

int64_t count_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

struct SweepCase {
  std::vector<int64_t> shape;
  bool negative_axes;  // also every axis - rank (the small shapes; the mapping is the same)
};

// Rows of 0, 1, primes and the 16-lane width -1/+0/+1; strided groups whose inner size is below,
// at and above the vector width, and dims of 1031 and 2053 on either side of the axis; more than
// 65,535 rows; a 262,144-element group; rank 1 to 5.
std::vector<SweepCase> sweep() {
  return {
      {{0}, true},           {{1}, true},           {{7}, true},        {{15}, true},
      {{16}, true},          {{17}, true},          {{3, 0}, true},     {{0, 5}, true},
      {{31, 33}, true},      {{5, 1}, true},        {{2, 3, 5}, true},  {{3, 0, 4}, true},
      {{5, 9, 17}, true},    {{2, 3, 5, 7}, true},  {{2, 1, 3, 1, 4}, true},
      {{3, 5, 2053}, false}, {{2, 1031, 37}, false}, {{65537, 3}, false}, {{1, 262144}, false},
  };
}

Problem make_problem(OpId id, DType t, const std::vector<int64_t>& shape, int64_t axis, uint64_t seed) {
  Problem p;
  p.op = id;
  p.sig = {{t, t, t}};
  p.shape = shape;
  p.attrs = {{"axis", static_cast<double>(axis)}};
  p.seed = seed;
  return p;
}

TEST(Softmax, EveryOpDtypeShapeAxis) {
  uint64_t seed = 1;
  int cases = 0;
  for (OpId id : softmax_ops()) {
    for (DType t : kAllDTypes) {
      for (const SweepCase& c : sweep()) {
        const int64_t rank = static_cast<int64_t>(c.shape.size());
        for (int64_t axis = c.negative_axes ? -rank : 0; axis < rank; ++axis) {
          // Misaligned both ways for small tensors; large ones alternate (one code path either way).
          const bool large = count_of(c.shape) > 20000;
          for (bool misaligned : {false, true}) {
            if (large && misaligned != (seed % 2 == 1)) continue;
            Problem p = make_problem(id, t, c.shape, axis, seed++);
            p.misaligned = misaligned;
            const Report r = run_case(p);
            ASSERT_TRUE(r.pass) << describe(p) << ": " << r.detail;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_GT(cases, 2000);
}

// The sweep's data keeps outputs well away from zero, so a kernel that skipped work would fail:
// check that here once, for the sizes where values are smallest.
TEST(Softmax, OutputsAreMostlyNonzero) {
  for (OpId id : softmax_ops()) {
    const Report r = run_case(make_problem(id, DType::f32, {2, 1031, 37}, 1, 3));
    ASSERT_TRUE(r.pass) << r.detail;
    int64_t zeros = 0;
    for (double v : r.outputs[0]) zeros += v == 0;
    EXPECT_LT(zeros, static_cast<int64_t>(r.outputs[0].size() / 1000)) << op_schema(id).name;
  }
}

TEST(Softmax, ResultsDoNotDependOnThreadCount) {
  struct Shape {
    std::vector<int64_t> shape;
    int64_t axis;
  };
  // Each big enough for 4 threads: rows; strided with several outer slices; strided with one slice
  // split into inner blocks; slabs past the cache budget, in blocks that fit it; slabs past the L2
  // budget that an eighth of a 32 MiB L3 holds for one thread, not four (whole rows, then blocks).
  // Folded narrow inner sizes (many slabs, each a few vectors with a partial one at the end).
  const Shape shapes[] = {{{200, 700}, -1},  {{4, 67, 523}, 1},  {{1, 32, 4099}, 1}, {{2, 1024, 700}, 1},
                          {{4, 512, 600}, 1}, {{1024, 33, 5}, 1}, {{2048, 7, 17}, 1}};
  for (OpId id : softmax_ops()) {
    for (DType t : {DType::f32, DType::bf16}) {
      for (const Shape& s : shapes) {
        Problem p = make_problem(id, t, s.shape, s.axis, 11);
        p.threads = 1;
        const Report one = run_case(p);
        p.threads = 4;
        const Report four = run_case(p);
        ASSERT_TRUE(one.pass && four.pass) << describe(p) << one.detail << four.detail;
        ASSERT_EQ(one.outputs, four.outputs) << describe(p);
      }
    }
  }
}

std::vector<OpId> single_axis_ops() {
  return {OpId::SoftmaxGrad_13, OpId::LogSoftmaxGrad_13, OpId::Softmax_13, OpId::LogSoftmax_13};
}

// A non-last axis whose inner size is below the vector width, odd, or just past it, a few vectors
// wide (a column a lane) or with a least common multiple with the lanes past what folds (folded
// into whole vectors, or blocks of columns), over axis lengths that leave every kind of tail: one
// axis step, two, a prime, one past a power of two; one slab and several.
TEST(Softmax, NonLastAxisNarrowAndOddInnerSizes) {
  uint64_t seed = 500;
  int cases = 0;
  for (OpId id : single_axis_ops())
    for (DType t : kAllDTypes)
      for (int64_t inner : {2, 3, 5, 7, 15, 16, 17, 64, 96, 100, 1000})
        for (int64_t n : {1, 2, 7, 33})
          for (int64_t outer : {1, 3}) {
            Problem p = make_problem(id, t, {outer, n, inner}, 1, seed++);
            p.misaligned = seed % 2 == 0;
            const Report r = run_case(p);
            ASSERT_TRUE(r.pass) << describe(p) << ": " << r.detail;
            ++cases;
          }
  EXPECT_EQ(cases, 4 * 4 * 11 * 4 * 2);
}

// Folded, a partial last vector's padded lanes alias real columns. With every input near -300 a
// padded 0 taken into a column's max would make every exp underflow (0/0, -inf), and exp(0 - max)
// taken into its sum would overflow: neither may count.
TEST(Softmax, FoldedPaddingStaysOutOfMaxAndSum) {
  for (OpId id : {OpId::Softmax_13, OpId::LogSoftmax_13})
    for (DType t : {DType::f32, DType::f64, DType::bf16})
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{2, 7, 3}, {3, 5, 7}, {1, 33, 2}, {2, 3, 17}}) {
        Problem p = make_problem(id, t, shape, 1, 77);
        p.edit_inputs = [t](oracle::Tensors& in) {
          for (double& v : in[0]->v) v = oracle::round_to(t, v - 300);
        };
        const Report r = run_case(p);
        ASSERT_TRUE(r.pass) << describe(p) << ": " << r.detail;
        for (double v : r.outputs[0]) ASSERT_TRUE(std::isfinite(v)) << describe(p);
      }
}

// A NaN makes its own group NaN and no other, folded columns sharing its vectors included.
TEST(Softmax, FoldedNanStaysInItsGroup) {
  const std::vector<int64_t> shape = {2, 7, 3};  // groups (o, i); element (o, a, i) at (o * 7 + a) * 3 + i
  for (OpId id : {OpId::Softmax_13, OpId::LogSoftmax_13})
    for (DType t : {DType::f32, DType::bf16}) {
      Problem p = make_problem(id, t, shape, 1, 78);
      p.edit_inputs = [](oracle::Tensors& in) { in[0]->v[(1 * 7 + 4) * 3 + 2] = NAN; };  // group (1, 2)
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << describe(p) << ": " << r.detail;
      for (int64_t o = 0; o < 2; ++o)
        for (int64_t a = 0; a < 7; ++a)
          for (int64_t i = 0; i < 3; ++i)
            EXPECT_EQ(std::isnan(r.outputs[0][(o * 7 + a) * 3 + i]), o == 1 && i == 2) << describe(p) << " " << o << a << i;
    }
}

// Runs `op` by name on the given inputs, attributes as given (none: the schema's defaults).
std::vector<double> run_op(OpId id, DType t, const oracle::Tensors& inputs, std::vector<Attribute> attrs) {
  std::vector<HostTensor> in;
  for (const auto& x : inputs) in.emplace_back(t, *x);
  HostTensor out(t, inputs[0]->shape);
  std::vector<TensorView> views;
  for (HostTensor& s : in) views.push_back(s.view());
  const TensorView out_view = out.view();
  std::vector<const TensorView*> in_ptr;
  for (const TensorView& v : views) in_ptr.push_back(&v);
  const TensorView* out_ptr[] = {&out_view};
  const Status s = run(op_schema(id).name, in_ptr, out_ptr, attrs);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out.values();
}

// x with dims a and b swapped (a plain index permutation, written independently of the library).
oracle::Tensor swap_dims(const oracle::Tensor& x, int a, int b) {
  const int rank = static_cast<int>(x.shape.size());
  std::vector<int64_t> shape = x.shape;
  std::swap(shape[a], shape[b]);
  oracle::Tensor r(shape);
  std::vector<int64_t> idx(rank, 0);
  for (int64_t e = 0; e < x.numel(); ++e) {
    int64_t rem = e;  // unravel e in x's shape
    for (int d = rank - 1; d >= 0; --d) {
      idx[d] = rem % x.shape[d];
      rem /= x.shape[d];
    }
    std::swap(idx[a], idx[b]);
    int64_t f = 0;
    for (int d = 0; d < rank; ++d) f = f * shape[d] + idx[d];
    r.v[f] = x.v[e];
  }
  return r;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, const Tolerance& tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (std::size_t e = 0; e < got.size(); ++e)
    ASSERT_LE(std::fabs(got[e] - want[e]), tol.abs + tol.rel * std::fabs(want[e]))
        << what << " at " << e << ": " << got[e] << " vs " << want[e];
}

// docs/semantics.md A5: a _13 op on a non-last axis does in place what ORT gets by swapping that
// axis with the last, running the last-axis op and swapping back. Do that swap here, by hand.
TEST(Softmax, NonLastAxisEqualsHandTransposition) {
  const std::vector<int64_t> shape = {3, 5, 4, 19};
  const int last = 3;
  for (OpId id : {OpId::SoftmaxGrad_13, OpId::LogSoftmaxGrad_13, OpId::Softmax_13, OpId::LogSoftmax_13}) {
    for (DType t : {DType::f32, DType::f64, DType::f16}) {
      for (int axis = 0; axis < last; ++axis) {
        const Problem p = make_problem(id, t, shape, axis, 100 + axis);
        oracle::Rng rng(p.seed);
        const std::vector<DType> types(op_schema(id).inputs.size(), t);
        const oracle::Tensors in = oracle::make_inputs(op_schema(id).name, shape, full_attrs(p), types, rng);
        oracle::Tensors swapped;
        for (const auto& x : in) swapped.push_back(swap_dims(*x, axis, last));
        const oracle::Attrs last_axis = {{"axis", -1.0}};
        const oracle::Tensor want = swap_dims(*oracle::reference(op_schema(id).name, swapped, last_axis)[0], axis, last);

        const std::string what = describe(p);
        const std::vector<double> strided = run_op(id, t, in, {{"axis", double(axis)}});
        expect_close(strided, want.v, tolerance(p, 0), what + " in place vs transposed oracle");
        // And the library's own last-axis path on the transposed data, swapped back.
        oracle::Tensor via_last(swapped[0]->shape);
        via_last.v = run_op(id, t, swapped, {{"axis", -1.0}});
        const Tolerance tol = tolerance(p, 0);
        expect_close(strided, swap_dims(via_last, axis, last).v, {2 * tol.abs, 2 * tol.rel},
                     what + " in place vs transposed library");
      }
    }
  }
}

// ORT's defaults: axis 1 (the opset 1-12 names, coerce to 2-D) and -1 (the _13 names), in the
// schema, in the typed API's args, and when `run` is given no attributes.
TEST(Softmax, AxisDefaults) {
  EXPECT_EQ(SoftmaxGradArgs{}.axis, 1);
  EXPECT_EQ(LogSoftmaxGradArgs{}.axis, 1);
  EXPECT_EQ(SoftmaxArgs{}.axis, 1);
  EXPECT_EQ(SoftmaxGrad13Args{}.axis, -1);
  EXPECT_EQ(LogSoftmaxGrad13Args{}.axis, -1);
  EXPECT_EQ(Softmax13Args{}.axis, -1);
  const std::vector<int64_t> shape = {2, 3, 4};
  for (OpId id : softmax_ops()) {
    const OpSchema& op = op_schema(id);
    const double want = single_axis(id) ? -1 : 1;
    ASSERT_GE(op.find_attribute("axis"), 0) << op.name;
    EXPECT_EQ(op.attributes[op.find_attribute("axis")].default_value, want) << op.name;

    oracle::Rng rng(5);
    const std::vector<DType> types(op.inputs.size(), DType::f64);
    const oracle::Tensors in = oracle::make_inputs(op.name, shape, {{"axis", want}}, types, rng);
    const std::vector<double> got = run_op(id, DType::f64, in, {});
    const Problem p = make_problem(id, DType::f64, shape, static_cast<int64_t>(want), 5);
    expect_close(got, oracle::reference(op.name, in, {{"axis", want}})[0]->v, tolerance(p, 0),
                 std::string(op.name) + " default axis");
    // The other convention's default gives different groups, hence different values.
    const std::vector<double> other = oracle::reference(op.name, in, {{"axis", -want}})[0]->v;
    double diff = 0;
    for (std::size_t e = 0; e < got.size(); ++e) diff = std::max(diff, std::fabs(got[e] - other[e]));
    EXPECT_GT(diff, 1e-3) << op.name;
  }
  // The typed entry points pass their args' default on.
  oracle::Rng rng(9);
  const std::vector<DType> types(2, DType::f32);
  const oracle::Tensors in = oracle::make_inputs("SoftmaxGrad", shape, {{"axis", 1.0}}, types, rng);
  HostTensor dy(DType::f32, *in[0]), y(DType::f32, *in[1]), dx(DType::f32, shape), dx13(DType::f32, shape);
  ASSERT_TRUE(softmax_grad({dy.view(), y.view(), dx.view()}).is_ok());
  ASSERT_TRUE(softmax_grad_13({dy.view(), y.view(), dx13.view()}).is_ok());
  const Problem p1 = make_problem(OpId::SoftmaxGrad, DType::f32, shape, 1, 9);
  const Problem p13 = make_problem(OpId::SoftmaxGrad_13, DType::f32, shape, -1, 9);
  expect_close(dx.values(), oracle::reference("SoftmaxGrad", in, {{"axis", 1.0}})[0]->v, tolerance(p1, 0),
               "softmax_grad()");
  expect_close(dx13.values(), oracle::reference("SoftmaxGrad_13", in, {{"axis", -1.0}})[0]->v, tolerance(p13, 0),
               "softmax_grad_13()");
}

// ---- shape rules ---------------------------------------------------------------------------

struct BadCall {
  std::vector<int64_t> in0, in1, out;
  double axis;
  std::vector<std::string> mentions;  // substrings the message must contain
};

TEST(Softmax, ShapeRulesNameTheArgument) {
  for (OpId id : softmax_ops()) {
    const OpSchema& op = op_schema(id);
    const bool grad = op.gradient;
    const std::string in0(op.inputs[0].name), out0(op.outputs[0].name);
    const std::string in1 = grad ? std::string(op.inputs[1].name) : "";
    std::vector<BadCall> bad = {
        {{2, 3}, {2, 3}, {3, 2}, -1, {"'" + out0 + "'", "[3, 2]", "[2, 3]"}},
        {{2, 3}, {2, 3}, {2, 3}, 2, {"'axis'", "2", "[-2, 1]"}},
        {{2, 3}, {2, 3}, {2, 3}, -3, {"'axis'", "-3", "[-2, 1]"}},
        {{}, {}, {}, 0, {"'axis'", "rank 0"}},
    };
    if (grad) bad.push_back({{2, 3}, {2, 4}, {2, 3}, -1, {"'" + in1 + "'", "[2, 4]", "[2, 3]", "'dY'"}});
    for (const BadCall& b : bad) {
      HostTensor x0(DType::f32, b.in0), x1(DType::f32, b.in1), out(DType::f32, b.out);
      std::vector<float> v(out.bytes.size() / 4 + 1, 0.5f);
      std::memcpy(out.bytes.data(), v.data(), out.bytes.size());
      const std::vector<std::byte> before = out.bytes;
      const TensorView v0 = x0.view(), v1 = x1.view(), vo = out.view();
      std::vector<const TensorView*> ins = {&v0};
      if (grad) ins.push_back(&v1);
      const TensorView* outs[] = {&vo};
      const Attribute attrs[] = {{"axis", b.axis}};
      const Status s = run(op.name, ins, outs, attrs);
      ASSERT_EQ(s.code(), StatusCode::invalid_argument) << op.name << " " << s.to_string();
      EXPECT_EQ(s.message().rfind(std::string(op.name) + ": ", 0), 0u) << s.message();
      for (const std::string& m : b.mentions) EXPECT_NE(s.message().find(m), std::string::npos) << s.message();
      EXPECT_EQ(out.bytes, before) << op.name << ": output written by a rejected call";
    }
  }
}

TEST(Softmax, OutputMayNotOverlapAnInput) {
  std::vector<float> buf(64, 0.25f);
  const int64_t shape[] = {4, 8};
  const TensorView dy(buf.data(), DType::f32, shape), y(buf.data() + 32, DType::f32, shape),
      dx(buf.data() + 16, DType::f32, shape);
  const Status s = softmax_grad_13({dy, y, dx});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
}

// Empty tensors are valid; their other dims may multiply past int64 without harm.
TEST(Softmax, EmptyTensorWithHugeDims) {
  const int64_t shape[] = {1ll << 40, 0, 1ll << 40};
  const TensorView t(nullptr, DType::f32, shape);
  for (int64_t axis : {0, 1, 2, -1}) {
    EXPECT_TRUE(softmax_grad({t, t, t, axis}).is_ok()) << axis;
    EXPECT_TRUE(log_softmax_grad_13({t, t, t, axis}).is_ok()) << axis;
    EXPECT_TRUE(softmax({t, t, axis}).is_ok()) << axis;
    EXPECT_TRUE(log_softmax_13({t, t, axis}).is_ok()) << axis;
  }
}

// ---- the oracle against finite differences of its own forward ---------------------------------

// With y = F(x) (softmax or log-softmax) and L = sum(dY * y), the gradient op's dX must be dL/dx.
TEST(Softmax, OracleGradientMatchesFiniteDifferences) {
  const std::vector<int64_t> shape = {2, 3, 5};
  const struct {
    const char* forward;
    const char* grad;
    double axis;
  } pairs[] = {{"Softmax", "SoftmaxGrad", 1},         {"Softmax_13", "SoftmaxGrad_13", 1},
               {"LogSoftmax", "LogSoftmaxGrad", 1},   {"LogSoftmax_13", "LogSoftmaxGrad_13", 0},
               {"Softmax_13", "SoftmaxGrad_13", -1},  {"LogSoftmax", "LogSoftmaxGrad", 0}};
  for (const auto& pr : pairs) {
    const oracle::Attrs attrs = {{"axis", pr.axis}};
    oracle::Rng rng(17);
    const std::vector<DType> f64 = {DType::f64, DType::f64};
    oracle::Tensor x = *oracle::make_inputs(pr.forward, shape, attrs, f64, rng)[0];
    oracle::Tensor dy(shape);
    oracle::fill_uniform(dy, DType::f64, -1, 1, rng);
    const oracle::Tensor y = *oracle::reference(pr.forward, {x}, attrs)[0];
    const oracle::Tensor dx = *oracle::reference(pr.grad, {dy, y}, attrs)[0];
    auto loss = [&](const oracle::Tensor& at) {
      const oracle::Tensor f = *oracle::reference(pr.forward, {at}, attrs)[0];
      long double l = 0;
      for (std::size_t e = 0; e < f.v.size(); ++e) l += static_cast<long double>(dy.v[e]) * f.v[e];
      return static_cast<double>(l);
    };
    const double h = 1e-5;
    for (std::size_t e = 0; e < x.v.size(); ++e) {
      oracle::Tensor plus = x, minus = x;
      plus.v[e] += h;
      minus.v[e] -= h;
      const double fd = (loss(plus) - loss(minus)) / (2 * h);
      EXPECT_NEAR(dx.v[e], fd, 1e-8) << pr.grad << " axis " << pr.axis << " at " << e;
    }
  }
}

}  // namespace
}  // namespace gradops::check
