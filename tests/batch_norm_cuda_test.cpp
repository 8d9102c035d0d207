// The BatchNorm family on CUDA against the float64 oracle and the CPU implementation: both ops and
// the four halves of their split, every signature, both layouts; reduce + apply against the fused
// op bit for bit, and a batch cut in two with its halves' sums added; ranks 1 to 5, C = 1 to
// 8192, each kernel (runs and columns, 16-byte packs and single elements); empty and one-value
// batches; sums near the f16 maximum; misaligned bases (and pointers off their element size,
// declined with a reason); a tensor of more than 2^31 elements in each layout; bitwise
// repeatability; the caller's stream; kernels holding multiprocessors beside the fused ops.
// Every test reports SKIPPED where no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda_blocker.hpp"
#include "cuda_support.hpp"
#include "gradops/ops.hpp"

namespace gradops::check {
namespace {

class BatchNormCuda : public Cuda {};

constexpr OpId kOps[] = {OpId::BatchNormalizationGrad, OpId::BatchNormInternal};

Problem bn_problem(OpId id, const TypeSignature& sig, const std::vector<int64_t>& shape, bool channels_last,
                   uint64_t seed) {
  Problem p;
  p.op = id;
  p.sig = sig;
  p.shape = shape;
  p.attrs = {{"channels_last", channels_last ? 1.0 : 0.0}};
  if (id == OpId::BatchNormalizationGrad) p.attrs["epsilon"] = 1e-5;
  p.seed = seed;
  p.device = Device::cuda();
  return p;
}

std::string impl_of(const Problem& p) {
  Case c(p);
  std::string name;
  const Status s = c.implementation(&name);
  return s.is_ok() ? name : s.to_string();
}

// Ranks 1 to 5; Mc = 0, 1, 2; C = 1, primes, and around the 32-unit channel tile; NCHW runs of
// 1 (the columns walk), of whole 16-byte packs, of 8-byte packs only (14x14 in 16 bits) and neither;
// NHWC rows of whole packs and not.
std::vector<std::vector<int64_t>> sweep() {
  return {{0},          {1},          {7},           {3, 0},        {2, 0, 5},    {1, 5},        {5, 1},
          {2, 3},       {13, 7},      {3, 5, 1},     {2, 3, 5},     {4, 3, 64},   {2, 3, 65},    {2, 3, 5, 7},
          {2, 3, 2, 3, 5}, {1, 1, 1, 1, 1}, {1, 3, 1031}, {4, 16, 8, 8}, {3, 40, 7, 7}, {129, 5}, {2, 1, 4099},
          {257, 8},     {600, 128},   {5, 2, 419},   {4, 130, 3},   {3, 4099},     {3, 5, 14, 14}, {2, 3, 6}};
}

TEST_F(BatchNormCuda, EveryOpSignatureLayoutShape) {
  uint64_t seed = 1;
  for (OpId id : kOps)
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (bool last : {false, true})
        for (const auto& shape : sweep())
          for (bool misaligned : {false, true}) {
            Problem p = bn_problem(id, sig, shape, last, seed++);
            p.misaligned = misaligned;
            EXPECT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));  // every case reports, not only the first
          }
}

// ResNet-50's layer shapes, scaled down in N; C up to 8192; channels too long to hold on chip.
TEST_F(BatchNormCuda, NetworkShapesAndManyChannels) {
  const std::vector<int64_t> shapes[] = {{4, 64, 56, 56}, {4, 256, 14, 14}, {8, 2048, 7, 7},
                                         {2, 8192, 3, 3}, {3, 8192},        {2, 96, 3, 5, 7},
                                         {4, 2, 400, 400}};
  const TypeSignature sigs[] = {{{DType::f32, DType::f32, DType::f32}},
                                {{DType::bf16, DType::bf16, DType::f32}},
                                {{DType::f16, DType::f32, DType::f32}},
                                {{DType::f64, DType::f64, DType::f64}}};
  uint64_t seed = 3000;
  for (OpId id : kOps)
    for (const TypeSignature& sig : sigs)
      for (bool last : {false, true})
        for (const auto& shape : shapes) {
          Problem p = bn_problem(id, sig, shape, last, seed++);
          ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
        }
}

// Which kernel takes which tensors, so that the sweeps above cover each of them.
TEST_F(BatchNormCuda, KernelPerLayoutAndAlignment) {
  struct Expect {
    std::vector<int64_t> shape;
    bool last, misaligned;
    const char* impl;
  };
  const Expect cases[] = {
      {{2, 16, 8, 8}, false, false, "cuda:runs_vec16"},  {{2, 16, 7, 7}, false, false, "cuda:runs"},
      {{2, 16, 8, 8}, false, true, "cuda:runs"},         {{2, 8, 8, 16}, true, false, "cuda:columns_vec16"},
      {{2, 8, 8, 15}, true, false, "cuda:columns"},      {{2, 8, 8, 16}, true, true, "cuda:columns"},
      {{64, 32}, false, false, "cuda:columns_vec16"},    {{4096}, false, false, "cuda:runs_vec16"},
      {{64, 1}, true, false, "cuda:runs_vec16"},  {{2, 16, 7, 2}, false, false, "cuda:runs_vec8"},
  };
  for (OpId id : kOps)
    for (const Expect& e : cases) {
      Problem p = bn_problem(id, {{DType::f32, DType::f32, DType::f32}}, e.shape, e.last, 1);
      p.misaligned = e.misaligned;
      EXPECT_EQ(impl_of(p), e.impl) << describe(p);
    }
  // 16-bit runs of 8-byte packs (ResNet's 14x14) and f64 runs, which have no 8-byte kernel.
  for (OpId id : kOps) {
    EXPECT_EQ(impl_of(bn_problem(id, {{DType::bf16, DType::bf16, DType::f32}}, {2, 16, 14, 14}, false, 1)),
              "cuda:runs_vec8");
    EXPECT_EQ(impl_of(bn_problem(id, {{DType::f64, DType::f64, DType::f64}}, {2, 16, 7, 1}, false, 1)), "cuda:runs");
  }
}

// A pointer off its element size: every CUDA row declines, and the status says why.
TEST_F(BatchNormCuda, PointersOffTheirElementSizeAreDeclined) {
  for (OpId id : kOps) {
    Problem p = bn_problem(id, {{DType::f32, DType::f32, DType::f32}}, {2, 3, 5}, false, 1);
    p.misalign_bytes = 1;
    const Report r = run_case(p);
    EXPECT_EQ(r.status.code(), StatusCode::unimplemented) << r.status.to_string();
    EXPECT_NE(r.status.to_string().find("not aligned to its element size"), std::string::npos) << r.status.to_string();
  }
}

// Optional outputs left out.
TEST_F(BatchNormCuda, OptionalOutputsCanBeOmitted) {
  for (bool last : {false, true}) {
    for (int mask = 1; mask < 4; ++mask) {
      Problem p = bn_problem(OpId::BatchNormalizationGrad, {{DType::f32, DType::f32, DType::f32}}, {4, 3, 64}, last, 3);
      p.skip_output = {false, (mask & 1) != 0, (mask & 2) != 0};
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << describe(p) << " mask " << mask << ": " << r.detail;
    }
    for (int mask = 1; mask < 16; ++mask) {
      Problem p = bn_problem(OpId::BatchNormInternal, {{DType::f16, DType::f16, DType::f32}}, {4, 3, 72}, last, 5);
      p.skip_output = {false, (mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0, (mask & 8) != 0};
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << describe(p) << " mask " << mask << ": " << r.detail;
    }
  }
}

// f16 sums near the format's maximum: dbias = Σ dY = 64000 (f16 holds 65504) with every partial
// in f32, and a forward whose values sit near 60000 (the mean close to the maximum, the variance
// from the shifted sums).
TEST_F(BatchNormCuda, SumsNearTheF16Maximum) {
  const TypeSignature sig{{DType::f16, DType::f16, DType::f16}};
  for (bool last : {false, true}) {
    Problem g = bn_problem(OpId::BatchNormalizationGrad, sig, {40, 2, 100}, last, 11);
    g.edit_inputs = [](oracle::Tensors& in) {
      for (double& v : in[0]->v) v = 16;  // dY: 4000 values a channel
    };
    ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(g));
    Problem f = bn_problem(OpId::BatchNormInternal, sig, {40, 2, 100}, last, 12);
    f.edit_inputs = [](oracle::Tensors& in) {
      int k = 0;
      for (double& v : in[0]->v) v = 59968 + 32 * (k++ % 3);
    };
    ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(f));
  }
}

// Every output has the same bits on every run.
TEST_F(BatchNormCuda, RepeatedRunsAreBitwiseIdentical) {
  const std::vector<int64_t> shapes[] = {{32, 64, 28, 28}, {32, 512, 7, 7}, {3, 1, 100003}, {7, 300, 5}};
  for (OpId id : kOps)
    for (bool last : {false, true})
      for (const auto& shape : shapes) {
        Problem p = bn_problem(id, {{DType::f32, DType::f32, DType::f32}}, shape, last, 77);
        ASSERT_NO_FATAL_FAILURE(check_same_bits_every_run(p));
      }
}

// Work is ordered on the caller's stream: a stream of its own, with a kernel-length copy queued
// ahead on it, and no device-wide synchronization by the library.
TEST_F(BatchNormCuda, RunsOnTheCallersStream) {
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  DeviceBuffer a(256 << 20), b(256 << 20);
  ASSERT_TRUE(a.base && b.base);
  // The copy's source is written first, on the same stream: no read of unwritten memory (initcheck).
  ASSERT_EQ(cudaMemsetAsync(a.base, 0, 256 << 20, stream), cudaSuccess);
  for (OpId id : kOps)
    for (bool last : {false, true}) {
      ASSERT_EQ(cudaMemcpyAsync(b.base, a.base, 256 << 20, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
      Problem p = bn_problem(id, {{DType::bf16, DType::bf16, DType::f32}}, {16, 96, 20, 20}, last, 21);
      p.cuda_stream = stream;
      const Report r = run_case(p);
      ASSERT_TRUE(r.status.is_ok()) << r.status.to_string();
      ASSERT_TRUE(r.pass) << r.detail;
    }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// ---- the split: BatchNormStatsReduce/Apply, BatchNormGradReduce/Apply ----------------------------

constexpr OpId kSplitOps[] = {OpId::BatchNormStatsReduce, OpId::BatchNormStatsApply, OpId::BatchNormGradReduce,
                              OpId::BatchNormGradApply};

TEST_F(BatchNormCuda, SplitOpsMatchOracleAndCpu) {
  const std::vector<int64_t> shapes[] = {{0},       {7},        {3, 0},       {1, 5},         {13, 7},
                                         {4, 3, 64}, {2, 3, 65}, {3, 5, 14, 14}, {2, 3, 5, 7}, {1, 1, 4099},
                                         {129, 5},  {600, 128}, {4, 40, 7, 7}};
  uint64_t seed = 6000;
  for (OpId id : kSplitOps)
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (bool last : {false, true})
        for (const auto& shape : shapes) {
          Problem p = bn_problem(id, sig, shape, last, seed++);
          p.attrs.erase("epsilon");
          p.misaligned = seed % 3 == 0;
          ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
        }
}

// A device tensor from host values (or poisoned with NaN where none are given).
struct Dev {
  DType t;
  std::vector<int64_t> shape;
  std::unique_ptr<DeviceBuffer> buf;
  Dev(DType type, std::vector<int64_t> s, const std::vector<double>* values = nullptr)
      : t(type), shape(std::move(s)), buf(std::make_unique<DeviceBuffer>(bytes() + 16)) {
    std::vector<std::byte> host(bytes());
    for (int64_t i = 0; i < count_of(shape); ++i)
      check::store(t, host.data() + i * dtype_size(t), values ? (*values)[static_cast<std::size_t>(i)] : std::nan(""));
    EXPECT_EQ(cudaMemcpy(buf->base, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::size_t bytes() const { return static_cast<std::size_t>(count_of(shape)) * dtype_size(t); }
  TensorView view() const { return TensorView(buf->base, t, std::span<const int64_t>(shape), Device::cuda()); }
  std::vector<double> values() const { return download(buf->base, t, 0, count_of(shape)); }
  std::vector<std::byte> raw() const {
    std::vector<std::byte> host(bytes());
    EXPECT_EQ(cudaMemcpy(host.data(), buf->base, host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }
};

// One batch of the fused op's inputs (the oracle's), on the host.
struct Batch {
  bool grad;
  TypeSignature sig;
  std::vector<int64_t> shape;
  bool last;
  int64_t c;
  std::vector<DType> types;
  std::vector<std::vector<double>> in;  // the fused op's five inputs
};

Batch make_batch(bool grad, const TypeSignature& sig, const std::vector<int64_t>& shape, bool last, uint64_t seed) {
  const OpId id = grad ? OpId::BatchNormalizationGrad : OpId::BatchNormInternal;
  Problem p = bn_problem(id, sig, shape, last, seed);
  oracle::Rng rng(seed);
  Batch b{grad, sig, shape, last, shape.size() < 2 ? 1 : last ? shape.back() : shape[1], {}, {}};
  for (int i = 0; i < 5; ++i) b.types.push_back(input_dtype(p, i));
  const oracle::Tensors t = oracle::make_inputs(op_schema(id).name, shape, full_attrs(p), b.types, rng);
  for (int i = 0; i < 5; ++i) b.in.push_back(t[static_cast<std::size_t>(i)]->v);
  return b;
}

// The inputs of rows [r0, r1) of dim 0 (whole samples; per-channel inputs whole).
std::vector<Dev> upload(const Batch& b, int64_t r0, int64_t r1) {
  std::vector<Dev> d;
  std::vector<int64_t> shape = b.shape;
  const int64_t per_row = shape.empty() || shape[0] == 0 ? 0 : count_of(shape) / shape[0];
  shape[0] = r1 - r0;
  const int xs = b.grad ? 2 : 1;  // dY and X (grad), X (forward): X-shaped inputs first
  for (int i = 0; i < 5; ++i) {
    if (i < xs) {
      const std::vector<double> part(b.in[i].begin() + r0 * per_row, b.in[i].begin() + r1 * per_row);
      d.emplace_back(b.types[i], shape, &part);
    } else {
      d.emplace_back(b.types[i], std::vector<int64_t>{b.c}, &b.in[i]);
    }
  }
  return d;
}
std::vector<Dev> outputs(const Batch& b, const std::vector<int64_t>& shape) {
  std::vector<Dev> o;
  o.emplace_back(b.sig.types[0], shape);
  for (int i = 0; i < (b.grad ? 2 : 4); ++i) o.emplace_back(b.sig.types[b.grad ? 1 : 2], std::vector<int64_t>{b.c});
  return o;
}
// Runs the op on ctx's stream without waiting for it.
Status launch_op(OpId id, const std::vector<const Dev*>& in, const std::vector<const Dev*>& out,
                 const std::vector<Attribute>& attrs, const Context& ctx = {}) {
  std::vector<TensorView> iv, ov;
  for (const Dev* d : in) iv.push_back(d->view());
  for (const Dev* d : out) ov.push_back(d->view());
  std::vector<const TensorView*> ip, op;
  for (auto& v : iv) ip.push_back(&v);
  for (auto& v : ov) op.push_back(&v);
  return run(op_schema(id).name, ip, op, attrs, ctx);
}
Status call(OpId id, const std::vector<const Dev*>& in, const std::vector<const Dev*>& out,
            std::vector<Attribute> attrs) {
  const Status s = launch_op(id, in, out, attrs);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return s;
}
std::vector<const Dev*> ptrs(const std::vector<Dev>& v) {
  std::vector<const Dev*> r;
  for (const Dev& d : v) r.push_back(&d);
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
std::vector<Dev> fused(const Batch& b, const std::vector<Dev>& in) {
  std::vector<Dev> out = outputs(b, b.shape);
  const Status s = call(b.grad ? OpId::BatchNormalizationGrad : OpId::BatchNormInternal, ptrs(in), ptrs(out),
                        fused_attrs(b));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}
Dev reduce(const Batch& b, const std::vector<Dev>& in) {
  Dev sums(DType::f64, std::vector<int64_t>{2 * b.c + 1});
  const std::vector<Attribute> at = {{"channels_last", b.last ? 1.0 : 0.0}};
  const Status s = b.grad ? call(OpId::BatchNormGradReduce, {&in[0], &in[1], &in[3], &in[4]}, {&sums}, at)
                          : call(OpId::BatchNormStatsReduce, {&in[0], &in[3]}, {&sums}, at);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return sums;
}
std::vector<Dev> apply(const Batch& b, const std::vector<Dev>& in, const Dev& sums, const std::vector<int64_t>& shape) {
  std::vector<Dev> out = outputs(b, shape);
  std::vector<const Dev*> ip = ptrs(in);
  ip.push_back(&sums);
  const Status s = call(b.grad ? OpId::BatchNormGradApply : OpId::BatchNormStatsApply, ip, ptrs(out), apply_attrs(b));
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  return out;
}
std::string what(const Batch& b) {
  std::string s = std::string(b.grad ? "grad" : "forward") + " (" + dtype_name(b.sig.types[0]) + "," +
                  dtype_name(b.sig.types[1]) + "," + dtype_name(b.sig.types[2]) + ") [";
  for (std::size_t i = 0; i < b.shape.size(); ++i) s += (i ? "," : "") + std::to_string(b.shape[i]);
  return s + "]" + (b.last ? " NHWC" : " NCHW");
}

// Shapes through every CUDA kernel: NCHW runs of 16-byte packs, of 8-byte packs (16-bit 14x14),
// of single elements; NHWC rows of packs and not; one channel; many groups; Mc = 1 and 0. The
// fused op holds a channel on chip (in plain blocks, in clusters of 2 and of 16) where it fits;
// the channels of [4, 2, 400, 400] do not fit a cluster at 32 bits, so its fused op runs the
// reduce, sums and apply kernels, as NHWC's ([400000, 8] among them) always does (in one tile of
// channels, and in several with a shorter last one: 1000 channels in packs, 1001 not).
struct Shape {
  std::vector<int64_t> shape;
  bool last;
};
const Shape kPaths[] = {{{8, 16, 32, 32}, false}, {{4, 24, 14, 14}, false}, {{6, 40, 7, 7}, false},
                        {{8, 14, 14, 64}, true},  {{50, 7, 7, 36}, true},   {{1, 1, 70001}, false},
                        {{20000, 8}, true},       {{1, 5}, false},          {{0, 4, 3}, true},
                        {{4, 2, 400, 400}, false}, {{400000, 8}, true},  {{3, 11, 1000}, true},
                        {{2, 9, 1001}, true}};

// One participant: reduce + apply on the GPU is the fused op there, bit for bit.
TEST_F(BatchNormCuda, ReduceThenApplyIsTheFusedOpBitwise) {
  uint64_t seed = 7000;
  for (bool grad : {true, false})
    for (const TypeSignature& sig : op_schema(OpId::BatchNormInternal).signatures)
      for (const Shape& sh : kPaths) {
        const Batch b = make_batch(grad, sig, sh.shape, sh.last, seed++);
        const std::vector<Dev> in = upload(b, 0, b.shape.empty() ? 0 : b.shape[0]);
        const std::vector<Dev> want = fused(b, in);
        const Dev sums = reduce(b, in);
        EXPECT_EQ(sums.values().back(), static_cast<double>(count_of(b.shape) / std::max<int64_t>(b.c, 1)))
            << what(b) << " count";
        const std::vector<Dev> got = apply(b, in, sums, b.shape);
        for (std::size_t o = 0; o < want.size(); ++o) EXPECT_EQ(want[o].raw(), got[o].raw()) << what(b) << " output " << o;
      }
}

// A batch cut in two along N: each half's sums on the GPU, added as an all-reduce would, then
// each half's apply with the total; every output matches the fused op on the whole batch (the
// per-channel ones from either half).
TEST_F(BatchNormCuda, HalvesWithSummedSumsMatchTheWholeBatch) {
  uint64_t seed = 8000;
  const Shape shapes[] = {{{8, 16, 32, 32}, false}, {{6, 40, 7, 7}, false}, {{8, 14, 14, 64}, true}, {{2000, 8}, true}};
  for (bool grad : {true, false})
    for (const TypeSignature& sig : {TypeSignature{{DType::f32, DType::f32, DType::f32}},
                                     TypeSignature{{DType::bf16, DType::bf16, DType::f32}},
                                     TypeSignature{{DType::f64, DType::f64, DType::f64}}})
      for (const Shape& sh : shapes) {
        const Batch b = make_batch(grad, sig, sh.shape, sh.last, seed++);
        const int64_t n = b.shape[0], h = n / 2 - 1;
        const std::vector<Dev> whole = upload(b, 0, n), lo = upload(b, 0, h), hi = upload(b, h, n);
        const std::vector<Dev> want = fused(b, whole);
        const std::vector<double> s1 = reduce(b, lo).values(), s2 = reduce(b, hi).values();
        std::vector<double> total(s1.size());
        for (std::size_t i = 0; i < total.size(); ++i) total[i] = s1[i] + s2[i];
        const Dev sums(DType::f64, std::vector<int64_t>{2 * b.c + 1}, &total);
        std::vector<int64_t> shape_lo = b.shape, shape_hi = b.shape;
        shape_lo[0] = h, shape_hi[0] = n - h;
        const std::vector<Dev> got_lo = apply(b, lo, sums, shape_lo), got_hi = apply(b, hi, sums, shape_hi);
        const double rel = sig.types[0] == DType::f64 ? 1e-12 : sig.types[0] == DType::f32 ? 2e-5 : 2e-2;
        for (std::size_t o = 0; o < want.size(); ++o) {
          const std::vector<double> w = want[o].values();
          std::vector<double> g = got_lo[o].values();
          if (o == 0) {
            const std::vector<double> g2 = got_hi[o].values();
            g.insert(g.end(), g2.begin(), g2.end());
          }
          ASSERT_EQ(g.size(), w.size());
          double scale = 0;
          for (double v : w) scale = std::max(scale, std::fabs(v));
          for (std::size_t e = 0; e < w.size(); ++e)
            ASSERT_NEAR(g[e], w[e], rel * (std::fabs(w[e]) + scale * 1e-2 + 1e-6))
                << what(b) << " output " << o << "[" << e << "]";
        }
      }
}

// Kernels holding multiprocessors, as a collective on another stream may (an all-reduce takes one
// a channel), do not stop the fused ops: they finish on what is left, with the bits of a run on
// the whole device. A quarter of the multiprocessors held: every path, NCHW held in clusters of 2
// to 8 blocks and in plain blocks, NHWC's three kernels. All but two held: the paths without
// clusters; a cluster may wait for the holder to finish there (measured in docs/ops/batch_norm.md).
TEST_F(BatchNormCuda, FinishesBesideKernelsHoldingMultiprocessors) {
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  cudaStream_t hold_stream = nullptr, stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&hold_stream, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  struct Hold {
    int blocks;
    std::vector<Shape> shapes;
  };
  const Shape plain_nchw{{16, 256, 14, 14}, false}, nhwc{{16, 14, 14, 512}, true};
  const Hold holds[] = {{sms / 4, {{{32, 64, 56, 56}, false}, {{16, 64, 56, 56}, false}, plain_nchw, nhwc}},
                        {sms - 2, {plain_nchw, nhwc}}};
  uint64_t seed = 9000;
  for (const Hold& h : holds)
    for (bool grad : {true, false})
      for (const Shape& sh : h.shapes) {
        const Batch b = make_batch(grad, {{DType::f32, DType::f32, DType::f32}}, sh.shape, sh.last, seed++);
        const std::vector<Dev> in = upload(b, 0, b.shape[0]);
        const std::vector<Dev> want = fused(b, in);
        const std::vector<Dev> got = outputs(b, b.shape);  // allocated before the holding kernel runs
        Context ctx;
        ctx.cuda_stream = stream;
        const std::string at = what(b) + " beside " + std::to_string(h.blocks) + " held multiprocessors";
        bool finished = false;
        {
          Blocker hold(h.blocks, hold_stream, 20000);
          ASSERT_TRUE(hold.all_running(5000)) << at << ": the holding kernel did not start";
          const Status s = launch_op(grad ? OpId::BatchNormalizationGrad : OpId::BatchNormInternal, ptrs(in),
                                     ptrs(got), fused_attrs(b), ctx);
          EXPECT_TRUE(s.is_ok()) << at << ": " << s.to_string();
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (!finished && std::chrono::steady_clock::now() < end) {
            finished = cudaStreamQuery(stream) == cudaSuccess;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          EXPECT_TRUE(hold.release()) << at << ": the holding kernel gave up before the release";
        }
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_TRUE(finished) << at << ": did not finish while they were held";
        for (std::size_t o = 0; o < want.size(); ++o) EXPECT_EQ(want[o].raw(), got[o].raw()) << at << " output " << o;
      }
  ASSERT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(hold_stream), cudaSuccess);
}

// ---- more than 2^31 elements ---------------------------------------------------------------------

// Values of channel c over flat [begin, end) of a periodic fill with a constant tail from `tail`
// on: each residue's count, in double.
struct Periodic {
  std::vector<double> pattern;
  int64_t tail;
  double tail_value;
  double at(int64_t i) const {
    return i >= tail ? tail_value : pattern[static_cast<std::size_t>(i % static_cast<int64_t>(pattern.size()))];
  }
};

// Σ f(i) over the flat indices i of [begin, end) with i % stride == phase (stride 1: all).
template <class F>
double periodic_sum(int64_t begin, int64_t end, int64_t stride, int64_t phase, int64_t period, int64_t tail, F f) {
  double s = 0;
  const int64_t stop = std::min(end, tail);
  for (int64_t r = 0; r < period; ++r) {  // residues of the period: i = r + k·period
    if (r % stride != phase % stride) continue;
    const int64_t lo = begin <= r ? 0 : (begin - r + period - 1) / period;
    const int64_t hi = stop <= r ? 0 : (stop - r + period - 1) / period;
    if (hi > lo) s += static_cast<double>(hi - lo) * f(r);
  }
  for (int64_t i = std::max(begin, tail); i < end; ++i)
    if (i % stride == phase % stride) s += f(i);
  return s;
}

// BatchNormalizationGrad, NCHW [1, 2, 2^30 + 3] f16 (T1 = T2 = f32): one run per channel, the
// second wholly past 2^31 elements, whose last 2^20 values differ from the period (a kernel that
// wrapped its index would read the period there instead).
TEST_F(BatchNormCuda, GradOver2Pow31ElementsNchw) {
  const DType t = DType::f16;
  const int64_t s = (int64_t{1} << 30) + 3, n = 2 * s, tail = n - (int64_t{1} << 20), period = 1000;
  if (!enough_memory(static_cast<std::size_t>(3 * n * 2))) GTEST_SKIP() << "not enough device memory";
  DeviceBuffer dy(n * 2), x(n * 2), dx(n * 2), ch(6 * 4);
  for (auto* b : {&dy, &x, &dx, &ch}) ASSERT_TRUE(b->base);
  const Periodic px{pattern(period, t, -2, 2, 1), tail, 3.0}, pdy{pattern(period, t, -1, 1.2, 2), tail, 2.0};
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.base, t, px.pattern, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, pdy.pattern, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.bytes() + tail * 2, t, {3.0}, n - tail));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.bytes() + tail * 2, t, {2.0}, n - tail));
  const std::vector<double> scale = {1.25, -0.5}, mean = {0.125, -0.25}, istd = {1.5, 0.75};
  float* cp = reinterpret_cast<float*>(ch.base);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(cp, DType::f32, scale, 2));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(cp + 2, DType::f32, mean, 2));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(cp + 4, DType::f32, istd, 2));
  DeviceBuffer ds(8), db(8);
  const int64_t shape[] = {1, 2, s}, cshape[] = {2};
  BatchNormGradArgs a{TensorView(dy.base, t, shape, Device::cuda()),
                      TensorView(x.base, t, shape, Device::cuda()),
                      TensorView(cp, DType::f32, cshape, Device::cuda()),
                      TensorView(cp + 2, DType::f32, cshape, Device::cuda()),
                      TensorView(cp + 4, DType::f32, cshape, Device::cuda()),
                      TensorView(dx.base, t, shape, Device::cuda()),
                      TensorView(ds.base, DType::f32, cshape, Device::cuda()),
                      TensorView(db.base, DType::f32, cshape, Device::cuda())};
  const Status st = batch_norm_grad(a);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> gds = download(ds.base, DType::f32, 0, 2), gdb = download(db.base, DType::f32, 0, 2);
  for (int c = 0; c < 2; ++c) {
    const int64_t b0 = c * s, b1 = b0 + s;
    const double s1 = periodic_sum(b0, b1, 1, 0, period, tail, [&](int64_t i) { return pdy.at(i); });
    const double s2 = periodic_sum(b0, b1, 1, 0, period, tail, [&](int64_t i) { return pdy.at(i) * (px.at(i) - mean[c]); });
    const double mag = periodic_sum(b0, b1, 1, 0, period, tail, [&](int64_t i) { return std::fabs(pdy.at(i)) * 3; });
    EXPECT_NEAR(gdb[c], s1, 1e-6 * mag) << "dbias[" << c << "]";
    EXPECT_NEAR(gds[c], istd[c] * s2, 1e-6 * mag * istd[c]) << "dscale[" << c << "]";
    const double k = scale[c] * istd[c], b = -k * s1 / s, cc = -k * istd[c] * istd[c] * s2 / s;
    for (int64_t first : {b0, b0 + s / 2, int64_t{1} << 31, b1 - 4096}) {
      if (first < b0 || first >= b1) continue;
      const int64_t lo = std::clamp(first - 2048, b0, b1 - 4096), cnt = 4096;
      const std::vector<double> got = download(dx.base, t, lo, cnt);
      for (int64_t e = 0; e < cnt; ++e) {
        const int64_t i = lo + e;
        const double want = k * pdy.at(i) + b + cc * (px.at(i) - mean[c]);
        ASSERT_NEAR(got[e], want, 2e-3 * (std::fabs(want) + 1)) << "dx[" << i << "]";
      }
    }
  }
}

// BatchNormInternal, NHWC [2^29 + 1, 4] f16 (T2 = f32): 4 channels across every row, past 2^31
// elements, the last 2^20 values again off the period.
TEST_F(BatchNormCuda, ForwardOver2Pow31ElementsNhwc) {
  const DType t = DType::f16;
  const int64_t rows = (int64_t{1} << 29) + 1, c = 4, n = rows * c, tail = n - (int64_t{1} << 20), period = 1000;
  if (!enough_memory(static_cast<std::size_t>(2 * n * 2))) GTEST_SKIP() << "not enough device memory";
  DeviceBuffer x(n * 2), y(n * 2), par(8 * 2), st(16 * 4);
  for (auto* b : {&x, &y, &par, &st}) ASSERT_TRUE(b->base);
  const Periodic px{pattern(period, t, 1, 5, 3), tail, 7.0};
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.base, t, px.pattern, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.bytes() + tail * 2, t, {7.0}, n - tail));
  const std::vector<double> scale = {1.5, -0.75, 2, 1}, bias = {0.5, 0.25, -1, 0};
  ASSERT_NO_FATAL_FAILURE(fill_periodic(par.base, t, scale, 4));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(par.bytes() + 8, t, bias, 4));
  float* sp = reinterpret_cast<float*>(st.base);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(sp, DType::f32, {0.0}, 4));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(sp + 4, DType::f32, {1.0}, 4));
  const int64_t shape[] = {rows, 1, c}, cshape[] = {c};
  auto f32 = [&](float* p) { return TensorView(p, DType::f32, cshape, Device::cuda()); };
  BatchNormTrainingArgs a{TensorView(x.base, t, shape, Device::cuda()),
                          TensorView(par.base, t, cshape, Device::cuda()),
                          TensorView(par.bytes() + 8, t, cshape, Device::cuda()),
                          f32(sp),
                          f32(sp + 4),
                          TensorView(y.base, t, shape, Device::cuda()),
                          f32(sp),
                          f32(sp + 4),
                          f32(sp + 8),
                          f32(sp + 12)};
  a.momentum = 0.75f;
  a.channels_last = true;
  const Status s = batch_norm_training(a);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> got = download(sp, DType::f32, 0, 16);
  for (int ch = 0; ch < c; ++ch) {
    const double m = static_cast<double>(rows);
    const double mu = periodic_sum(0, n, c, ch, period, tail, [&](int64_t i) { return px.at(i); }) / m;
    const double m2 = periodic_sum(0, n, c, ch, period, tail, [&](int64_t i) { return (px.at(i) - mu) * (px.at(i) - mu); });
    const double istd = 1 / std::sqrt(m2 / m + 1e-5);
    EXPECT_NEAR(got[8 + ch], mu, 1e-4 * std::fabs(mu)) << "saved_mean[" << ch << "]";
    EXPECT_NEAR(got[12 + ch], istd, 1e-3 * istd) << "saved_inv_std[" << ch << "]";
    EXPECT_NEAR(got[ch], 0.25 * mu, 1e-4 * std::fabs(mu)) << "running_mean[" << ch << "]";
    EXPECT_NEAR(got[4 + ch], 0.75 + 0.25 * m2 / (m - 1), 1e-3 * (1 + m2 / m)) << "running_var[" << ch << "]";
    for (int64_t first : {int64_t{0}, int64_t{1} << 31, n - 4096}) {
      const int64_t lo = std::clamp<int64_t>(first - 2048, 0, n - 4096), cnt = 4096;
      const std::vector<double> yv = download(y.base, t, lo, cnt);
      for (int64_t e = 0; e < cnt; ++e) {
        const int64_t i = lo + e;
        if (i % c != ch) continue;
        const double want = (px.at(i) - mu) * istd * scale[ch] + bias[ch];
        ASSERT_NEAR(yv[e], want, 2e-3 * (std::fabs(want) + 1)) << "y[" << i << "]";
      }
    }
  }
}

}  // namespace
}  // namespace gradops::check
