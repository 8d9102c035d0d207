// The CUDA backend's stream contract, across families: work is queued on the caller's stream
// behind what is already there, and no call waits for it. Reports SKIPPED where no GPU is visible.
#include "cuda_support.hpp"

namespace gradops::check {
namespace {

// A chain of three ops on a stream the test creates, behind ~64 copies that produce the first
// input: each op must wait for the work before it on that stream, and return before it has run.
// Only that stream is synchronized before the results are read.
TEST_F(Cuda, WorkIsOrderedOnTheCallersStreamAndNotWaitedFor) {
  const int64_t rows = 4096, cols = 4096, n = rows * cols;
  const DType t = DType::f32;
  DeviceBuffer src(n * 4), x(n * 4), dy(n * 4), relu_out(n * 4), x2(n * 4), b(cols * 4), dx2(n * 4), db(cols * 4),
      y3(n * 4), dx3(n * 4);
  for (auto* buf : {&src, &x, &dy, &relu_out, &x2, &b, &dx2, &db, &y3, &dx3}) ASSERT_TRUE(buf->base);
  auto host_pattern = [&](int64_t count, double lo, double hi, uint64_t seed, bool softmax_like = false) {
    std::vector<double> v = pattern(static_cast<std::size_t>(count), t, lo, hi, seed, softmax_like,
                                    softmax_like ? 1.0 / (cols * 6.822) : 1.0);
    return v;
  };
  const std::vector<double> hsrc = host_pattern(n, -2, 2, 11), hdy = host_pattern(n, -1, 1, 12),
                            hx2 = host_pattern(n, -3, 3, 13), hb = host_pattern(cols, -1, 1, 14),
                            hy3 = host_pattern(n, -4, 4, 15, true);
  auto upload = [&](void* dst, const std::vector<double>& v) {
    ASSERT_NO_FATAL_FAILURE(fill_periodic(dst, t, v, static_cast<int64_t>(v.size())));
  };
  ASSERT_NO_FATAL_FAILURE(upload(src.base, hsrc));
  ASSERT_NO_FATAL_FAILURE(upload(dy.base, hdy));
  ASSERT_NO_FATAL_FAILURE(upload(x2.base, hx2));
  ASSERT_NO_FATAL_FAILURE(upload(b.base, hb));
  ASSERT_NO_FATAL_FAILURE(upload(y3.base, hy3));
  ASSERT_EQ(cudaMemset(x.base, 0, n * 4), cudaSuccess);  // until the copies land, ReluGrad sees zeros
  for (auto* out : {&relu_out, &dx2, &db, &dx3})
    ASSERT_EQ(cudaMemset(out->base, 0xFF, out == &db ? cols * 4 : n * 4), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const Stream owned;  // non-blocking
  ASSERT_TRUE(owned.stream) << "cudaStreamCreateWithFlags failed";
  cudaStream_t stream = owned.stream;
  Context ctx;
  ctx.cuda_stream = stream;
  const int64_t shape[] = {rows, cols}, bshape[] = {cols};
  auto view = [&](const DeviceBuffer& buf, bool bias = false) {
    return bias ? TensorView(buf.base, t, bshape, Device::cuda()) : TensorView(buf.base, t, shape, Device::cuda());
  };
  auto chain = [&]() {
    EXPECT_TRUE(relu_grad({view(dy), view(x), view(relu_out)}, ctx).is_ok());
    EXPECT_TRUE(bias_gelu_grad({view(relu_out), view(x2), view(b, true), view(dx2), view(db, true)}, ctx).is_ok());
    EXPECT_TRUE(softmax_grad_13({view(dx2), view(y3), view(dx3)}, ctx).is_ok());
  };
  chain();  // loads the kernels, so that the timed chain below is only launches
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  for (auto* out : {&relu_out, &dx2, &dx3}) ASSERT_EQ(cudaMemsetAsync(out->base, 0xFF, n * 4, stream), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.base, 0, n * 4, stream), cudaSuccess);
  for (int i = 0; i < 64; ++i) ASSERT_EQ(cudaMemcpyAsync(x.base, src.base, n * 4, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
  chain();
  EXPECT_EQ(cudaStreamQuery(stream), cudaErrorNotReady) << "gradops waited for the stream";
  (void)cudaGetLastError();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);

  // The same chain on the CPU, from the same values.
  std::vector<float> cx(n), cdy(n), cx2(n), cb(cols), cy3(n), c_relu(n), cdx2(n), cdb(cols), cdx3(n);
  for (int64_t i = 0; i < n; ++i) cx[i] = static_cast<float>(hsrc[i]), cdy[i] = static_cast<float>(hdy[i]),
                                  cx2[i] = static_cast<float>(hx2[i]), cy3[i] = static_cast<float>(hy3[i]);
  for (int64_t j = 0; j < cols; ++j) cb[j] = static_cast<float>(hb[j]);
  auto hview = [&](const std::vector<float>& v, bool bias = false) {
    return bias ? TensorView(v.data(), t, bshape) : TensorView(v.data(), t, shape);
  };
  ASSERT_TRUE(relu_grad({hview(cdy), hview(cx), hview(c_relu)}).is_ok());
  ASSERT_TRUE(bias_gelu_grad({hview(c_relu), hview(cx2), hview(cb, true), hview(cdx2), hview(cdb, true)}).is_ok());
  ASSERT_TRUE(softmax_grad_13({hview(cdx2), hview(cy3), hview(cdx3)}).is_ok());

  const std::vector<double> g_dx3 = download(dx3.base, t, 0, n), g_db = download(db.base, t, 0, cols);
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale += std::fabs(cdx3[i]) / n;
  ASSERT_GT(scale, 0);
  for (int64_t i = 0; i < n; ++i)
    ASSERT_LE(std::fabs(g_dx3[i] - cdx3[i]), 1e-4 * (std::fabs(cdx3[i]) + scale)) << "dX of the chain's end at " << i;
  double db_scale = 0;
  for (int64_t j = 0; j < cols; ++j) db_scale += std::fabs(cdb[j]) / cols;
  for (int64_t j = 0; j < cols; ++j)
    ASSERT_LE(std::fabs(g_db[j] - cdb[j]), 1e-4 * (std::fabs(cdb[j]) + db_scale)) << "dB[" << j << "]";
}

}  // namespace
}  // namespace gradops::check
