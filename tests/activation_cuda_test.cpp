// The activation family on CUDA tensors, against the float64 oracle and the CPU implementation:
// every op and dtype over the shape sweep (misaligned, in place, without dB, poisoned outputs),
// attributes, GELU tails, the bias kernels' row batches, more than 65,535 rows and 2^31 elements,
// pointers at unrelated offsets or not aligned to their element, bitwise repeatability, scratch
// from the context's allocator. Built into activation_test with the CUDA backend; every test
// reports SKIPPED where no GPU is visible.
#include <optional>
#include <string>

#include "cuda_support.hpp"

namespace gradops::check {
namespace {

// Sizes around the 16-byte pack of every dtype, odd row lengths, rows that fill whole packs (the
// bias kernel's vector path), more than 65,535 rows, 262,144 elements in one row, rank 1 to 5.
std::vector<std::vector<int64_t>> activation_shapes() {
  return {{0},     {1},     {7},          {15},        {16},       {17},           {3, 0},     {0, 5},
          {31, 33}, {2, 3, 5, 7}, {2, 1, 3, 1, 4}, {65537, 2}, {1, 262144}, {4099}, {64, 1024}, {3, 4100}};
}

TEST_F(Cuda, ActivationMatchesOracleAndCpu) {
  uint64_t seed = 1;
  for (OpId id : family_ops(OpFamily::activation))
    for (DType t : kAllDTypes)
      for (const auto& shape : activation_shapes())
        for (bool misaligned : {false, true}) {
          Problem p;
          p.op = id;
          p.sig = {{t, t, t}};
          p.shape = shape;
          p.misaligned = misaligned;
          p.seed = seed++;
          ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
        }
}

TEST_F(Cuda, ActivationInPlaceAndWithoutBiasGradient) {
  for (OpId id : family_ops(OpFamily::activation))
    for (DType t : kAllDTypes)
      for (bool misaligned : {false, true}) {
        Problem p;
        p.op = id;
        p.sig = {{t, t, t}};
        p.shape = {37, 128};
        p.misaligned = misaligned;
        p.device = Device::cuda();
        p.seed = 7;
        if (!op_schema(id).aliases.empty()) {
          p.inplace = true;
          const Report r = run_case(p);
          ASSERT_TRUE(r.pass) << r.detail;
          p.inplace = false;
        }
        if (op_schema(id).outputs.size() > 1) {
          p.skip_output = {false, true};
          const Report r = run_case(p);
          ASSERT_TRUE(r.pass) << r.detail;
        }
      }
}

TEST_F(Cuda, QuickGeluAndLeakyReluAttributes) {
  for (OpId id : {OpId::QuickGeluGrad, OpId::QuickGelu, OpId::LeakyReluGrad, OpId::LeakyRelu})
    for (double alpha : {0.0, 0.5, 1.0, 1.702, 3.0}) {
      Problem p;
      p.op = id;
      p.shape = {1000};
      p.attrs = {{"alpha", alpha}};
      p.device = Device::cuda();
      const Report r = run_case(p);
      ASSERT_TRUE(r.pass) << r.detail;
    }
}

// The tail tests' tensors on the device, of n elements each: x, dY of ones, and an output.
template <class T>
struct TailTensors {
  static constexpr DType kType = std::is_same_v<T, float> ? DType::f32 : DType::f64;
  int64_t shape[1];
  std::size_t bytes;
  DeviceBuffer x_d, dy_d, out_d;
  TensorView vx, vdy, vout;
  explicit TailTensors(int64_t n)
      : shape{n}, bytes(static_cast<std::size_t>(n) * sizeof(T)), x_d(bytes), dy_d(bytes), out_d(bytes),
        vx(x_d.base, kType, shape, Device::cuda()), vdy(dy_d.base, kType, shape, Device::cuda()),
        vout(out_d.base, kType, shape, Device::cuda()) {}
  // x and the ones to the device; false where a buffer or a copy failed.
  bool upload(const std::vector<T>& x) {
    const std::vector<T> ones(x.size(), T(1));
    return x_d.base && dy_d.base && out_d.base &&
           cudaMemcpy(x_d.base, x.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess &&
           cudaMemcpy(dy_d.base, ones.data(), bytes, cudaMemcpyHostToDevice) == cudaSuccess;
  }
  bool download(std::vector<T>& out) const {
    out.resize(static_cast<std::size_t>(shape[0]));
    return cudaMemcpy(out.data(), out_d.base, bytes, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
};

// f32 GeluGrad keeps relative accuracy in the negative tail (docs/semantics.md A3), where 1 + erf
// would lose every digit; FastGeluGrad and QuickGeluGrad vanish there without NaN.
TEST_F(Cuda, GeluFamilyTails) {
  const int n = 100001;
  std::vector<float> x(n), dx;
  for (int i = 0; i < n; ++i) x[i] = static_cast<float>(-13.0 + 11.0 * i / (n - 1));  // [-13, -2]
  TailTensors<float> d(n);
  ASSERT_TRUE(d.upload(x));
  ASSERT_TRUE(gelu_grad({d.vdy, d.vx, d.vout}).is_ok());
  ASSERT_TRUE(d.download(dx));
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    const double ref = oracle::gelu_grad(x[i]);
    if (std::fabs(ref) > 1e-37) worst = std::max(worst, std::fabs(dx[i] - ref) / std::fabs(ref));
  }
  EXPECT_LE(worst, 2e-5) << "GeluGrad's relative error in [-13, -2]";
  ASSERT_TRUE(fast_gelu_grad({d.vdy, d.vx, d.vout}).is_ok());
  ASSERT_TRUE(d.download(dx));
  for (int i = 0; i < n; ++i) {
    const double ref = oracle::fast_gelu_grad(x[i]);
    ASSERT_LE(std::fabs(dx[i] - ref), 1e-6 + 1e-5 * std::fabs(ref)) << "FastGeluGrad at " << x[i];
  }
  ASSERT_TRUE(quick_gelu_grad({d.vdy, d.vx, d.vout}).is_ok());
  ASSERT_TRUE(d.download(dx));
  for (int i = 0; i < n; ++i) {
    const double ref = oracle::quick_gelu_grad(x[i], 1.702f);
    ASSERT_LE(std::fabs(dx[i] - ref), 1e-30 + 1e-5 * std::fabs(ref)) << "QuickGeluGrad at " << x[i];
  }
}

// f64 GeluGrad and Gelu keep relative accuracy across the tails, from one exp and erfcx: out to
// x = -37 (e = exp(-x^2/2) near 1e-298, still normal), where x^2's rounding alone would cost
// hundreds of ulp without its exact split, and on the positive side, where Gelu's 1 - tail must
// not lose the tail.
TEST_F(Cuda, GeluF64Tails) {
  const int n = 200001;
  std::vector<double> x(n), out;
  for (int i = 0; i < n; ++i) x[i] = -37.0 + 74.0 * i / (n - 1);  // [-37, 37]
  TailTensors<double> d(n);
  ASSERT_TRUE(d.upload(x));
  ASSERT_TRUE(gelu_grad({d.vdy, d.vx, d.vout}).is_ok());
  ASSERT_TRUE(d.download(out));
  for (int i = 0; i < n; ++i) {
    const double ref = oracle::gelu_grad(x[i]);
    // Relative away from GeluGrad's zero near x = -0.7518, absolute (to 1 in the derivative) near it.
    const double tol = std::fabs(x[i] + 0.7518) > 0.25 ? 1e-13 * std::fabs(ref) : 1e-15;
    ASSERT_LE(std::fabs(out[i] - ref), tol) << "f64 GeluGrad at " << x[i];
  }
  ASSERT_TRUE(gelu({d.vx, d.vout}).is_ok());
  ASSERT_TRUE(d.download(out));
  for (int i = 0; i < n; ++i) {
    const double ref = oracle::gelu(x[i]);
    ASSERT_LE(std::fabs(out[i] - ref), 1e-13 * std::fabs(ref) + 1e-300) << "f64 Gelu at " << x[i];
  }
}

// Many rows of 64 with a ragged last batch and remainder rows, with and without dB. Aligned, only
// f32 with dB runs the 2-D bias kernel's row batches (the row kernels take 16-bit with dB and every
// case without dB); rows that start off a 16-byte boundary send every case there.
TEST_F(Cuda, BiasKernelManyRowBatches) {
  for (DType t : {DType::f32, DType::bf16})
    for (OpId id : {OpId::BiasGeluGrad_dX, OpId::BiasFastGeluGrad_dX})
      for (bool without_db : {false, true})
        for (bool misaligned : {false, true}) {
          Problem p;
          p.op = id;
          p.sig = {{t, t, t}};
          p.shape = {200003, 64};
          p.misaligned = misaligned;
          if (without_db) p.skip_output = {false, true};
          ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
          if (!misaligned) continue;
          p.device = Device::cuda();
          std::string name;
          ASSERT_TRUE(Case(p).implementation(&name).is_ok());
          EXPECT_EQ(name.rfind("cuda:bias_2d", 0), 0u)
              << dtype_name(t) << (without_db ? "" : " with dB") << ": " << name;
        }
}

// More than 65,535 rows on the bias path (the sweeps cover the flat one).
TEST_F(Cuda, BiasGeluGradMoreThan65535Rows) {
  Problem p;
  p.op = OpId::BiasGeluGrad_dX;
  p.sig = {{DType::bf16, DType::bf16, DType::bf16}};
  p.shape = {70001, 64};
  ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
}

// Tensors at different offsets from a 16-byte boundary: the one-element rows.
TEST_F(Cuda, ActivationPointersAtUnrelatedOffsets) {
  for (DType t : {DType::f32, DType::f16, DType::f64})
    for (OpId id : family_ops(OpFamily::activation))
      ASSERT_NO_FATAL_FAILURE(check_offsets(id, t, {37, 129}, 0, {"cuda:flat_scalar", "cuda:bias_2d_scalar"}));
}

TEST_F(Cuda, ActivationPointerNotAlignedToItsElementIsUnimplemented) {
  DeviceBuffer buf(4096);
  ASSERT_TRUE(buf.base);
  const int64_t shape[] = {16, 16};
  // 16 x 16 f32 = 1024 bytes each, apart: only the 2-byte offset is wrong.
  const TensorView odd(buf.bytes() + 2, DType::f32, shape, Device::cuda());
  const TensorView even(buf.bytes() + 3072, DType::f32, shape, Device::cuda());
  const TensorView out(buf.bytes() + 1536, DType::f32, shape, Device::cuda());
  const Status s = relu_grad({even, odd, out});
  EXPECT_EQ(s.code(), StatusCode::unimplemented) << s.to_string();
  EXPECT_NE(s.to_string().find("not aligned to its element size"), std::string::npos) << s.to_string();
}

// Same inputs, same bits: dB's partial sums run in a fixed order.
TEST_F(Cuda, ActivationRepeatedRunsAreBitwiseIdentical) {
  struct Run {
    OpId op;
    DType t;
    std::vector<int64_t> shape;
  };
  const Run runs[] = {
      {OpId::BiasGeluGrad_dX, DType::f32, {300, 1111}},
      {OpId::BiasFastGeluGrad_dX, DType::bf16, {4099, 256}},
  };
  for (const Run& r : runs) {
    Problem p;
    p.op = r.op;
    p.sig = {{r.t, r.t, r.t}};
    p.shape = r.shape;
    p.device = Device::cuda();
    ASSERT_NO_FATAL_FAILURE(check_same_bits_every_run(p));
  }
}

// ---- more than 2^31 elements -----------------------------------------------------------------

TEST_F(Cuda, ReluGradOver2Pow31Elements) {
  const int64_t n = (int64_t{1} << 31) + 65536 + 3;
  const DType t = DType::f16;
  if (!enough_memory(3 * n * 2)) GTEST_SKIP() << "not enough device memory";
  DeviceBuffer dy(n * 2), x(n * 2), dx(n * 2);
  ASSERT_TRUE(dy.base && x.base && dx.base);
  const std::vector<double> pdy = pattern(1000003, t, -2, 2, 1), px = pattern(999983, t, -2, 2, 2);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, pdy, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.base, t, px, n));
  ASSERT_EQ(cudaMemset(dx.base, 0xFF, n * 2), cudaSuccess);
  const int64_t shape[] = {n};
  ASSERT_TRUE(relu_grad({TensorView(dy.base, t, shape, Device::cuda()), TensorView(x.base, t, shape, Device::cuda()),
                         TensorView(dx.base, t, shape, Device::cuda())})
                  .is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // The first elements, everything past 2^31 - 2^20, and a scattering in between.
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 4096}, {(int64_t{1} << 31) - (1 << 20), n}};
  std::mt19937_64 rng(3);
  for (int i = 0; i < 64; ++i) {
    const int64_t at = static_cast<int64_t>(rng() % static_cast<uint64_t>(n - 64));
    ranges.push_back({at, at + 64});
  }
  for (const auto& [lo, hi] : ranges) {
    const std::vector<double> got = download(dx.base, t, lo, hi - lo);
    for (int64_t i = lo; i < hi; ++i) {
      const double want = px[i % px.size()] > 0 ? pdy[i % pdy.size()] : 0.0;
      ASSERT_EQ(got[i - lo], want) << "dX[" << i << "]";
    }
  }
}

TEST_F(Cuda, BiasGeluGradOver2Pow31Elements) {
  const int64_t cols = 2048, rows = (int64_t{1} << 20) + 1, n = rows * cols;
  const DType t = DType::f16;
  if (!enough_memory(3 * n * 2)) GTEST_SKIP() << "not enough device memory";
  DeviceBuffer dy(n * 2), x(n * 2), dx(n * 2), b(cols * 2);
  ASSERT_TRUE(dy.base && x.base && dx.base && b.base);
  const std::vector<double> pdy = pattern(1000003, t, -2, 2, 6), px = pattern(999983, t, -3, 3, 7),
                            pb = pattern(static_cast<std::size_t>(cols), t, -1, 1, 8);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, pdy, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(x.base, t, px, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(b.base, t, pb, cols));
  ASSERT_EQ(cudaMemset(dx.base, 0xFF, n * 2), cudaSuccess);
  const int64_t bshape[] = {cols};
  // Rows [r0, r1) of the tensors; dB into db_out, or none.
  auto call = [&](int64_t r0, int64_t r1, void* db_out) {
    const int64_t part[] = {r1 - r0, cols};
    const std::size_t off = static_cast<std::size_t>(r0 * cols * 2);
    std::optional<TensorView> db_view;
    if (db_out) db_view = TensorView(db_out, t, bshape, Device::cuda());
    return bias_gelu_grad({TensorView(static_cast<char*>(dy.base) + off, t, part, Device::cuda()),
                           TensorView(static_cast<char*>(x.base) + off, t, part, Device::cuda()),
                           TensorView(b.base, t, bshape, Device::cuda()),
                           TensorView(static_cast<char*>(dx.base) + off, t, part, Device::cuda()), db_view});
  };
  ASSERT_TRUE(call(0, rows, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Problem p;
  p.op = OpId::BiasGeluGrad_dX;
  p.sig = {{t, t, t}};
  p.shape = {rows, cols};
  const Tolerance tol = tolerance(p, 0);
  auto check_dx = [&](const char* with) {
    for (int64_t r : {int64_t{0}, rows / 3, rows - 3, rows - 2, rows - 1}) {
      const std::vector<double> got = download(dx.base, t, r * cols, cols);
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t i = r * cols + j;
        const double z = px[i % px.size()] + pb[j];
        const double want = pdy[i % pdy.size()] * oracle::gelu_grad(z);
        ASSERT_LE(std::fabs(got[j] - want), tol.abs + tol.rel * std::fabs(want))
            << "dX[" << r << ", " << j << "] " << with;
      }
    }
  };
  ASSERT_NO_FATAL_FAILURE(check_dx("without dB"));

  // With dB (the kernel that sums columns as it goes): dX again, and dB against the sum of the
  // dBs of the two halves, each under 2^31 elements (a column sum of a million rows has no cheap
  // host reference; an indexing fault past 2^31 would show as a difference).
  DeviceBuffer db(cols * 2), db_a(cols * 2), db_b(cols * 2);
  ASSERT_TRUE(db.base && db_a.base && db_b.base);
  ASSERT_EQ(cudaMemset(dx.base, 0xFF, n * 2), cudaSuccess);
  ASSERT_TRUE(call(0, rows, db.base).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_NO_FATAL_FAILURE(check_dx("with dB"));
  ASSERT_TRUE(call(0, rows / 2, db_a.base).is_ok());
  ASSERT_TRUE(call(rows / 2, rows, db_b.base).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<double> whole = download(db.base, t, 0, cols), a = download(db_a.base, t, 0, cols),
                            bh = download(db_b.base, t, 0, cols);
  for (int64_t j = 0; j < cols; ++j) {
    // Each of the three is rounded once to f16 (2^-11 relative) from f32 sums of half a million
    // terms or more.
    const double want = a[j] + bh[j], scale = std::fabs(a[j]) + std::fabs(bh[j]);
    ASSERT_TRUE(std::isfinite(whole[j])) << "dB[" << j << "]";
    ASSERT_LE(std::fabs(whole[j] - want), 4e-3 * scale + 1e-3) << "dB[" << j << "]";
  }
}

// ---- scratch ------------------------------------------------------------------------------------

// dB's partial sums come from the context's allocator when one is given, and go back to it.
TEST_F(Cuda, ScratchComesFromTheContextsAllocator) {
  Problem p;
  p.op = OpId::BiasGeluGrad_dX;
  p.shape = {513, 96};
  const oracle::Attrs attrs = full_attrs(p);
  const DType types[] = {DType::f32, DType::f32, DType::f32};
  oracle::Rng rng(9);
  const oracle::Tensors in = oracle::make_inputs("BiasGeluGrad_dX", p.shape, attrs, types, rng);
  const oracle::Tensors want = oracle::reference("BiasGeluGrad_dX", in, attrs);
  const int64_t n = 513 * 96;
  DeviceBuffer dy(n * 4), x(n * 4), b(96 * 4), dx(n * 4), db(96 * 4);
  auto up = [&](const DeviceBuffer& d, const oracle::Tensor& v) {
    std::vector<float> f(v.v.begin(), v.v.end());
    ASSERT_EQ(cudaMemcpy(d.base, f.data(), f.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  };
  ASSERT_NO_FATAL_FAILURE(up(dy, *in[0]));
  ASSERT_NO_FATAL_FAILURE(up(x, *in[1]));
  ASSERT_NO_FATAL_FAILURE(up(b, *in[2]));
  CountingAllocator counter;
  const WorkspaceAllocator alloc = counter.allocator();
  Context ctx;
  ctx.allocator = &alloc;
  const int64_t shape[] = {513, 96}, bshape[] = {96};
  const Status s = bias_gelu_grad({TensorView(dy.base, DType::f32, shape, Device::cuda()),
                                   TensorView(x.base, DType::f32, shape, Device::cuda()),
                                   TensorView(b.base, DType::f32, bshape, Device::cuda()),
                                   TensorView(dx.base, DType::f32, shape, Device::cuda()),
                                   TensorView(db.base, DType::f32, bshape, Device::cuda())},
                                  ctx);
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(counter.allocations, 1);
  EXPECT_EQ(counter.releases, 1);
  const std::vector<double> got = download(db.base, DType::f32, 0, 96);
  const Tolerance tol = tolerance(p, 1);
  for (int j = 0; j < 96; ++j) EXPECT_LE(std::fabs(got[j] - want[1]->v[j]), tol.abs + tol.rel * std::fabs(want[1]->v[j])) << j;
}

}  // namespace
}  // namespace gradops::check
