// What the CUDA tests of every family share: whether a GPU is visible (the tests report SKIPPED
// otherwise), device buffers, streams, a counting scratch allocator, the GPU-against-CPU check of
// one problem, tensors at unrelated offsets, and the fills for tensors of more than 2^31 elements.
// Element storage is the harness's (harness/host_tensor.hpp).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "harness/checker.hpp"
#include "harness/host_tensor.hpp"

namespace gradops::check {

inline bool gpu_visible() {
  static const bool visible = [] {
    int n = 0;
    const bool ok = cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
    (void)cudaGetLastError();
    return ok;
  }();
  return visible;
}

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!gpu_visible()) GTEST_SKIP() << "no CUDA device is visible";
  }
};

inline std::vector<OpId> family_ops(OpFamily f) {
  std::vector<OpId> ops;
  for (const OpSchema& s : op_schemas())
    if (s.family == f) ops.push_back(s.id);
  return ops;
}

inline int64_t count_of(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

inline bool single_axis(OpId id) {
  return id == OpId::SoftmaxGrad_13 || id == OpId::LogSoftmaxGrad_13 || id == OpId::Softmax_13 ||
         id == OpId::LogSoftmax_13;
}

// |a - b| within twice the oracle tolerance (each side is within one of the exact value).
inline bool close(double a, double b, const Tolerance& t) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(a - b) <= 2 * (t.abs + t.rel * std::fabs(b));
}

// The same problem (same seed, so the same inputs) on the GPU and on the CPU: each against the
// oracle, then against each other.
inline void check_gpu_and_cpu(Problem p) {
  p.device = Device::cuda();
  const Report gpu = run_case(p);
  ASSERT_TRUE(gpu.status.is_ok()) << describe(p) << ": " << gpu.status.to_string();
  ASSERT_TRUE(gpu.pass) << gpu.detail;
  Problem c = p;
  c.device = Device::cpu();
  c.cuda_stream = nullptr;
  const Report cpu = run_case(c);
  ASSERT_TRUE(cpu.pass) << cpu.detail;
  ASSERT_EQ(gpu.outputs.size(), cpu.outputs.size());
  for (std::size_t o = 0; o < gpu.outputs.size(); ++o) {
    ASSERT_EQ(gpu.outputs[o].size(), cpu.outputs[o].size());
    const Tolerance tol = tolerance(p, static_cast<int>(o));
    for (std::size_t e = 0; e < gpu.outputs[o].size(); ++e)
      ASSERT_TRUE(close(gpu.outputs[o][e], cpu.outputs[o][e], tol))
          << describe(p) << ": output " << o << "[" << e << "] is " << gpu.outputs[o][e] << " on the GPU and "
          << cpu.outputs[o][e] << " on the CPU";
  }
}

// p run `runs` times on one prepared case (outputs poisoned before each run): every run matches
// the oracle and has run 0's bits.
inline void check_same_bits_every_run(const Problem& p, int runs = 3) {
  Case c(p);
  std::vector<std::vector<double>> first;
  for (int rep = 0; rep < runs; ++rep) {
    c.poison_outputs();
    ASSERT_TRUE(c.run().is_ok()) << describe(p);
    const Report r = c.compare();
    ASSERT_TRUE(r.pass) << r.detail;
    if (rep == 0) first = r.outputs;
    else ASSERT_EQ(r.outputs, first) << describe(p) << ": run " << rep << " differs from run 0";
  }
}

// ---- hand-made buffers and streams ---------------------------------------------------------

struct DeviceBuffer {
  void* base = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (cudaMalloc(&base, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      base = nullptr;
    }
  }
  ~DeviceBuffer() {
    if (base) (void)cudaFree(base);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::byte* bytes() const { return static_cast<std::byte*>(base); }
};

// A stream of the test's own (non-blocking by default: it does not wait for the legacy default
// stream), destroyed with the test.
struct Stream {
  cudaStream_t stream = nullptr;
  explicit Stream(unsigned flags = cudaStreamNonBlocking) {
    if (cudaStreamCreateWithFlags(&stream, flags) != cudaSuccess) {
      (void)cudaGetLastError();
      stream = nullptr;
    }
  }
  ~Stream() {
    if (stream) (void)cudaStreamDestroy(stream);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
};

// Holds a stream shut: work queued after it waits until open() (or 30 s, so that a call that
// wrongly waits for the stream fails instead of hanging). A host function blocking the stream is
// deterministic where a queue of copies ahead is only likely to outlast the host's calls.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t s) : stream_(s) {
    if (cudaLaunchHostFunc(s, &StreamGate::hold, state_.get()) != cudaSuccess) {
      (void)cudaGetLastError();
      state_->failed = true;
    }
  }
  // The host function reads the state: it must have run before the state goes.
  ~StreamGate() {
    open();
    (void)cudaStreamSynchronize(stream_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;
  bool ok() const { return !state_->failed; }
  // Lets the stream go on; true where it was still held (the gate had not timed out).
  bool open() {
    state_->open.store(true);
    return !state_->timed_out.load();
  }

 private:
  struct State {
    std::atomic<bool> open{false}, timed_out{false};
    bool failed = false;
  };
  static void hold(void* p) {
    auto* st = static_cast<State*>(p);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!st->open.load()) {
      if (std::chrono::steady_clock::now() > until) {
        st->timed_out.store(true);
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  cudaStream_t stream_;
  std::unique_ptr<State> state_ = std::make_unique<State>();
};

// A context allocator over cudaMalloc/cudaFree that counts its calls: scratch must come from the
// context's allocator when one is given, and every allocation must go back to it.
struct CountingAllocator {
  int allocations = 0, releases = 0;
  static void* allocate(void* user, Device, std::size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    ++static_cast<CountingAllocator*>(user)->allocations;
    return p;
  }
  static void release(void* user, Device, void* p, std::size_t) {
    (void)cudaFree(p);
    ++static_cast<CountingAllocator*>(user)->releases;
  }
  WorkspaceAllocator allocator() { return {allocate, release, this}; }
};

// ---- tensors at unrelated offsets ---------------------------------------------------------------

// Tensors whose pointers sit at different offsets from a 16-byte boundary take the one-element
// paths; each tensor here starts its own number of elements past a 256-byte boundary.
// impl, if given, receives the implementation that ran; each tensor's offset is its own number
// of elements past a 256-byte boundary: offsets[k % offsets.size()] for the k-th tensor.
inline void check_offsets(OpId id, DType t, const std::vector<int64_t>& shape, int64_t axis,
                          std::vector<std::string> allowed = {}, std::string* impl_out = nullptr,
                          std::vector<int> offsets = {1, 2, 0}, std::vector<bool> skip_output = {}) {
  Problem p;
  p.op = id;
  p.sig = {{t, t, t}};
  p.shape = shape;
  if (op_schema(id).find_attribute("axis") >= 0) p.attrs = {{"axis", static_cast<double>(axis)}};
  const OpSchema& op = op_schema(id);
  const oracle::Attrs attrs = full_attrs(p);
  std::vector<DType> in_types(op.inputs.size(), t);
  oracle::Rng rng(42);
  const oracle::Tensors in = oracle::make_inputs(op.name, shape, attrs, in_types, rng);
  const oracle::Tensors expected = oracle::reference(op.name, in, attrs);
  const std::size_t es = dtype_size(t);
  int offset = 0;
  std::vector<std::unique_ptr<DeviceBuffer>> bufs;
  std::vector<TensorView> views;
  std::vector<const TensorView*> ins, outs;
  views.reserve(16);  // stable addresses: ins and outs point into it
  auto make = [&](const oracle::Tensor& v, bool upload) -> TensorView {
    const std::size_t n = static_cast<std::size_t>(v.numel());
    bufs.push_back(std::make_unique<DeviceBuffer>(n * es + 256));
    std::byte* data = bufs.back()->bytes() + offsets[offset++ % offsets.size()] * es;
    std::vector<std::byte> host(n * es, std::byte{0xFF});          // outputs start poisoned
    if (upload)
      for (std::size_t e = 0; e < n; ++e) store(t, host.data() + e * es, v.v[e]);
    EXPECT_EQ(cudaMemcpy(data, host.data(), n * es, cudaMemcpyHostToDevice), cudaSuccess);
    return TensorView(data, t, std::span<const int64_t>(v.shape), Device::cuda());
  };
  std::vector<int> out_view;  // index into views, or -1 for an absent output
  for (const auto& v : in) {
    if (!v) {
      ins.push_back(nullptr);
      continue;
    }
    views.push_back(make(*v, true));
    ins.push_back(&views.back());
  }
  for (std::size_t o = 0; o < expected.size(); ++o) {
    const auto& v = expected[o];
    if (!v || (o < skip_output.size() && skip_output[o])) {
      outs.push_back(nullptr);
      out_view.push_back(-1);
      continue;
    }
    views.push_back(make(*v, false));
    outs.push_back(&views.back());
    out_view.push_back(static_cast<int>(views.size()) - 1);
  }
  std::vector<Attribute> attr_list;
  for (const auto& [k, v] : attrs) attr_list.push_back({k, v});
  std::string impl;
  ASSERT_TRUE(implementation_name(op.name, ins, outs, attr_list, {}, &impl).is_ok());
  if (impl_out) *impl_out = impl;
  if (!allowed.empty()) EXPECT_NE(std::find(allowed.begin(), allowed.end(), impl), allowed.end()) << impl;
  const Status s = run(op.name, ins, outs, attr_list, {});
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (std::size_t o = 0; o < expected.size(); ++o) {
    if (out_view[o] < 0) continue;
    const std::size_t n = static_cast<std::size_t>(expected[o]->numel());
    std::vector<std::byte> host(n * es);
    ASSERT_EQ(cudaMemcpy(host.data(), views[out_view[o]].data, n * es, cudaMemcpyDeviceToHost), cudaSuccess);
    const Tolerance tol = tolerance(p, static_cast<int>(o));
    for (std::size_t e = 0; e < n; ++e) {
      const double got = load(t, host.data() + e * es), want = expected[o]->v[e];
      ASSERT_TRUE(std::fabs(got - want) <= tol.abs + tol.rel * std::fabs(want))
          << describe(p) << " (" << impl << "): output " << o << "[" << e << "] = " << got << ", expected " << want;
    }
  }
}

// ---- more than 2^31 elements -----------------------------------------------------------------

// Fills n elements with pattern[i % pattern.size()]: the pattern once, then doubling copies.
inline void fill_periodic(void* dst, DType t, const std::vector<double>& pattern, int64_t n) {
  const std::size_t es = dtype_size(t);
  std::vector<std::byte> host(pattern.size() * es);
  for (std::size_t i = 0; i < pattern.size(); ++i) store(t, host.data() + i * es, pattern[i]);
  auto* d = static_cast<std::byte*>(dst);
  int64_t filled = std::min<int64_t>(n, static_cast<int64_t>(pattern.size()));
  ASSERT_EQ(cudaMemcpy(d, host.data(), filled * es, cudaMemcpyHostToDevice), cudaSuccess);
  while (filled < n) {
    const int64_t k = std::min(filled, n - filled);
    ASSERT_EQ(cudaMemcpy(d + filled * es, d, k * es, cudaMemcpyDeviceToDevice), cudaSuccess);
    filled += k;
  }
}

inline std::vector<double> pattern(std::size_t size, DType t, double lo, double hi, uint64_t seed, bool exp_of = false,
                            double scale = 1) {
  oracle::Rng rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(size);
  for (double& x : v) x = oracle::round_to(t, exp_of ? std::exp(u(rng)) * scale : u(rng));
  return v;
}

inline std::vector<double> download(const void* src, DType t, int64_t first, int64_t count) {
  const std::size_t es = dtype_size(t);
  std::vector<std::byte> host(static_cast<std::size_t>(count) * es);
  EXPECT_EQ(cudaMemcpy(host.data(), static_cast<const std::byte*>(src) + first * es, host.size(),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  std::vector<double> v(static_cast<std::size_t>(count));
  for (int64_t i = 0; i < count; ++i) v[i] = load(t, host.data() + i * es);
  return v;
}

inline bool enough_memory(std::size_t bytes) {
  std::size_t free_bytes = 0, total = 0;
  return cudaMemGetInfo(&free_bytes, &total) == cudaSuccess && free_bytes > bytes + (1ull << 30);
}

}  // namespace gradops::check
