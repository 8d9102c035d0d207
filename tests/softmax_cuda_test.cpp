// The softmax family on CUDA tensors, against the float64 oracle and the CPU implementation:
// every op and dtype over the shape sweep (every axis, misaligned, poisoned outputs), which row
// takes which rows, more than 65,535 rows and 2^31 elements, pointers at unrelated offsets or not
// aligned to their element, bitwise repeatability. Built into softmax_test with the CUDA backend;
// every test reports SKIPPED where no GPU is visible.
#include "cuda_support.hpp"

namespace gradops::check {
namespace {

// Rows of every CUDA path: sub-warp groups, warp per row, a block per row, clusters of 2 to 16
// blocks (with ragged ends when the row is not a whole number of packs), two passes, and the
// strided path for every non-last axis.
struct SoftmaxShape {
  std::vector<int64_t> shape;
  bool every_axis;  // false: the last axis and axis 0 only
};
std::vector<SoftmaxShape> softmax_shapes() {
  return {{{0}, true},          {{1}, true},         {{7}, true},          {{16}, true},
          {{17}, true},         {{3, 0}, true},      {{0, 5}, true},       {{31, 33}, true},
          {{5, 1}, true},       {{2, 3, 5}, true},   {{2, 3, 5, 7}, true}, {{2, 1, 3, 1, 4}, true},
          {{3, 5, 2053}, false}, {{2, 1031, 37}, false}, {{65537, 3}, false}, {{9, 1025}, false},
          {{5, 2048}, false},   {{4, 4100}, false},  {{2, 32768}, false},  {{3, 50257}, false},
          {{2, 131072}, false}, {{1, 262144}, false}, {{1, 270000}, false}};
}

TEST_F(Cuda, SoftmaxMatchesOracleAndCpu) {
  uint64_t seed = 1000;
  for (OpId id : family_ops(OpFamily::softmax))
    for (DType t : kAllDTypes)
      for (const SoftmaxShape& s : softmax_shapes()) {
        const int rank = static_cast<int>(s.shape.size());
        std::vector<int64_t> axes;
        if (s.every_axis) {
          for (int a = -rank; a < rank; ++a) axes.push_back(a);
        } else {
          axes = {rank - 1, 0};
          if (!single_axis(id) && rank > 1) axes = {0, rank - 1};  // whole tensor; rows of the last dim
        }
        for (int64_t axis : axes)
          for (bool misaligned : {false, true}) {
            Problem p;
            p.op = id;
            p.sig = {{t, t, t}};
            p.shape = s.shape;
            p.attrs = {{"axis", static_cast<double>(axis)}};
            p.misaligned = misaligned;
            p.seed = seed++;
            ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
          }
      }
}

// A non-last axis, [outer, axis, inner]: inner below, at and above a 16-byte pack, odd, and folded
// into packs (inner dividing a pack, whole packs a slice) or not; axes held by part of a block, a
// block, clusters of 2 to 16 blocks, and longer ones (cuda:strided, its axis split into chunks).
TEST_F(Cuda, SoftmaxNonLastAxisMatchesOracleAndCpu) {
  const std::vector<std::vector<int64_t>> shapes = {
      {3, 1, 5},     {2, 2, 3},      {4, 7, 8},    {3, 33, 96},   {2, 16, 4096}, {5, 100, 17},
      {3, 1000, 3},  {2, 5000, 2},   {1, 9000, 8}, {1, 32000, 2}, {1, 40000, 2}, {2, 300, 1028},
      {3, 6, 2},     {5, 64, 4},     {3, 7, 2},    {4, 3000, 4},  {4, 100, 3},   {3, 50, 6},
      {2, 64, 7},    {2, 1000, 5},   {2, 5, 3},    {3, 8000, 3},
      // Gradients hold 8 packs a thread where 4 need a cluster: f32 at inner 2 on 16 blocks, then
      // beyond (cuda:strided); 16-bit on 8 and 9 blocks.
      {1, 64000, 2}, {1, 70000, 2},
      // cuda:strided's split (long axes over few columns): ragged last chunks (240, 242 and 2
      // positions), an odd inner over several column tiles, more chunks than lanes along the axis.
      {3, 7000, 33}, {2, 4097, 5},  {1, 65537, 3},
      // ... and in 16-byte packs along inner (aligned: whole packs a row; tiles across outer rows).
      {2, 20000, 64}, {2, 20000, 24},
      // ... held in narrower tiles where line-wide ones would need more than 16 blocks: 64 bytes
      // on 16 blocks at inner 64, 48 bytes on 9 at f32's inner 24.
      {2, 8000, 64}, {3, 6000, 24}};
  uint64_t seed = 5000;
  for (OpId id : family_ops(OpFamily::softmax)) {
    if (!single_axis(id)) continue;
    for (DType t : kAllDTypes)
      for (const std::vector<int64_t>& shape : shapes)
        for (bool misaligned : {false, true}) {
          Problem p;
          p.op = id;
          p.sig = {{t, t, t}};
          p.shape = shape;
          p.attrs = {{"axis", 1.0}};
          p.misaligned = misaligned;
          p.seed = seed++;
          ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
        }
  }
}

// cuda:strided reads packs along inner where the tensors allow (f32 pairs at inner 6) and
// single elements where they do not (here: misaligned by an element): the same statistics in the
// same order, so the same bits. The axes are long enough that neither read takes
// cuda:strided_held in any dtype (SoftmaxPathPerRowLength checks the packed reads' path).
TEST_F(Cuda, SoftmaxStridedPacksGiveTheBitsOfSingleElements) {
  const std::vector<std::vector<int64_t>> shapes = {{2, 40000, 64}, {4, 20000, 24}, {2, 80000, 6}};
  for (OpId id : family_ops(OpFamily::softmax)) {
    if (!single_axis(id)) continue;
    for (DType t : kAllDTypes)
      for (const std::vector<int64_t>& shape : shapes) {
        Problem p;
        p.op = id;
        p.sig = {{t, t, t}};
        p.shape = shape;
        p.attrs = {{"axis", 1.0}};
        p.seed = 7100;
        p.device = Device::cuda();
        const Report packed = run_case(p);
        p.misaligned = true;
        const Report single = run_case(p);
        ASSERT_TRUE(packed.status.is_ok() && single.status.is_ok()) << describe(p);
        ASSERT_TRUE(packed.pass) << packed.detail;
        ASSERT_TRUE(single.pass) << single.detail;
        ASSERT_EQ(packed.outputs, single.outputs) << describe(p) << ": packed and single-element reads differ";
      }
  }
}

// Which implementation takes which rows (so that the sweep above covers each of them).
TEST_F(Cuda, SoftmaxPathPerRowLength) {
  struct Expect {
    std::vector<int64_t> shape;
    DType t;
    int64_t axis;
    const char* impl;
  };
  const Expect cases[] = {
      {{64, 3}, DType::f32, -1, "cuda:warp_per_row"},        {{64, 1024}, DType::f32, -1, "cuda:warp_per_row"},
      {{64, 2048}, DType::bf16, -1, "cuda:warp_per_row"},    {{9, 1025}, DType::f32, -1, "cuda:block_per_row"},
      {{2, 32768}, DType::f32, -1, "cuda:cluster_per_row"},  {{2, 131072}, DType::f32, -1, "cuda:cluster_per_row"},
      {{1, 262144}, DType::f32, -1, "cuda:two_pass"},
      {{2, 131072}, DType::bf16, -1, "cuda:cluster_per_row"}, {{1, 262144}, DType::f16, -1, "cuda:cluster_per_row"},
      {{1, 270000}, DType::bf16, -1, "cuda:two_pass"},       {{31, 33}, DType::f32, 0, "cuda:strided_held"},
      {{2, 5000, 2}, DType::f32, 1, "cuda:strided_held"},     {{1, 32000, 2}, DType::f32, 1, "cuda:strided_held"},
      {{1, 70000, 2}, DType::f32, 1, "cuda:strided"},         {{64, 1000, 96}, DType::bf16, 1, "cuda:strided_held"},
      {{8, 32768, 128}, DType::f32, 1, "cuda:strided"},       {{1, 65537, 3}, DType::bf16, 1, "cuda:strided"},
      {{2, 40000, 64}, DType::bf16, 1, "cuda:strided"},       {{4, 20000, 24}, DType::f16, 1, "cuda:strided"},
      {{4, 20000, 24}, DType::f64, 1, "cuda:strided"},      {{2, 80000, 6}, DType::bf16, 1, "cuda:strided"},
  };
  for (const Expect& e : cases) {
    const std::size_t bytes = static_cast<std::size_t>(count_of(e.shape)) * dtype_size(e.t);
    DeviceBuffer dy(bytes), y(bytes), dx(bytes);
    ASSERT_TRUE(dy.base && y.base && dx.base);
    const TensorView vdy(dy.base, e.t, std::span<const int64_t>(e.shape), Device::cuda()),
        vy(y.base, e.t, std::span<const int64_t>(e.shape), Device::cuda()),
        vdx(dx.base, e.t, std::span<const int64_t>(e.shape), Device::cuda());
    const TensorView* ins[] = {&vdy, &vy};
    const TensorView* outs[] = {&vdx};
    const Attribute attrs[] = {{"axis", static_cast<double>(e.axis)}};
    std::string name;
    ASSERT_TRUE(implementation_name("SoftmaxGrad_13", ins, outs, attrs, {}, &name).is_ok());
    EXPECT_EQ(name, e.impl) << "SoftmaxGrad_13 (" << dtype_name(e.t) << ") " << count_of(e.shape) << " elements";
  }
}

// More than 65,535 rows on the block path (the sweeps cover the warp one).
TEST_F(Cuda, SoftmaxMoreThan65535Rows) {
  for (OpId id : {OpId::SoftmaxGrad_13, OpId::LogSoftmax_13}) {
    Problem p;
    p.op = id;
    p.shape = {70001, 300};  // misaligned rows of 300: the block path with ragged ends
    p.misaligned = true;
    ASSERT_NO_FATAL_FAILURE(check_gpu_and_cpu(p));
  }
}

// Tensors at different offsets from a 16-byte boundary: one element per access.
TEST_F(Cuda, SoftmaxPointersAtUnrelatedOffsets) {
  for (DType t : {DType::f32, DType::f16, DType::f64})
    for (OpId id : family_ops(OpFamily::softmax))
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{7, 100}, {7, 300}, {3, 5000}})
        ASSERT_NO_FATAL_FAILURE(check_offsets(id, t, shape, single_axis(id) ? -1 : 1,
                                              {"cuda:warp_per_row", "cuda:block_per_row", "cuda:two_pass",
                                               "cuda:strided"}));
}

TEST_F(Cuda, SoftmaxPointerNotAlignedToItsElementIsUnimplemented) {
  DeviceBuffer buf(4096);
  ASSERT_TRUE(buf.base);
  const int64_t shape[] = {16, 16};
  // 16 x 16 f32 = 1024 bytes each, apart: only the 2-byte offset is wrong.
  const TensorView odd(buf.bytes() + 2, DType::f32, shape, Device::cuda());
  const TensorView even(buf.bytes() + 3072, DType::f32, shape, Device::cuda());
  const TensorView out(buf.bytes() + 1536, DType::f32, shape, Device::cuda());
  const Status s = softmax_grad_13({even, odd, out});
  EXPECT_EQ(s.code(), StatusCode::unimplemented) << s.to_string();
  EXPECT_NE(s.to_string().find("not aligned to its element size"), std::string::npos) << s.to_string();
}

// Same inputs, same bits: every row reduction runs in a fixed order.
TEST_F(Cuda, SoftmaxRepeatedRunsAreBitwiseIdentical) {
  struct Run {
    OpId op;
    DType t;
    std::vector<int64_t> shape;
    int64_t axis;
  };
  const Run runs[] = {
      {OpId::SoftmaxGrad_13, DType::f32, {100, 1000}, -1},   {OpId::SoftmaxGrad_13, DType::f32, {8, 50257}, -1},
      {OpId::LogSoftmaxGrad_13, DType::f16, {4, 131072}, -1}, {OpId::Softmax_13, DType::f32, {2, 262144}, -1},
      {OpId::LogSoftmax_13, DType::f32, {30, 500, 7}, 1},     {OpId::SoftmaxGrad_13, DType::bf16, {3, 20000, 2}, 1},
      {OpId::Softmax_13, DType::f32, {2, 40000, 2}, 1},
  };
  for (const Run& r : runs) {
    Problem p;
    p.op = r.op;
    p.sig = {{r.t, r.t, r.t}};
    p.shape = r.shape;
    p.attrs = {{"axis", static_cast<double>(r.axis)}};
    p.device = Device::cuda();
    ASSERT_NO_FATAL_FAILURE(check_same_bits_every_run(p));
  }
}

// ---- more than 2^31 elements -----------------------------------------------------------------

// [rows, cols, inner] with the softmax over cols: inner 1 is the last axis (a row kernel), inner 2
// the held strided kernel.
void check_grad_over_2pow31(int64_t inner) {
  const int64_t cols = 4096 / inner, rows = (int64_t{1} << 19) + 1, n = rows * cols * inner;  // 2^31 + 4096
  const DType t = DType::bf16;
  if (!enough_memory(3 * n * 2)) GTEST_SKIP() << "not enough device memory";
  DeviceBuffer dy(n * 2), y(n * 2), dx(n * 2);
  ASSERT_TRUE(dy.base && y.base && dx.base);
  // y of softmax magnitude (e^U(-4,4) over cols times its mean), dY ~ U(-1, 1); periods prime to
  // the row length, so that every row differs.
  const std::vector<double> py = pattern(1000003, t, -4, 4, 4, true, 1.0 / (cols * 6.822));
  const std::vector<double> pdy = pattern(999983, t, -1, 1, 5);
  ASSERT_NO_FATAL_FAILURE(fill_periodic(y.base, t, py, n));
  ASSERT_NO_FATAL_FAILURE(fill_periodic(dy.base, t, pdy, n));
  ASSERT_EQ(cudaMemset(dx.base, 0xFF, n * 2), cudaSuccess);
  const int64_t shape[] = {rows, cols, inner};
  ASSERT_TRUE(softmax_grad_13({TensorView(dy.base, t, shape, Device::cuda()),
                               TensorView(y.base, t, shape, Device::cuda()),
                               TensorView(dx.base, t, shape, Device::cuda()), 1})
                  .is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int64_t> check_rows = {0, 1, rows / 2};
  for (int64_t r = rows - 300; r < rows; ++r) check_rows.push_back(r);  // all past element 2^31
  for (int64_t r : check_rows) {
    const std::vector<double> got = download(dx.base, t, r * cols * inner, cols * inner);
    for (int64_t c = 0; c < inner; ++c) {
      double s = 0, s_abs = 0;
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t i = (r * cols + j) * inner + c;
        s += py[i % py.size()] * pdy[i % pdy.size()];
        s_abs += std::fabs(py[i % py.size()] * pdy[i % pdy.size()]);
      }
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t i = (r * cols + j) * inner + c;
        const double yv = py[i % py.size()], gv = pdy[i % pdy.size()], want = yv * (gv - s);
        // One bf16 rounding, plus f32 arithmetic on a sum of `cols` terms (worst case).
        const double tol =
            0x1p-8 * std::fabs(want) + std::fabs(yv) * (cols * 0x1p-24 * s_abs + 0x1p-22 * std::fabs(gv));
        ASSERT_LE(std::fabs(got[j * inner + c] - want), tol) << "dX[" << r << ", " << j << ", " << c << "]";
      }
    }
  }
}

TEST_F(Cuda, SoftmaxGradOver2Pow31Elements) { ASSERT_NO_FATAL_FAILURE(check_grad_over_2pow31(1)); }
TEST_F(Cuda, SoftmaxGradOver2Pow31ElementsOnAMiddleAxis) { ASSERT_NO_FATAL_FAILURE(check_grad_over_2pow31(2)); }

}  // namespace
}  // namespace gradops::check
