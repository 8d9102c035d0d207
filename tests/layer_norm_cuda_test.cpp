// The LayerNorm family on CUDA against the float64 oracle and the CPU implementation: every op and
// (T, U, V) signature; normalized sizes 1 to 2^20 (each launch shape: rows per warp, block per row,
// cluster per row, the general kernel); 1, 3 and 100,000 rows; intermediate axes; misaligned bases;
// a tensor of more than 2^31 elements; bitwise repeatability; work ordered on the caller's stream
// without a device-wide synchronization; scratch from the context's allocator. No op of the family
// allows an output to alias an input, so there is no in-place case. Every test reports SKIPPED
// where no GPU is visible.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_support.hpp"

namespace gradops::check {
namespace {

using LayerNormCuda = Cuda;  // reports SKIPPED where no GPU is visible

Problem problem(OpId op, const TypeSignature& sig, std::vector<int64_t> shape, int64_t axis, uint64_t seed) {
  Problem p;
  p.op = op;
  p.sig = sig;
  p.shape = std::move(shape);
  p.attrs = {{"axis", static_cast<double>(axis)}};
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

// ---- every op and signature ---------------------------------------------------------------------

struct ShapeAxis {
  std::vector<int64_t> shape;
  int64_t axis;
};

// Normalized sizes around every launch shape, with rows 1 and 3, intermediate axes, and the empty
// cases; each with aligned and misaligned bases.
std::vector<ShapeAxis> small_sweep() {
  return {{{1, 1}, 1},       {{3, 2}, 1},          {{3, 7}, -1},        {{3, 128}, 1},      {{1, 541}, 1},
          {{3, 768}, 1},     {{1, 1600}, 1},       {{3, 4096}, -1},     {{2, 3, 5, 8}, 2},  {{4, 6, 128}, 1},
          {{2, 3, 5, 7}, 1}, {{5, 2, 2, 64}, 1},   {{0, 5}, 1},         {{3, 0}, 1},        {{33, 48}, 1},
          {{9, 2048}, 1},    {{5, 3000}, 1}};
}

TEST_F(LayerNormCuda, EveryOpAndSignatureMatchesOracleAndCpu) {
  uint64_t seed = 1;
  for (OpId id : family_ops(OpFamily::layer_norm))
    for (const TypeSignature& sig : op_schema(id).signatures)
      for (const ShapeAxis& sa : small_sweep())
        for (bool misaligned : {false, true}) {
          Problem p = problem(id, sig, sa.shape, sa.axis, seed++);
          p.misaligned = misaligned;
          ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
        }
}

// Long rows (a cluster of blocks, then the general kernel) and many rows, f32 and bf16 (and f64
// where a cluster holds less).
TEST_F(LayerNormCuda, LongRowsAndManyRows) {
  const ShapeAxis shapes[] = {{{3, 16384}, 1},  {{2, 65536}, 1}, {{2, 131072}, 1},   {{1, 262144}, 1}, {{2, int64_t{1} << 20}, 1},
                              {{100000, 128}, 1}, {{100000, 7}, 1}, {{100000, 1}, 1}, {{1, 65536}, 0}};
  const TypeSignature sigs[] = {{{DType::f32, DType::f32, DType::f32}},
                                {{DType::bf16, DType::f32, DType::bf16}},
                                {{DType::f64, DType::f64, DType::f64}}};
  uint64_t seed = 5000;
  for (OpId id : family_ops(OpFamily::layer_norm))
    for (const TypeSignature& sig : sigs)
      for (const ShapeAxis& sa : shapes) {
        Problem p = problem(id, sig, sa.shape, sa.axis, seed++);
        p.misaligned = seed % 3 == 0;
        ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
      }
}

// Optional outputs left out: dscale or dbias alone, the forwards' statistics.
TEST_F(LayerNormCuda, OptionalOutputsCanBeOmitted) {
  uint64_t seed = 9000;
  for (OpId id : family_ops(OpFamily::layer_norm)) {
    const int outs = static_cast<int>(op_schema(id).outputs.size());
    for (int skip = 1; skip < outs; ++skip)
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{64, 256}, std::vector<int64_t>{7, 541}}) {
        Problem p = problem(id, {{DType::f32, DType::f32, DType::f32}}, shape, 1, seed++);
        p.skip_output.assign(static_cast<std::size_t>(outs), false);
        p.skip_output[static_cast<std::size_t>(skip)] = true;
        const Report r = run_case(p);
        ASSERT_TRUE(r.pass) << r.detail;
      }
  }
}

// Which kernel takes which rows, so that the sweeps above cover each of them.
TEST_F(LayerNormCuda, PathPerRowLength) {
  struct Expect {
    std::vector<int64_t> shape;
    DType t;
    bool misaligned;
    const char* grad;  // the gradients' kernel
    const char* fwd;   // the forwards' (8 packs a thread where 4 would need a cluster)
  };
  const Expect cases[] = {
      {{64, 128}, DType::f32, false, "cuda:rows_per_warp", "cuda:rows_per_warp"},
      {{64, 256}, DType::bf16, false, "cuda:rows_per_warp", "cuda:rows_per_warp"},
      {{64, 768}, DType::f32, false, "cuda:block_per_row", "cuda:block_per_row"},
      {{64, 4096}, DType::bf16, false, "cuda:block_per_row", "cuda:block_per_row"},
      {{4, 16384}, DType::f32, false, "cuda:cluster_per_row", "cuda:block_per_row"},
      {{2, 65536}, DType::f32, false, "cuda:cluster_per_row", "cuda:cluster_per_row"},
      {{2, 65536}, DType::bf16, false, "cuda:cluster_per_row", "cuda:cluster_per_row"},
      {{1, 131072}, DType::f32, false, "cuda:cluster_per_row", "cuda:cluster_per_row"},
      {{2, 65536}, DType::f64, false, "cuda:cluster_per_row", "cuda:cluster_per_row"},
      {{1, 262144}, DType::f32, false, "cuda:general", "cuda:cluster_per_row"},
      {{1, 131072}, DType::f64, false, "cuda:general", "cuda:cluster_per_row"},
      {{1, 524288}, DType::f32, false, "cuda:general", "cuda:general"},
      {{64, 541}, DType::f32, false, "cuda:general", "cuda:general"},
      {{64, 768}, DType::f32, true, "cuda:general", "cuda:general"},
  };
  for (OpId id : family_ops(OpFamily::layer_norm))
    for (const Expect& e : cases) {
      Problem p = problem(id, {{e.t, DType::f32, e.t}}, e.shape, 1, 1);
      p.misaligned = e.misaligned;
      EXPECT_EQ(impl_of(p), op_schema(id).gradient ? e.grad : e.fwd) << describe(p);
    }
}

// dscale/dbias (and everything else) have the same bits on every run.
TEST_F(LayerNormCuda, RepeatedRunsAreBitwiseIdentical) {
  const std::vector<int64_t> shapes[] = {{4099, 256}, {1000, 768}, {64, 16384}, {300, 541}, {20000, 128}};
  for (OpId id : family_ops(OpFamily::layer_norm))
    for (const std::vector<int64_t>& shape : shapes) {
      Problem p = problem(id, {{DType::f32, DType::f32, DType::f32}}, shape, 1, 77);
      ASSERT_NO_FATAL_FAILURE(check_same_bits_every_run(p));
    }
}

// Gradients with many large partial rows (a row a block, written in 16-byte pieces, and several
// rows a block, folded first; block counts even and odd): the oracle's and the CPU's values, and
// the same bits on every run.
TEST_F(LayerNormCuda, LargePartialRowsMatchOracleAndCpu) {
  struct Shape {
    std::vector<int64_t> shape;
    DType t;
  };
  const Shape shapes[] = {{{2048, 1024}, DType::f32}, {{1000, 768}, DType::bf16}, {{600, 8192}, DType::bf16},
                          {{530, 4096}, DType::f32}};
  uint64_t seed = 12000;
  for (OpId id : family_ops(OpFamily::layer_norm)) {
    if (!op_schema(id).gradient) continue;
    for (const Shape& s : shapes) {
      Problem p = problem(id, {{s.t, DType::f32, s.t}}, s.shape, 1, seed++);
      ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
      ASSERT_NO_FATAL_FAILURE(check_same_bits_every_run(p, 2));
    }
  }
}

// LayerNormalizationGrad over more than 2^31 elements (bf16), on the held path (cols of whole
// packs) and the general one (an odd cols): rows repeat with period 3, so dx of any row and every
// dscale/dbias column have a closed form the host computes in double.
TEST_F(LayerNormCuda, GradOver2Pow31Elements) {
  const DType t = DType::bf16;
  for (int64_t cols : {int64_t{4096}, int64_t{4099}}) {
    const int64_t rows = (int64_t{1} << 31) / cols + 7, n = rows * cols;
    if (!enough_memory(static_cast<std::size_t>(3 * n * 2))) GTEST_SKIP() << "not enough device memory";
    DeviceBuffer dy(n * 2), x(n * 2), dx(n * 2), scale(cols * 2), mean(rows * 4), inv(rows * 4), ds(cols * 2),
        db(cols * 2);
    for (auto* b : {&dy, &x, &dx, &scale, &mean, &inv, &ds, &db}) ASSERT_TRUE(b->base);
    const std::vector<double> px = pattern(3 * cols, t, -2, 2, 1), pdy = pattern(3 * cols, t, -1, 1, 2),
                              psc = pattern(cols, t, 0.5, 1.5, 3);
    std::vector<double> pmu(3), pr(3);
    for (int k = 0; k < 3; ++k) {
      double s = 0, q = 0;
      for (int64_t j = 0; j < cols; ++j) s += px[k * cols + j];
      for (int64_t j = 0; j < cols; ++j) q += (px[k * cols + j] - s / cols) * (px[k * cols + j] - s / cols);
      pmu[k] = oracle::round_to(DType::f32, s / cols);
      pr[k] = oracle::round_to(DType::f32, 1 / std::sqrt(q / cols + 1e-5));
    }
    ASSERT_NO_FATAL_FAILURE(fill_periodic(x.base, t, px, n));
    ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, pdy, n));
    ASSERT_NO_FATAL_FAILURE(fill_periodic(scale.base, t, psc, cols));
    ASSERT_NO_FATAL_FAILURE(fill_periodic(mean.base, DType::f32, pmu, rows));
    ASSERT_NO_FATAL_FAILURE(fill_periodic(inv.base, DType::f32, pr, rows));
    const int64_t shape[] = {rows, cols}, sshape[] = {rows, 1}, cshape[] = {cols};
    LayerNormGradArgs a{TensorView(dy.base, t, shape, Device::cuda()), TensorView(x.base, t, shape, Device::cuda()),
                        TensorView(scale.base, t, cshape, Device::cuda()),
                        TensorView(mean.base, DType::f32, sshape, Device::cuda()),
                        TensorView(inv.base, DType::f32, sshape, Device::cuda()),
                        TensorView(dx.base, t, shape, Device::cuda()), TensorView(ds.base, t, cshape, Device::cuda()),
                        TensorView(db.base, t, cshape, Device::cuda()), -1};
    const Status s = layer_norm_grad(a);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Expected per row type k, in double.
    std::vector<std::vector<double>> want(3, std::vector<double>(cols));
    std::vector<double> wds(cols, 0), wdb(cols, 0);
    const int64_t count[3] = {(rows + 2) / 3, (rows + 1) / 3, rows / 3};
    for (int k = 0; k < 3; ++k) {
      double s1 = 0, s2 = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const double g = pdy[k * cols + j] * psc[j], xh = (px[k * cols + j] - pmu[k]) * pr[k];
        s1 += g;
        s2 += g * xh;
      }
      for (int64_t j = 0; j < cols; ++j) {
        const double g = pdy[k * cols + j] * psc[j], xh = (px[k * cols + j] - pmu[k]) * pr[k];
        want[k][j] = pr[k] * (g - s1 / cols - xh * s2 / cols);
        wds[j] += count[k] * pdy[k * cols + j] * xh;
        wdb[j] += count[k] * pdy[k * cols + j];
      }
    }
    for (int64_t row : {int64_t{0}, int64_t{1}, int64_t{2}, rows / 2, rows - 2, rows - 1}) {
      const std::vector<double> got = download(dx.base, t, row * cols, cols);
      for (int64_t j = 0; j < cols; ++j)
        ASSERT_NEAR(got[j], want[row % 3][j], 1e-2 * (std::fabs(want[row % 3][j]) + 0.1))
            << "cols " << cols << ": dx[" << row << ", " << j << "]";
    }
    const std::vector<double> gds = download(ds.base, t, 0, cols), gdb = download(db.base, t, 0, cols);
    for (int64_t j = 0; j < cols; ++j) {
      ASSERT_NEAR(gds[j], wds[j], 1e-2 * std::fabs(wds[j]) + 1e-4 * rows) << "cols " << cols << ": dscale[" << j << "]";
      ASSERT_NEAR(gdb[j], wdb[j], 1e-2 * std::fabs(wdb[j]) + 1e-4 * rows) << "cols " << cols << ": dbias[" << j << "]";
    }
  }
}

// The forward and its gradient queued on a non-blocking stream behind a gate and the copy that
// produces their input: gradops returns before the stream has run (no device-wide or stream synchronization), and the
// results match the CPU's.
TEST_F(LayerNormCuda, WorkIsOrderedOnTheCallersStreamAndNotWaitedFor) {
  const int64_t rows = 2048, cols = 1024, n = rows * cols;
  const DType t = DType::f32;
  DeviceBuffer src(n * 4), x(n * 4), y(n * 4), mean(rows * 4), inv(rows * 4), dy(n * 4), dx(n * 4), scale(cols * 4),
      bias(cols * 4), ds(cols * 4), db(cols * 4);
  for (auto* b : {&src, &x, &y, &mean, &inv, &dy, &dx, &scale, &bias, &ds, &db}) ASSERT_TRUE(b->base);
  const std::vector<double> hx = pattern(n, t, -2, 2, 21), hdy = pattern(n, t, -1, 1, 22),
                            hs = pattern(cols, t, 0.5, 1.5, 23), hb = pattern(cols, t, -1, 1, 24);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(src.base, t, hx, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, hdy, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(scale.base, t, hs, cols));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(bias.base, t, hb, cols));
  ASSERT_EQ(cudaMemset(x.base, 0, n * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Stream owned;  // non-blocking
  ASSERT_TRUE(owned.stream) << "cudaStreamCreateWithFlags failed";
  cudaStream_t stream = owned.stream;
  Context ctx;
  ctx.cuda_stream = stream;
  const int64_t shape[] = {rows, cols}, sshape[] = {rows, 1}, cshape[] = {cols};
  auto dv = [&](const DeviceBuffer& b, const int64_t* s, int rank) {
    return TensorView(b.base, t, std::span<const int64_t>(s, rank), Device::cuda());
  };
  auto chain = [&]() {
    EXPECT_TRUE(layer_norm({dv(x, shape, 2), dv(scale, cshape, 1), dv(bias, cshape, 1), dv(y, shape, 2),
                            dv(mean, sshape, 2), dv(inv, sshape, 2), -1, 1e-5f},
                           ctx)
                    .is_ok());
    EXPECT_TRUE(layer_norm_grad({dv(dy, shape, 2), dv(x, shape, 2), dv(scale, cshape, 1), dv(mean, sshape, 2),
                                 dv(inv, sshape, 2), dv(dx, shape, 2), dv(ds, cshape, 1), dv(db, cshape, 1), -1},
                                ctx)
                    .is_ok());
  };
  chain();  // loads the kernels
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.base, 0, n * 4, stream), cudaSuccess);
  for (auto* out : {&y, &dx}) ASSERT_EQ(cudaMemsetAsync(out->base, 0xFF, n * 4, stream), cudaSuccess);
  {
    // The copy that produces x waits behind a gate the test holds until the chain has returned. (64
    // copies ahead instead, about 0.4 ms of work, were once outlasted by the host's calls.)
    StreamGate gate(stream);
    ASSERT_TRUE(gate.ok()) << "cudaLaunchHostFunc failed";
    ASSERT_EQ(cudaMemcpyAsync(x.base, src.base, n * 4, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
    chain();
    EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "gradops waited for the stream";
    (void)cudaGetLastError();
    EXPECT_TRUE(gate.open()) << "gradops waited for the stream (the gate timed out)";
  }
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  std::vector<float> cx(n), cdy(n), cs(cols), cb(cols), cy(n), cm(rows), ci(rows), cdx(n), cds(cols), cdb(cols);
  for (int64_t i = 0; i < n; ++i) cx[i] = static_cast<float>(hx[i]), cdy[i] = static_cast<float>(hdy[i]);
  for (int64_t j = 0; j < cols; ++j) cs[j] = static_cast<float>(hs[j]), cb[j] = static_cast<float>(hb[j]);
  auto hv = [&](const std::vector<float>& v, const int64_t* s, int rank) {
    return TensorView(v.data(), t, std::span<const int64_t>(s, rank));
  };
  ASSERT_TRUE(layer_norm({hv(cx, shape, 2), hv(cs, cshape, 1), hv(cb, cshape, 1), hv(cy, shape, 2), hv(cm, sshape, 2),
                          hv(ci, sshape, 2), -1, 1e-5f})
                  .is_ok());
  ASSERT_TRUE(layer_norm_grad({hv(cdy, shape, 2), hv(cx, shape, 2), hv(cs, cshape, 1), hv(cm, sshape, 2),
                               hv(ci, sshape, 2), hv(cdx, shape, 2), hv(cds, cshape, 1), hv(cdb, cshape, 1), -1})
                  .is_ok());
  const std::vector<double> gy = download(y.base, t, 0, n), gdx = download(dx.base, t, 0, n),
                            gds = download(ds.base, t, 0, cols), gdb = download(db.base, t, 0, cols);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_NEAR(gy[i], cy[i], 1e-4 * (std::fabs(cy[i]) + 1)) << "Y[" << i << "]";
    ASSERT_NEAR(gdx[i], cdx[i], 1e-4 * (std::fabs(cdx[i]) + 1)) << "dX[" << i << "]";
  }
  for (int64_t j = 0; j < cols; ++j) {
    ASSERT_NEAR(gds[j], cds[j], 1e-4 * (std::fabs(cds[j]) + 10)) << "dscale[" << j << "]";
    ASSERT_NEAR(gdb[j], cdb[j], 1e-4 * (std::fabs(cdb[j]) + 10)) << "dbias[" << j << "]";
  }
}

// The dscale/dbias partial rows come from the context's allocator and go back to it.
TEST_F(LayerNormCuda, ScratchComesFromTheContextsAllocator) {
  const int64_t rows = 513, cols = 96, n = rows * cols;
  const DType t = DType::f32;
  DeviceBuffer dy(n * 4), x(n * 4), dx(n * 4), scale(cols * 4), inv(rows * 4), ds(cols * 4);
  for (auto* b : {&dy, &x, &dx, &scale, &inv, &ds}) ASSERT_TRUE(b->base);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, pattern(n, t, -1, 1, 31), n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.base, t, pattern(n, t, -1, 1, 32), n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(scale.base, t, pattern(cols, t, 0.5, 1.5, 33), cols));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(inv.base, t, pattern(rows, t, 0.5, 2, 34), rows));
  CountingAllocator counter;
  const WorkspaceAllocator alloc = counter.allocator();
  Context ctx;
  ctx.allocator = &alloc;
  const int64_t shape[] = {rows, cols}, sshape[] = {rows}, cshape[] = {cols};
  const Status s = rms_norm_grad({TensorView(dy.base, t, shape, Device::cuda()), TensorView(x.base, t, shape, Device::cuda()),
                                  TensorView(scale.base, t, cshape, Device::cuda()),
                                  TensorView(inv.base, t, sshape, Device::cuda()),
                                  TensorView(dx.base, t, shape, Device::cuda()),
                                  TensorView(ds.base, t, cshape, Device::cuda()), -1},
                                 ctx);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter.allocations, 1);
  EXPECT_EQ(counter.releases, 1);
}

}  // namespace
}  // namespace gradops::check
