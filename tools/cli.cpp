// Shared pieces of the `gradops` subcommands.
#include "cli.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <exception>
#include <random>

#include <fmt/core.h>

#include "gradops/ops.hpp"

namespace gradops::cli {

// ---- options ----------------------------------------------------------------------------------

int parse_args(CLI::App& app, std::string_view command, std::span<char* const> args) {
  app.name("gradops " + std::string(command));
  std::vector<std::string> words(args.begin(), args.end());
  std::reverse(words.begin(), words.end());  // CLI11 takes them last first
  try {
    app.parse(std::move(words));
  } catch (const CLI::CallForHelp&) {
    fmt::print("{}", app.help());
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    return usage_error(command, e.what());
  }
  return -1;
}

int usage_error(std::string_view command, const std::string& message) {
  fmt::print(stderr, "gradops {}: {}\n(gradops {} --help lists the options)\n", command, message, command);
  return kExitUsage;
}

void add_selection_options(CLI::App& app, std::vector<std::string>* ops, std::vector<std::string>* dtypes,
                           std::string_view dtype_help) {
  app.add_option("--op", *ops, "only these operators (ORT names, comma-separated; repeatable)")
      ->type_name("NAMES")
      ->allow_extra_args(false);
  app.add_option("--dtype", *dtypes, std::string(dtype_help))->type_name("DTYPES")->allow_extra_args(false);
}

bool parse_int(std::string_view s, int64_t* out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty();
}

bool parse_uint(std::string_view s, uint64_t* out) {
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty();
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = s.find(sep, begin);
    parts.emplace_back(s.substr(begin, end == std::string_view::npos ? std::string_view::npos : end - begin));
    if (end == std::string_view::npos) return parts;
    begin = end + 1;
  }
}

bool parse_shape(std::string_view s, std::vector<int64_t>* out) {
  out->clear();
  for (const std::string& d : split(s, 'x')) {
    int64_t v;
    if (!parse_int(d, &v) || v < 0) return false;
    out->push_back(v);
  }
  return !out->empty() && out->size() <= static_cast<std::size_t>(kMaxRank);
}

bool parse_attr(std::string_view s, std::string* name, double* value) {
  const auto eq = s.find('=');
  if (eq == std::string_view::npos || eq == 0) return false;
  *name = std::string(s.substr(0, eq));
  const std::string v(s.substr(eq + 1));
  char* end = nullptr;
  *value = std::strtod(v.c_str(), &end);
  return !v.empty() && end == v.c_str() + v.size() && std::isfinite(*value);
}

bool parse_device(std::string_view s, Device* out, std::string* error) {
  std::string_view type = s;
  int64_t index = 0;
  if (const auto colon = s.find(':'); colon != std::string_view::npos) {
    type = s.substr(0, colon);
    if (!parse_int(s.substr(colon + 1), &index) || index < 0 || index > 1024) {
      *error = "bad device index in '" + std::string(s) + "'";
      return false;
    }
  }
  if (type == "cpu" && index == 0) {
    *out = Device::cpu();
    return true;
  }
  if (type == "cuda") {
#if defined(GRADOPS_HAVE_CUDA)
    *out = Device::cuda(static_cast<int>(index));
    return true;
#else
    *error = "this gradops was built without CUDA; the only device is cpu";
    return false;
#endif
  }
  *error = "unknown device '" + std::string(s) + "' (expected cpu or cuda)";
  return false;
}

// ---- selection ----------------------------------------------------------------------------------

bool Selection::parse(const std::vector<std::string>& op_values, const std::vector<std::string>& dtype_values,
                      std::string* error) {
  for (const std::string& v : op_values)
    for (const std::string& name : split(v, ',')) {
      if (!find_op(name)) {
        *error = "unknown operator '" + name + "' (gradops list shows them all)";
        return false;
      }
      ops.push_back(name);
    }
  for (const std::string& v : dtype_values) {
    for (const std::string& d : split(v, ',')) {
      DType t;
      if (!parse_dtype(d, &t)) {
        *error = "unknown dtype '" + d + "' in --dtype " + v + " (expected f32, f64, f16 or bf16)";
        return false;
      }
    }
    dtypes.push_back(v);
  }
  return true;
}

bool Selection::op_selected(const OpSchema& op) const {
  return ops.empty() || std::find(ops.begin(), ops.end(), op.name) != ops.end();
}

bool Selection::signature_selected(const OpSchema& op, const TypeSignature& sig) const {
  if (dtypes.empty()) return true;
  for (const std::string& v : dtypes) {
    const std::vector<std::string> parts = split(v, ',');
    std::vector<DType> ts(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) parse_dtype(parts[i], &ts[i]);  // checked in parse()
    if (op.type_vars.size() > 1 && parts.size() == op.type_vars.size()) {
      if (std::equal(ts.begin(), ts.end(), sig.types.begin())) return true;
    } else if (std::find(ts.begin(), ts.end(), sig.types[0]) != ts.end()) {
      return true;
    }
  }
  return false;
}

std::string signature_string(const OpSchema& op, const TypeSignature& sig) {
  std::string s;
  for (std::size_t v = 0; v < op.type_vars.size(); ++v) s += std::string(v ? "," : "") + dtype_name(sig.types[v]);
  return s;
}

std::string shape_string(std::span<const int64_t> shape) {
  if (shape.empty()) return "scalar";
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
}

// ---- seeds --------------------------------------------------------------------------------------

uint64_t fresh_seed() {
  std::random_device rd;
  return 1 + rd() % 999999999u;  // short enough to retype
}

namespace {
uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
}  // namespace

uint64_t problem_seed(uint64_t run_seed, std::string_view op, std::string_view signature, std::string_view shape,
                      const oracle::Attrs& attrs) {
  std::string key = std::string(op) + "|" + std::string(signature) + "|" + std::string(shape);
  for (const auto& [k, v] : attrs) key += "|" + k + "=" + std::to_string(v);
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : key) h = (h ^ c) * 0x100000001b3ull;
  return splitmix64(run_seed ^ splitmix64(h));
}

// ---- checking one problem -------------------------------------------------------------------------

const char* outcome_name(Outcome o) {
  switch (o) {
    case Outcome::pass: return "PASS";
    case Outcome::fail: return "FAIL";
    case Outcome::error: return "ERROR";
    case Outcome::unimplemented: return "UNIMPLEMENTED";
    case Outcome::no_oracle: return "NO-ORACLE";
  }
  return "?";
}

int outcome_rank(Outcome o) {
  switch (o) {
    case Outcome::fail: return 0;
    case Outcome::error: return 1;
    case Outcome::unimplemented: return 2;
    case Outcome::no_oracle: return 3;
    case Outcome::pass: return 4;
  }
  return 0;
}

namespace {

// When the oracle cannot make inputs, ask gradops whether it could run the op at all: required
// inputs and outputs of the main shape, resolved without running. Real buffers (never touched) keep
// the call honest: no aliasing, no null data.
bool gradops_says_unimplemented(const check::Problem& p, std::string* message) {
  const OpSchema& op = op_schema(p.op);
  std::vector<std::unique_ptr<std::byte[]>> storage;
  std::vector<TensorView> in_views(op.inputs.size()), out_views(op.outputs.size());
  std::vector<const TensorView*> in(op.inputs.size()), out(op.outputs.size());
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  auto make = [&](DType t) {
    storage.push_back(std::make_unique_for_overwrite<std::byte[]>(static_cast<std::size_t>(n) * dtype_size(t) + 1));
    return TensorView(storage.back().get(), t, std::span<const int64_t>(p.shape), p.device);
  };
  for (std::size_t i = 0; i < op.inputs.size(); ++i)
    if (!op.inputs[i].optional) in_views[i] = make(check::input_dtype(p, static_cast<int>(i))), in[i] = &in_views[i];
  for (std::size_t i = 0; i < op.outputs.size(); ++i)
    if (!op.outputs[i].optional) out_views[i] = make(check::output_dtype(p, static_cast<int>(i))), out[i] = &out_views[i];
  std::vector<Attribute> attrs;
  const oracle::Attrs full = check::full_attrs(p);
  for (const auto& [k, v] : full) attrs.push_back({k, v});
  std::string impl;
  const Status s = implementation_name(op.name, in, out, attrs, Context{}, &impl);
  if (s.code() != StatusCode::unimplemented) return false;
  *message = s.to_string();
  return true;
}

}  // namespace

Checked check_problem(const check::Problem& p, bool keep_case) {
  Checked c;
  std::unique_ptr<check::Case> cs;
  try {
    cs = std::make_unique<check::Case>(p);
  } catch (const std::bad_alloc&) {
    c.outcome = Outcome::error;
    c.detail = check::describe(p) + ": out of host memory preparing the inputs and the reference";
    return c;
  } catch (const std::exception& e) {
    const std::string why = e.what();
    if (!why.starts_with("oracle:")) {
      c.outcome = Outcome::error;
      c.detail = check::describe(p) + ": " + why;
    } else if (std::string m; gradops_says_unimplemented(p, &m)) {
      c.outcome = Outcome::unimplemented;
      c.detail = check::describe(p) + ": " + m;
    } else {
      c.outcome = Outcome::no_oracle;
      c.detail = check::describe(p) + ": " + why;
    }
    return c;
  }
  cs->poison_outputs();
  const Status s = cs->run();
  c.report.status = s;
  if (!s) {
    c.outcome = s.code() == StatusCode::unimplemented ? Outcome::unimplemented : Outcome::error;
    c.detail = check::describe(p) + ": " + s.to_string();
    return c;
  }
  c.report = cs->compare();
  c.report.status = s;
  c.outcome = c.report.pass ? Outcome::pass : Outcome::fail;
  c.detail = c.report.detail;
  if (keep_case && c.outcome == Outcome::pass) c.prepared = std::move(cs);
  return c;
}

bool validate_problem(const check::Problem& p, std::string* message, std::string* impl) {
  check::Problem small = p;
  if (!small.shape.empty() && small.shape[0] > 2) small.shape[0] = 2;
  auto refused = [&](const Status& s) {
    if (s.code() != StatusCode::invalid_argument) return false;
    *message = s.to_string();
    return true;
  };
  try {
    const check::Case c(small);
    return !refused(c.implementation(impl));
  } catch (const std::exception& e) {
    if (!std::string_view(e.what()).starts_with("oracle:")) return true;  // the check reports it
  }
  // The oracle cannot make inputs with these attributes (an axis beyond the rank, say): ask gradops
  // about them over inputs made with the defaults.
  check::Problem plain = small;
  plain.attrs.clear();
  try {
    const check::Case c(plain);
    return !refused(c.implementation(check::full_attrs(small), impl));
  } catch (const std::exception&) {
    return true;  // no oracle for the op at all: the check says NO-ORACLE
  }
}

bool device_usable(Device device, std::string* reason) {
  if (device.type == DeviceType::cpu) return true;
  const check::DeviceMemory* dev = check::device_memory(device.type);
  if (!dev) {
    *reason = std::string("this gradops has no ") + device_type_name(device.type) + " backend";
    return false;
  }
  return dev->usable(device.index, reason);
}

}  // namespace gradops::cli
