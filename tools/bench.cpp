// gradops bench: each (op, dtype signature, shape) of a suite is checked against the oracle, then
// timed; bandwidth under the bytes model is compared with a memcpy measured in the same run.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli.hpp"

namespace gradops::cli {
namespace {

constexpr OptionSpec kSpecs[] = {
    {"--device", "DEVICE", "cpu (default) or cuda"},
    {"--op", "NAMES", "only these operators (ORT names, comma-separated; repeatable)", true},
    {"--dtype", "DTYPES", "dtypes to time (default f32,bf16,f16); each picks the op's signature with\n"
                          "the most type variables equal to it (f16 -> f16,f32,f16 for LayerNorm);\n"
                          "a whole signature (f16,f16,f32) picks exactly that one; repeatable", true},
    {"--shape", "SHAPES", "instead of the suite's shapes: 1024x768 (x between dims, commas between\n"
                          "shapes; repeatable)", true},
    {"--attr", "NAME=VALUE", "an attribute for the ops that have it (axis=0, channels_last=1); repeatable", true},
    {"--threads", "N", "CPU threads for gradops and for the memcpy reference (default: OpenMP's)"},
    {"--repeats", "N", "timed runs per case (default: at least 10, and about 0.5 s worth)"},
    {"--quick", "", "small shapes and short timing: a smoke test for CI"},
    {"--full", "", "the suite's shapes as they are (on CPU they are otherwise scaled down)"},
    {"--json", "FILE", "also write the results to FILE as JSON"},
    {"--seed", "N", "the run's seed for the random inputs (default: a fresh one, printed)"},
};

// On CPU each case's working set (the bytes model) is scaled down to at most this, halving the
// rows and keeping the columns: large enough to stream from memory, small enough for a laptop and
// for the float64 reference the check needs (several times the working set).
constexpr int64_t kCpuBudgetBytes = int64_t{256} << 20;

// ---- the suite (the targets of docs/performance.md) ---------------------------------------------

using Shapes = std::vector<std::vector<int64_t>>;

struct SuiteShapes {
  Shapes elementwise, bias, softmax, norm, batch;
};

const SuiteShapes kDefault = {
    {{int64_t{1} << 26}},
    {{16384, 4096}, {8192, 3072}, {4096, 16384}},
    {{65536, 128}, {32768, 512}, {16384, 1024}, {8192, 4096}, {2048, 32768}, {512, 131072}, {8192, 50257}},
    {{32768, 768}, {16384, 1024}, {8192, 1600}, {8192, 4096}, {4096, 8192}, {2048, 16384}, {1024, 65536}, {229, 541}},
    // ResNet-50's batch-norm layers at N = 32, NCHW (the NHWC cases permute them to N,H,W,C).
    {{32, 64, 112, 112}, {32, 256, 56, 56}, {32, 512, 28, 28}, {32, 1024, 14, 14}, {32, 2048, 7, 7}},
};
const SuiteShapes kQuick = {
    {{int64_t{1} << 16}}, {{256, 512}}, {{512, 128}, {64, 4096}}, {{512, 768}, {229, 541}}, {{4, 64, 28, 28}},
};

struct SuiteCase {
  OpId op;
  std::vector<int64_t> shape;
  oracle::Attrs attrs;            // overrides of the schema's defaults
  std::vector<bool> skip_output;  // optional outputs left out
};

bool has_bias(const OpSchema& op) {
  return op.family == OpFamily::activation && op.inputs.size() > (op.gradient ? 2u : 1u);
}

std::vector<SuiteCase> suite_cases(const OpSchema& op, const SuiteShapes& s) {
  const Shapes& shapes = op.family == OpFamily::softmax      ? s.softmax
                         : op.family == OpFamily::layer_norm ? s.norm
                         : op.family == OpFamily::batch_norm ? s.batch
                         : has_bias(op)                      ? s.bias
                                                             : s.elementwise;
  std::vector<SuiteCase> cases;
  for (const auto& shape : shapes) {
    cases.push_back({op.id, shape, {}, {}});
    if (op.family == OpFamily::batch_norm)
      cases.push_back({op.id, {shape[0], shape[2], shape[3], shape[1]}, {{"channels_last", 1}}, {}});
    if (has_bias(op) && op.outputs.size() > 1) cases.push_back({op.id, shape, {}, {false, true}});  // dX alone
  }
  return cases;
}

// The signature that `--dtype t` means for this op: T = t with the most type variables equal to t
// (statistics stay f32 where the table says so), first in table order.
const TypeSignature* natural_signature(const OpSchema& op, DType t) {
  const TypeSignature* best = nullptr;
  int best_score = -1;
  for (const TypeSignature& s : op.signatures) {
    if (s.types[0] != t) continue;
    int score = 0;
    for (std::size_t v = 0; v < op.type_vars.size(); ++v) score += s.types[v] == t;
    if (score > best_score) best = &s, best_score = score;
  }
  return best;
}

std::vector<TypeSignature> bench_signatures(const OpSchema& op, const Selection& sel) {
  const std::vector<std::string> values =
      sel.dtypes.empty() ? std::vector<std::string>{"f32", "bf16", "f16"} : sel.dtypes;
  std::vector<TypeSignature> out;
  auto add = [&](const TypeSignature& s) {
    if (std::none_of(out.begin(), out.end(), [&](const TypeSignature& o) { return o.types == s.types; }))
      out.push_back(s);
  };
  for (const std::string& v : values) {
    const std::vector<std::string> parts = split(v, ',');
    std::vector<DType> ts(parts.size());
    for (std::size_t i = 0; i < parts.size(); ++i) parse_dtype(parts[i], &ts[i]);  // checked by Selection
    if (op.type_vars.size() > 1 && parts.size() == op.type_vars.size()) {
      for (const TypeSignature& s : op.signatures)
        if (std::equal(ts.begin(), ts.end(), s.types.begin())) add(s);
    } else {
      for (DType t : ts)
        if (const TypeSignature* s = natural_signature(op, t)) add(*s);
    }
  }
  return out;
}

// Halves the rows (dim 0) until the bytes model fits the budget. The model is linear in the rows
// (per-row and per-column tensors only), so two tiny cases give it exactly.
std::vector<int64_t> fit_to_budget(const check::Problem& p, int64_t budget) {
  if (p.shape.empty() || p.shape[0] <= 1) return p.shape;
  auto bytes_at = [&](int64_t rows) {
    check::Problem q = p;
    q.shape[0] = rows;
    return check::Case(q).bytes();
  };
  int64_t fixed, per_row;
  try {
    const int64_t one = bytes_at(1), two = bytes_at(2);
    per_row = two - one;
    fixed = one - per_row;
  } catch (const std::exception&) {
    return p.shape;  // no oracle for the op: the check reports it, the shape does not matter
  }
  std::vector<int64_t> s = p.shape;
  while (s[0] > 1 && fixed + per_row * s[0] > budget) s[0] = (s[0] + 1) / 2;
  return s;
}

// ---- the machine and its copy bandwidth -----------------------------------------------------------

std::string read_file(const char* path) {
  std::ifstream f(path);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

struct Machine {
  std::string cpu = "unknown";
  int logical_cpus = 1;
  int cores = 1;
  int64_t llc_bytes = 0;
  int64_t memory_bytes = 0;
};

Machine machine_info() {
  Machine m;
  const std::string info = read_file("/proc/cpuinfo");
  if (const auto at = info.find("model name"); at != std::string::npos) {
    const auto colon = info.find(':', at), end = info.find('\n', at);
    if (colon != std::string::npos && colon < end) m.cpu = info.substr(colon + 2, end - colon - 2);
  }
  m.logical_cpus = std::max(1u, std::thread::hardware_concurrency());
  std::set<std::string> cores;  // distinct (package, core) pairs
  for (int c = 0; c < m.logical_cpus; ++c) {
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(c) + "/topology/";
    const std::string pkg = read_file((base + "physical_package_id").c_str()), core = read_file((base + "core_id").c_str());
    if (!core.empty()) cores.insert(pkg + "/" + core);
  }
  m.cores = cores.empty() ? m.logical_cpus : static_cast<int>(cores.size());
  m.llc_bytes = std::max<long>({sysconf(_SC_LEVEL3_CACHE_SIZE), sysconf(_SC_LEVEL2_CACHE_SIZE), 0L});
  m.memory_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  return m;
}

struct Copy {
  int64_t buffer_bytes = 0;  // copied per run; read + write bytes are twice this
  double median_us = NAN;
  double gbps = NAN;  // (read + write bytes) / median time
  double gbps_end = NAN;  // measured again after the cases: a drifting machine shows here
};

// Timing statistics of a sample of run times, in seconds.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// memcpy of disjoint chunks by `threads` OpenMP threads, the way gradops splits its work, over
// buffers far larger than the last-level cache. Pages are first touched by the thread that copies
// them.
Copy measure_copy(int threads, int64_t bytes, int repeats) {
  constexpr int64_t kPage = 4096;
  bytes = (bytes + kPage - 1) / kPage * kPage;
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> src(static_cast<std::byte*>(std::aligned_alloc(kPage, bytes)));
  std::unique_ptr<std::byte, Free> dst(static_cast<std::byte*>(std::aligned_alloc(kPage, bytes)));
  Copy c;
  if (!src || !dst) return c;
  auto bound = [&](int64_t t, int64_t nt) { return t == nt ? bytes : bytes / kPage * t / nt * kPage; };
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    std::memset(src.get() + bound(t, nt), 1, bound(t + 1, nt) - bound(t, nt));
    std::memset(dst.get() + bound(t, nt), 0, bound(t + 1, nt) - bound(t, nt));
  }
  std::vector<double> seconds;
  for (int r = 0; r <= repeats; ++r) {  // the first is a warm-up
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::memcpy(dst.get() + bound(t, nt), src.get() + bound(t, nt), bound(t + 1, nt) - bound(t, nt));
    }
    const auto t1 = std::chrono::steady_clock::now();
    if (r) seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
  }
  c.buffer_bytes = bytes;
  c.median_us = median(seconds) * 1e6;
  c.gbps = 2.0 * static_cast<double>(bytes) / (c.median_us * 1e3);
  return c;
}

// ---- one case -----------------------------------------------------------------------------------

struct Result {
  std::string op, dtype;
  std::vector<int64_t> shape, suite_shape;
  oracle::Attrs attrs;
  std::vector<std::string> outputs;
  std::string impl;
  Outcome outcome = Outcome::error;
  std::string detail;
  double max_error = NAN, tolerance = NAN;
  double median_us = NAN, min_us = NAN;
  int repeats = 0;
  int64_t bytes = 0;
  double gbps = NAN;
};

struct Timing {
  double median_s = NAN, min_s = NAN;
  int repeats = 0;
  Status status;
};

Timing time_case(check::Case& c, Device device, int64_t fixed_repeats, bool quick) {
  const check::DeviceMemory* dev = device.type == DeviceType::cpu ? nullptr : check::device_memory(device.type);
  auto sync = [&] {
    if (dev) dev->synchronize();
  };
  Timing t;
  for (int w = 0; w < 2; ++w)  // warm-up: caches, page mappings, thread pool
    if (t.status = c.run(); !t.status) return t;
  sync();
  const int min_runs = quick ? 5 : 10, max_runs = 1000;
  const double target_s = quick ? 0.05 : 0.5;
  std::vector<double> s;
  double total = 0;
  while (fixed_repeats > 0 ? static_cast<int64_t>(s.size()) < fixed_repeats
                           : (static_cast<int>(s.size()) < min_runs || total < target_s) &&
                                 static_cast<int>(s.size()) < max_runs) {
    const auto t0 = std::chrono::steady_clock::now();
    t.status = c.run();
    sync();
    const auto t1 = std::chrono::steady_clock::now();
    if (!t.status) return t;
    s.push_back(std::chrono::duration<double>(t1 - t0).count());
    total += s.back();
  }
  t.median_s = median(s);
  t.min_s = *std::min_element(s.begin(), s.end());
  t.repeats = static_cast<int>(s.size());
  return t;
}

// ---- output -------------------------------------------------------------------------------------

std::string json_string(std::string_view s) {
  std::string r = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') r += '\\', r += static_cast<char>(c);
    else if (c == '\n') r += "\\n";
    else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      r += b;
    } else r += static_cast<char>(c);
  }
  return r + "\"";
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

std::string json_shape(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (std::size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

const char* json_status(Outcome o) {
  switch (o) {
    case Outcome::pass: return "pass";
    case Outcome::fail: return "fail";
    case Outcome::error: return "error";
    case Outcome::unimplemented: return "unimplemented";
    case Outcome::no_oracle: return "no_oracle";
  }
  return "error";
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char b[32];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return b;
}

std::string attrs_label(const oracle::Attrs& attrs) {
  std::string s;
  for (const auto& [k, v] : attrs) {
    char b[64];
    std::snprintf(b, sizeof b, " %s=%g", k.c_str(), v);
    s += b;
  }
  return s;
}

// Rewritten after every case, so that an interrupted run still leaves its results ("complete": false).
bool write_json(const std::string& path, const Machine& m, int threads, Device device, uint64_t seed, bool quick,
                bool full, const Copy& copy, const std::vector<Result>& results, bool complete) {
  std::string j = "{\n";
  j += "  \"schema\": \"gradops-bench/1\",\n";
  j += std::string("  \"complete\": ") + (complete ? "true" : "false") + ",\n";
  j += "  \"date\": " + json_string(utc_now()) + ",\n";
  j += "  \"gradops\": {\"version\": " + json_string(GRADOPS_VERSION) + ", \"build_type\": " +
       json_string(GRADOPS_BUILD_TYPE) + ", \"compiler\": " + json_string(__VERSION__) +
#if defined(GRADOPS_HAVE_CUDA)
       ", \"cuda\": true},\n";
#else
       ", \"cuda\": false},\n";
#endif
  j += "  \"machine\": {\"cpu\": " + json_string(m.cpu) + ", \"cores\": " + std::to_string(m.cores) +
       ", \"logical_cpus\": " + std::to_string(m.logical_cpus) + ", \"threads\": " + std::to_string(threads) +
       ", \"llc_bytes\": " + std::to_string(m.llc_bytes) + ", \"memory_bytes\": " + std::to_string(m.memory_bytes) +
       "},\n";
  j += "  \"device\": " + json_string(device_type_name(device.type)) + ",\n";
  j += "  \"seed\": " + std::to_string(seed) + ",\n";
  j += std::string("  \"suite\": ") + (quick ? "\"quick\"" : full ? "\"full\"" : "\"default\"") + ",\n";
  if (device.type != DeviceType::cpu)
    j += "  \"copy\": null,\n";  // no device-to-device copy reference yet
  else
    j += "  \"copy\": {\"method\": \"OpenMP memcpy of disjoint chunks\", \"threads\": " + std::to_string(threads) +
       ", \"buffer_bytes\": " + std::to_string(copy.buffer_bytes) + ", \"median_us\": " +
       json_number(copy.median_us) + ", \"gbps\": " + json_number(copy.gbps) +
       ", \"gbps_end\": " + json_number(copy.gbps_end) + "},\n";
  j += "  \"cases\": [";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::string attrs = "{";
    for (const auto& [k, v] : r.attrs) attrs += (attrs.size() > 1 ? ", " : "") + json_string(k) + ": " + json_number(v);
    attrs += "}";
    std::string outs = "[";
    for (std::size_t o = 0; o < r.outputs.size(); ++o) outs += (o ? ", " : "") + json_string(r.outputs[o]);
    outs += "]";
    const double fraction = r.gbps / copy.gbps;
    j += std::string(i ? "," : "") + "\n    {\"op\": " + json_string(r.op) + ", \"dtype\": " + json_string(r.dtype) +
         ", \"device\": " + json_string(device_type_name(device.type)) + ", \"shape\": " + json_shape(r.shape) +
         ", \"suite_shape\": " + json_shape(r.suite_shape) + ", \"attrs\": " + attrs + ", \"outputs\": " + outs +
         ",\n     \"impl\": " + json_string(r.impl) + ", \"status\": " + json_string(json_status(r.outcome)) +
         ", \"detail\": " + json_string(r.detail) + ", \"max_error\": " + json_number(r.max_error) +
         ", \"tolerance\": " + json_number(r.tolerance) + ",\n     \"median_us\": " + json_number(r.median_us) +
         ", \"min_us\": " + json_number(r.min_us) + ", \"repeats\": " + std::to_string(r.repeats) +
         ", \"bytes\": " + std::to_string(r.bytes) + ", \"gbps\": " + json_number(r.gbps) +
         ", \"copy_gbps\": " + json_number(r.outcome == Outcome::pass ? copy.gbps : NAN) +
         ", \"fraction_of_copy\": " + json_number(fraction) + "}";
  }
  j += "\n  ]\n}\n";
  std::ofstream f(path);
  f << j;
  return static_cast<bool>(f);
}

}  // namespace

int bench_main(std::span<char* const> args) {
  Options o;
  std::string error;
  if (!parse_options(args, kSpecs, &o, &error)) return usage_error("bench", error);
  if (o.has("--help")) {
    print_help(stdout, "gradops bench [options]",
               "Checks, then times, every (op, dtype signature, shape) of the embedded suite: the shapes of\n"
               "the performance targets (elementwise 2^26 elements, bias-gelu 16384x4096 ..., softmax and\n"
               "LayerNorm rows x cols lists, ResNet-50 batch norms at N=32 in NCHW and NHWC; forwards too).\n"
               "On CPU the rows are halved until a case's working set is at most 256 MiB (--full keeps\n"
               "them). A case that fails its check is reported as such, with no time. Reports the median\n"
               "time, GB/s under the bytes model (inputs read once, outputs written once) and the share\n"
               "of a memcpy measured in the same run with the same threads. Exit status 1 if any case did\n"
               "not pass its check (including UNIMPLEMENTED and NO-ORACLE).",
               kSpecs);
    return kExitOk;
  }
  Selection sel;
  if (!sel.parse(o, &error)) return usage_error("bench", error);
  Device device = Device::cpu();
  if (const std::string* d = o.last("--device"); d && !parse_device(*d, &device, &error))
    return usage_error("bench", error);
  uint64_t seed = fresh_seed();
  if (const std::string* s = o.last("--seed"); s && !parse_uint(*s, &seed))
    return usage_error("bench", "--seed takes a non-negative integer, got '" + *s + "'");
  int64_t threads = 0, repeats = 0;
  if (const std::string* t = o.last("--threads"); t && (!parse_int(*t, &threads) || threads < 1 || threads > 4096))
    return usage_error("bench", "--threads takes a count from 1 to 4096, got '" + *t + "'");
  if (const std::string* r = o.last("--repeats"); r && (!parse_int(*r, &repeats) || repeats < 1 || repeats > 1000000))
    return usage_error("bench", "--repeats takes a count from 1, got '" + *r + "'");
  const bool quick = o.has("--quick"), full = o.has("--full");
  if (quick && full) return usage_error("bench", "--quick and --full contradict each other");
  Shapes user_shapes;
  for (const std::string& v : o.all("--shape"))
    for (const std::string& one : split(v, ',')) {
      std::vector<int64_t> s;
      if (!parse_shape(one, &s))
        return usage_error("bench", "bad shape '" + one + "' (expected dims joined by x, such as 1024x768)");
      user_shapes.push_back(s);
    }
  oracle::Attrs user_attrs;
  for (const std::string& v : o.all("--attr")) {
    std::string name;
    double value;
    if (!parse_attr(v, &name, &value)) return usage_error("bench", "bad attribute '" + v + "' (expected NAME=VALUE)");
    user_attrs[name] = value;
  }
  const int used_threads = threads > 0 ? static_cast<int>(threads) : omp_get_max_threads();

  // The cases, in table order.
  std::vector<std::pair<SuiteCase, TypeSignature>> plan;
  std::set<std::string> attrs_used;
  for (const OpSchema& op : op_schemas()) {
    if (!sel.op_selected(op)) continue;
    std::vector<SuiteCase> cases;
    if (user_shapes.empty()) cases = suite_cases(op, quick ? kQuick : kDefault);
    else
      for (const auto& s : user_shapes) cases.push_back({op.id, s, {}, {}});
    for (SuiteCase& c : cases)
      for (const auto& [k, v] : user_attrs)
        if (op.find_attribute(k) >= 0) c.attrs[k] = v, attrs_used.insert(k);
    for (const TypeSignature& sig : bench_signatures(op, sel))
      for (const SuiteCase& c : cases) plan.emplace_back(c, sig);
  }
  for (const auto& [k, v] : user_attrs)
    if (!attrs_used.count(k)) return usage_error("bench", "no selected operator has an attribute '" + k + "'");
  if (plan.empty()) return usage_error("bench", "no operator and dtype matches the filters");

  const Machine machine = machine_info();
  std::printf("gradops %s bench: %s, %s, %d cores, %d threads, seed %llu\n", GRADOPS_VERSION,
              device_type_name(device.type), machine.cpu.c_str(), machine.cores, used_threads,
              static_cast<unsigned long long>(seed));
  Copy copy;
  // Far beyond the last-level cache, but within an eighth of the memory.
  const int64_t copy_bytes = std::min<int64_t>(std::max<int64_t>(int64_t{1} << 30, 4 * machine.llc_bytes),
                                               std::max<int64_t>(machine.memory_bytes / 8, int64_t{64} << 20));
  const int copy_repeats = quick ? 3 : 7;
  if (device.type == DeviceType::cpu) {
    std::fprintf(stderr, "measuring memcpy bandwidth (2 x %.2f GB)...\n", static_cast<double>(copy_bytes) / 1e9);
    copy = measure_copy(used_threads, copy_bytes, copy_repeats);
    std::printf("memcpy: %.1f GB/s read+write (OpenMP, %d threads, %.2f GB buffers, last-level cache %.0f MB)\n",
                copy.gbps, used_threads, static_cast<double>(copy.buffer_bytes) / 1e9,
                static_cast<double>(machine.llc_bytes) / 1e6);
  }
  std::printf("\n%-34s %-14s %-26s %-17s %-13s %7s %11s %9s %7s\n", "op", "dtype", "shape", "impl", "status",
              "err/tol", "median_us", "GB/s", "copy%");
  std::fflush(stdout);

  const bool tty = isatty(fileno(stderr));
  const std::string* json_path = o.last("--json");
  bool json_ok = true;
  std::vector<Result> results;
  int not_passed = 0;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const auto& [sc, sig] = plan[i];
    const OpSchema& op = op_schema(sc.op);
    Result r;
    r.op = op.name;
    r.dtype = signature_string(op, sig);
    r.suite_shape = sc.shape;
    r.attrs = sc.attrs;
    check::Problem p;
    p.op = sc.op;
    p.sig = sig;
    p.shape = sc.shape;
    p.attrs = sc.attrs;
    p.skip_output = sc.skip_output;
    p.threads = static_cast<int>(threads);
    p.device = device;
    if (device.type == DeviceType::cpu && !full) p.shape = fit_to_budget(p, kCpuBudgetBytes);
    p.seed = problem_seed(seed, op.name, r.dtype, shape_string(p.shape), p.attrs);
    r.shape = p.shape;
    for (std::size_t k = 0; k < op.outputs.size(); ++k)
      if (!(k < sc.skip_output.size() && sc.skip_output[k])) r.outputs.emplace_back(op.outputs[k].name);
    const std::string label = r.op + (r.outputs.size() < op.outputs.size() ? " (" + r.outputs[0] + " only)" : "");
    const std::string shape_label = shape_string(r.shape) + attrs_label(r.attrs);
    std::fprintf(stderr, "%s[%zu/%zu] %s %s %s%s", tty ? "\r\033[K" : "", i + 1, plan.size(), label.c_str(),
                 r.dtype.c_str(), shape_label.c_str(), tty ? "" : "\n");
    std::fflush(stderr);

    Checked c = check_problem(p, true);
    r.outcome = c.outcome;
    r.detail = c.outcome == Outcome::pass ? "" : c.detail;
    if (c.outcome == Outcome::pass || c.outcome == Outcome::fail) {
      r.max_error = c.report.max_error;
      r.tolerance = c.report.tolerance;
    }
    if (c.prepared) {
      r.bytes = c.prepared->bytes();
      if (Status s = c.prepared->implementation(&r.impl); !s) r.impl = "?";
      const Timing t = time_case(*c.prepared, device, repeats, quick);
      if (!t.status) {
        r.outcome = Outcome::error;
        r.detail = "while timing: " + t.status.to_string();
      } else {
        r.median_us = t.median_s * 1e6;
        r.min_us = t.min_s * 1e6;
        r.repeats = t.repeats;
        r.gbps = static_cast<double>(r.bytes) / (r.median_us * 1e3);
      }
    }
    c.prepared.reset();
    if (tty) std::fprintf(stderr, "\r\033[K");
    not_passed += r.outcome != Outcome::pass;

    char ratio[16] = "-", med[24] = "-", gbps[16] = "-", pct[16] = "-";
    if (std::isfinite(r.max_error))
      std::snprintf(ratio, sizeof ratio, "%.2f", r.max_error == 0 ? 0.0 : r.max_error / r.tolerance);
    if (std::isfinite(r.median_us)) std::snprintf(med, sizeof med, "%.1f", r.median_us);
    if (std::isfinite(r.gbps)) std::snprintf(gbps, sizeof gbps, "%.2f", r.gbps);
    if (std::isfinite(r.gbps / copy.gbps)) std::snprintf(pct, sizeof pct, "%.0f%%", 100 * r.gbps / copy.gbps);
    std::printf("%-34s %-14s %-26s %-17s %-13s %7s %11s %9s %7s\n", label.c_str(), r.dtype.c_str(),
                shape_label.c_str(), r.impl.empty() ? "-" : r.impl.c_str(), outcome_name(r.outcome), ratio, med,
                gbps, pct);
    if (r.outcome != Outcome::pass) std::printf("  %s\n", r.detail.c_str());
    std::fflush(stdout);
    results.push_back(std::move(r));
    if (json_path)
      json_ok = write_json(*json_path, machine, used_threads, device, seed, quick, full, copy, results,
                           i + 1 == plan.size() && device.type != DeviceType::cpu);
  }

  if (device.type == DeviceType::cpu) {
    copy.gbps_end = measure_copy(used_threads, copy_bytes, copy_repeats).gbps;
    std::printf("\nmemcpy again after the cases: %.1f GB/s (%+.0f%%; copy%% above uses the first measurement)\n",
                copy.gbps_end, 100 * (copy.gbps_end / copy.gbps - 1));
    if (json_path)
      json_ok = write_json(*json_path, machine, used_threads, device, seed, quick, full, copy, results, true);
  }
  std::printf("\n%zu cases: %zu passed and timed, %d did not pass (seed %llu)\n", results.size(),
              results.size() - not_passed, not_passed, static_cast<unsigned long long>(seed));
  if (json_path) {
    if (!json_ok) {
      std::fprintf(stderr, "gradops bench: could not write %s\n", json_path->c_str());
      return kExitFailures;
    }
    std::printf("wrote %s\n", json_path->c_str());
  }
  return not_passed ? kExitFailures : kExitOk;
}

}  // namespace gradops::cli
