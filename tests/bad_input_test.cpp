// Bad input for every op in the table (docs/design.md §7, docs/semantics.md A4, A6): each argument
// made wrong in each way the contract forbids must return the right status, with a message that
// starts with the op's name and names the argument, and must leave every byte of every buffer
// (inputs, outputs and the guard bytes around them) untouched. One test case per op and kind of
// mistake, generated from the op table, so a new op is covered without touching this file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "harness/call_buffers.hpp"

namespace gradops::testing {
namespace {

// Every dim > 1 so that dropping any dim changes the element count; rank 3 so that both "one row
// per leading dim" and "all trailing dims" readings of an axis are exercised.
const std::vector<int64_t> kShape = {2, 3, 5};

bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `name` occurs in `msg` as a whole word: "X" matches "'X' has" but not "dX" or "X_grad". Names
// that are ordinary words of a message ("input", "output") must appear quoted.
bool names(const std::string& msg, std::string_view name) {
  if (name == "input" || name == "output") {
    for (const char* q : {"'", "\"", "`"})
      if (msg.find(q + std::string(name) + q) != std::string::npos) return true;
    return false;
  }
  for (std::size_t p = msg.find(name); p != std::string::npos; p = msg.find(name, p + 1)) {
    const bool left = p == 0 || !ident_char(msg[p - 1]);
    const bool right = p + name.size() >= msg.size() || !ident_char(msg[p + name.size()]);
    if (left && right) return true;
  }
  return false;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> all_op_names() {
  std::vector<std::string> r;
  for (const OpSchema& s : op_schemas()) r.emplace_back(s.name);
  return r;
}

// One tensor argument of a call.
struct Target {
  bool output;
  int index;
};

struct Outcome {
  Status status;
  std::string changed;  // empty if no byte of any buffer changed
};

class BadInput : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    op_ = find_op(GetParam());
    ASSERT_NE(op_, nullptr);
    try {
      valid_ = valid_call(*op_, kShape, op_->signatures[0]);
    } catch (const std::exception& e) {
      FAIL() << op_->name << ": the oracle cannot build a valid call: " << e.what();
    }
    CallBuffers b(valid_);
    const Status s = b.run();
    ASSERT_TRUE(s.is_ok()) << "the valid call must succeed first: " << s.to_string();
    ASSERT_EQ(b.changed_guards(), "") << "the valid call";
    for (std::size_t o = 0; o < valid_.out.size(); ++o) {
      reference_.emplace_back();
      if (!valid_.out[o].present) continue;
      ASSERT_EQ(b.unwritten_element(o), "") << "the valid call left an output element unwritten";
      reference_[o] = b.output_bytes(o);
    }
  }

  std::vector<Target> targets() const {
    std::vector<Target> t;
    for (std::size_t i = 0; i < valid_.in.size(); ++i)
      if (valid_.in[i].present) t.push_back({false, static_cast<int>(i)});
    for (std::size_t o = 0; o < valid_.out.size(); ++o)
      if (valid_.out[o].present) t.push_back({true, static_cast<int>(o)});
    return t;
  }
  static ArgSpec& arg(CallSpec& c, Target t) { return t.output ? c.out[t.index] : c.in[t.index]; }
  const ArgSchema& schema(Target t) const { return t.output ? op_->outputs[t.index] : op_->inputs[t.index]; }
  std::string_view name(Target t) const { return schema(t).name; }
  static TensorView& view(CallBuffers& b, Target t) { return t.output ? b.out_view[t.index] : b.in_view[t.index]; }

  static Outcome attempt(const CallSpec& spec, const std::function<void(CallBuffers&)>& tweak = {}) {
    CallBuffers b(spec);
    if (tweak) tweak(b);
    const Status s = b.run();
    return {s, b.changed_bytes()};
  }

  // The call must fail with `code`, a message "<Op>: ..." naming each of `must_name`, and no byte
  // written anywhere.
  void expect_rejected(const std::string& what, const Outcome& r, std::vector<std::string_view> must_name,
                       StatusCode code = StatusCode::invalid_argument, const char* must_contain = nullptr) {
    SCOPED_TRACE(std::string(op_->name) + ", " + what);
    EXPECT_EQ(r.status.code(), code) << r.status.to_string();
    const std::string& m = r.status.message();
    EXPECT_EQ(m.rfind(std::string(op_->name) + ": ", 0), 0u) << "message does not start with the op: " << m;
    for (std::string_view n : must_name) EXPECT_TRUE(names(m, n)) << "message does not name '" << n << "': " << m;
    if (must_contain) EXPECT_NE(lower(m).find(must_contain), std::string::npos) << "no '" << must_contain << "': " << m;
    EXPECT_EQ(r.changed, "") << "a rejected call wrote to memory";
  }

  void expect_accepted(const std::string& what, const CallSpec& spec, bool same_outputs) {
    SCOPED_TRACE(std::string(op_->name) + ", " + what);
    CallBuffers b(spec);
    const Status s = b.run();
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_EQ(b.changed_guards(), "");
    for (std::size_t o = 0; o < spec.out.size(); ++o) {
      if (!spec.out[o].present) continue;
      EXPECT_EQ(b.unwritten_element(o), "");
      if (same_outputs) EXPECT_TRUE(b.output_bytes(o) == reference_[o]) << op_->outputs[o].name << " differs";
    }
  }

  // A dtype for tensor t that makes the call's dtype assignment invalid: one that differs from a
  // tensor of the same type variable, or else one that gives a combination outside the op's
  // signature list. nullopt if every dtype is valid there.
  std::optional<DType> invalid_dtype(Target t) const {
    const int tv = schema(t).type_var;
    bool shared = false;
    std::array<int, std::tuple_size_v<decltype(TypeSignature::types)>> var;
    var.fill(-1);
    for (Target u : targets()) {
      const ArgSpec& a = u.output ? valid_.out[u.index] : valid_.in[u.index];
      const int v = (u.output ? op_->outputs[u.index] : op_->inputs[u.index]).type_var;
      var[v] = static_cast<int>(a.dtype);
      if (v == tv && (u.output != t.output || u.index != t.index)) shared = true;
    }
    const DType current = (t.output ? valid_.out[t.index] : valid_.in[t.index]).dtype;
    for (DType d : kAllDTypes) {
      if (d == current) continue;
      if (shared) return d;
      var[tv] = static_cast<int>(d);
      bool listed = false;
      for (const TypeSignature& s : op_->signatures) {
        bool m = true;
        for (std::size_t v = 0; v < op_->type_vars.size(); ++v)
          m = m && (var[v] < 0 || var[v] == static_cast<int>(s.types[v]));
        listed = listed || m;
      }
      if (!listed) return d;
    }
    return std::nullopt;
  }

  // Shapes the contract accepts besides the oracle's (docs/semantics.md A4): LayerNorm stats (type
  // variable U) may carry trailing 1s, and a forward LayerNorm's Scale/B may be broadcast with
  // leading 1s. Those two mutations are skipped there.
  bool is_stats(Target t) const { return op_->type_vars.size() == 3 && op_->type_vars[1] == "U" && schema(t).type_var == 1; }
  // BatchNormStatsReduce's X is tied to the rest of the call by its channel count alone (the sums
  // have 2·C + 1 values whatever N and the spatial dims are): only a change of C is an error.
  bool only_channels_tied(Target t) const { return op_->id == OpId::BatchNormStatsReduce && !t.output && t.index == 0; }
  static int64_t channels_nchw(const std::vector<int64_t>& s) { return s.size() < 2 ? 1 : s[1]; }
  bool is_forward_norm_param(Target t) const {
    return op_->type_vars.size() == 3 && op_->type_vars[1] == "U" && !op_->gradient && !t.output && schema(t).type_var == 2;
  }

  std::string shape_text(const std::vector<int64_t>& s) const {
    std::string r = "[";
    for (std::size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
    return r + "]";
  }

  const OpSchema* op_ = nullptr;
  CallSpec valid_;
  std::vector<std::vector<std::byte>> reference_;
};

TEST_P(BadInput, ValidCallSucceeds) {
  // SetUp ran the valid call: every output element written, nothing else touched.
  SUCCEED();
}

TEST_P(BadInput, OptionalArgumentsMayBeOmitted) {
  for (std::size_t i = 0; i < op_->inputs.size(); ++i) {
    if (!op_->inputs[i].optional) continue;
    CallSpec c = valid_;
    c.in[i].present = false;
    expect_accepted("without input " + std::string(op_->inputs[i].name), c, false);
  }
  for (std::size_t o = 0; o < op_->outputs.size(); ++o) {
    if (!op_->outputs[o].optional) continue;
    CallSpec c = valid_;
    c.out[o].present = false;
    // Leaving an output out changes nothing about the others.
    expect_accepted("without output " + std::string(op_->outputs[o].name), c, true);
  }
}

TEST_P(BadInput, WrongShape) {
  for (Target t : targets()) {
    const std::vector<int64_t> good = arg(valid_, t).shape;
    std::vector<std::pair<std::string, std::vector<int64_t>>> bad;
    for (std::size_t d = 0; d < good.size(); ++d) {
      auto s = good;
      ++s[d];
      bad.emplace_back("dim " + std::to_string(d) + " grown", s);
    }
    for (std::size_t d = 0; d < good.size(); ++d)
      if (good[d] != 1) {
        auto s = good;
        s.erase(s.begin() + static_cast<std::ptrdiff_t>(d));
        bad.emplace_back("dim " + std::to_string(d) + " dropped", s);
        break;
      }
    if (!is_forward_norm_param(t)) {
      auto s = good;
      s.insert(s.begin(), 1);
      bad.emplace_back("leading 1 added", s);
    }
    if (!is_stats(t)) {
      auto s = good;
      s.push_back(1);
      bad.emplace_back("trailing 1 added", s);
    }
    for (const auto& [how, shape] : bad) {
      if (only_channels_tied(t) && channels_nchw(shape) == channels_nchw(good)) continue;
      CallSpec c = valid_;
      arg(c, t).shape = shape;
      expect_rejected(std::string(name(t)) + " " + shape_text(good) + " -> " + shape_text(shape) + " (" + how + ")",
                      attempt(c), {name(t)});
    }
  }
}

TEST_P(BadInput, WrongDtype) {
  int tried = 0;
  for (Target t : targets()) {
    const std::optional<DType> d = invalid_dtype(t);
    if (!d) continue;
    ++tried;
    CallSpec c = valid_;
    arg(c, t).dtype = *d;
    expect_rejected(std::string(name(t)) + " as " + dtype_name(*d), attempt(c), {name(t)});
  }
  EXPECT_GT(tried, 0);
}

TEST_P(BadInput, WrongDevice) {
  for (Target t : targets()) {
    CallSpec c = valid_;
    arg(c, t).device = Device::cuda(0);
    expect_rejected(std::string(name(t)) + " on cuda:0, the rest on cpu", attempt(c), {name(t)},
                    StatusCode::invalid_argument, "device");
    CallSpec g = valid_;
    for (Target u : targets()) arg(g, u).device = Device::cuda(0);
    arg(g, t).device = Device::cuda(1);
    expect_rejected(std::string(name(t)) + " on cuda:1, the rest on cuda:0", attempt(g), {name(t)},
                    StatusCode::invalid_argument, "device");
  }
}

TEST_P(BadInput, AllOnCudaIsUnimplementedWithoutCuda) {
#ifdef GRADOPS_HAVE_CUDA
  GTEST_SKIP() << "this build has CUDA";
#else
  CallSpec c = valid_;
  for (Target t : targets()) arg(c, t).device = Device::cuda(0);
  expect_rejected("every tensor on cuda:0", attempt(c), {}, StatusCode::unimplemented, "cuda");
#endif
}

TEST_P(BadInput, AxisOutOfRange) {
  const int a = op_->find_attribute("axis");
  if (a < 0) GTEST_SKIP() << "no axis attribute";
  const int64_t r = static_cast<int64_t>(kShape.size());
  for (int64_t axis : {r, -r - 1, r + 1000, std::int64_t{-1} << 40}) {
    CallSpec c = valid_;
    for (auto& [k, v] : c.attrs)
      if (k == "axis") v = static_cast<double>(axis);
    expect_rejected("axis " + std::to_string(axis), attempt(c), {"axis"});
  }
}

TEST_P(BadInput, MissingArguments) {
  for (std::size_t i = 0; i < op_->inputs.size(); ++i) {
    if (op_->inputs[i].optional) continue;
    CallSpec c = valid_;
    c.in[i].present = false;
    expect_rejected("input " + std::string(op_->inputs[i].name) + " missing", attempt(c), {op_->inputs[i].name});
  }
  for (std::size_t o = 0; o < op_->outputs.size(); ++o) {
    if (op_->outputs[o].optional) continue;
    CallSpec c = valid_;
    c.out[o].present = false;
    expect_rejected("output " + std::string(op_->outputs[o].name) + " missing", attempt(c), {op_->outputs[o].name});
  }
  for (const AttrSchema& s : op_->attributes) {
    if (!s.required) continue;
    CallSpec c = valid_;
    std::erase_if(c.attrs, [&](auto& kv) { return kv.first == s.name; });
    expect_rejected("attribute " + std::string(s.name) + " missing", attempt(c), {s.name});
  }
}

TEST_P(BadInput, Attributes) {
  {
    CallSpec c = valid_;
    c.attrs.emplace_back("no_such_attribute", 3.0);
    expect_rejected("unknown attribute", attempt(c), {"no_such_attribute"});
  }
  for (const AttrSchema& s : op_->attributes) {
    std::vector<double> bad = {std::nan("")};
    if (s.type == AttrType::int64) bad = {0.5, -1.25, 1e300, std::numeric_limits<double>::infinity(), std::nan("")};
    for (double v : bad) {
      CallSpec c = valid_;
      for (auto& [k, x] : c.attrs)
        if (k == s.name) x = v;
      expect_rejected("attribute " + std::string(s.name) + " = " + std::to_string(v), attempt(c), {s.name});
    }
    CallSpec twice = valid_;
    for (const auto& [k, x] : valid_.attrs)
      if (k == s.name) twice.attrs.emplace_back(k, x);
    expect_rejected("attribute " + std::string(s.name) + " given twice", attempt(twice), {s.name});
  }
}

// docs/semantics.md A6: an output may share memory with an input only as the very same buffer of a
// documented in-place pair; every other overlap is rejected.
TEST_P(BadInput, Overlap) {
  auto alias_rule = [&](int o, int i) {
    for (const AliasRule& r : op_->aliases)
      if (r.output == o && r.input == i) return true;
    return false;
  };
  for (std::size_t o = 0; o < op_->outputs.size(); ++o) {
    if (!valid_.out[o].present) continue;
    const Target out{true, static_cast<int>(o)};
    for (std::size_t i = 0; i < op_->inputs.size(); ++i) {
      if (!valid_.in[i].present) continue;
      const Target in{false, static_cast<int>(i)};
      for (const bool exact : {false, true}) {
        auto place = [&](CallBuffers& b) {
          TensorView &vi = view(b, in), &vo = view(b, out);
          const std::size_t ni = vi.nbytes(), shift = exact ? 0 : dtype_size(vi.dtype);
          std::byte* a = b.arena(std::max<std::size_t>(ni, shift + vo.nbytes()));
          std::memcpy(a, vi.data, ni);
          vi.data = a;
          vo.data = a + shift;
          b.snapshot_arena();
        };
        const std::string what = std::string("output ") + std::string(name(out)) + (exact ? " is" : " overlaps") +
                                 " input " + std::string(name(in));
        if (exact && alias_rule(static_cast<int>(o), static_cast<int>(i))) {
          // The documented in-place pair: allowed, and the result is the out-of-place one.
          SCOPED_TRACE(std::string(op_->name) + ", " + what);
          CallBuffers b(valid_);
          std::byte* arena = b.arena(b.in_view[i].nbytes());
          std::memcpy(arena, b.in_view[i].data, b.in_view[i].nbytes());
          b.in_view[i].data = arena;
          b.out_view[o].data = arena;
          const Status s = b.run();
          ASSERT_TRUE(s.is_ok()) << s.to_string();
          EXPECT_EQ(0, std::memcmp(arena, reference_[o].data(), reference_[o].size())) << "in-place result differs";
          for (std::size_t o2 = 0; o2 < op_->outputs.size(); ++o2)
            if (o2 != o && valid_.out[o2].present) EXPECT_TRUE(b.output_bytes(o2) == reference_[o2]);
          continue;
        }
        if (!exact && count_of(valid_.in[i].shape) < 2) continue;  // a one-element input cannot be overlapped partially
        expect_rejected(what, attempt(valid_, place), {name(out), name(in)});
      }
    }
    for (std::size_t o1 = 0; o1 < o; ++o1) {
      if (!valid_.out[o1].present) continue;
      const Target first{true, static_cast<int>(o1)};
      for (const bool exact : {false, true}) {
        auto place = [&](CallBuffers& b) {
          TensorView &v1 = view(b, first), &v2 = view(b, out);
          const std::size_t shift = exact ? 0 : dtype_size(v1.dtype);
          std::byte* a = b.arena(std::max<std::size_t>(v1.nbytes(), shift + v2.nbytes()));
          v1.data = a;
          v2.data = a + shift;
          b.snapshot_arena();
        };
        expect_rejected(std::string("outputs ") + std::string(name(first)) + " and " + std::string(name(out)) +
                            (exact ? " share a buffer" : " overlap"),
                        attempt(valid_, place), {name(first), name(out)});
      }
    }
  }
}

TEST_P(BadInput, NullData) {
  for (Target t : targets()) {
    if (count_of(arg(valid_, t).shape) == 0) continue;
    expect_rejected(std::string(name(t)) + " with null data",
                    attempt(valid_, [&](CallBuffers& b) { view(b, t).data = nullptr; }), {name(t)});
  }
}

TEST_P(BadInput, SizeOverflowAndMalformedViews) {
  for (Target t : targets()) {
    const std::string n(name(t));
    const int rank = static_cast<int>(arg(valid_, t).shape.size());
    if (rank >= 2)
      expect_rejected(n + " with 2^40 x 2^40 elements", attempt(valid_, [&](CallBuffers& b) {
                        view(b, t).dims[0] = int64_t{1} << 40;
                        view(b, t).dims[1] = int64_t{1} << 40;
                      }),
                      {name(t)});
    if (rank >= 1) {
      // 2^62 elements fit in int64, their bytes do not.
      expect_rejected(n + " with 2^62 elements", attempt(valid_, [&](CallBuffers& b) {
                        TensorView& v = view(b, t);
                        for (int d = 0; d < v.rank; ++d) v.dims[d] = 1;
                        v.dims[0] = int64_t{1} << 62;
                      }),
                      {name(t)});
      expect_rejected(n + " with a negative dim",
                      attempt(valid_, [&](CallBuffers& b) { view(b, t).dims[rank - 1] = -1; }), {name(t)});
    }
    expect_rejected(n + " with rank 9", attempt(valid_, [&](CallBuffers& b) {
                      TensorView& v = view(b, t);
                      const std::vector<int64_t> nine(9, 1);
                      v = TensorView(v.data, v.dtype, std::span<const int64_t>(nine), v.device);
                    }),
                    {name(t)});
    expect_rejected(n + " with dtype code 7",
                    attempt(valid_, [&](CallBuffers& b) { view(b, t).dtype = static_cast<DType>(7); }), {name(t)});
  }
}

TEST_P(BadInput, TooManyArguments) {
  expect_rejected("one input too many", attempt(valid_, [](CallBuffers& b) { b.in_ptr.push_back(b.in_ptr[0]); }), {});
  expect_rejected("one output too many",
                  attempt(valid_, [](CallBuffers& b) { b.out_ptr.push_back(b.out_ptr[0]); }), {});
}

INSTANTIATE_TEST_SUITE_P(EveryOp, BadInput, ::testing::ValuesIn(all_op_names()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

// ---- op-specific rules --------------------------------------------------------------------------

class OpRule : public BadInput {};

Outcome run_with(const CallSpec& base, const std::string& attr, double value) {
  CallSpec c = base;
  bool found = false;
  for (auto& [k, v] : c.attrs)
    if (k == attr) v = value, found = true;
  if (!found) c.attrs.emplace_back(attr, value);
  CallBuffers b(c);
  const Status s = b.run();
  return {s, b.changed_bytes()};
}

// docs/semantics.md A5: LeakyReluGrad's mask on Y is only a gradient for alpha >= 0.
TEST_P(OpRule, LeakyReluGradAlpha) {
  expect_rejected("alpha -0.01", run_with(valid_, "alpha", -0.01), {"alpha"});
  expect_rejected("alpha -inf", run_with(valid_, "alpha", -std::numeric_limits<double>::infinity()), {"alpha"});
  for (double ok : {0.0, 0.5, 2.0}) {
    CallSpec c = valid_;
    for (auto& [k, v] : c.attrs)
      if (k == "alpha") v = ok;
    expect_accepted("alpha " + std::to_string(ok), c, false);
  }
}
INSTANTIATE_TEST_SUITE_P(Leaky, OpRule, ::testing::Values(std::string("LeakyReluGrad")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

class TrainingMode : public BadInput {};
// gradops runs BatchNormInternal's training form only.
TEST_P(TrainingMode, ZeroIsRejected) {
  expect_rejected("training_mode 0", run_with(valid_, "training_mode", 0), {"training_mode"});
  expect_rejected("training_mode 2", run_with(valid_, "training_mode", 2), {"training_mode"});
}
INSTANTIATE_TEST_SUITE_P(BatchNormInternal, TrainingMode, ::testing::Values(std::string("BatchNormInternal")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

class BatchNormLayout : public BadInput {};
// channels_last is 0 or 1; with 1 the channel count is the last dim, so the NCHW-shaped channel
// tensors of the valid call no longer fit.
TEST_P(BatchNormLayout, ChannelsLast) {
  expect_rejected("channels_last 2", run_with(valid_, "channels_last", 2), {"channels_last"});
  expect_rejected("channels_last 1 on NCHW channel tensors", run_with(valid_, "channels_last", 1), {});
}
INSTANTIATE_TEST_SUITE_P(BatchNorm, BatchNormLayout,
                         ::testing::Values(std::string("BatchNormalizationGrad"), std::string("BatchNormInternal")),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(BadInputByName, UnknownOperator) {
  const Status s = run("NoSuchGrad", {}, {});
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("NoSuchGrad"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace gradops::testing
