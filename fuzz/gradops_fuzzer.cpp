// libFuzzer target over the by-name C entry point, gradops_run.
//
// Each input picks an operator, a dtype signature, a small main shape and attribute values, builds
// the valid call the float64 oracle makes for them, then applies up to four mutations: a dtype
// code, rank or dim changed (to 0, huge, negative, or so that products overflow), strides, device,
// an input or output dropped, added or NULL, attributes unknown, misspelled, duplicated, out of
// range or NaN, an output aliased to an input or overlapping it. Every buffer sits at a random byte
// offset (misaligned for its dtype) between guard bands of pattern bytes. The verdict:
//  - a non-ok status has a message and leaves every byte of every buffer and guard untouched;
//  - an ok status leaves the guards and the inputs untouched (an allowed in-place output aside);
//  - an ok call that is the oracle's valid call (mutations that keep a call valid included) matches
//    the float64 reference within the op's tolerance, NaN- and infinity-aware.
// ASan, UBSan and LeakSanitizer (libFuzzer's -detect_leaks) catch the rest; -timeout the hangs.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gradops/gradops.h"
#include "harness/call_buffers.hpp"
#include "harness/checker.hpp"

namespace {

using namespace gradops;

constexpr std::size_t kGuard = 64;
constexpr int64_t kMaxElements = 4096;
constexpr int64_t kMaxBacked = int64_t{1} << 20;

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "gradops_fuzzer: %s\n", what.c_str());
  std::abort();
}

// One tensor's storage: guard | data | guard, the data at `offset` bytes past 64-byte alignment.
struct Storage {
  std::vector<unsigned char> bytes, snapshot;
  std::size_t data_at = 0, data_len = 0;
  void* data() { return bytes.data() + data_at; }
};

unsigned char pattern(std::size_t id, std::size_t i) { return static_cast<unsigned char>(0xA5u ^ (31u * id + 7u * i)); }

double attr_value(FuzzedDataProvider& f, const AttrSchema& a) {
  switch (f.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return std::numeric_limits<double>::quiet_NaN();
    case 1: return f.ConsumeBool() ? INFINITY : -INFINITY;
    case 2: return f.ConsumeFloatingPoint<double>();
    case 3: return a.min;
    case 4: return a.max;
    case 5: return a.min - 1;
    case 6: return a.max + (a.type == AttrType::int64 ? 1 : 1e30);
    case 7: return static_cast<double>(f.ConsumeIntegralInRange<int>(-4, 4));
    case 8: return f.ConsumeFloatingPointInRange<double>(-2, 2);
    default: return a.default_value;
  }
}

int64_t mutated_dim(FuzzedDataProvider& f) {
  switch (f.ConsumeIntegralInRange<int>(0, 6)) {
    case 0: return 0;
    case 1: return -f.ConsumeIntegralInRange<int64_t>(1, std::numeric_limits<int64_t>::max());
    case 2: return int64_t{1} << f.ConsumeIntegralInRange<int>(31, 62);
    case 3: return std::numeric_limits<int64_t>::max();
    case 4: return f.ConsumeIntegralInRange<int64_t>(1, 9);
    default: return f.ConsumeIntegral<int64_t>();
  }
}

int64_t numel_or_minus1(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d == 0) return 0;
  }
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

struct Tensor {
  bool present = false;
  int32_t dtype = 0;
  gradops_device device{GRADOPS_DEVICE_CPU, 0};
  std::vector<int64_t> shape, strides;
  bool use_strides = false;
  int alias_of_input = -1;  // output placed on input k's storage
  int64_t alias_shift = 0;  // in bytes, for overlaps
  std::size_t storage = 0;
};

int run_one(const uint8_t* data, std::size_t size) {
  FuzzedDataProvider f(data, size);
  const auto ops = op_schemas();
  const OpSchema& op = ops[f.ConsumeIntegralInRange<std::size_t>(0, ops.size() - 1)];
  const TypeSignature& sig = op.signatures[f.ConsumeIntegralInRange<std::size_t>(0, op.signatures.size() - 1)];
  std::vector<int64_t> main_shape(f.ConsumeIntegralInRange<std::size_t>(1, 4));
  for (int64_t& d : main_shape) d = f.ConsumeIntegralInRange<int64_t>(0, 19);
  while (numel_or_minus1(main_shape) > kMaxElements / 4) *std::max_element(main_shape.begin(), main_shape.end()) /= 2;
  oracle::Attrs overrides;
  for (const AttrSchema& a : op.attributes)
    if (f.ConsumeBool()) {
      // Mostly valid values, so that the oracle comparison sees non-default attributes.
      double v = a.type == AttrType::int64 ? static_cast<double>(f.ConsumeIntegralInRange<int>(-3, 3))
                                            : f.ConsumeFloatingPointInRange<double>(0, 1);
      if (a.name == "axis") v = static_cast<double>(f.ConsumeIntegralInRange<int>(-static_cast<int>(main_shape.size()),
                                                                                   static_cast<int>(main_shape.size()) - 1));
      if (a.type == AttrType::int64 && (v < a.min || v > a.max)) v = a.min;
      overrides[std::string(a.name)] = v;
    }
  testing::CallSpec spec;
  const uint32_t seed = f.ConsumeIntegral<uint32_t>();
  try {
    spec = testing::valid_call(op, main_shape, sig, overrides, seed);
  } catch (const std::exception&) {
    return 0;  // shapes the oracle has no valid call for (rank 1 for BatchNorm's channels, ...)
  }
  // Every attribute explicitly, as the oracle used them.
  std::vector<std::pair<std::string, double>> attrs = spec.attrs;

  std::vector<Tensor> in(spec.in.size()), out(spec.out.size());
  auto from_spec = [](const testing::ArgSpec& a) {
    Tensor t;
    t.present = a.present;
    t.dtype = static_cast<int32_t>(a.dtype);
    t.shape = a.shape;
    return t;
  };
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = from_spec(spec.in[i]);
  for (std::size_t o = 0; o < out.size(); ++o) out[o] = from_spec(spec.out[o]);
  std::size_t num_in = in.size(), num_out = out.size();
  std::string op_name(op.name);
  int threads = f.ConsumeIntegralInRange<int>(0, 3);

  // Mutations. `keeps_valid` stays true for those that leave a valid call valid.
  bool keeps_valid = true;
  const int mutations = f.ConsumeIntegralInRange<int>(0, 4);
  for (int m = 0; m < mutations; ++m) {
    const bool pick_out = f.ConsumeBool();
    std::vector<Tensor>& side = pick_out ? out : in;
    Tensor& t = side[f.ConsumeIntegralInRange<std::size_t>(0, side.size() - 1)];
    switch (f.ConsumeIntegralInRange<int>(0, 17)) {
      case 0: t.dtype = f.ConsumeIntegralInRange<int32_t>(-2, 6); keeps_valid = false; break;
      case 1: t.shape.resize(f.ConsumeIntegralInRange<std::size_t>(0, 9)); keeps_valid = false; break;
      case 2:
      case 3:
        if (!t.shape.empty()) t.shape[f.ConsumeIntegralInRange<std::size_t>(0, t.shape.size() - 1)] = mutated_dim(f);
        keeps_valid = false;
        break;
      case 4:
        t.use_strides = true;
        t.strides.assign(t.shape.size(), 0);
        for (int64_t& s : t.strides) s = f.ConsumeBool() ? mutated_dim(f) : f.ConsumeIntegralInRange<int64_t>(0, 64);
        keeps_valid = false;
        break;
      case 5: {  // dense strides, spelled out: still valid
        t.use_strides = true;
        t.strides.assign(t.shape.size(), 1);
        int64_t s = 1;
        for (std::size_t d = t.shape.size(); d-- > 0;) {
          t.strides[d] = s;
          if (__builtin_mul_overflow(s, t.shape[d] > 0 ? t.shape[d] : 1, &s)) s = 0;  // the fuzzer's own arithmetic
        }
        break;
      }
      case 6:
        t.device = {f.ConsumeIntegralInRange<int32_t>(-1, 3), f.ConsumeIntegralInRange<int32_t>(-2, 6)};
        keeps_valid = false;
        break;
      case 7:  // NULL entry: valid for an optional output, whose siblings must then still match
        t.present = false;
        if (!pick_out) keeps_valid = false;
        break;
      case 8: num_in = f.ConsumeIntegralInRange<std::size_t>(0, 6); keeps_valid = false; break;
      case 9: num_out = f.ConsumeIntegralInRange<std::size_t>(0, 6); keeps_valid = false; break;
      case 10: attrs.emplace_back(f.ConsumeRandomLengthString(12), f.ConsumeFloatingPoint<double>()); keeps_valid = false; break;
      case 11:
        if (!attrs.empty()) {
          std::string& n = attrs[f.ConsumeIntegralInRange<std::size_t>(0, attrs.size() - 1)].first;
          if (!n.empty()) n[f.ConsumeIntegralInRange<std::size_t>(0, n.size() - 1)] ^= 0x20;  // a case typo
        }
        keeps_valid = false;
        break;
      case 12:
        if (!attrs.empty()) attrs.push_back(attrs[f.ConsumeIntegralInRange<std::size_t>(0, attrs.size() - 1)]);
        keeps_valid = false;
        break;
      case 13:
        if (!attrs.empty()) {
          auto& [n, v] = attrs[f.ConsumeIntegralInRange<std::size_t>(0, attrs.size() - 1)];
          const int k = op.find_attribute(n);
          if (k >= 0) v = attr_value(f, op.attributes[k]);
          // A small finite value the op accepts must give the oracle's results for it too; the
          // extremes are checked for rejection and untouched bytes only.
          if (k >= 0 && std::isfinite(v) && std::fabs(v) <= 2) overrides[n] = v;
          else keeps_valid = false;
        } else {
          keeps_valid = false;
        }
        break;
      case 14:
        if (pick_out && !in.empty()) {
          t.alias_of_input = f.ConsumeIntegralInRange<int>(0, static_cast<int>(in.size()) - 1);
          t.alias_shift = f.ConsumeIntegralInRange<int64_t>(-16, 16);
          keeps_valid = false;
        }
        break;
      case 15: op_name = f.ConsumeRandomLengthString(24); keeps_valid = false; break;
      case 16: threads = f.ConsumeIntegralInRange<int>(-2, 64); break;  // any count it accepts: the same results
      default:  // the default takes over (a required one goes missing)
        if (!attrs.empty()) attrs.erase(attrs.begin() + static_cast<std::ptrdiff_t>(f.ConsumeIntegralInRange<std::size_t>(0, attrs.size() - 1)));
        keeps_valid = false;
        break;
    }
  }

  // An attribute value changed above (case 13) is one the oracle's inputs were not drawn for (the
  // gradients' Y is a softmax along the axis they were made with, and the tolerances rest on that):
  // draw them again for the attributes the call now has, from the same seed. Where that changes
  // the inputs' shapes too, the call is only checked byte for byte.
  const oracle::Attrs drawn_for = testing::full_attributes(op, overrides);
  std::string redrawn;  // for the verbose print: the attributes the first inputs were drawn for
  for (const auto& [n, v] : spec.attrs)
    if (drawn_for.at(n) != v) redrawn += " '" + n + "' = " + std::to_string(v);
  if (keeps_valid && !redrawn.empty()) {
    try {
      testing::CallSpec again = testing::valid_call(op, main_shape, sig, overrides, seed);
      for (std::size_t i = 0; i < again.in.size(); ++i)
        keeps_valid = keeps_valid && again.in[i].present == spec.in[i].present && again.in[i].shape == spec.in[i].shape;
      if (keeps_valid) spec.in_values = std::move(again.in_values);
    } catch (const std::exception&) {
      keeps_valid = false;
    }
  }

  // Storage: one per present tensor, at a random misalignment, sized for its shape up to
  // kMaxBacked elements (mutated dims of several tensors can agree, making a larger valid call),
  // else a small region (a call that large must be rejected or empty).
  std::vector<Storage> store;
  auto place = [&](Tensor& t) {
    if (!t.present) return;
    const int64_t n = numel_or_minus1(t.shape);
    const std::size_t es = t.dtype >= 0 && t.dtype <= 3 ? dtype_size(static_cast<DType>(t.dtype)) : 4;
    const std::size_t len = n >= 0 && n <= kMaxBacked ? static_cast<std::size_t>(n) * es : 16;
    Storage s;
    const std::size_t shift = f.ConsumeIntegralInRange<std::size_t>(0, 7);
    s.bytes.resize(len + 2 * kGuard + 64 + shift);
    const auto base = reinterpret_cast<uintptr_t>(s.bytes.data()) + kGuard;
    s.data_at = kGuard + (64 - base % 64) % 64 + shift;
    s.data_len = len;
    for (std::size_t i = 0; i < s.bytes.size(); ++i) s.bytes[i] = pattern(store.size(), i);
    t.storage = store.size();
    store.push_back(std::move(s));
  };
  for (Tensor& t : in) place(t);
  for (Tensor& t : out) place(t);
  // The reduce halves of the BatchNorm split tie X (and dY) to their sums output through the channel
  // count alone: with another N or spatial size the call is still valid, so a tensor larger than
  // its storage is the caller's error, which no library can detect. Such calls are not made.
  if (op_name == "BatchNormStatsReduce" || op_name == "BatchNormGradReduce")
    for (const Tensor& t : in)
      if (t.present && numel_or_minus1(t.shape) > kMaxBacked) return 0;
  // Inputs hold the oracle's values where the dtype and shape are still the spec's.
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (!in[i].present || in[i].dtype != static_cast<int32_t>(spec.in[i].dtype) || in[i].shape != spec.in[i].shape)
      continue;
    const std::vector<double>& v = spec.in_values[i];
    Storage& s = store[in[i].storage];
    const std::size_t es = dtype_size(spec.in[i].dtype);
    for (std::size_t e = 0; e < v.size() && (e + 1) * es <= s.data_len; ++e)
      testing::store(spec.in[i].dtype, reinterpret_cast<std::byte*>(s.data()) + e * es, v[e]);
  }
  for (Storage& s : store) s.snapshot = s.bytes;

  // An output placed on an input's storage must fit in it and its guard bands: an empty input's
  // storage cannot hold a non-empty output, which the library rightly finds not to overlap it.
  for (Tensor& t : out) {
    if (t.alias_of_input < 0 || !t.present || !in[static_cast<std::size_t>(t.alias_of_input)].present) continue;
    const Storage& st = store[in[static_cast<std::size_t>(t.alias_of_input)].storage];
    const int64_t n = numel_or_minus1(t.shape);
    const int64_t es = t.dtype >= 0 && t.dtype <= 3 ? static_cast<int64_t>(dtype_size(static_cast<DType>(t.dtype))) : 4;
    const int64_t lo = static_cast<int64_t>(st.data_at) + t.alias_shift;
    if (n < 0 || n > kMaxBacked || lo + n * es > static_cast<int64_t>(st.bytes.size())) t.alias_of_input = -1;
  }
  auto c_tensor = [&](const Tensor& t, bool output) {
    gradops_tensor c{};
    c.device = t.device;
    c.rank = static_cast<int32_t>(t.shape.size());
    c.dtype = t.dtype;
    c.shape = t.shape.data();
    c.strides = t.use_strides ? t.strides.data() : nullptr;
    if (output && t.alias_of_input >= 0 && in[static_cast<std::size_t>(t.alias_of_input)].present) {
      Storage& s = store[in[static_cast<std::size_t>(t.alias_of_input)].storage];
      c.data = static_cast<unsigned char*>(s.data()) + t.alias_shift;  // stays inside the guard bands
    } else {
      c.data = store[t.storage].data();
    }
    return c;
  };
  // The ABI's contract: strides, when given, has `rank` entries (a rank mutation after a strides
  // one would otherwise hand the library a short array, which it cannot detect).
  for (Tensor& t : in) t.strides.resize(t.use_strides ? t.shape.size() : 0);
  for (Tensor& t : out) t.strides.resize(t.use_strides ? t.shape.size() : 0);
  std::vector<gradops_tensor> cin(in.size()), cout(out.size());
  std::vector<const gradops_tensor*> pin(std::max<std::size_t>(num_in, 1), nullptr),
      pout(std::max<std::size_t>(num_out, 1), nullptr);
  for (std::size_t i = 0; i < in.size(); ++i)
    if (in[i].present) cin[i] = c_tensor(in[i], false);
  for (std::size_t o = 0; o < out.size(); ++o)
    if (out[o].present) cout[o] = c_tensor(out[o], true);
  for (std::size_t i = 0; i < num_in; ++i) pin[i] = i < in.size() && in[i].present ? &cin[i] : (i < in.size() ? nullptr : &cin[0]);
  for (std::size_t o = 0; o < num_out; ++o) pout[o] = o < out.size() && out[o].present ? &cout[o] : (o < out.size() ? nullptr : &cout[0]);
  std::vector<gradops_attribute> cattrs;
  for (const auto& [n, v] : attrs) cattrs.push_back({n.c_str(), v});
  gradops_context ctx{};
  ctx.num_threads = threads;

  // GRADOPS_FUZZ_VERBOSE=1: print the call first (to turn a saved input into a regression test).
  static const bool verbose = std::getenv("GRADOPS_FUZZ_VERBOSE") != nullptr;
  if (verbose) {
    auto print = [&](const char* side, std::size_t k, const gradops_tensor* t) {
      if (!t) return (void)std::fprintf(stderr, "  %s[%zu] NULL\n", side, k);
      std::fprintf(stderr, "  %s[%zu] dtype %d device %d:%d misalign %zu shape", side, k, t->dtype, t->device.type,
                   t->device.index, static_cast<std::size_t>(reinterpret_cast<uintptr_t>(t->data) % 64));
      for (int32_t d = 0; d < t->rank; ++d) std::fprintf(stderr, " %lld", static_cast<long long>(t->shape[d]));
      if (t->strides) {
        std::fprintf(stderr, " strides");
        for (int32_t d = 0; d < t->rank; ++d) std::fprintf(stderr, " %lld", static_cast<long long>(t->strides[d]));
      }
      std::fprintf(stderr, "\n");
    };
    std::fprintf(stderr, "gradops_fuzzer: %s, %zu inputs, %zu outputs, threads %d\n", op_name.c_str(), num_in, num_out, threads);
    for (std::size_t i = 0; i < num_in; ++i) print("in", i, pin[i]);
    for (std::size_t o = 0; o < num_out; ++o) print("out", o, pout[o]);
    for (const auto& [n, v] : attrs) std::fprintf(stderr, "  attr '%s' = %.17g\n", n.c_str(), v);
    if (keeps_valid && !redrawn.empty())
      std::fprintf(stderr, "  inputs drawn again for these attributes (first drawn for%s)\n", redrawn.c_str());
    for (std::size_t b = 0; b < store.size(); ++b)
      std::fprintf(stderr, "  buffer %zu: %zu data bytes\n", b, store[b].data_len);
  }
  const gradops_status s = gradops_run(op_name.c_str(), pin.data(), num_in, pout.data(), num_out, cattrs.data(),
                                       cattrs.size(), &ctx);
  const std::string msg = gradops_last_error();

  if (s != GRADOPS_OK) {
    if (msg.empty()) fail(op_name + ": status " + gradops_status_string(s) + " without a message");
    if (s == GRADOPS_INTERNAL) fail(op_name + ": internal error: " + msg);
    for (std::size_t b = 0; b < store.size(); ++b)
      if (store[b].bytes != store[b].snapshot) fail(op_name + ": rejected (" + msg + ") but buffer " + std::to_string(b) + " changed");
    return 0;
  }
  if (!msg.empty()) fail(op_name + ": ok with a message: " + msg);
  // ok: only the outputs' bytes may have changed. An output placed on an input's storage (an
  // allowed in-place pair, or a shifted placement the library found not to overlap) may change
  // exactly its own bytes there; every other byte (guards, inputs) must be as it was.
  bool any_alias = false;
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> writable(store.size());
  for (const Tensor& t : out) {
    if (!t.present) continue;
    const int64_t n = numel_or_minus1(t.shape);
    const std::size_t bytes = n > 0 ? static_cast<std::size_t>(n) * dtype_size(static_cast<DType>(t.dtype)) : 0;
    if (t.alias_of_input >= 0 && in[static_cast<std::size_t>(t.alias_of_input)].present) {
      any_alias = true;
      const Storage& st = store[in[static_cast<std::size_t>(t.alias_of_input)].storage];
      const std::size_t lo = static_cast<std::size_t>(static_cast<int64_t>(st.data_at) + t.alias_shift);
      writable[in[static_cast<std::size_t>(t.alias_of_input)].storage].push_back({lo, lo + bytes});
    } else {
      writable[t.storage].push_back({store[t.storage].data_at, store[t.storage].data_at + bytes});
    }
  }
  for (std::size_t b = 0; b < store.size(); ++b) {
    const Storage& st = store[b];
    for (std::size_t i = 0; i < st.bytes.size(); ++i) {
      if (st.bytes[i] == st.snapshot[i]) continue;
      bool allowed = false;
      for (const auto& [lo, hi] : writable[b]) allowed = allowed || (i >= lo && i < hi);
      if (!allowed) fail(op_name + ": ok, but byte " + std::to_string(i) + " of buffer " + std::to_string(b) + " changed");
    }
  }
  if (!keeps_valid || any_alias) return 0;

  // The oracle's valid call (perhaps with dense strides spelled out, misaligned, fewer optional
  // outputs, other thread counts): every written output matches the float64 reference.
  check::Problem p;
  p.op = op.id;
  p.sig = sig;
  p.shape = main_shape;
  for (const auto& [k, v] : overrides) p.attrs[k] = v;
  oracle::Tensors inputs;
  for (std::size_t i = 0; i < spec.in.size(); ++i) {
    if (!spec.in[i].present) {
      inputs.emplace_back();
      continue;
    }
    oracle::Tensor t(spec.in[i].shape);
    t.v = spec.in_values[i];
    inputs.emplace_back(std::move(t));
  }
  const oracle::Tensors want = oracle::reference(op.name, inputs, check::full_attrs(p));
  for (std::size_t o = 0; o < out.size(); ++o) {
    if (!out[o].present || o >= want.size() || !want[o]) continue;
    const check::Tolerance tol = check::tolerance(p, static_cast<int>(o));
    const DType t = static_cast<DType>(out[o].dtype);
    const std::size_t es = dtype_size(t);
    const unsigned char* d = static_cast<const unsigned char*>(store[out[o].storage].data());
    for (std::size_t e = 0; e < want[o]->v.size(); ++e) {
      double got = 0;
      switch (t) {
        case DType::f32: { float x; std::memcpy(&x, d + e * es, 4); got = x; break; }
        case DType::f64: std::memcpy(&got, d + e * es, 8); break;
        case DType::f16: { half x; std::memcpy(&x, d + e * es, 2); got = static_cast<float>(x); break; }
        case DType::bf16: { bfloat16 x; std::memcpy(&x, d + e * es, 2); got = static_cast<float>(x); break; }
      }
      const double w = want[o]->v[e];
      const bool ok = (std::isnan(w) && std::isnan(got)) ||
                      (std::isinf(oracle::round_to(t, w)) ? got == oracle::round_to(t, w)
                                                          : std::fabs(got - w) <= tol.abs + tol.rel * std::fabs(w));
      if (!ok) {
        // Exact values: six significant digits can print the same number for both sides.
        char buf[256];
        std::snprintf(buf, sizeof buf, " = %a (%.9g), oracle %a (%.17g); |difference| %a > tolerance %a (abs %a + rel %a)",
                      got, got, w, w, std::fabs(got - w), tol.abs + tol.rel * std::fabs(w), tol.abs, tol.rel);
        fail(op_name + ": " + std::string(op.outputs[o].name) + "[" + std::to_string(e) + "]" + buf + " (" +
             check::describe(p) + ")");
      }
    }
  }
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) { return run_one(data, size); }
