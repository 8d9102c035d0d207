// BatchNorm family against the float64 oracle: both ops, every signature, both layouts over the
// shape sweep (misaligned too), optional outputs left out, running statistics in place, thread-count
// invariance, NCHW against NHWC on transposed data, the edge cases Mc = 0 and Mc = 1, a variance
// far from zero, the validation rules, and the oracle against finite differences of its forward.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "batch_norm_common.hpp"
#include "harness/checker.hpp"

namespace gradops::check {
namespace {

constexpr OpId kOps[] = {OpId::BatchNormalizationGrad, OpId::BatchNormInternal};

Problem make_problem(OpId id, const TypeSignature& sig, const std::vector<int64_t>& shape, bool channels_last,
                     uint64_t seed) {
  Problem p;
  p.op = id;
  p.sig = sig;
  p.shape = shape;
  p.attrs = {{"channels_last", channels_last ? 1.0 : 0.0}};
  if (id == OpId::BatchNormalizationGrad) p.attrs["epsilon"] = 1e-5;  // required by the schema
  p.seed = seed;
  return p;
}

// Ranks 1 to 5; Mc = 0 (several ways), 1 and 2; C = 1 and primes; NCHW spatial sizes below, at
// and above kPlaneMin (1024), from which planes are folded in place, and planes crossing a piece
// (kChain * 4 vectors: 2048 to 8192 values by target and dtype); channels below, at and above
// kMaxCols (1600) columns at once; more than 65,535 rows in NHWC; one channel of 262,147 values.
// Each shape runs in both layouts, where C is a different dim.
std::vector<std::vector<int64_t>> sweep() {
  return {{0},           {1},           {2},          {7},           {3, 0},       {0, 3},
          {2, 0, 5},     {1, 1},        {1, 5},       {5, 1},        {2, 3},       {13, 7},
          {3, 5, 1},     {2, 3, 5},     {4, 3, 63},   {3, 2, 64},    {2, 3, 65},   {2, 3, 5, 7},
          {2, 3, 2, 3, 5}, {1, 1, 1, 1, 1}, {1, 3, 1031}, {5, 2, 419}, {129, 5},  {257, 3, 3},
          {2, 2049, 3},  {3, 4099},     {65537, 3},   {3, 22000, 2}, {1, 1, 262147},
          {2, 3, 1023},  {2, 3, 1024},  {1, 2, 8193}, {3, 1599},     {3, 1600},    {3, 1601},
          // NCHW planes (spatial >= 1024) of too few channels to fuse, written as one run a thread
          // across plane and sample boundaries.
          {4, 3, 1031}};
}

TEST(BatchNorm, EveryOpSignatureLayoutShape) {
  uint64_t seed = 1;
  for (OpId id : kOps)
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (bool last : {false, true})
        for (const auto& shape : sweep()) {
          Problem p = make_problem(id, sig, shape, last, seed++);
          p.misaligned = seed % 2 == 0;
          const Report r = run_case(p);
          ASSERT_TRUE(r.pass) << describe(p) << ": " << r.detail;
        }
}

TEST(BatchNorm, OptionalOutputsCanBeOmitted) {
  for (bool last : {false, true}) {
    for (int mask = 1; mask < 4; ++mask) {  // scale_grad, bias_grad
      Problem p = make_problem(OpId::BatchNormalizationGrad, {{DType::f32, DType::f32, DType::f32}}, {4, 3, 5}, last, 3);
      p.skip_output = {false, (mask & 1) != 0, (mask & 2) != 0};
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << describe(p) << " mask " << mask << ": " << r.detail;
    }
    for (int mask = 1; mask < 16; ++mask) {  // running_mean, running_var, saved_mean, saved_inv_std
      Problem p = make_problem(OpId::BatchNormInternal, {{DType::f16, DType::f16, DType::f32}}, {4, 3, 70}, last, 5);
      p.skip_output = {false, (mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0, (mask & 8) != 0};
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << describe(p) << " mask " << mask << ": " << r.detail;
    }
  }
}

// running_mean/running_var written over input_mean/input_var (ORT's Alias(3,1), Alias(4,2)) give
// the same bits as separate buffers, which the oracle checks.
TEST(BatchNorm, RunningStatisticsInPlace) {
  for (const TypeSignature& sig : op_schema(OpId::BatchNormInternal).signatures)
    for (bool last : {false, true})
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 5, 70}, {2, 4, 3}, {1, 3}}) {
        const Problem p = make_problem(OpId::BatchNormInternal, sig, shape, last, 21);
        const Report ref = run_case(p);
        ASSERT_TRUE(ref.pass) << describe(p) << ": " << ref.detail;

        const oracle::Attrs attrs = full_attrs(p);
        oracle::Rng rng(p.seed);
        std::vector<DType> types;
        for (int i = 0; i < 5; ++i) types.push_back(input_dtype(p, i));
        const oracle::Tensors in = oracle::make_inputs("BatchNormInternal", shape, attrs, types, rng);
        HostTensor x(types[0], *in[0]), scale(types[1], *in[1]), b(types[2], *in[2]), mean(types[3], *in[3]),
            var(types[4], *in[4]), y(types[0], shape), smean(types[3], in[3]->shape), sistd(types[3], in[3]->shape);
        BatchNormTrainingArgs a;
        a.x = x.view(), a.scale = scale.view(), a.bias = b.view(), a.input_mean = mean.view(), a.input_var = var.view();
        a.y = y.view();
        a.running_mean = mean.view();
        a.running_var = var.view();
        a.saved_mean = smean.view();
        a.saved_inv_std = sistd.view();
        a.channels_last = last;
        ASSERT_TRUE(batch_norm_training(a).is_ok()) << describe(p);
        EXPECT_TRUE(same_bits(y.values(), ref.outputs[0])) << describe(p) << " Y";
        EXPECT_TRUE(same_bits(mean.values(), ref.outputs[1])) << describe(p) << " running_mean";
        EXPECT_TRUE(same_bits(var.values(), ref.outputs[2])) << describe(p) << " running_var";
        EXPECT_TRUE(same_bits(smean.values(), ref.outputs[3])) << describe(p) << " saved_mean";
        EXPECT_TRUE(same_bits(sistd.values(), ref.outputs[4])) << describe(p) << " saved_inv_std";
      }
}

// Shapes with many chunks in each traversal: NCHW planes, NCHW short runs, NHWC rows (narrow and
// wider than a column block), a single long channel; NCHW with few channels (one thread takes
// whole channels, several split the passes) and with many (blocks of channels differ by thread
// count).
TEST(BatchNorm, ResultsDoNotDependOnThreadCount) {
  const struct {
    std::vector<int64_t> shape;
    bool last;
  } cases[] = {{{6, 5, 3001}, false}, {{700, 40, 7}, false}, {{300, 100, 3}, true},
               {{31, 2100}, true},      {{1, 1, 300001}, false}, {{9000, 1, 40}, true},
               {{40, 5, 300}, false},   {{300, 20, 130}, false}, {{3, 40, 2000}, false}};
  for (OpId id : kOps)
    for (DType t : {DType::f32, DType::bf16})
      for (const auto& c : cases) {
        const TypeSignature sig{{t, t, DType::f32}};
        Problem p = make_problem(id, sig, c.shape, c.last, 11);
        p.threads = 1;
        const Report one = run_case(p);
        p.threads = 4;
        const Report four = run_case(p);
        ASSERT_TRUE(one.pass && four.pass) << describe(p) << one.detail << four.detail;
        ASSERT_EQ(one.outputs.size(), four.outputs.size());
        for (std::size_t o = 0; o < one.outputs.size(); ++o)
          EXPECT_TRUE(same_bits(one.outputs[o], four.outputs[o])) << describe(p) << " output " << o;
      }
}

// The same batch as NCHW and as NHWC (transposed by hand) gives the same results within the
// tolerance of each (the two layouts sum in different orders).
TEST(BatchNorm, LayoutsAgreeOnTransposedData) {
  const int64_t n = 3, c = 5, h = 7, w = 11;
  const std::vector<int64_t> nchw = {n, c, h, w}, nhwc = {n, h, w, c};
  auto to_nhwc = [&](const std::vector<double>& v) {
    std::vector<double> r(v.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t s = 0; s < h * w; ++s) r[(i * h * w + s) * c + ch] = v[(i * c + ch) * h * w + s];
    return r;
  };
  const TypeSignature sig{{DType::f32, DType::f32, DType::f32}};
  for (OpId id : kOps) {
    const Problem p = make_problem(id, sig, nchw, false, 31);
    const oracle::Attrs attrs = full_attrs(p);
    oracle::Rng rng(p.seed);
    const std::vector<DType> types(5, DType::f32);
    const oracle::Tensors in = oracle::make_inputs(op_schema(id).name, nchw, attrs, types, rng);
    std::vector<HostTensor> a, b;  // NCHW, NHWC
    for (const auto& t : in) {
      a.emplace_back(DType::f32, *t);
      oracle::Tensor tt = *t;
      if (tt.shape.size() == 4) tt.shape = nhwc, tt.v = to_nhwc(t->v);
      b.emplace_back(DType::f32, tt);
    }
    const std::vector<std::vector<int64_t>> out_nchw = {nchw, {c}, {c}, {c}, {c}}, out_nhwc = {nhwc, {c}, {c}, {c}, {c}};
    const std::size_t outs = op_schema(id).outputs.size();
    std::vector<HostTensor> oa, ob;
    for (std::size_t o = 0; o < outs; ++o) oa.emplace_back(DType::f32, out_nchw[o]), ob.emplace_back(DType::f32, out_nhwc[o]);
    auto call = [&](std::vector<HostTensor>& ins, std::vector<HostTensor>& outv, bool last) {
      std::vector<TensorView> iv, ov;
      for (auto& s : ins) iv.push_back(s.view());
      for (auto& s : outv) ov.push_back(s.view());
      std::vector<const TensorView*> ip, op;
      for (auto& v : iv) ip.push_back(&v);
      for (auto& v : ov) op.push_back(&v);
      const Attribute at[] = {{"epsilon", 1e-5}, {"channels_last", last ? 1.0 : 0.0}};
      return run(op_schema(id).name, ip, op, at);
    };
    ASSERT_TRUE(call(a, oa, false).is_ok());
    ASSERT_TRUE(call(b, ob, true).is_ok());
    for (std::size_t o = 0; o < outs; ++o) {
      const std::vector<double> va = o == 0 ? to_nhwc(oa[o].values()) : oa[o].values(), vb = ob[o].values();
      const Tolerance tol = tolerance(p, static_cast<int>(o));
      for (std::size_t e = 0; e < va.size(); ++e)
        ASSERT_NEAR(va[e], vb[e], 2 * (tol.abs + tol.rel * std::fabs(va[e])))
            << op_schema(id).name << " " << op_schema(id).outputs[o].name << "[" << e << "]";
    }
  }
}

// The edges, by hand, with the running statistics in place: Mc = 1 (running_var is NaN, the
// unbiased variance of one value being undefined; Y = B exactly) and Mc = 0 (running statistics
// pass through; saved mean 0 and saved inverse std 1/sqrt(epsilon); the grad's sums are 0).
TEST(BatchNorm, SingleValueAndEmptyBatches) {
  const float eps = 1e-3f, m = 0.75f;
  const std::vector<float> x = {1.5f, -2.0f, 4.0f}, scale = {2, 3, 4}, b = {0.5f, -0.5f, 1},
                           old_mean = {1, 2, 3}, old_var = {4, 5, 6};
  for (bool last : {false, true})
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 3}, {0, 3}, {0, 1, 3}, {1, 1, 3}}) {
      const bool empty = shape[0] == 0;
      if (!last && shape.size() == 3) continue;  // NCHW [n, 1, 3] has one channel
      std::vector<float> y(3, NAN), rm = old_mean, rv = old_var, sm(3, NAN), si(3, NAN);
      BatchNormTrainingArgs a;
      a.x = TensorView(x.data(), DType::f32, std::span<const int64_t>(shape));
      a.y = TensorView(y.data(), DType::f32, std::span<const int64_t>(shape));
      a.scale = TensorView::of(scale.data(), {3}), a.bias = TensorView::of(b.data(), {3});
      a.input_mean = TensorView::of(rm.data(), {3}), a.running_mean = a.input_mean;
      a.input_var = TensorView::of(rv.data(), {3}), a.running_var = a.input_var;
      a.saved_mean = TensorView::of(sm.data(), {3}), a.saved_inv_std = TensorView::of(si.data(), {3});
      a.epsilon = eps;
      a.momentum = m;
      a.channels_last = last;
      ASSERT_TRUE(batch_norm_training(a).is_ok());
      for (int ch = 0; ch < 3; ++ch) {
        EXPECT_FLOAT_EQ(si[ch], 1 / std::sqrt(eps)) << ch;
        if (empty) {
          EXPECT_EQ(sm[ch], 0.0f) << ch;
          EXPECT_EQ(rm[ch], old_mean[ch]) << ch;
          EXPECT_EQ(rv[ch], old_var[ch]) << ch;
        } else {
          EXPECT_EQ(sm[ch], x[ch]) << ch;
          EXPECT_FLOAT_EQ(rm[ch], m * old_mean[ch] + (1 - m) * x[ch]) << ch;
          EXPECT_TRUE(std::isnan(rv[ch])) << ch;
          EXPECT_EQ(y[ch], b[ch]) << ch;  // x - mean is exactly 0
        }
      }
      // The grad on the same batch: dX = 0 for one value (dY - S1 = 0, xhat = 0), sums 0 when empty.
      const std::vector<float> dy = {0.25f, -1.0f, 2.0f};
      std::vector<float> dx(3, NAN), ds(3, NAN), db(3, NAN);
      BatchNormGradArgs g;
      g.dy = TensorView(dy.data(), DType::f32, std::span<const int64_t>(shape));
      g.x = a.x;
      g.dx = TensorView(dx.data(), DType::f32, std::span<const int64_t>(shape));
      g.scale = a.scale, g.mean = TensorView::of(sm.data(), {3}), g.inv_std = TensorView::of(si.data(), {3});
      g.dscale = TensorView::of(ds.data(), {3}), g.dbias = TensorView::of(db.data(), {3});
      g.channels_last = last;
      ASSERT_TRUE(batch_norm_grad(g).is_ok());
      for (int ch = 0; ch < 3; ++ch) {
        EXPECT_EQ(ds[ch], 0.0f) << ch;
        EXPECT_EQ(db[ch], empty ? 0.0f : dy[ch]) << ch;
        if (!empty) EXPECT_EQ(dx[ch], 0.0f) << ch;
      }
    }
}

// An empty batch whose other dims multiply past int64 (valid: it has no elements). The CPU kernel's
// traffic estimate multiplied them (signed overflow under UBSan, found by the fuzzer); every op of
// the family now returns OK with the running statistics passed through.
TEST(BatchNorm, EmptyBatchWithHugeDims) {
  const std::vector<int64_t> shape = {std::numeric_limits<int64_t>::max(), 13, 0};
  for (bool grad : {false, true}) {
    std::vector<float> ch(13, 0.5f), rm(13, 1.0f), rv(13, 2.0f), sm(13, NAN), si(13, NAN), ds(13, NAN), db(13, NAN);
    float none = 0;
    const TensorView big(&none, DType::f32, std::span<const int64_t>(shape));
    if (!grad) {
      BatchNormTrainingArgs a;
      a.x = big, a.y = big;
      a.scale = TensorView::of(ch.data(), {13}), a.bias = a.scale;
      a.input_mean = TensorView::of(rm.data(), {13}), a.running_mean = a.input_mean;
      a.input_var = TensorView::of(rv.data(), {13}), a.running_var = a.input_var;
      a.saved_mean = TensorView::of(sm.data(), {13}), a.saved_inv_std = TensorView::of(si.data(), {13});
      const Status st = batch_norm_training(a);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(rm[0], 1.0f);
      EXPECT_EQ(rv[12], 2.0f);
    } else {
      BatchNormGradArgs g;
      g.dy = big, g.x = big, g.dx = big;
      g.scale = TensorView::of(ch.data(), {13}), g.mean = TensorView::of(rm.data(), {13});
      g.inv_std = TensorView::of(rv.data(), {13});
      g.dscale = TensorView::of(ds.data(), {13}), g.dbias = TensorView::of(db.data(), {13});
      const Status st = batch_norm_grad(g);
      ASSERT_TRUE(st.is_ok()) << st.to_string();
      EXPECT_EQ(ds[0], 0.0f);
      EXPECT_EQ(db[12], 0.0f);
    }
  }
}

// epsilon 0 and channels of one value each: every (x - mean) * inv_std is 0 * inf, NaN as the
// oracle says, in every signature and layout (the fuzzer found ±inf from the rounding of the mean).
TEST(BatchNorm, NoSpreadAndEpsilonZeroGiveNaN) {
  uint64_t seed = 61;
  for (const TypeSignature& sig : op_schema(OpId::BatchNormInternal).signatures)
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 18}, {1, 4, 1}, {1, 1, 1, 1}})
      for (bool last : {false, true}) {
        Problem p = make_problem(OpId::BatchNormInternal, sig, shape, last, seed++);
        p.attrs["epsilon"] = 0;
        const Report r = run_case(p);
        EXPECT_TRUE(r.pass) << describe(p) << ": " << r.detail;
      }
}

// One value per channel and a tiny epsilon (the fuzzer's fifth finding): the saved inverse std is
// near 1/sqrt(epsilon), so x̂ = (x - mean)·inv_std is the rounding of the mean to T2 magnified by up
// to 5e8, and X_grad = c·(x - mean) reaches 1e12 with a few roundings in it. The check's bound must
// take x̂ from that rounding, not from the data's spread (it held x̂ to 2e-4 and failed a 2-ulp
// f64 result).
TEST(BatchNorm, OneValuePerChannelWithTinyEpsilon) {
  uint64_t seed = 71;
  for (const TypeSignature& sig : op_schema(OpId::BatchNormalizationGrad).signatures)
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{1, 15}, {1, 4, 1}})
      for (bool last : {false, true})
        for (double eps : {3.3e-18, 1e-20}) {
          Problem p = make_problem(OpId::BatchNormalizationGrad, sig, shape, last, seed++);
          p.attrs["epsilon"] = eps;
          const Report r = run_case(p);
          EXPECT_TRUE(r.pass) << describe(p) << ": " << r.detail;
        }
}

// A batch far from zero: the variance must come from deviations, not E[x²] - E[x]², which in f32
// loses about u·mean²/var = 6e-8·1e6/0.33, a fifth of the value.
TEST(BatchNorm, VarianceFarFromZero) {
  const int64_t mc = 100000;
  std::vector<float> x(mc), y(mc), scale = {1}, b = {0}, old_mean = {0}, old_var = {1}, sm(1), si(1);
  oracle::Rng rng(3);
  std::uniform_real_distribution<double> u(-1, 1);
  for (float& v : x) v = static_cast<float>(1000 + u(rng));
  long double sum = 0, sq = 0;
  for (float v : x) sum += v;
  const long double mean = sum / mc;
  for (float v : x) sq += (v - mean) * (v - mean);
  const double istd = static_cast<double>(1 / std::sqrt(sq / mc + 1e-5L));
  for (bool last : {false, true}) {
    BatchNormTrainingArgs a;
    a.x = TensorView::of(x.data(), {mc, 1}), a.y = TensorView::of(y.data(), {mc, 1});
    a.scale = TensorView::of(scale.data(), {1}), a.bias = TensorView::of(b.data(), {1});
    a.input_mean = TensorView::of(old_mean.data(), {1}), a.input_var = TensorView::of(old_var.data(), {1});
    a.saved_mean = TensorView::of(sm.data(), {1}), a.saved_inv_std = TensorView::of(si.data(), {1});
    a.channels_last = last;
    ASSERT_TRUE(batch_norm_training(a).is_ok());
    EXPECT_NEAR(sm[0], static_cast<double>(mean), 1e-3);
    EXPECT_NEAR(si[0], istd, 1e-5 * istd) << "layout " << last;
  }
}

// ORT's schema requires epsilon but the saved inverse std already includes it: any value gives
// the same bits.
TEST(BatchNorm, GradIgnoresEpsilon) {
  const std::vector<int64_t> shape = {3, 4, 9};
  oracle::Rng rng(41);
  const std::vector<DType> types(5, DType::f32);
  const oracle::Tensors in = oracle::make_inputs("BatchNormalizationGrad", shape, {{"epsilon", 1e-5}}, types, rng);
  std::vector<HostTensor> ins;
  for (const auto& t : in) ins.emplace_back(DType::f32, *t);
  std::vector<double> first;
  for (double eps : {1e-5, 0.5, 0.0}) {
    HostTensor dx(DType::f32, shape), ds(DType::f32, {4}), db(DType::f32, {4});
    BatchNormGradArgs g;
    g.dy = ins[0].view(), g.x = ins[1].view(), g.scale = ins[2].view(), g.mean = ins[3].view(), g.inv_std = ins[4].view();
    g.dx = dx.view(), g.dscale = ds.view(), g.dbias = db.view();
    g.epsilon = static_cast<float>(eps);
    ASSERT_TRUE(batch_norm_grad(g).is_ok());
    std::vector<double> all = dx.values();
    for (double v : ds.values()) all.push_back(v);
    for (double v : db.values()) all.push_back(v);
    if (first.empty()) first = all;
    EXPECT_TRUE(same_bits(first, all)) << "epsilon " << eps;
  }
}

// ---- validation ---------------------------------------------------------------------------------

struct GradCall {
  std::vector<int64_t> x_shape = {2, 4, 5}, dy_shape = {2, 4, 5}, dx_shape = {2, 4, 5};
  std::vector<int64_t> scale = {4}, mean = {4}, var = {4}, dscale = {4}, dbias = {4};
  std::vector<float> buf = std::vector<float>(1000, 0.25f);
  std::vector<float> out = std::vector<float>(1000, 7.0f);
  std::vector<Attribute> attrs = {{"epsilon", 1e-5}};
  bool rank0 = false;

  Status run_it() {
    const float* in = buf.data();
    TensorView dy(in, DType::f32, std::span<const int64_t>(dy_shape)), x(in, DType::f32, std::span<const int64_t>(x_shape));
    if (rank0) x = TensorView(in, DType::f32, std::span<const int64_t>());
    TensorView s(in, DType::f32, std::span<const int64_t>(scale)), m(in, DType::f32, std::span<const int64_t>(mean)),
        v(in, DType::f32, std::span<const int64_t>(var));
    TensorView dx(out.data(), DType::f32, std::span<const int64_t>(dx_shape)),
        ds(out.data() + 500, DType::f32, std::span<const int64_t>(dscale)),
        db(out.data() + 700, DType::f32, std::span<const int64_t>(dbias));
    const TensorView* ins[] = {&dy, &x, &s, &m, &v};
    const TensorView* outs[] = {&dx, &ds, &db};
    return run("BatchNormalizationGrad", ins, outs, attrs);
  }
};

void expect_invalid(const Status& s, const std::vector<std::string>& parts, const std::vector<float>& out) {
  EXPECT_EQ(s.code(), StatusCode::invalid_argument) << s.to_string();
  for (const std::string& part : parts) EXPECT_NE(s.message().find(part), std::string::npos) << s.message() << " lacks " << part;
  for (float v : out) ASSERT_EQ(v, 7.0f) << "an output was written: " << s.message();
}

TEST(BatchNorm, GradValidation) {
  {
    GradCall c;
    ASSERT_TRUE(c.run_it().is_ok());
  }
  {
    GradCall c;
    c.scale = {3};
    expect_invalid(c.run_it(), {"BatchNormalizationGrad: 'scale' has shape [3], expected [4]", "dim 1 of 'X'"}, c.out);
  }
  {
    GradCall c;
    c.var = {4, 1};
    expect_invalid(c.run_it(), {"'variance' has shape [4, 1], expected [4]"}, c.out);
  }
  {
    GradCall c;
    c.mean = {5};
    expect_invalid(c.run_it(), {"'mean' has shape [5], expected [4]"}, c.out);
  }
  {
    GradCall c;
    c.dy_shape = {2, 4, 6};
    expect_invalid(c.run_it(), {"'dY' has shape [2, 4, 6], expected [2, 4, 5]"}, c.out);
  }
  {
    GradCall c;
    c.dx_shape = {2, 20};
    expect_invalid(c.run_it(), {"'X_grad' has shape [2, 20]"}, c.out);
  }
  {
    GradCall c;
    c.dbias = {1, 4};
    expect_invalid(c.run_it(), {"'bias_grad' has shape [1, 4], expected [4]"}, c.out);
  }
  {
    GradCall c;  // NHWC: C is the last dim, 5
    c.attrs.push_back({"channels_last", 1});
    expect_invalid(c.run_it(), {"'scale' has shape [4], expected [5]", "last dim of 'X'"}, c.out);
  }
  {
    GradCall c;
    c.attrs.push_back({"channels_last", 2});
    expect_invalid(c.run_it(), {"attribute 'channels_last' is 2"}, c.out);
  }
  {
    GradCall c;
    c.rank0 = true;
    expect_invalid(c.run_it(), {"'X' has rank 0"}, c.out);
  }
  {
    GradCall c;  // rank-1 X is one channel in either layout
    c.x_shape = c.dy_shape = c.dx_shape = {20};
    expect_invalid(c.run_it(), {"'scale' has shape [4], expected [1]", "rank-1 'X' has a single channel"}, c.out);
    c.scale = c.mean = c.var = c.dscale = c.dbias = {1};
    EXPECT_TRUE(c.run_it().is_ok());
  }
  {
    GradCall c;
    c.attrs.clear();
    expect_invalid(c.run_it(), {"required attribute 'epsilon' is missing"}, c.out);
  }
}

TEST(BatchNorm, ForwardValidation) {
  std::vector<float> in(200, 0.5f), out(200, 7.0f);
  auto call = [&](std::vector<int64_t> x_shape, std::vector<int64_t> ch_shape, std::vector<Attribute> attrs,
                  bool alias_wrong = false) {
    const TensorView x(in.data(), DType::f32, std::span<const int64_t>(x_shape));
    const TensorView v(in.data(), DType::f32, std::span<const int64_t>(ch_shape));
    const TensorView y(out.data(), DType::f32, std::span<const int64_t>(x_shape));
    const int64_t c4[] = {4};
    std::vector<float> mean(4, 0.0f), var(4, 1.0f);
    const TensorView im(mean.data(), DType::f32, c4), iv(var.data(), DType::f32, c4);
    const TensorView rm(alias_wrong ? var.data() : out.data() + 100, DType::f32, c4),
        rv(out.data() + 110, DType::f32, c4);
    const TensorView* ins[] = {&x, &v, &v, &im, &iv};
    const TensorView* outs[] = {&y, &rm, &rv};
    return run("BatchNormInternal", ins, outs, attrs);
  };
  EXPECT_TRUE(call({2, 4, 3}, {4}, {}).is_ok());
  std::fill(out.begin(), out.end(), 7.0f);
  expect_invalid(call({2, 4, 3}, {4}, {{"training_mode", 0}}), {"attribute 'training_mode' is 0, expected 1"}, out);
  expect_invalid(call({2, 4, 3}, {4}, {{"epsilon", -1}}), {"attribute 'epsilon' is -1"}, out);
  expect_invalid(call({2, 4, 3}, {3}, {}), {"BatchNormInternal: 'scale' has shape [3], expected [4]"}, out);
  expect_invalid(call({2, 3, 4}, {4}, {}), {"'scale' has shape [4], expected [3]"}, out);
  expect_invalid(call({2, 4, 3}, {4}, {}, true), {"output 'running_mean' overlaps input 'input_var'"}, out);
  EXPECT_TRUE(call({2, 3, 4}, {4}, {{"channels_last", 1}}).is_ok());
}

// ---- the oracle against finite differences of its own forward ---------------------------------

// With Y = BatchNormInternal(X) (statistics of the batch itself) and L = Σ dY·Y, the gradient op's
// X_grad, scale_grad and bias_grad must be dL/dX, dL/dscale and dL/dB, in both layouts.
TEST(BatchNorm, OracleGradientMatchesFiniteDifferences) {
  const std::vector<int64_t> shape = {3, 2, 5};
  for (bool last : {false, true}) {
    const oracle::Attrs fattrs = {{"epsilon", 1e-3}, {"momentum", 0.9}, {"training_mode", 1},
                                  {"channels_last", last ? 1.0 : 0.0}};
    const oracle::Attrs gattrs = {{"epsilon", 1e-3}, {"channels_last", last ? 1.0 : 0.0}};
    const std::vector<DType> f64(5, DType::f64);
    oracle::Rng rng(5);
    oracle::Tensors fin = oracle::make_inputs("BatchNormInternal", shape, fattrs, f64, rng);
    const oracle::Tensors gin0 = oracle::make_inputs("BatchNormalizationGrad", shape, gattrs, f64, rng);
    const oracle::Tensor dy = *gin0[0];
    const oracle::Tensors fout = oracle::reference("BatchNormInternal", fin, fattrs);
    const oracle::Tensors gout =
        oracle::reference("BatchNormalizationGrad", {dy, fin[0], fin[1], fout[3], fout[4]}, gattrs);
    auto loss = [&](const oracle::Tensors& at) {
      const oracle::Tensor y = *oracle::reference("BatchNormInternal", at, fattrs)[0];
      long double l = 0;
      for (std::size_t e = 0; e < y.v.size(); ++e) l += static_cast<long double>(dy.v[e]) * y.v[e];
      return static_cast<double>(l);
    };
    const double h = 1e-6;
    auto fd = [&](int input, std::size_t e) {
      oracle::Tensors plus = fin, minus = fin;
      plus[input]->v[e] += h;
      minus[input]->v[e] -= h;
      return (loss(plus) - loss(minus)) / (2 * h);
    };
    for (std::size_t e = 0; e < fin[0]->v.size(); ++e) EXPECT_NEAR(gout[0]->v[e], fd(0, e), 1e-6) << "X_grad " << e;
    for (std::size_t ch = 0; ch < fin[1]->v.size(); ++ch) {
      EXPECT_NEAR(gout[1]->v[ch], fd(1, ch), 1e-6) << "scale_grad " << ch;
      EXPECT_NEAR(gout[2]->v[ch], fd(2, ch), 1e-6) << "bias_grad " << ch;
    }
  }
}

}  // namespace
}  // namespace gradops::check
