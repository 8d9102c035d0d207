// The BatchNorm split (gradops' own BatchNormStatsReduce/Apply, BatchNormGradReduce/Apply) against
// the float64 oracle over every signature, both layouts and the edge shapes; reduce + apply against
// the fused op bit for bit, at several thread counts; a batch cut in two along N, its halves' sums
// added as an all-reduce would, against the fused op on the whole batch; the validation of `sums`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "batch_norm_common.hpp"
#include "harness/checker.hpp"

namespace gradops::check {
namespace {

constexpr OpId kSplitOps[] = {OpId::BatchNormStatsReduce, OpId::BatchNormStatsApply, OpId::BatchNormGradReduce,
                              OpId::BatchNormGradApply};

Problem split_problem(OpId id, const TypeSignature& sig, const std::vector<int64_t>& shape, bool last,
                      uint64_t seed) {
  Problem p;
  p.op = id;
  p.sig = sig;
  p.shape = shape;
  p.attrs = {{"channels_last", last ? 1.0 : 0.0}};
  p.seed = seed;
  return p;
}

// Ranks 1 to 4; Mc = 0, 1 and 2; C = 1; both traversals (NCHW short runs and planes, NHWC rows)
// and their chunk boundaries; one long channel.
std::vector<std::vector<int64_t>> split_sweep() {
  return {{0},       {1},        {7},        {3, 0},     {0, 3},       {1, 5},      {2, 3},     {13, 7},
          {2, 3, 5}, {4, 3, 63}, {3, 2, 65}, {2, 3, 5, 7}, {1, 3, 1031}, {129, 5}, {257, 3, 3}, {2, 2049, 3},
          {1, 1, 262147}};
}

TEST(BatchNormSplit, EveryOpSignatureLayoutShape) {
  uint64_t seed = 100;
  for (OpId id : kSplitOps)
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (bool last : {false, true})
        for (const auto& shape : split_sweep()) {
          Problem p = split_problem(id, sig, shape, last, seed++);
          p.misaligned = seed % 2 == 0;
          const Report r = run_case(p);
          ASSERT_TRUE(r.pass) << describe(p) << ": " << r.detail;
        }
}

TEST(BatchNormSplit, OptionalOutputsCanBeOmitted) {
  for (int mask = 1; mask < 16; ++mask) {
    Problem p = split_problem(OpId::BatchNormStatsApply, {{DType::f16, DType::f16, DType::f32, DType::f64}}, {4, 3, 70},
                              mask % 2 == 0, 5);
    p.skip_output = {false, (mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0, (mask & 8) != 0};
    const Report r = run_case(p);
    ASSERT_TRUE(r.pass) << describe(p) << " mask " << mask << ": " << r.detail;
  }
  for (int mask = 1; mask < 4; ++mask) {
    Problem p = split_problem(OpId::BatchNormGradApply, {{DType::f32, DType::f32, DType::f32, DType::f64}}, {4, 3, 5},
                              mask == 2, 3);
    p.skip_output = {false, (mask & 1) != 0, (mask & 2) != 0};
    const Report r = run_case(p);
    ASSERT_TRUE(r.pass) << describe(p) << " mask " << mask << ": " << r.detail;
  }
}

// ---- calls by hand ------------------------------------------------------------------------------

// The tensors of one fused call and its halves, from the oracle's inputs for the fused op.
struct Batch {
  bool grad;
  TypeSignature sig;  // the fused op's (T, T1, T2)
  std::vector<int64_t> shape;
  bool last;
  int64_t c;
  std::vector<HostTensor> in;  // the fused op's inputs
};

Batch make_batch(bool grad, const TypeSignature& sig, const std::vector<int64_t>& shape, bool last, uint64_t seed) {
  const OpId id = grad ? OpId::BatchNormalizationGrad : OpId::BatchNormInternal;
  Problem p;
  p.op = id;
  p.sig = sig;
  p.shape = shape;
  p.attrs = {{"channels_last", last ? 1.0 : 0.0}};
  if (grad) p.attrs["epsilon"] = 1e-5;
  oracle::Rng rng(seed);
  std::vector<DType> types;
  for (int i = 0; i < 5; ++i) types.push_back(input_dtype(p, i));
  const oracle::Tensors t = oracle::make_inputs(op_schema(id).name, shape, full_attrs(p), types, rng);
  Batch b{grad, sig, shape, last, shape.size() < 2 ? 1 : last ? shape.back() : shape[1], {}};
  for (int i = 0; i < 5; ++i) b.in.emplace_back(types[i], *t[i]);
  return b;
}

Status call(OpId id, std::vector<HostTensor*> in, std::vector<HostTensor*> out, std::vector<Attribute> attrs, int threads) {
  std::vector<TensorView> iv, ov;
  for (HostTensor* s : in) iv.push_back(s->view());
  for (HostTensor* s : out) ov.push_back(s->view());
  std::vector<const TensorView*> ip, op;
  for (auto& v : iv) ip.push_back(&v);
  for (auto& v : ov) op.push_back(&v);
  Context ctx;
  ctx.num_threads = threads;
  return run(op_schema(id).name, ip, op, attrs, ctx);
}

// Outputs of the fused op or of its apply half: the X-shaped one, then the per-channel ones.
std::vector<HostTensor> outputs_for(const Batch& b, const std::vector<int64_t>& shape) {
  std::vector<HostTensor> o;
  o.emplace_back(b.sig.types[0], shape);
  const int channel_outs = b.grad ? 2 : 4;
  for (int i = 0; i < channel_outs; ++i) o.emplace_back(b.sig.types[b.grad ? 1 : 2], std::vector<int64_t>{b.c});
  return o;
}
std::vector<HostTensor*> ptrs(std::vector<HostTensor>& v) {
  std::vector<HostTensor*> r;
  for (HostTensor& s : v) r.push_back(&s);
  return r;
}

std::vector<Attribute> fused_attrs(const Batch& b) {
  if (b.grad) return {{"epsilon", 1e-5}, {"channels_last", b.last ? 1.0 : 0.0}};
  return {{"epsilon", 1e-3}, {"momentum", 0.75}, {"channels_last", b.last ? 1.0 : 0.0}};
}
std::vector<Attribute> apply_attrs(const Batch& b) {
  if (b.grad) return {{"channels_last", b.last ? 1.0 : 0.0}};
  return fused_attrs(b);
}

// The reduce half on (part of) the batch: `in` are the fused op's inputs for that part.
HostTensor reduce(const Batch& b, std::vector<HostTensor>& in, int threads) {
  HostTensor sums(DType::f64, std::vector<int64_t>{2 * b.c + 1});
  for (int64_t i = 0; i < 2 * b.c + 1; ++i) sums.set(i, std::nan(""));  // poisoned
  const std::vector<Attribute> at = {{"channels_last", b.last ? 1.0 : 0.0}};
  const Status s = b.grad ? call(OpId::BatchNormGradReduce, {&in[0], &in[1], &in[3], &in[4]}, {&sums}, at, threads)
                          : call(OpId::BatchNormStatsReduce, {&in[0], &in[3]}, {&sums}, at, threads);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return sums;
}
// The apply half on (part of) the batch with the given sums.
std::vector<HostTensor> apply(const Batch& b, std::vector<HostTensor>& in, HostTensor& sums, const std::vector<int64_t>& shape,
                          int threads) {
  std::vector<HostTensor> out = outputs_for(b, shape);
  std::vector<HostTensor*> ip = ptrs(in);
  ip.push_back(&sums);
  const Status s = call(b.grad ? OpId::BatchNormGradApply : OpId::BatchNormStatsApply, ip, ptrs(out), apply_attrs(b),
                        threads);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}
std::vector<HostTensor> fused(const Batch& b, std::vector<HostTensor>& in, int threads) {
  std::vector<HostTensor> out = outputs_for(b, b.shape);
  const Status s = call(b.grad ? OpId::BatchNormalizationGrad : OpId::BatchNormInternal, ptrs(in), ptrs(out),
                        fused_attrs(b), threads);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}

std::string what(const Batch& b, int threads) {
  std::string s = std::string(b.grad ? "grad" : "forward") + " (" + dtype_name(b.sig.types[0]) + "," +
                  dtype_name(b.sig.types[1]) + "," + dtype_name(b.sig.types[2]) + ") [";
  for (std::size_t i = 0; i < b.shape.size(); ++i) s += (i ? "," : "") + std::to_string(b.shape[i]);
  return s + "]" + (b.last ? " NHWC" : " NCHW") + " threads " + std::to_string(threads);
}

// Shapes through every path of the CPU kernel: NCHW fused blocks (planes and short runs), NCHW
// with few channels (passes one after the other), NHWC narrow and wide rows, one long channel,
// Mc = 1 and Mc = 0.
struct Shape {
  std::vector<int64_t> shape;
  bool last;
};
const Shape kPaths[] = {{{4, 16, 1500}, false}, {{50, 24, 9}, false}, {{3, 2, 3000}, false}, {{200, 7}, true},
                        {{40, 3, 900}, true},   {{1, 1, 70001}, false}, {{1, 5}, false},    {{0, 4, 3}, true}};

// One participant: reduce + apply is the fused op, bit for bit, for every signature, path and
// thread count.
TEST(BatchNormSplit, ReduceThenApplyIsTheFusedOpBitwise) {
  uint64_t seed = 7;
  for (bool grad : {true, false})
    for (const TypeSignature& sig : op_schema(OpId::BatchNormInternal).signatures)
      for (const Shape& sh : kPaths)
        for (int threads : {1, 2, 3}) {
          Batch b = make_batch(grad, sig, sh.shape, sh.last, seed++);
          std::vector<HostTensor> want = fused(b, b.in, threads);
          HostTensor sums = reduce(b, b.in, threads);
          EXPECT_EQ(sums.get(2 * b.c), static_cast<double>(count_of(b.shape) / std::max<int64_t>(b.c, 1)))
              << what(b, threads) << " count";
          std::vector<HostTensor> got = apply(b, b.in, sums, b.shape, threads);
          for (std::size_t o = 0; o < want.size(); ++o)
            EXPECT_TRUE(same_bits(want[o].values(), got[o].values())) << what(b, threads) << " output " << o;
        }
}

// The sums do not depend on the thread count either.
TEST(BatchNormSplit, SumsDoNotDependOnThreadCount) {
  for (bool grad : {true, false})
    for (const Shape& sh : kPaths) {
      Batch b = make_batch(grad, {{DType::f32, DType::f32, DType::f32}}, sh.shape, sh.last, 17);
      const std::vector<double> one = reduce(b, b.in, 1).values();
      for (int threads : {2, 4}) EXPECT_TRUE(same_bits(one, reduce(b, b.in, threads).values())) << what(b, threads);
    }
}

// Rows [r0, r1) of dim 0 of a stored tensor.
HostTensor rows_of(const HostTensor& s, int64_t r0, int64_t r1) {
  std::vector<int64_t> shape = s.shape;
  const int64_t per = shape[0] ? count_of(shape) / shape[0] : 0;
  shape[0] = r1 - r0;
  HostTensor out(s.dtype, shape);
  for (int64_t i = 0; i < (r1 - r0) * per; ++i) out.set(i, s.get(r0 * per + i));
  return out;
}

// Two participants: the batch cut along N, each half reduced, the sums added (the all-reduce), each
// half applied with the total. Within the fused op's tolerance of the whole batch's fused result
// (the halves sum in another order); the channel outputs are the same on both halves, bitwise.
TEST(BatchNormSplit, HalvesWithSummedSumsMatchTheWholeBatch) {
  uint64_t seed = 50;
  const Shape shapes[] = {{{6, 5, 37}, false}, {{8, 16, 1500}, false}, {{9, 4, 7}, true}, {{2, 3, 2000}, false},
                          {{5, 3}, false},     {{2, 1}, false},        {{3, 2, 5}, true}};
  for (bool grad : {true, false})
    for (const TypeSignature& sig : op_schema(OpId::BatchNormInternal).signatures)
      for (const Shape& sh : shapes) {
        Batch b = make_batch(grad, sig, sh.shape, sh.last, seed++);
        const int64_t n = b.shape[0], cut = n / 2;
        std::vector<HostTensor> want = fused(b, b.in, 2);
        // Each participant holds its rows of X (and dY) and the shared per-channel tensors.
        std::vector<HostTensor> part[2];
        for (int h = 0; h < 2; ++h)
          for (std::size_t i = 0; i < b.in.size(); ++i) {
            const bool batched = static_cast<int>(i) < (grad ? 2 : 1);
            part[h].push_back(batched ? rows_of(b.in[i], h ? cut : 0, h ? n : cut) : b.in[i]);
          }
        HostTensor s0 = reduce(b, part[0], 2), s1 = reduce(b, part[1], 1);
        HostTensor total(DType::f64, s0.shape);
        for (int64_t i = 0; i < 2 * b.c + 1; ++i) total.set(i, s0.get(i) + s1.get(i));
        ASSERT_EQ(total.get(2 * b.c), static_cast<double>(n * (count_of(b.shape) / n / b.c))) << what(b, 2);
        std::vector<int64_t> sh0 = b.shape, sh1 = b.shape;
        sh0[0] = cut, sh1[0] = n - cut;
        std::vector<HostTensor> o0 = apply(b, part[0], total, sh0, 2), o1 = apply(b, part[1], total, sh1, 1);

        Problem p;
        p.op = grad ? OpId::BatchNormalizationGrad : OpId::BatchNormInternal;
        p.sig = sig;
        p.shape = b.shape;
        p.attrs = {{"channels_last", b.last ? 1.0 : 0.0}, {"epsilon", grad ? 1e-5 : 1e-3}, {"momentum", 0.75}};
        if (grad) p.attrs.erase("momentum");
        for (std::size_t o = 0; o < want.size(); ++o) {
          // Each side is within the tolerance of the exact value, so they are within twice it.
          const Tolerance tol = tolerance(p, static_cast<int>(o));
          std::vector<double> got = o0[o].values();
          if (o == 0) {
            const std::vector<double> g1 = o1[o].values();
            got.insert(got.end(), g1.begin(), g1.end());
          } else {
            EXPECT_TRUE(same_bits(o0[o].values(), o1[o].values())) << what(b, 2) << " output " << o;
          }
          const std::vector<double> w = want[o].values();
          ASSERT_EQ(w.size(), got.size());
          for (std::size_t e = 0; e < w.size(); ++e) {
            if (std::isnan(w[e]) || std::isnan(got[e])) {
              EXPECT_TRUE(std::isnan(w[e]) && std::isnan(got[e])) << what(b, 2) << " output " << o << "[" << e << "]";
              continue;
            }
            ASSERT_NEAR(w[e], got[e], 2 * (tol.abs + tol.rel * std::fabs(w[e])))
                << what(b, 2) << " output " << o << "[" << e << "]";
          }
        }
      }
}

// Where the cut falls on a boundary of the fixed summation tree (two samples, NCHW, each run one
// piece: spatial <= 2,048 values, a piece being kChain * 4 vectors, 2,048 values or more but for
// f64 on SSE4 and the portable target), the forward's sums about K add in the same order on one
// call as on two, so every output of BatchNormInternal is the same bits.
TEST(BatchNormSplit, HalvesAtATreeBoundaryAreBitwiseForTheForward) {
  for (const TypeSignature& sig : op_schema(OpId::BatchNormInternal).signatures)
    for (int64_t spatial : {1024, 2048}) {
      Batch b = make_batch(false, sig, {2, 6, spatial}, false, 90);
      std::vector<HostTensor> want = fused(b, b.in, 1);
      std::vector<HostTensor> part[2];
      for (int h = 0; h < 2; ++h)
        for (std::size_t i = 0; i < b.in.size(); ++i) part[h].push_back(i == 0 ? rows_of(b.in[0], h, h + 1) : b.in[i]);
      HostTensor s0 = reduce(b, part[0], 1), s1 = reduce(b, part[1], 1);
      HostTensor total(DType::f64, s0.shape);
      for (int64_t i = 0; i < 2 * b.c + 1; ++i) total.set(i, s0.get(i) + s1.get(i));
      std::vector<int64_t> one = b.shape;
      one[0] = 1;
      std::vector<HostTensor> o0 = apply(b, part[0], total, one, 1), o1 = apply(b, part[1], total, one, 1);
      std::vector<double> y = o0[0].values(), y1 = o1[0].values();
      y.insert(y.end(), y1.begin(), y1.end());
      EXPECT_TRUE(same_bits(want[0].values(), y)) << what(b, 1) << " Y";
      for (std::size_t o = 1; o < want.size(); ++o)
        EXPECT_TRUE(same_bits(want[o].values(), o0[o].values())) << what(b, 1) << " output " << o;
    }
}

// An empty participant (N = 0) still reduces (zeros, count 0) and applies with the global sums,
// getting the global statistics and parameter gradients.
TEST(BatchNormSplit, AnEmptyParticipantGetsTheGlobalResults) {
  for (bool grad : {true, false}) {
    Batch b = make_batch(grad, {{DType::f32, DType::f32, DType::f32}}, {4, 3, 5}, false, 61);
    std::vector<HostTensor> want = fused(b, b.in, 1);
    std::vector<HostTensor> empty;
    for (std::size_t i = 0; i < b.in.size(); ++i)
      empty.push_back(static_cast<int>(i) < (grad ? 2 : 1) ? rows_of(b.in[i], 0, 0) : b.in[i]);
    HostTensor s_empty = reduce(b, empty, 1), s_all = reduce(b, b.in, 1);
    for (int64_t i = 0; i < 2 * b.c + 1; ++i) EXPECT_EQ(s_empty.get(i), 0.0) << i;
    HostTensor total(DType::f64, s_all.shape);
    for (int64_t i = 0; i < 2 * b.c + 1; ++i) total.set(i, s_all.get(i) + s_empty.get(i));
    std::vector<int64_t> none = b.shape;
    none[0] = 0;
    std::vector<HostTensor> got = apply(b, empty, total, none, 1);
    for (std::size_t o = 1; o < want.size(); ++o)
      EXPECT_TRUE(same_bits(want[o].values(), got[o].values())) << (grad ? "grad" : "forward") << " output " << o;
  }
}

// A data-parallel SyncBatchNorm keeps its running statistics in step on every participant, so
// input_mean (the forward's shift) may differ from the batch mean by any amount: f32 data at
// 1000 ± 1 with K = 0 still gives the variance to f32 accuracy through the f64 sums.
TEST(BatchNormSplit, ShiftFarFromTheMean) {
  const int64_t n = 64, c = 2, s = 50;
  HostTensor x(DType::f32, std::vector<int64_t>{n, c, s}), k(DType::f32, std::vector<int64_t>{c});
  oracle::Rng rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < count_of(x.shape); ++i) x.set(i, static_cast<float>(1000 + u(rng)));
  k.set(0, 0), k.set(1, 0);
  HostTensor sums(DType::f64, std::vector<int64_t>{2 * c + 1});
  ASSERT_TRUE(call(OpId::BatchNormStatsReduce, {&x, &k}, {&sums}, {}, 2).is_ok());
  for (int64_t ch = 0; ch < c; ++ch) {
    long double mean = 0, m2 = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) mean += x.get((i * c + ch) * s + j);
    mean /= n * s;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < s; ++j) m2 += (x.get((i * c + ch) * s + j) - mean) * (x.get((i * c + ch) * s + j) - mean);
    const double m = static_cast<double>(n * s), d = sums.get(ch) / m;
    const double var = (sums.get(c + ch) - sums.get(ch) * d) / m;
    EXPECT_NEAR(var, static_cast<double>(m2 / m), 1e-6 * static_cast<double>(m2 / m)) << ch;
    EXPECT_NEAR(d, static_cast<double>(mean), 1e-9) << ch;
  }
}

// ---- validation ---------------------------------------------------------------------------------

TEST(BatchNormSplit, SumsOfTheWrongShapeAreRejectedAndNothingIsWritten) {
  Batch b = make_batch(true, {{DType::f32, DType::f32, DType::f32}}, {2, 4, 5}, false, 3);
  HostTensor bad_sums(DType::f64, std::vector<int64_t>{8});  // 2·C + 1 = 9
  std::vector<HostTensor> out = outputs_for(b, b.shape);
  for (HostTensor& o : out)
    for (int64_t i = 0; i < count_of(o.shape); ++i) o.set(i, 7);
  std::vector<HostTensor*> ip = ptrs(b.in);
  ip.push_back(&bad_sums);
  const Status s = call(OpId::BatchNormGradApply, ip, ptrs(out), {}, 1);
  ASSERT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("BatchNormGradApply"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'sums' has shape [8], expected [9]"), std::string::npos) << s.message();
  for (HostTensor& o : out)
    for (double v : o.values()) ASSERT_EQ(v, 7);

  HostTensor sums_out(DType::f64, std::vector<int64_t>{4, 2});
  for (int64_t i = 0; i < 8; ++i) sums_out.set(i, 7);
  const Status r = call(OpId::BatchNormStatsReduce, {&b.in[1], &b.in[3]}, {&sums_out}, {}, 1);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("BatchNormStatsReduce"), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("'sums' has shape [4, 2], expected [9]"), std::string::npos) << r.message();
  for (double v : sums_out.values()) ASSERT_EQ(v, 7);

  // The sums are f64 for every T: f32 sums are no signature.
  HostTensor f32_sums(DType::f32, std::vector<int64_t>{9});
  const Status t = call(OpId::BatchNormStatsReduce, {&b.in[1], &b.in[3]}, {&f32_sums}, {}, 1);
  ASSERT_FALSE(t.is_ok());
  EXPECT_NE(t.message().find("BatchNormStatsReduce"), std::string::npos) << t.message();
  EXPECT_NE(t.message().find("sums"), std::string::npos) << t.message();
}

TEST(BatchNormSplit, SchemaIsGradopsOwn) {
  for (OpId id : kSplitOps) {
    const OpSchema& s = op_schema(id);
    SCOPED_TRACE(std::string(s.name));
    EXPECT_EQ(s.origin, OpOrigin::gradops);
    EXPECT_EQ(s.domain, "gradops");
    EXPECT_EQ(s.family, OpFamily::batch_norm);
    EXPECT_FALSE(s.gradient);
    EXPECT_EQ(find_op(s.name), &s);
    EXPECT_TRUE(supports(id, DeviceType::cpu));
    const bool reduce_half = id == OpId::BatchNormStatsReduce || id == OpId::BatchNormGradReduce;
    EXPECT_EQ(s.signatures.size(), reduce_half ? 6u : 7u);
    for (const TypeSignature& sig : s.signatures) EXPECT_EQ(sig.types[s.type_vars.size() - 1], DType::f64);
  }
}

}  // namespace
}  // namespace gradops::check
