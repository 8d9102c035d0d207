// Regression tests for what a poisoned, guard-banded sweep of the C ABI found: attribute names
// and values that were silently accepted, a CPU device index other than 0, out-of-memory messages
// naming another op, size arithmetic that overflowed, and the C++ and C entry points disagreeing
// on a CUDA call without a driver. Every rejected call must leave every byte untouched.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "gradops/gradops.h"
#include "harness/call_buffers.hpp"
#include "harness/checker.hpp"

#if defined(GRADOPS_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

namespace gradops::testing {
namespace {

const std::vector<int64_t> kShape = {2, 3, 5};
constexpr double kInf = std::numeric_limits<double>::infinity();

CallSpec valid(const OpSchema& op, const oracle::Attrs& overrides = {}) {
  return valid_call(op, kShape, op.signatures[0], overrides);
}

// The same call through the C ABI, on CallBuffers' storage.
struct CCall {
  std::vector<gradops_tensor> in, out;
  std::vector<const gradops_tensor*> in_ptr, out_ptr;
  std::vector<gradops_attribute> attrs;

  explicit CCall(const CallBuffers& b) {
    auto to_c = [](const TensorView& v) {
      gradops_tensor t{};
      t.data = v.data;
      t.device = {static_cast<int32_t>(v.device.type), v.device.index};
      t.rank = v.rank;
      t.dtype = static_cast<int32_t>(v.dtype);
      t.shape = v.dims.data();
      return t;
    };
    in.reserve(b.in_ptr.size());
    out.reserve(b.out_ptr.size());
    for (const TensorView* v : b.in_ptr) {
      in.push_back(v ? to_c(*v) : gradops_tensor{});
      in_ptr.push_back(v ? &in.back() : nullptr);
    }
    for (const TensorView* v : b.out_ptr) {
      out.push_back(v ? to_c(*v) : gradops_tensor{});
      out_ptr.push_back(v ? &out.back() : nullptr);
    }
    for (const Attribute& a : b.attrs) attrs.push_back({a.name.data(), a.value});
  }
  gradops_status run(const char* op) const {
    return gradops_run(op, in_ptr.data(), in_ptr.size(), out_ptr.data(), out_ptr.size(), attrs.data(),
                       attrs.size(), nullptr);
  }
  gradops_status implementation(const char* op) const {
    char name[128];
    return gradops_implementation_name(op, in_ptr.data(), in_ptr.size(), out_ptr.data(), out_ptr.size(),
                                       attrs.data(), attrs.size(), nullptr, name, sizeof name);
  }
};

bool starts_with_op(const std::string& m, std::string_view op) { return m.rfind(std::string(op) + ": ", 0) == 0; }

// Rejected through gradops::run and gradops_run alike, by name, with nothing written.
void expect_rejected_everywhere(const CallSpec& spec, const std::string& must_contain,
                                StatusCode code = StatusCode::invalid_argument) {
  const std::string op(spec.op->name);
  {
    CallBuffers b(spec);
    const Status s = b.run();
    EXPECT_EQ(s.code(), code) << op << " (C++): " << s.to_string();
    EXPECT_TRUE(starts_with_op(s.message(), op)) << s.message();
    EXPECT_NE(s.message().find(must_contain), std::string::npos) << "no \"" << must_contain << "\": " << s.message();
    EXPECT_EQ(b.changed_bytes(), "") << op << " (C++): a rejected call wrote to memory";
  }
  {
    CallBuffers b(spec);
    const CCall c(b);
    const gradops_status s = c.run(op.c_str());
    const std::string m = gradops_last_error();
    EXPECT_EQ(static_cast<int>(s), static_cast<int>(code)) << op << " (C): " << m;
    EXPECT_TRUE(starts_with_op(m, op)) << m;
    EXPECT_NE(m.find(must_contain), std::string::npos) << "no \"" << must_contain << "\": " << m;
    EXPECT_EQ(b.changed_bytes(), "") << op << " (C): a rejected call wrote to memory";
  }
}

void expect_accepted(const CallSpec& spec) {
  CallBuffers b(spec);
  const Status s = b.run();
  EXPECT_TRUE(s.is_ok()) << spec.op->name << ": " << s.to_string();
  EXPECT_EQ(b.changed_guards(), "") << spec.op->name;
}

// ---- unknown and misspelled attributes ------------------------------------------------------

TEST(StrictAttributes, UnknownNameIsRejectedByEveryOp) {
  for (const OpSchema& op : op_schemas()) {
    SCOPED_TRACE(std::string(op.name));
    CallSpec c = valid(op);
    c.attrs.emplace_back("no_such_attribute", 1.0);
    expect_rejected_everywhere(c, "'no_such_attribute'");
  }
}

// The case from the issue, and its analogue for each op that has attributes: a wrong case of a
// real name must not run with the default.
TEST(StrictAttributes, MisspelledNameIsRejected) {
  {
    CallSpec c = valid(*find_op("LeakyReluGrad"));
    c.attrs = {{"Alpha", 0.5}};
    expect_rejected_everywhere(c, "'Alpha'");
  }
  for (const OpSchema& op : op_schemas()) {
    for (const AttrSchema& a : op.attributes) {
      SCOPED_TRACE(std::string(op.name) + "." + std::string(a.name));
      std::string wrong(a.name);
      wrong[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(wrong[0])));
      CallSpec c = valid(op);
      c.attrs.emplace_back(wrong, a.default_value);
      expect_rejected_everywhere(c, "'" + wrong + "'");
    }
  }
}

// ---- attribute ranges -----------------------------------------------------------------------

struct RangeCase {
  const char* op;
  const char* attr;
  double value;
};

TEST(AttributeRanges, OutOfRangeValuesAreRejected) {
  const RangeCase cases[] = {
      {"LayerNormalization", "epsilon", -1e-5},
      {"LayerNormalization", "epsilon", -kInf},
      {"LayerNormalization", "epsilon", kInf},
      {"SimplifiedLayerNormalization", "epsilon", -1e-5},
      {"SimplifiedLayerNormalization", "epsilon", -kInf},
      {"QuickGeluGrad", "alpha", kInf},
      {"QuickGeluGrad", "alpha", -kInf},
      {"QuickGelu", "alpha", kInf},
      {"LeakyReluGrad", "alpha", 1e39},   // finite as a double, infinite as the f32 it becomes
      {"LeakyReluGrad", "alpha", 3.5e38},
      {"LeakyReluGrad", "alpha", -0.5},
      {"LeakyRelu", "alpha", -1e39},
      {"BatchNormInternal", "momentum", -5},
      {"BatchNormInternal", "momentum", 1.5},
      {"BatchNormInternal", "momentum", kInf},
      {"BatchNormInternal", "epsilon", -1},
      {"BatchNormalizationGrad", "epsilon", -1},
      {"BatchNormalizationGrad", "epsilon", kInf},
  };
  for (const RangeCase& r : cases) {
    SCOPED_TRACE(std::string(r.op) + "." + r.attr + " = " + std::to_string(r.value));
    const OpSchema& op = *find_op(r.op);
    CallSpec c = valid(op);
    for (auto& [k, v] : c.attrs)
      if (k == r.attr) v = r.value;
    expect_rejected_everywhere(c, std::string("attribute '") + r.attr + "'");
    CallBuffers b(c);
    EXPECT_NE(b.run().message().find("expected"), std::string::npos) << "the message must say what is valid";
  }
}

// The ends of each range are valid calls.
TEST(AttributeRanges, RangeEndsAreAccepted) {
  const RangeCase cases[] = {
      {"LayerNormalization", "epsilon", 0},
      {"SimplifiedLayerNormalization", "epsilon", 0},
      {"LeakyReluGrad", "alpha", 0},
      {"LeakyReluGrad", "alpha", std::numeric_limits<float>::max()},
      {"LeakyRelu", "alpha", -std::numeric_limits<float>::max()},
      {"QuickGeluGrad", "alpha", -100},
      {"BatchNormInternal", "momentum", 0},
      {"BatchNormInternal", "momentum", 1},
      {"BatchNormalizationGrad", "epsilon", 0},
  };
  for (const RangeCase& r : cases) {
    SCOPED_TRACE(std::string(r.op) + "." + r.attr + " = " + std::to_string(r.value));
    expect_accepted(valid(*find_op(r.op), {{r.attr, r.value}}));
  }
}

// Every FLOAT attribute of every op rejects NaN and both infinities; the table documents a range
// for each and the message quotes it.
TEST(AttributeRanges, EveryFloatAttributeRejectsNonFinite) {
  for (const OpSchema& op : op_schemas())
    for (const AttrSchema& a : op.attributes) {
      if (a.type != AttrType::float32) continue;
      for (double v : {std::nan(""), kInf, -kInf}) {
        SCOPED_TRACE(std::string(op.name) + "." + std::string(a.name) + " = " + std::to_string(v));
        CallSpec c = valid(op);
        for (auto& [k, x] : c.attrs)
          if (k == a.name) x = v;
        expect_rejected_everywhere(c, "attribute '" + std::string(a.name) + "'");
      }
    }
}

// The table's data: every attribute's default lies in its documented range, and every range
// excludes NaN and the infinities.
TEST(AttributeRanges, DefaultsLieInTheirRanges) {
  for (const OpSchema& op : op_schemas())
    for (const AttrSchema& a : op.attributes) {
      SCOPED_TRACE(std::string(op.name) + "." + std::string(a.name));
      if (!a.required) {
        EXPECT_TRUE(a.in_range(a.default_value));
      }
      EXPECT_FALSE(a.in_range(std::nan("")));
      EXPECT_FALSE(a.in_range(kInf));
      EXPECT_FALSE(a.in_range(-kInf));
      EXPECT_LE(a.min, a.max);
    }
}

// ---- device indices -------------------------------------------------------------------------

TEST(DeviceIndex, CpuTensorsMustBeOnIndexZero) {
  for (const OpSchema& op : op_schemas()) {
    SCOPED_TRACE(std::string(op.name));
    CallSpec c = valid(op);
    for (ArgSpec& a : c.in) a.device = {DeviceType::cpu, 5};
    for (ArgSpec& a : c.out) a.device = {DeviceType::cpu, 5};
    expect_rejected_everywhere(c, "cpu:5");
    CallSpec neg = valid(op);
    for (ArgSpec& a : neg.in) a.device = {DeviceType::cuda, -1};
    for (ArgSpec& a : neg.out) a.device = {DeviceType::cuda, -1};
    expect_rejected_everywhere(neg, "cuda:-1");
  }
}

// ---- out of memory --------------------------------------------------------------------------

void* no_memory(void*, Device, std::size_t) { return nullptr; }

// Every op whose CPU path takes scratch reports a failed allocation as out_of_memory under its
// own name (BiasFastGeluGrad_dX used to say BiasGeluGrad_dX, Softmax_13 said Softmax).
TEST(OutOfMemory, MessageNamesTheOpThatWasCalled) {
  const WorkspaceAllocator failing{no_memory, nullptr, nullptr};
  Context ctx;
  ctx.allocator = &failing;
  for (const char* must_fail : {"BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "Softmax", "Softmax_13"}) {
    CallBuffers b(valid(*find_op(must_fail)));
    const Status s = b.run(ctx);
    EXPECT_EQ(s.code(), StatusCode::out_of_memory) << must_fail << ": " << s.to_string();
    EXPECT_TRUE(starts_with_op(s.message(), must_fail)) << s.message();
    EXPECT_EQ(b.changed_bytes(), "") << must_fail;
  }
  for (const OpSchema& op : op_schemas()) {
    CallBuffers b(valid(op));
    const Status s = b.run(ctx);
    if (s.code() != StatusCode::out_of_memory) continue;
    EXPECT_TRUE(starts_with_op(s.message(), op.name)) << s.message();
  }
}

// ---- size arithmetic ------------------------------------------------------------------------

// Dims whose product passes 2^63 with explicit strides: the dense-stride check must not overflow
// (UBSan's signed-overflow check aborts here if it does) and the call is rejected for its size.
TEST(SizeArithmetic, CStridesOfHugeDimsDoNotOverflow) {
  static float x[4], dy[4], dx[4];
  const int64_t huge = int64_t{1} << 40;
  const int64_t shape[3] = {huge, huge, huge};
  const int64_t strides[3] = {0, huge, 1};  // 0: what the wrapped product of the dims gives
  gradops_tensor tdy{dy, {GRADOPS_DEVICE_CPU, 0}, 3, GRADOPS_DTYPE_F32, shape, strides};
  gradops_tensor tx{x, {GRADOPS_DEVICE_CPU, 0}, 3, GRADOPS_DTYPE_F32, shape, strides};
  gradops_tensor tdx{dx, {GRADOPS_DEVICE_CPU, 0}, 3, GRADOPS_DTYPE_F32, shape, strides};
  const gradops_tensor* in[2] = {&tdy, &tx};
  const gradops_tensor* out[1] = {&tdx};
  EXPECT_EQ(gradops_run("ReluGrad", in, 2, out, 1, nullptr, 0, nullptr), GRADOPS_INVALID_ARGUMENT);
  EXPECT_TRUE(starts_with_op(gradops_last_error(), "ReluGrad")) << gradops_last_error();
  // An empty tensor with the same huge dims: its dense strides are checked as far as they fit in
  // int64, and the outer ones (which address nothing) are not computed.
  const int64_t empty_shape[4] = {0, huge, huge, huge};
  const int64_t empty_strides[4] = {0, 0, huge, 1};
  gradops_tensor e{nullptr, {GRADOPS_DEVICE_CPU, 0}, 4, GRADOPS_DTYPE_F32, empty_shape, empty_strides};
  const gradops_tensor* ein[2] = {&e, &e};
  const gradops_tensor* eout[1] = {&e};
  EXPECT_EQ(gradops_run("ReluGrad", ein, 2, eout, 1, nullptr, 0, nullptr), GRADOPS_OK) << gradops_last_error();
}

// An empty BatchNorm batch whose other dims multiply past int64: the per-channel spatial size must
// be computed without overflow, and the call behaves as any empty batch (running statistics pass
// through, saved mean 0, saved inverse std 1/sqrt(epsilon)).
TEST(SizeArithmetic, EmptyBatchNormWithHugeDims) {
  const int64_t huge = int64_t{1} << 40;
  for (bool last : {false, true}) {
    SCOPED_TRACE(last ? "channels_last" : "NCHW");
    const std::vector<int64_t> shape = last ? std::vector<int64_t>{0, huge, huge, 3} : std::vector<int64_t>{0, 3, huge, huge};
    std::vector<float> scale = {1, 2, 3}, b = {0, 0, 0}, rm = {1, 2, 3}, rv = {4, 5, 6}, sm(3, NAN), si(3, NAN);
    BatchNormTrainingArgs a;
    a.x = TensorView(nullptr, DType::f32, std::span<const int64_t>(shape));
    a.y = a.x;
    a.scale = TensorView::of(scale.data(), {3}), a.bias = TensorView::of(b.data(), {3});
    a.input_mean = TensorView::of(rm.data(), {3}), a.running_mean = a.input_mean;
    a.input_var = TensorView::of(rv.data(), {3}), a.running_var = a.input_var;
    a.saved_mean = TensorView::of(sm.data(), {3}), a.saved_inv_std = TensorView::of(si.data(), {3});
    a.epsilon = 0.25f;
    a.channels_last = last;
    const Status s = batch_norm_training(a);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    for (int ch = 0; ch < 3; ++ch) {
      EXPECT_EQ(sm[ch], 0.0f);
      EXPECT_EQ(si[ch], 2.0f);
      EXPECT_EQ(rm[ch], static_cast<float>(ch + 1));
    }
  }
}

// ---- unaligned element access -------------------------------------------------------------

// Base pointers that are not a multiple of the element size (the header allows any alignment):
// every op and signature still matches the oracle, in the vector body and the tail. The result was
// right before too, but through misaligned typed loads and stores that UBSan reports (and the
// compiler may break); scripts/sanitize.sh runs this with -fsanitize=alignment, no recovery.
TEST(Alignment, BytewiseMisalignedBuffersMatchTheOracle) {
  for (const OpSchema& op : op_schemas())
    for (const TypeSignature& sig : op.signatures)
      for (int offset : {1, 3}) {
        check::Problem p;
        p.op = op.id;
        p.sig = sig;
        p.shape = op.family == OpFamily::batch_norm ? std::vector<int64_t>{2, 3, 37} : std::vector<int64_t>{3, 37};
        p.misalign_bytes = offset;
        const check::Report r = check::run_case(p);
        EXPECT_TRUE(r.pass) << r.detail;
      }
}

// ---- concurrent callers ---------------------------------------------------------------------

// Eight threads call every op at once (valid calls, and rejected ones through the C ABI, whose
// error message is per thread): each valid call gives the bytes of a serial run, each error its
// own message. scripts/sanitize.sh runs this under ASan; docs/robustness.md reports it under TSan.
TEST(Concurrency, CallersOnManyThreadsGiveTheSerialBytes) {
  std::vector<CallSpec> specs;
  std::vector<std::vector<std::vector<std::byte>>> serial;
  for (const OpSchema& op : op_schemas()) {
    specs.push_back(valid_call(op, {3, 4, 67}, op.signatures[op.signatures.size() - 1]));
    CallBuffers b(specs.back());
    ASSERT_TRUE(b.run().is_ok()) << op.name;
    serial.emplace_back();
    for (std::size_t o = 0; o < specs.back().out.size(); ++o)
      serial.back().push_back(specs.back().out[o].present ? b.output_bytes(o) : std::vector<std::byte>{});
  }
  constexpr int kThreads = 8;
  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      Context ctx;
      ctx.num_threads = 1 + t % 2;
      for (int round = 0; round < 2 && errors[t].empty(); ++round)
        for (std::size_t i = 0; i < specs.size(); ++i) {
          const std::size_t k = (i + static_cast<std::size_t>(t) * 5) % specs.size();
          const std::string op(specs[k].op->name);
          CallBuffers b(specs[k]);
          if (const Status s = b.run(ctx); !s) {
            errors[t] = op + ": " + s.to_string();
            return;
          }
          for (std::size_t o = 0; o < specs[k].out.size(); ++o)
            if (specs[k].out[o].present && b.output_bytes(o) != serial[k][o]) {
              errors[t] = op + ": output " + std::to_string(o) + " differs from the serial run";
              return;
            }
          CallSpec bad = specs[k];
          bad.attrs.emplace_back("thread_" + std::to_string(t), 1.0);
          CallBuffers bb(bad);
          const CCall c(bb);
          if (c.run(op.c_str()) != GRADOPS_INVALID_ARGUMENT ||
              std::string(gradops_last_error()).find("thread_" + std::to_string(t)) == std::string::npos) {
            errors[t] = op + ": the C error message is not this thread's: " + gradops_last_error();
            return;
          }
        }
    });
  for (std::thread& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(errors[t], "") << "thread " << t;
}

// ---- CUDA calls: running and resolving agree ------------------------------------------------

// gradops_run and gradops_implementation_name (and their C++ counterparts) give the same status
// for a call on CUDA tensors: unimplemented without the backend, device_error without a usable
// driver (implementation_name used to say ok there). With a GPU the CUDA tests cover it.
TEST(CudaConsistency, RunAndImplementationNameAgree) {
#if defined(GRADOPS_HAVE_CUDA)
  int devices = 0;
  const bool have_gpu = cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0;
  (void)cudaGetLastError();
  if (have_gpu) GTEST_SKIP() << "a GPU is present: the CUDA tests cover these calls";
  const StatusCode want = StatusCode::device_error;
#else
  const StatusCode want = StatusCode::unimplemented;
#endif
  for (const OpSchema& op : op_schemas()) {
    SCOPED_TRACE(std::string(op.name));
    CallSpec c = valid(op);
    for (ArgSpec& a : c.in) a.device = Device::cuda(0);
    for (ArgSpec& a : c.out) a.device = Device::cuda(0);
    CallBuffers b(c);
    std::string impl;
    const Status resolved = implementation_name(op.name, b.in_ptr, b.out_ptr, b.attrs, Context{}, &impl);
    const CCall cc(b);
    const gradops_status c_resolved = cc.implementation(std::string(op.name).c_str());
    const Status ran = b.run();
    const gradops_status c_ran = cc.run(std::string(op.name).c_str());
    EXPECT_EQ(ran.code(), want) << ran.to_string();
    EXPECT_EQ(resolved.code(), want) << resolved.to_string();
    EXPECT_EQ(static_cast<int>(c_resolved), static_cast<int>(want));
    EXPECT_EQ(static_cast<int>(c_ran), static_cast<int>(want));
    EXPECT_TRUE(starts_with_op(ran.message(), op.name)) << ran.message();
    EXPECT_TRUE(starts_with_op(resolved.message(), op.name)) << resolved.message();
    EXPECT_EQ(b.changed_bytes(), "");
  }
}

}  // namespace
}  // namespace gradops::testing
