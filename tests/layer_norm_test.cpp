// LayerNorm family against the float64 oracle: every op and (T, U, V) signature over the shape
// sweep (rank 1 to 5, every axis, empty, cols = 1, long rows, many rows, misaligned), both
// statistics shapes and both scale shapes, optional outputs omitted, thread-count invariance,
// forward-then-backward consistency, the oracle against finite differences, and validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>

#include "harness/checker.hpp"
#include "harness/host_tensor.hpp"

namespace gradops::check {
namespace {

std::vector<OpId> family_ops() {
  std::vector<OpId> ops;
  for (const OpSchema& s : op_schemas())
    if (s.family == OpFamily::layer_norm) ops.push_back(s.id);
  return ops;
}

struct ShapeAxis {
  std::vector<int64_t> shape;
  int64_t axis;
};

std::vector<ShapeAxis> sweep() {
  std::vector<ShapeAxis> s = {
      {{0}, 0}, {{1}, 0}, {{7}, 0}, {{3, 0}, 1}, {{0, 5}, 1}, {{0, 5}, 0}, {{5, 1}, -1}, {{4, 3, 1}, 2},
      {{31, 33}, -1}, {{31, 33}, 0}, {{17, 15}, 1}, {{16, 16}, 1}, {{13, 17}, 1}, {{2, 511}, 1}, {{3, 513}, 1},
      {{65537, 3}, 1},   // more rows than a CUDA grid dimension holds
      {{66001, 1}, -1},  // cols = 1 over many rows
      {{1, 262144}, 1}, {{3, 65521}, -1}};
  for (int64_t a = 0; a < 4; ++a) s.push_back({{2, 3, 5, 7}, a});
  for (int64_t a = -5; a < 0; ++a) s.push_back({{2, 1, 3, 1, 4}, a});
  return s;
}

Problem problem(OpId op, const TypeSignature& sig, std::vector<int64_t> shape, int64_t axis, uint64_t seed) {
  Problem p;
  p.op = op;
  p.sig = sig;
  p.shape = std::move(shape);
  p.attrs = {{"axis", static_cast<double>(axis)}};
  p.seed = seed;
  return p;
}

TEST(LayerNorm, EveryOpSignatureShape) {
  uint64_t seed = 1;
  for (OpId id : family_ops()) {
    for (const TypeSignature& sig : op_schema(id).signatures) {
      for (const ShapeAxis& sa : sweep()) {
        Problem p = problem(id, sig, sa.shape, sa.axis, seed++);
        p.misaligned = seed % 2 == 0;
        const Report r = run_case(p);
        ASSERT_TRUE(r.pass) << r.detail;
      }
    }
  }
}

TEST(LayerNorm, NonDefaultEpsilon) {
  for (OpId id : {OpId::LayerNormalization, OpId::SimplifiedLayerNormalization, OpId::LayerNormalizationGrad,
                  OpId::SimplifiedLayerNormalizationGrad, OpId::InvertibleLayerNormalizationGrad}) {
    for (double eps : {0.0, 0.25}) {
      Problem p = problem(id, {{DType::f64, DType::f64, DType::f64}}, {9, 4}, -1, 3);
      p.attrs["epsilon"] = eps;  // the grads ignore it; their oracle statistics use it
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << r.detail;
    }
  }
}

TEST(LayerNorm, OptionalOutputsCanBeOmitted) {
  for (OpId id : family_ops()) {
    const int outputs = static_cast<int>(op_schema(id).outputs.size());
    for (int mask = 1; mask < (1 << (outputs - 1)); ++mask) {
      for (DType t : {DType::f32, DType::bf16}) {
        Problem p = problem(id, {{t, DType::f32, t}}, {37, 129}, -1, 5);
        p.skip_output.assign(outputs, false);
        for (int o = 1; o < outputs; ++o) p.skip_output[o] = (mask >> (o - 1)) & 1;
        const Report r = run_case(p);
        ASSERT_TRUE(r.pass) << r.detail << " (skip mask " << mask << ")";
      }
    }
  }
}

bool same_bits(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        (!a[i].empty() && std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(double)) != 0))
      return false;
  return true;
}

TEST(LayerNorm, ResultsDoNotDependOnThreadCount) {
  for (OpId id : family_ops()) {
    for (const TypeSignature& sig : {TypeSignature{{DType::f32, DType::f32, DType::f32}},
                                     TypeSignature{{DType::bf16, DType::f32, DType::bf16}},
                                     TypeSignature{{DType::f64, DType::f32, DType::f64}}}) {
      // Several chunks of rows for dscale/dbias in both: long rows, and many short ones.
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{300, 1111}, std::vector<int64_t>{20011, 33}}) {
        Problem p = problem(id, sig, shape, -1, 11);
        p.threads = 1;
        const Report one = run_case(p);
        p.threads = 4;
        const Report four = run_case(p);
        ASSERT_TRUE(one.pass && four.pass) << one.detail << four.detail;
        ASSERT_TRUE(same_bits(one.outputs, four.outputs)) << describe(p);
      }
    }
  }
}

// ---- calls built by hand: tensors stored in their dtypes, any shapes --------------------------

// Outputs start as 0xFF bytes (NaN in every dtype): a call must write every element.
constexpr std::byte kPoison{0xFF};

// Expects every element of `got` within the checker's tolerance for output `o` of `p`.
void expect_close(const Problem& p, int o, const HostTensor& got, const std::vector<double>& expected) {
  const Tolerance tol = tolerance(p, o);
  ASSERT_EQ(got.count(), static_cast<int64_t>(expected.size()));
  for (int64_t i = 0; i < got.count(); ++i) {
    const double a = got.get(i), e = expected[i];
    ASSERT_LE(std::fabs(a - e), tol.abs + tol.rel * std::fabs(e))
        << describe(p) << ": " << op_schema(p.op).outputs[o].name << "[" << i << "] = " << a << ", expected " << e;
  }
}

std::vector<int64_t> leading(const std::vector<int64_t>& shape, int axis) {
  return std::vector<int64_t>(shape.begin(), shape.begin() + axis);
}

// The statistics as [d0..d(axis-1)] (no trailing 1s) and scale-like tensors as 1-D [cols]: the
// other accepted forms, which the oracle (with ORT's saved shapes) does not make.
TEST(LayerNorm, StatisticsWithoutTrailingOnesAndFlatScale) {
  const std::vector<int64_t> shape = {4, 3, 5, 2};
  for (OpId id : family_ops()) {
    const OpSchema& op = op_schema(id);
    for (const TypeSignature& sig : {TypeSignature{{DType::f32, DType::f32, DType::f32}},
                                     TypeSignature{{DType::f64, DType::f32, DType::f64}},
                                     TypeSignature{{DType::f16, DType::f32, DType::f16}}}) {
      for (int axis : {0, 1, 2, 3}) {
        const Problem p = problem(id, sig, shape, axis, 100 + axis);
        const oracle::Attrs attrs = full_attrs(p);
        std::vector<DType> in_types;
        for (std::size_t i = 0; i < op.inputs.size(); ++i) in_types.push_back(input_dtype(p, static_cast<int>(i)));
        oracle::Rng rng(p.seed);
        const oracle::Tensors in = oracle::make_inputs(op.name, shape, attrs, in_types, rng);
        const oracle::Tensors want = oracle::reference(op.name, in, attrs);
        int64_t cols = 1;
        for (std::size_t d = axis; d < shape.size(); ++d) cols *= shape[d];
        // Reshape every per-row tensor to the leading dims and every per-column one to [cols].
        auto reshaped = [&](const std::vector<int64_t>& s) {
          if (s == shape) return s;
          int64_t n = 1;
          for (int64_t d : s) n *= d;
          return n == cols && s.size() == shape.size() - axis ? std::vector<int64_t>{cols} : leading(shape, axis);
        };
        std::vector<std::unique_ptr<HostTensor>> ins, outs;
        std::vector<TensorView> in_views, out_views;
        for (std::size_t i = 0; i < in.size(); ++i)
          ins.push_back(std::make_unique<HostTensor>(in_types[i], reshaped(in[i]->shape), in[i]->v));
        for (std::size_t o = 0; o < want.size(); ++o)
          outs.push_back(std::make_unique<HostTensor>(output_dtype(p, static_cast<int>(o)), reshaped(want[o]->shape), kPoison));
        for (auto& s : ins) in_views.push_back(s->view());
        for (auto& s : outs) out_views.push_back(s->view());
        std::vector<const TensorView*> in_ptr, out_ptr;
        for (auto& v : in_views) in_ptr.push_back(&v);
        for (auto& v : out_views) out_ptr.push_back(&v);
        const Attribute a[] = {{"axis", static_cast<double>(axis)}};
        const Status s = run(op.name, in_ptr, out_ptr, a);
        ASSERT_TRUE(s.is_ok()) << describe(p) << ": " << s.to_string();
        for (std::size_t o = 0; o < want.size(); ++o) expect_close(p, static_cast<int>(o), *outs[o], want[o]->v);
      }
    }
  }
}

TEST(LayerNorm, ColsOneGivesZeroXGradAndSummedBiasGrad) {
  const int64_t rows = 1000;
  std::vector<float> x(rows), dy(rows), mean(rows), inv(rows), dx(rows, NAN), scale{1.25f}, ds{NAN}, db{NAN};
  double sum = 0;
  for (int64_t i = 0; i < rows; ++i) {
    x[i] = static_cast<float>(std::sin(i * 0.37) * 3);
    dy[i] = static_cast<float>(std::cos(i * 0.11));
    mean[i] = x[i];  // the mean of one value
    inv[i] = 1 / std::sqrt(1e-5f);
    sum += dy[i];
  }
  const int64_t shape[] = {rows, 1}, stats[] = {rows}, one[] = {1};
  LayerNormGradArgs a{TensorView(dy.data(), DType::f32, shape), TensorView(x.data(), DType::f32, shape),
                      TensorView(scale.data(), DType::f32, one), TensorView(mean.data(), DType::f32, stats),
                      TensorView(inv.data(), DType::f32, stats), TensorView(dx.data(), DType::f32, shape),
                      TensorView(ds.data(), DType::f32, one), TensorView(db.data(), DType::f32, one)};
  ASSERT_TRUE(layer_norm_grad(a).is_ok());
  for (float v : dx) ASSERT_EQ(v, 0.0f);
  EXPECT_NEAR(db[0], sum, 1e-3);
  EXPECT_EQ(ds[0], 0.0f);
}

// ---- forward then backward --------------------------------------------------------------------

// gradops' forward saves statistics (and Y) that gradops' backward consumes: the chain must give
// the gradient of the forward at X, which the oracle computes from X alone.
TEST(LayerNorm, ForwardThenBackwardIsTheGradientOfTheForward) {
  for (const TypeSignature& sig : {TypeSignature{{DType::f32, DType::f32, DType::f32}},
                                   TypeSignature{{DType::f64, DType::f64, DType::f64}},
                                   TypeSignature{{DType::f64, DType::f32, DType::f64}}}) {
    for (bool rms : {false, true}) {
      const std::vector<int64_t> shape = {6, 5, 40};
      const int axis = 1;
      const OpId fwd = rms ? OpId::SimplifiedLayerNormalization : OpId::LayerNormalization;
      const OpId bwd = rms ? OpId::SimplifiedLayerNormalizationGrad : OpId::LayerNormalizationGrad;
      const Problem pf = problem(fwd, sig, shape, axis, 21), pb = problem(bwd, sig, shape, axis, 21);
      const DType t = sig.types[0], u = sig.types[1], v = sig.types[2];
      // The backward's oracle inputs: dY, X, scale, statistics computed exactly from X.
      std::vector<DType> types;
      for (std::size_t i = 0; i < op_schema(bwd).inputs.size(); ++i) types.push_back(input_dtype(pb, static_cast<int>(i)));
      oracle::Rng rng(21);
      const oracle::Tensors in = oracle::make_inputs(op_schema(bwd).name, shape, full_attrs(pb), types, rng);
      const oracle::Tensors want = oracle::reference(op_schema(bwd).name, in, full_attrs(pb));

      HostTensor x(t, shape, in[1]->v), scale(v, in[2]->shape, in[2]->v), dy(v, shape, in[0]->v);
      HostTensor bias(v, in[2]->shape), y(v, shape, kPoison), mean(u, in.back()->shape, kPoison),
          inv(u, in.back()->shape, kPoison);
      HostTensor dx(t, shape, kPoison), ds(v, in[2]->shape, kPoison), db(v, in[2]->shape, kPoison);
      if (rms) {
        ASSERT_TRUE(rms_norm({x.view(), scale.view(), y.view(), inv.view(), axis}).is_ok());
        ASSERT_TRUE(rms_norm_grad({dy.view(), x.view(), scale.view(), inv.view(), dx.view(), ds.view(), axis}).is_ok());
      } else {
        ASSERT_TRUE(layer_norm({x.view(), scale.view(), bias.view(), y.view(), mean.view(), inv.view(), axis}).is_ok());
        ASSERT_TRUE(layer_norm_grad({dy.view(), x.view(), scale.view(), mean.view(), inv.view(), dx.view(), ds.view(),
                                     db.view(), axis})
                        .is_ok());
      }
      // The saved statistics differ from the exact ones by the forward's tolerance (relative e_r
      // in 1/std); the gradients inherit that relative error on top of their own.
      const double stats_rel = tolerance(pf, rms ? 1 : 2).rel;
      for (int o = 0; o < (rms ? 2 : 3); ++o) {
        const HostTensor& got = o == 0 ? dx : o == 1 ? ds : db;
        const Tolerance tol = tolerance(pb, o);
        double scale_of = 0;
        for (double e : want[o]->v) scale_of = std::max(scale_of, std::fabs(e));
        for (int64_t i = 0; i < got.count(); ++i) {
          const double e = want[o]->v[i];
          ASSERT_LE(std::fabs(got.get(i) - e), tol.abs + tol.rel * std::fabs(e) + 8 * stats_rel * scale_of)
              << describe(pb) << " output " << o << "[" << i << "]";
        }
      }
      if (rms) continue;
      // The invertible backward from the forward's Y (with its bias) gives the same gradients.
      HostTensor dx2(t, shape, kPoison), ds2(v, in[2]->shape, kPoison), db2(v, in[2]->shape, kPoison);
      ASSERT_TRUE(invertible_layer_norm_grad(
                      {dy.view(), y.view(), scale.view(), bias.view(), inv.view(), dx2.view(), ds2.view(), db2.view(), axis})
                      .is_ok());
      // x-hat differs between the two by Y's error (divided by |scale| >= 0.5) and by the rounding
      // of the statistics to U, which the invertible form only sees through r: |d xhat| <= 18 u_U
      // (|mu| <= 4, r <= 2.5, |xhat| <= 3), |d dX| <= r 2 G Xh |d xhat|, |d dscale| <= rows |d xhat|.
      const double y_rel = 2 * tolerance(pf, 0).abs;
      const double u_stats = u == DType::f64 ? 0x1p-53 : 0x1p-24;
      for (int o = 0; o < 3; ++o) {
        const HostTensor& a = o == 0 ? dx : o == 1 ? ds : db;
        const HostTensor& b = o == 0 ? dx2 : o == 1 ? ds2 : db2;
        const Tolerance tol = tolerance(pb, o);
        for (int64_t i = 0; i < a.count(); ++i)
          ASSERT_LE(std::fabs(a.get(i) - b.get(i)), 2 * tol.abs + 2 * tol.rel * std::fabs(a.get(i)) + 64 * y_rel +
                                                        18 * u_stats * (o == 0 ? 2.5 * 2 * 1.5 * 3 : 30.0))
              << describe(pb) << " invertible output " << o << "[" << i << "]";
      }
    }
  }
}

// ---- the oracle against finite differences of its own forward ---------------------------------

// Loss L = sum(dY * Y(X, scale, bias)); its gradients are what the backward ops compute.
TEST(LayerNorm, OracleGradientsMatchFiniteDifferences) {
  const std::vector<int64_t> shape = {3, 2, 5};
  const oracle::Attrs attrs = {{"axis", 1}, {"epsilon", 1e-3}, {"stash_type", 1}};
  const std::vector<DType> f64(5, DType::f64);
  for (bool rms : {false, true}) {
    const char* fwd = rms ? "SimplifiedLayerNormalization" : "LayerNormalization";
    const char* bwd = rms ? "SimplifiedLayerNormalizationGrad" : "LayerNormalizationGrad";
    oracle::Rng rng(5);
    oracle::Tensors fin = oracle::make_inputs(fwd, shape, attrs, f64, rng);
    oracle::Tensor dy(shape);
    oracle::fill_uniform(dy, DType::f64, -1, 1, rng);
    const oracle::Tensors fout = oracle::reference(fwd, fin, attrs);
    oracle::Tensors bin = {dy, fin[0], fin[1]};
    if (!rms) bin.push_back(fout[1]);
    bin.push_back(fout.back());
    const oracle::Tensors grads = oracle::reference(bwd, bin, attrs);
    auto loss = [&](const oracle::Tensors& x) {
      const oracle::Tensors y = oracle::reference(fwd, x, attrs);
      long double l = 0;
      for (std::size_t i = 0; i < dy.v.size(); ++i) l += static_cast<long double>(dy.v[i]) * y[0]->v[i];
      return static_cast<double>(l);
    };
    // Inputs X, scale, bias map to outputs X_grad, scale_grad, bias_grad.
    for (std::size_t k = 0; k < fin.size(); ++k) {
      for (std::size_t i = 0; i < fin[k]->v.size(); ++i) {
        const double h = 1e-5;
        oracle::Tensors plus = fin, minus = fin;
        plus[k]->v[i] += h;
        minus[k]->v[i] -= h;
        const double numeric = (loss(plus) - loss(minus)) / (2 * h);
        ASSERT_NEAR(grads[k]->v[i], numeric, 1e-7) << bwd << " output " << k << "[" << i << "]";
      }
    }
  }
}

// ---- validation -------------------------------------------------------------------------------

struct GradCall {
  std::vector<int64_t> x_shape = {4, 6, 5}, dy_shape = {4, 6, 5}, scale_shape = {6, 5}, mean_shape = {4, 1, 1},
                       inv_shape = {4, 1, 1}, dx_shape = {4, 6, 5}, ds_shape = {30}, db_shape = {6, 5};
  int64_t axis = 1;
};

// Runs LayerNormalizationGrad on sentinel-filled buffers; returns the status and checks that a
// failed call wrote nothing.
Status run_grad_call(const GradCall& g) {
  std::vector<double> ones(4096, 1.0);
  auto make = [&](const std::vector<int64_t>& s) { return HostTensor(DType::f32, s, kPoison); };
  HostTensor dy = make(g.dy_shape), x = make(g.x_shape), scale = make(g.scale_shape), mean = make(g.mean_shape),
         inv = make(g.inv_shape), dx = make(g.dx_shape), ds = make(g.ds_shape), db = make(g.db_shape);
  for (HostTensor* s : {&dy, &x, &scale, &mean, &inv})
    for (int64_t i = 0; i < s->count(); ++i) s->set(i, 0.5);
  const Status st = layer_norm_grad({dy.view(), x.view(), scale.view(), mean.view(), inv.view(), dx.view(), ds.view(),
                                     db.view(), g.axis});
  if (!st.is_ok()) {
    for (HostTensor* s : {&dx, &ds, &db})
      for (std::byte b : s->bytes) EXPECT_EQ(b, std::byte{0xFF}) << "an output was written by a failed call";
  }
  return st;
}

void expect_invalid(const GradCall& g, std::initializer_list<const char*> words) {
  const Status s = run_grad_call(g);
  ASSERT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  EXPECT_NE(s.message().find("LayerNormalizationGrad: "), std::string::npos) << s.message();
  for (const char* w : words) EXPECT_NE(s.message().find(w), std::string::npos) << s.message() << " lacks " << w;
}

TEST(LayerNorm, ValidCallsPass) {
  GradCall g;
  EXPECT_TRUE(run_grad_call(g).is_ok());
  g.mean_shape = g.inv_shape = {4};  // without trailing 1s
  g.scale_shape = {30};              // flat
  EXPECT_TRUE(run_grad_call(g).is_ok());
}

TEST(LayerNorm, RejectsBadShapes) {
  GradCall g;
  g.dy_shape = {4, 6, 6};
  expect_invalid(g, {"'Y_grad'", "[4, 6, 6]", "[4, 6, 5]"});
  g = {};
  g.dx_shape = {4, 30};
  expect_invalid(g, {"'X_grad'", "[4, 30]", "[4, 6, 5]"});
  g = {};
  g.scale_shape = {29};
  expect_invalid(g, {"'scale'", "[29]", "[30] or [6, 5]"});
  g = {};
  g.scale_shape = {5, 6};  // 30 values, but not the normalized dims
  expect_invalid(g, {"'scale'", "[5, 6]", "[30] or [6, 5]"});
  g = {};
  g.mean_shape = {4, 1};  // trailing 1s must reach the rank of X
  expect_invalid(g, {"'mean'", "[4, 1]", "[4] or [4, 1, 1]"});
  g = {};
  g.inv_shape = {5};
  expect_invalid(g, {"'inv_std_dev'", "[5]", "[4] or [4, 1, 1]"});
  g = {};
  g.ds_shape = {31};
  expect_invalid(g, {"'scale_grad'", "[31]"});
  g = {};
  g.db_shape = {6, 6};
  expect_invalid(g, {"'bias_grad'", "[6, 6]"});
  g = {};
  g.axis = 3;
  expect_invalid(g, {"'axis'", "3", "[-3, 2]"});
  g = {};
  g.axis = -4;
  expect_invalid(g, {"'axis'", "-4"});
}

TEST(LayerNorm, RejectsRankZeroAndOtherOpsNameTheirArguments) {
  GradCall g;
  g.x_shape = g.dy_shape = g.dx_shape = g.mean_shape = g.inv_shape = {};
  g.axis = 0;
  expect_invalid(g, {"'X'", "rank 0"});

  // InvertibleLayerNormalizationGrad: Y must match Y_grad; bias holds cols values.
  std::vector<float> buf(64, 0.5f), out(64);
  const int64_t s45[] = {4, 5}, s44[] = {4, 4}, s5[] = {5}, s4[] = {4}, s6[] = {6};
  auto v = [&](float* p, std::span<const int64_t> s) { return TensorView(p, DType::f32, s); };
  Status st = invertible_layer_norm_grad(
      {v(buf.data(), s45), v(buf.data(), s44), v(buf.data(), s5), v(buf.data(), s5), v(buf.data(), s4),
       v(out.data(), s45), std::nullopt, std::nullopt});
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("InvertibleLayerNormalizationGrad: 'Y' has shape [4, 4], expected [4, 5]"),
            std::string::npos)
      << st.message();
  st = invertible_layer_norm_grad({v(buf.data(), s45), v(buf.data(), s45), v(buf.data(), s5), v(buf.data(), s6),
                                   v(buf.data(), s4), v(out.data(), s45), std::nullopt, std::nullopt});
  EXPECT_NE(st.message().find("'bias' has shape [6]"), std::string::npos) << st.message();
  st = rms_norm_grad({v(buf.data(), s45), v(buf.data(), s45), v(buf.data(), s5), v(buf.data(), s5),
                      v(out.data(), s45), std::nullopt});
  EXPECT_NE(st.message().find("SimplifiedLayerNormalizationGrad: 'inv_std_var' has shape [5]"), std::string::npos)
      << st.message();
  // Forwards check their optional outputs too.
  st = layer_norm({v(buf.data(), s45), v(buf.data(), s5), std::nullopt, v(out.data(), s45), v(out.data() + 20, s5),
                   std::nullopt});
  EXPECT_NE(st.message().find("LayerNormalization: 'Mean' has shape [5], expected [4] or [4, 1]"), std::string::npos)
      << st.message();
  st = rms_norm({v(buf.data(), s45), v(buf.data(), s4), v(out.data(), s45), std::nullopt});
  EXPECT_NE(st.message().find("SimplifiedLayerNormalization: 'scale' has shape [4]"), std::string::npos)
      << st.message();
}

// A forward's Scale and B may carry leading 1s (the values are the same cols values); a
// gradient's scale may not, and neither may exceed the rank of X.
TEST(LayerNorm, ForwardScaleMayCarryLeadingOnes) {
  std::vector<float> x(20), scale(5), bias(5), y1(20), y2(20, NAN);
  for (int i = 0; i < 20; ++i) x[i] = static_cast<float>(std::sin(i * 1.3) + i % 3);
  for (int j = 0; j < 5; ++j) scale[j] = 0.5f + 0.25f * j, bias[j] = 0.1f * j;
  const int64_t s45[] = {4, 5}, s5[] = {5}, s15[] = {1, 5}, s115[] = {1, 1, 5};
  auto v = [](float* p, std::span<const int64_t> s) { return TensorView(p, DType::f32, s); };
  ASSERT_TRUE(layer_norm({v(x.data(), s45), v(scale.data(), s5), v(bias.data(), s5), v(y1.data(), s45), std::nullopt,
                          std::nullopt})
                  .is_ok());
  ASSERT_TRUE(layer_norm({v(x.data(), s45), v(scale.data(), s15), v(bias.data(), s15), v(y2.data(), s45), std::nullopt,
                          std::nullopt})
                  .is_ok());
  EXPECT_EQ(y1, y2);
  Status st =
      layer_norm({v(x.data(), s45), v(scale.data(), s115), std::nullopt, v(y2.data(), s45), std::nullopt, std::nullopt});
  EXPECT_NE(st.message().find("'Scale' has shape [1, 1, 5]"), std::string::npos) << st.message();
  std::vector<float> stats(4, 1.0f), dx(20), ds(5);
  const int64_t s4[] = {4};
  st = rms_norm_grad({v(x.data(), s45), v(x.data(), s45), v(scale.data(), s15), v(stats.data(), s4), v(dx.data(), s45),
                      v(ds.data(), s5)});
  EXPECT_NE(st.message().find("SimplifiedLayerNormalizationGrad: 'scale' has shape [1, 5] (5 values), expected [5]"),
            std::string::npos)
      << st.message();
}

// Empty tensors whose other dims multiply past int64 are valid and touch no data.
TEST(LayerNorm, EmptyTensorsWithHugeDims) {
  const int64_t big = int64_t{1} << 40;
  const int64_t x_rows_empty[] = {0, 3, big}, x_cols_empty[] = {big, big, 0}, stats[] = {0, 3}, cols[] = {big},
                none[] = {0};
  void* fake = reinterpret_cast<void*>(uintptr_t{64});  // never dereferenced
  auto v = [&](void* p, std::span<const int64_t> s) { return TensorView(p, DType::f32, s); };
  // rows = 0, cols = 2^40: scale is required (non-null), nothing is read or written.
  Status st = layer_norm_grad({v(nullptr, x_rows_empty), v(nullptr, x_rows_empty), v(fake, cols), v(nullptr, stats),
                               v(nullptr, stats), v(nullptr, x_rows_empty), std::nullopt, std::nullopt, 2});
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  // cols = 0, rows = 2^80: no statistics can be asked for; Y is empty.
  st = layer_norm({v(nullptr, x_cols_empty), v(nullptr, none), std::nullopt, v(nullptr, x_cols_empty), std::nullopt,
                   std::nullopt, 2});
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  // cols = 0, rows = 2^80 at axis 1 would be 2^40 rows of nothing: still nothing to do.
  const int64_t flat0[] = {0};
  st = rms_norm({v(nullptr, x_cols_empty), v(nullptr, flat0), v(nullptr, x_cols_empty), std::nullopt, 1});
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  // cols = 2^80 with rows = 0: scale cannot hold one value per column.
  const int64_t x_wide[] = {0, big, big};
  st = layer_norm({v(nullptr, x_wide), v(fake, cols), std::nullopt, v(nullptr, x_wide), std::nullopt, std::nullopt, 1});
  EXPECT_EQ(st.code(), StatusCode::invalid_argument);
  EXPECT_NE(st.message().find("multiply past 2^63 - 1"), std::string::npos) << st.message();
}

// Scratch for dscale/dbias comes from the caller's allocator.
TEST(LayerNorm, WorkspaceComesFromTheContextAllocator) {
  struct Counter {
    int allocations = 0, releases = 0;
  } counter;
  WorkspaceAllocator alloc;
  alloc.user = &counter;
  alloc.allocate = [](void* user, Device, std::size_t bytes) -> void* {
    ++static_cast<Counter*>(user)->allocations;
    return ::operator new(bytes, std::align_val_t{64});
  };
  alloc.deallocate = [](void* user, Device, void* p, std::size_t) {
    ++static_cast<Counter*>(user)->releases;
    ::operator delete(p, std::align_val_t{64});
  };
  std::vector<float> buf(60, 0.5f), dx(60), ds(5), db(5);
  const int64_t s[] = {12, 5}, s5[] = {5}, s12[] = {12};
  auto v = [&](float* p, std::span<const int64_t> sh) { return TensorView(p, DType::f32, sh); };
  Context ctx;
  ctx.allocator = &alloc;
  ASSERT_TRUE(layer_norm_grad({v(buf.data(), s), v(buf.data(), s), v(buf.data(), s5), v(buf.data(), s12),
                               v(buf.data(), s12), v(dx.data(), s), v(ds.data(), s5), v(db.data(), s5)},
                              ctx)
                  .is_ok());
  EXPECT_EQ(counter.allocations, 1);
  EXPECT_EQ(counter.releases, 1);
}

}  // namespace
}  // namespace gradops::check
