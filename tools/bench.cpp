// gradops bench: each (op, dtype signature, shape) of a suite is checked against the oracle, then
// timed; bandwidth under the bytes model is compared with a copy measured in the same run.
#include <fmt/core.h>
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
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli.hpp"
#include "memory_loops.hpp"

namespace gradops::cli {
namespace {

// On CPU each suite case's rows (the first dimension) are set so that its working set under the
// bytes model is at least this many times the last-level cache the tool detects (and at least
// kCpuMinBytes): the data then streams from memory, which is what the copy reference measures.
constexpr int64_t kCpuCacheMultiple = 2;
constexpr int64_t kCpuMinBytes = int64_t{256} << 20;
// A CPU case larger than this is checked against the oracle at fewer rows (the same op, dtypes,
// attributes and columns, within this working set), then timed at its own size on those inputs
// repeated along the rows: the float64 oracle is single-threaded and needs several times the
// working set, so checking gigabytes would take minutes per case.
constexpr int64_t kCheckBytes = int64_t{32} << 20;

// ---- the suites (docs/performance.md) -----------------------------------------------------------

using Shapes = std::vector<std::vector<int64_t>>;

struct SuiteShapes {
  Shapes elementwise, bias, softmax, norm, batch;
  bool dx_only = false;  // also the bias gradients without dB
  Shapes softmax_axis;   // [outer, axis, inner] timed at axis 1 by the single-axis (_13) softmax ops
};

// The default suite: one representative shape per family (two layouts for batch norm), every op.
// On CPU the rows are then sized beyond the last-level cache; the columns stay.
const SuiteShapes kDefault = {
    {{int64_t{1} << 26}}, {{16384, 4096}}, {{8192, 4096}}, {{16384, 1024}}, {{32, 256, 56, 56}}, false, {},
};
// --full: the shapes of the performance targets, forwards included.
const SuiteShapes kFull = {
    {{int64_t{1} << 26}},
    {{16384, 4096}, {8192, 3072}, {4096, 16384}},
    {{65536, 128}, {32768, 512}, {16384, 1024}, {8192, 4096}, {2048, 32768}, {512, 131072}, {8192, 50257}},
    {{32768, 768}, {16384, 1024}, {8192, 1600}, {8192, 4096}, {4096, 8192}, {2048, 16384}, {1024, 65536}, {229, 541}},
    // ResNet-50's batch-norm layers at N = 32, NCHW (the NHWC cases permute them to N,H,W,C).
    {{32, 64, 112, 112}, {32, 256, 56, 56}, {32, 512, 28, 28}, {32, 1024, 14, 14}, {32, 2048, 7, 7}},
    true,
    // A non-last axis: inner sizes below the vector width (folded), one of a few vectors, and wide
    // rows; short, medium and long axes. Each at least 64 MB in f32 before the rows are sized.
    {{256, 32768, 2}, {8192, 1000, 3}, {64, 32768, 8}, {256, 1000, 96}, {256, 16, 4096}, {32, 128, 4096}},
};
const SuiteShapes kQuick = {
    {{int64_t{1} << 16}}, {{256, 512}}, {{512, 128}, {64, 4096}}, {{512, 768}, {229, 541}}, {{4, 64, 28, 28}}, true, {},
};

// The share of the copy a CPU case is held to (docs/performance.md, "Targets on the CPU"); NaN for
// none. Kernels that evaluate erf, tanh or exp per element are bound by the core, not by memory,
// and are compared with PyTorch instead; BatchNorm must read x and dY twice once they leave the
// cache (five streams against the bytes model's three), so it is held to 0.90 of that 0.60 bound.
double cpu_target_share(const OpSchema& op) {
  static const std::set<std::string_view> kComputeBound = {
      "GeluGrad", "FastGeluGrad", "BiasGeluGrad_dX", "BiasFastGeluGrad_dX", "QuickGeluGrad",
      "Gelu",     "FastGelu",     "BiasGelu",        "QuickGelu",           "Sigmoid", "Tanh"};
  if (kComputeBound.count(op.name)) return NAN;
  return op.family == OpFamily::batch_norm ? 0.90 * 0.60 : 0.80;
}

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
    if (s.dx_only && has_bias(op) && op.outputs.size() > 1) cases.push_back({op.id, shape, {}, {false, true}});
  }
  // The opset 1-12 names coerce to 2-D at axis 1, which is rows again: the _13 names only.
  if (op.family == OpFamily::softmax && op.name.ends_with("_13"))
    for (const auto& shape : s.softmax_axis) cases.push_back({op.id, shape, {{"axis", 1}}, {}});
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

std::vector<TypeSignature> bench_signatures(const OpSchema& op, const Selection& sel, bool full) {
  const std::vector<std::string> values = !sel.dtypes.empty() ? sel.dtypes
                                          : full ? std::vector<std::string>{"f32", "bf16", "f16"}
                                                 : std::vector<std::string>{"f32", "bf16"};
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

// The bytes model as a function of the rows (dim 0): fixed + per_row * rows. It is linear (per-row
// and per-column tensors only), so two tiny cases give it exactly. false where the oracle cannot
// make the op's inputs (the check reports that; the shape does not matter).
bool row_model(const check::Problem& p, int64_t* fixed, int64_t* per_row) {
  if (p.shape.empty()) return false;
  auto bytes_at = [&](int64_t rows) {
    check::Problem q = p;
    q.shape[0] = rows;
    return check::Case(q).bytes();
  };
  try {
    const int64_t one = bytes_at(1), two = bytes_at(2);
    *per_row = two - one;
    *fixed = one - *per_row;
  } catch (const std::exception&) {
    return false;
  }
  return *per_row > 0;
}

// The fewest rows whose working set is at least `bytes`.
int64_t rows_at_least(int64_t fixed, int64_t per_row, int64_t bytes) {
  return std::max<int64_t>(1, (bytes - fixed + per_row - 1) / per_row);
}

// The most rows (at most `rows`) whose working set is at most `bytes`, at least one.
int64_t rows_at_most(int64_t fixed, int64_t per_row, int64_t bytes, int64_t rows) {
  return std::clamp<int64_t>((bytes - fixed) / per_row, 1, std::max<int64_t>(rows, 1));
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
  int64_t buffer_bytes = 0;  // the size of each of the two buffers
  double median_us = NAN;    // one run of the fastest loop
  std::string method;  // the fastest loop: "memcpy", "copy loop", "streaming copy loop" or "streaming add"
  double gbps = NAN;  // (read + write bytes) / median time, the run's first measurement of every loop
  double gbps_end = NAN;  // every loop measured again after the cases: a drifting machine shows here
  std::vector<double> samples_gbps;  // every measurement of the run, in order (the first is gbps)
};

// Timing statistics of a sample of run times, in seconds.
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? NAN : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// The copy reference: disjoint chunks handled by `threads` OpenMP threads, the way gradops splits
// its work, by four loops (memory_loops.cpp): glibc's memcpy (whose `rep movsb` runs well below
// vector stores on some virtual machines), a vector copy loop, the same with streaming stores, and
// a streaming add (c = a + b on 64-bit integers, two reads per write: the stream mix of most
// gradient ops, which outruns any copy where reads cost less than writes). The buffers live for the
// run, in the memory the cases' tensors get (huge pages where the OS has them).
class CopyReference {
 public:
  enum Method { kMemcpy, kLoop, kStream, kAdd };

  CopyReference(int threads, int64_t bytes) : threads_(threads) {
    constexpr int64_t kPage = 4096;
    bytes_ = (bytes + 2 * kPage - 1) / (2 * kPage) * (2 * kPage);
    try {
      src_ = check::allocate_host(bytes_), dst_ = check::allocate_host(bytes_);
    } catch (const std::bad_alloc&) {
      src_.reset(), dst_.reset();
      return;
    }
#pragma omp parallel num_threads(threads_)
    {  // each thread touches the pages it will copy
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::memset(src_.get() + bound(t, nt), 1, bound(t + 1, nt) - bound(t, nt));
      std::memset(dst_.get() + bound(t, nt), 0, bound(t + 1, nt) - bound(t, nt));
    }
  }
  bool ok() const { return src_ != nullptr; }
  int64_t buffer_bytes() const { return bytes_; }

  // Every loop, `repeats` runs each after a warm-up: the fastest median (read + write GB/s) is the
  // result. The fastest of the three copies is the copy that `interleave` runs from then on.
  Copy measure_all(int repeats) {
    Copy c;
    c.buffer_bytes = bytes_;
    double best_copy = NAN;
    for (const Method m : {kMemcpy, kLoop, kStream, kAdd}) {
      const double gbps = time(m, repeats);
      if (!(gbps <= c.gbps)) c.gbps = gbps, c.median_us = moved(m) / (gbps * 1e3), c.method = name(m);
      if (m != kAdd && !(gbps <= best_copy)) best_copy = gbps, copy_ = m;
    }
    return c;
  }
  // One run, outside the case's timing, after each of its timed runs: the fastest copy and the
  // streaming add in turn, since which of the two leads changes with the machine's state (a case
  // reading one stream per write is held to the copy, one reading two to the add, and the
  // reference is the higher of the two). `sample` gives the higher median bandwidth and starts over.
  void interleave() {
    const Method m = runs_[0].size() <= runs_[1].size() ? copy_ : kAdd;
    runs_[m == kAdd].push_back(run(m));
  }
  double sample() {
    double best = NAN;
    for (int i : {0, 1})
      if (!runs_[i].empty()) {
        const double gbps = moved(i ? kAdd : copy_) / (median(runs_[i]) * 1e9);
        if (!(gbps <= best)) best = gbps;
      }
    runs_[0].clear(), runs_[1].clear();
    return best;
  }

 private:
  static const char* name(Method m) {
    return m == kMemcpy ? "memcpy" : m == kLoop ? "copy loop" : m == kStream ? "streaming copy loop" : "streaming add";
  }
  double moved(Method m) const { return (m == kAdd ? 1.5 : 2.0) * static_cast<double>(bytes_); }  // read + write
  int64_t bound(int64_t t, int64_t nt) const { return t == nt ? bytes_ : bytes_ / 4096 * t / nt * 4096; }
  double time(Method m, int repeats) {
    std::vector<double> seconds;
    for (int r = 0; r <= repeats; ++r) {  // the first is a warm-up
      const double t = run(m);
      if (r) seconds.push_back(t);
    }
    return moved(m) / (median(seconds) * 1e9);
  }
  double run(Method m) {
    const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(threads_)
    {
      const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
      std::byte* d = dst_.get() + bound(t, nt);
      const std::byte* s = src_.get() + bound(t, nt);
      const int64_t n = bound(t + 1, nt) - bound(t, nt);
      auto* dw = reinterpret_cast<uint64_t*>(d);
      const auto* sw = reinterpret_cast<const uint64_t*>(s);
      if (m == kLoop) copy_loop(dw, sw, n / 8);
      else if (m == kStream) stream_copy(dw, sw, n / 8);
      else if (m == kAdd) stream_add(dw, sw, sw + n / 16, n / 16);  // the chunk's halves in, half out
      else std::memcpy(d, s, n);
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  int threads_;
  int64_t bytes_ = 0;
  check::HostBytes src_, dst_;
  Method copy_ = kMemcpy;
  std::vector<double> runs_[2];  // seconds of the interleaved copy and add runs since the last sample
};

// ---- one case -----------------------------------------------------------------------------------

struct Result {
  std::string op, dtype;
  std::vector<int64_t> shape, suite_shape, checked_shape;
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
  double copy_gbps = NAN;       // the copy sample taken last before this case
  bool cache_resident = false;  // the working set fits the last-level cache: no copy share
  double target_share = NAN;    // cpu_target_share, where the case is held to one
  const char* mark = nullptr;   // "pass" or "miss" against target_share; null where none applies
};

struct Timing {
  double median_s = NAN, min_s = NAN;
  int repeats = 0;
  Status status;
};

// `between`, where given, runs after each timed run, outside the timing.
Timing time_case(check::Case& c, Device device, int64_t fixed_repeats, bool quick, const std::function<void()>& between) {
  const check::DeviceMemory* dev = device.type == DeviceType::cpu ? nullptr : check::device_memory(device.type);
  auto sync = [&] {
    if (dev) dev->synchronize();
  };
  Timing t;
  for (int w = 0; w < 2; ++w)  // warm-up: caches, page mappings, thread pool
    if (t.status = c.run(); !t.status) return t;
  sync();
  const int min_runs = quick ? 5 : 10, max_runs = 1000;
  const double target_s = quick ? 0.05 : 0.25;
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
    if (between) between();
  }
  t.median_s = median(s);
  t.min_s = *std::min_element(s.begin(), s.end());
  t.repeats = static_cast<int>(s.size());
  return t;
}

// ---- output -------------------------------------------------------------------------------------

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

// Six significant digits, as the JSON has always had; null for NaN and infinities.
nlohmann::ordered_json json_number(double v) {
  if (!std::isfinite(v)) return nullptr;
  return std::strtod(fmt::format("{:.6g}", v).c_str(), nullptr);
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
  for (const auto& [k, v] : attrs) s += fmt::format(" {}={:g}", k, v);
  return s;
}

struct RunInfo {
  Machine machine;
  int threads = 1;
  Device device;
  uint64_t seed = 0;
  const char* suite = "default";
  int misalign_bytes = 0;
};

// The schema "gradops-bench/1" (docs/cli.md; tests/bench_json_test.py pins it). Rewritten after
// every case, so that an interrupted run still leaves its results ("complete": false).
bool write_json(const std::string& path, const RunInfo& run, const Copy& copy, const std::vector<Result>& results,
                bool complete) {
  using json = nlohmann::ordered_json;
  json j;
  j["schema"] = "gradops-bench/1";
  j["complete"] = complete;
  j["date"] = utc_now();
#if defined(GRADOPS_HAVE_CUDA)
  constexpr bool cuda = true;
#else
  constexpr bool cuda = false;
#endif
  j["gradops"] = {{"version", GRADOPS_VERSION}, {"build_type", GRADOPS_BUILD_TYPE}, {"compiler", __VERSION__},
                  {"cuda", cuda}};
  const Machine& m = run.machine;
  j["machine"] = {{"cpu", m.cpu},       {"cores", m.cores},         {"logical_cpus", m.logical_cpus},
                  {"threads", run.threads}, {"llc_bytes", m.llc_bytes}, {"memory_bytes", m.memory_bytes}};
  j["device"] = device_type_name(run.device.type);
  j["seed"] = run.seed;
  j["suite"] = run.suite;
  j["misalign_bytes"] = run.misalign_bytes;
  if (run.device.type != DeviceType::cpu) {
    j["copy"] = nullptr;  // no device-to-device copy reference yet
  } else {
    json samples = json::array();
    for (double g : copy.samples_gbps) samples.push_back(json_number(g));
    const auto [lo, hi] = std::minmax_element(copy.samples_gbps.begin(), copy.samples_gbps.end());
    j["copy"] = {{"method", "OpenMP " + copy.method + " of disjoint chunks (the fastest of memcpy, two copy loops and a streaming add)"},
                 {"threads", run.threads},
                 {"buffer_bytes", copy.buffer_bytes},
                 {"median_us", json_number(copy.median_us)},
                 {"gbps", json_number(copy.gbps)},
                 {"gbps_end", json_number(copy.gbps_end)},
                 {"samples_gbps", samples},
                 {"min_gbps", json_number(copy.samples_gbps.empty() ? NAN : *lo)},
                 {"max_gbps", json_number(copy.samples_gbps.empty() ? NAN : *hi)}};
  }
  json cases = json::array();
  for (const Result& r : results) {
    json attrs = json::object();
    for (const auto& [k, v] : r.attrs) attrs[k] = json_number(v);
    const bool timed = r.outcome == Outcome::pass;
    cases.push_back({{"op", r.op},
                     {"dtype", r.dtype},
                     {"device", device_type_name(run.device.type)},
                     {"shape", r.shape},
                     {"suite_shape", r.suite_shape},
                     {"checked_shape", r.checked_shape},
                     {"attrs", attrs},
                     {"outputs", r.outputs},
                     {"impl", r.impl},
                     {"status", json_status(r.outcome)},
                     {"detail", r.detail},
                     {"max_error", json_number(r.max_error)},
                     {"tolerance", json_number(r.tolerance)},
                     {"median_us", json_number(r.median_us)},
                     {"min_us", json_number(r.min_us)},
                     {"repeats", r.repeats},
                     {"bytes", r.bytes},
                     {"gbps", json_number(r.gbps)},
                     {"copy_gbps", json_number(timed && !r.cache_resident ? r.copy_gbps : NAN)},
                     {"fraction_of_copy", json_number(r.cache_resident ? NAN : r.gbps / r.copy_gbps)},
                     {"cache_resident", r.cache_resident},
                     {"target_share", json_number(r.target_share)},
                     {"mark", r.mark ? json(r.mark) : json(nullptr)}});
  }
  j["cases"] = std::move(cases);
  std::ofstream f(path);
  f << j.dump(1) << "\n";
  return static_cast<bool>(f);
}

std::string duration_label(double seconds) {
  const int s = static_cast<int>(std::lround(std::max(0.0, seconds)));
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// One planned case: what the table needs before it runs (its columns are sized from these).
struct Planned {
  SuiteCase sc;
  TypeSignature sig{};
  check::Problem problem;
  check::Problem checked;  // the problem compared with the oracle: `problem`, or the same with fewer rows
  std::string label, dtype, shape_label, impl;
};

}  // namespace

int bench_main(std::span<char* const> args) {
  CLI::App app{
      "Checks, then times, every (op, dtype signature, shape) of the embedded suite. The default suite\n"
      "has one representative shape per op family (two layouts for batch norm) in f32 and bf16, every\n"
      "operator; --full has the shapes of the performance targets in f32, bf16 and f16. On CPU the\n"
      "rows of every suite case are sized so that its working set is at least twice the last-level\n"
      "cache (and 256 MiB). A case that fails its check is reported as such, with no time. Reports the\n"
      "median time, GB/s under the bytes model (inputs read once, outputs written once) and the share\n"
      "of a copy (the fastest of memcpy, two copy loops and a streaming add) measured in the same run with the same\n"
      "threads (sampled through the run; its spread is printed). Cases whose working set fits the last-level cache are marked cache and get\n"
      "no share. Exit status 1 if any case did not pass its check (including UNIMPLEMENTED and\n"
      "NO-ORACLE), or if the device cannot be used; 2 for a usage error, such as an attribute value\n"
      "the operator does not accept."};
  std::string device_name = "cpu";
  std::vector<std::string> op_values, dtype_values, shape_values, attr_values;
  uint64_t seed = fresh_seed();
  int threads = 0, repeats = 0, misalign = 0;
  bool quick = false, full = false;
  std::string json_path;
  app.add_option("--device", device_name, "cpu (default) or cuda")->type_name("DEVICE");
  add_selection_options(app, &op_values, &dtype_values,
                        "dtypes to time (default f32,bf16; with --full f32,bf16,f16); each picks the op's\n"
                        "signature with the most type variables equal to it (f16 -> f16,f32,f16 for\n"
                        "LayerNorm); a whole signature (f16,f16,f32) picks exactly that one; repeatable");
  app.add_option("--shape", shape_values,
                 "instead of the suite's shapes: 1024x768 (x between dims, commas between shapes;\n"
                 "repeatable); used as given, also on CPU")
      ->type_name("SHAPES")
      ->allow_extra_args(false);
  app.add_option("--attr", attr_values, "an attribute for the ops that have it (axis=0, channels_last=1); repeatable")
      ->type_name("NAME=VALUE")
      ->allow_extra_args(false);
  app.add_option("--threads", threads, "CPU threads for gradops and for the copy reference (default: OpenMP's)")
      ->type_name("N")
      ->check(CLI::Range(1, 4096));
  app.add_option("--repeats", repeats, "timed runs per case (default: at least 10, and about 0.5 s worth)")
      ->type_name("N")
      ->check(CLI::Range(1, 1000000));
  app.add_option("--misalign", misalign,
                 "place every tensor BYTES past a 64-byte boundary, checked and timed there (default 0;\n"
                 "numpy's large arrays start 16 bytes past one)")
      ->type_name("BYTES")
      ->check(CLI::Range(0, 63));
  CLI::Option* quick_opt = app.add_flag("--quick", quick, "small shapes and short timing: a smoke test for CI");
  app.add_flag("--full", full, "the full suite: the shapes of the performance targets, f16 too")->excludes(quick_opt);
  app.add_option("--json", json_path, "also write the results to FILE as JSON")->type_name("FILE");
  app.add_option("--seed", seed, "the run's seed for the random inputs (default: a fresh one, printed)")
      ->type_name("N");
  if (const int rc = parse_args(app, "bench", args); rc >= 0) return rc;

  std::string error;
  Selection sel;
  if (!sel.parse(op_values, dtype_values, &error)) return usage_error("bench", error);
  Device device = Device::cpu();
  if (!parse_device(device_name, &device, &error)) return usage_error("bench", error);
  Shapes user_shapes;
  for (const std::string& v : shape_values)
    for (const std::string& one : split(v, ',')) {
      std::vector<int64_t> sh;
      if (!parse_shape(one, &sh))
        return usage_error("bench", "bad shape '" + one + "' (expected dims joined by x, such as 1024x768)");
      user_shapes.push_back(sh);
    }
  oracle::Attrs user_attrs;
  for (const std::string& v : attr_values) {
    std::string name;
    double value;
    if (!parse_attr(v, &name, &value)) return usage_error("bench", "bad attribute '" + v + "' (expected NAME=VALUE)");
    user_attrs[name] = value;
  }
  if (!device_usable(device, &error)) {
    fmt::print(stderr, "gradops bench: {}\n", error);
    return kExitFailures;
  }
  const int used_threads = threads > 0 ? threads : omp_get_max_threads();
  const Machine machine = machine_info();
  // Suite cases on CPU stream from memory: at least twice the last-level cache the tool detects.
  const int64_t cpu_target = std::max(kCpuMinBytes, kCpuCacheMultiple * machine.llc_bytes);

  // The cases, in table order.
  std::vector<std::pair<SuiteCase, TypeSignature>> cases_and_sigs;
  std::set<std::string> attrs_used;
  for (const OpSchema& op : op_schemas()) {
    if (!sel.op_selected(op)) continue;
    std::vector<SuiteCase> cases;
    if (user_shapes.empty()) cases = suite_cases(op, quick ? kQuick : full ? kFull : kDefault);
    else
      for (const auto& sh : user_shapes) cases.push_back({op.id, sh, {}, {}});
    for (SuiteCase& c : cases)
      for (const auto& [k, v] : user_attrs)
        if (op.find_attribute(k) >= 0) c.attrs[k] = v, attrs_used.insert(k);
    for (const TypeSignature& sig : bench_signatures(op, sel, full))
      for (const SuiteCase& c : cases) cases_and_sigs.emplace_back(c, sig);
  }
  for (const auto& [k, v] : user_attrs)
    if (!attrs_used.count(k)) return usage_error("bench", "no selected operator has an attribute '" + k + "'");
  if (cases_and_sigs.empty()) return usage_error("bench", "no operator and dtype matches the filters");

  // Every case sized and validated by gradops before anything is timed: an attribute value or a
  // shape the op refuses is a usage error now, not a failure after minutes of measuring.
  std::vector<Planned> plan;
  for (const auto& [sc, sig] : cases_and_sigs) {
    const OpSchema& op = op_schema(sc.op);
    Planned pl;
    pl.sc = sc;
    pl.sig = sig;
    check::Problem& p = pl.problem;
    p.op = sc.op;
    p.sig = sig;
    p.shape = sc.shape;
    p.attrs = sc.attrs;
    p.skip_output = sc.skip_output;
    p.threads = threads;
    p.device = device;
    p.misalign_bytes = misalign;
    if (std::string message; !validate_problem(p, &message, &pl.impl)) {
      const bool from_user = !user_shapes.empty() || !user_attrs.empty();
      if (from_user) return usage_error("bench", message);
    }
    pl.checked = p;
    if (int64_t fixed, per_row; device.type == DeviceType::cpu && row_model(p, &fixed, &per_row)) {
      if (!quick && user_shapes.empty()) p.shape[0] = rows_at_least(fixed, per_row, cpu_target);
      pl.checked.shape = p.shape;
      pl.checked.shape[0] = rows_at_most(fixed, per_row, kCheckBytes, p.shape[0]);
    }
    pl.dtype = signature_string(op, sig);
    p.seed = problem_seed(seed, op.name, pl.dtype, shape_string(p.shape), p.attrs);
    pl.checked.seed = p.seed;
    std::vector<std::string> outputs;
    for (std::size_t k = 0; k < op.outputs.size(); ++k)
      if (!(k < sc.skip_output.size() && sc.skip_output[k])) outputs.emplace_back(op.outputs[k].name);
    pl.label = std::string(op.name) + (outputs.size() < op.outputs.size() ? " (" + outputs[0] + " only)" : "");
    pl.shape_label = shape_string(p.shape) + attrs_label(p.attrs);
    plan.push_back(std::move(pl));
  }

  RunInfo run{machine, used_threads, device, seed, quick ? "quick" : full ? "full" : "default", misalign};
  fmt::print("gradops {} bench ({} suite): {}, {}, {} cores, {} threads, seed {}\n", GRADOPS_VERSION, run.suite,
             device_type_name(device.type), machine.cpu, machine.cores, used_threads, seed);
  Copy copy;
  // Source and destination together span the suite cases' working set (twice the last-level
  // cache), within an eighth of the memory.
  const int64_t copy_bytes = std::min<int64_t>(cpu_target / 2,
                                               std::max<int64_t>(machine.memory_bytes / 8, int64_t{64} << 20));
  std::optional<CopyReference> reference;
  double current_copy = NAN;
  if (device.type == DeviceType::cpu) {
    fmt::print(stderr, "measuring copy bandwidth (2 x {:.2f} GB)...\n", static_cast<double>(copy_bytes) / 1e9);
    reference.emplace(used_threads, copy_bytes);
    if (reference->ok()) {
      copy = reference->measure_all(quick ? 3 : 5);
      copy.samples_gbps.push_back(copy.gbps);
      current_copy = copy.gbps;
    }
    fmt::print("copy: {:.1f} GB/s read+write ({}, the fastest of memcpy, two copy loops and a streaming add; OpenMP, "
               "{} threads, 2 x {:.2f} GB; the fastest copy and the add run again between each case's timed runs, and the higher of their medians there is the case's reference)\n",
               copy.gbps, copy.method, used_threads, static_cast<double>(copy.buffer_bytes) / 1e9);
    fmt::print("last-level cache {:.0f} MB: suite cases are sized to at least {:.2f} GB; smaller ones are marked "
               "cache and get no copy share\n",
               static_cast<double>(machine.llc_bytes) / 1e6, static_cast<double>(cpu_target) / 1e9);
  }

  // Columns as wide as their content.
  std::size_t w_label = 2, w_dtype = 5, w_shape = 5, w_impl = 4;
  for (const Planned& pl : plan) {
    w_label = std::max(w_label, pl.label.size());
    w_dtype = std::max(w_dtype, pl.dtype.size());
    w_shape = std::max(w_shape, pl.shape_label.size());
    w_impl = std::max(w_impl, pl.impl.size());
  }
  auto row = [&](std::string_view label, std::string_view dtype, std::string_view shape, std::string_view impl,
                 std::string_view status, std::string_view ratio, std::string_view med, std::string_view gbps,
                 std::string_view pct, std::string_view target) {
    fmt::print("{:<{}}  {:<{}}  {:<{}}  {:<{}}  {:<13}  {:>7}  {:>11}  {:>8}  {:>6}  {}\n", label, w_label, dtype,
               w_dtype, shape, w_shape, impl, w_impl, status, ratio, med, gbps, pct, target);
  };
  fmt::print("\n");
  row("op", "dtype", "shape", "impl", "status", "err/tol", "median_us", "GB/s", "copy%",
      device.type == DeviceType::cpu ? "target" : "");
  std::fflush(stdout);

  const bool tty = isatty(fileno(stderr));
  bool json_ok = true;
  std::vector<Result> results;
  int not_passed = 0, above_copy = 0, marks_pass = 0, marks_miss = 0;
  const auto start = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const Planned& pl = plan[i];
    const check::Problem& p = pl.problem;
    const OpSchema& op = op_schema(p.op);
    Result r;
    r.op = op.name;
    r.dtype = pl.dtype;
    r.suite_shape = pl.sc.shape;
    r.shape = p.shape;
    r.attrs = p.attrs;
    for (std::size_t k = 0; k < op.outputs.size(); ++k)
      if (!(k < p.skip_output.size() && p.skip_output[k])) r.outputs.emplace_back(op.outputs[k].name);

    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string eta =
        i == 0 ? "" : fmt::format(", about {} left", duration_label(elapsed / static_cast<double>(i) * (plan.size() - i)));
    fmt::print(stderr, "{}[{}/{}] {} {} {} ({} so far{}){}", tty ? "\r\033[K" : "", i + 1, plan.size(), pl.label,
               r.dtype, pl.shape_label, duration_label(elapsed), eta, tty ? "" : "\n");
    std::fflush(stderr);

    Checked c = check_problem(pl.checked, true);
    r.checked_shape = pl.checked.shape;
    r.outcome = c.outcome;
    r.detail = c.outcome == Outcome::pass ? "" : c.detail;
    if (c.outcome == Outcome::pass || c.outcome == Outcome::fail) {
      r.max_error = c.report.max_error;
      r.tolerance = c.report.tolerance;
    }
    if (c.prepared && pl.checked.shape != p.shape) {
      try {
        c.prepared = check::Case::tiled(p, *c.prepared);
      } catch (const std::bad_alloc&) {
        c.prepared.reset();
        r.outcome = Outcome::error;
        r.detail = check::describe(p) + ": out of host memory for the timed buffers";
      } catch (const std::exception& e) {
        c.prepared.reset();
        r.outcome = Outcome::error;
        r.detail = check::describe(p) + ": preparing the timed buffers: " + e.what();
      }
    }
    if (c.prepared) {
      r.bytes = c.prepared->bytes();
      if (Status s = c.prepared->implementation(&r.impl); !s) r.impl = "?";
      // The machine's bandwidth drifts by tens of percent within minutes on shared hosts: a copy or
      // add run follows each timed run of the case, and the case's copy% is against their medians.
      std::function<void()> between;
      if (reference && reference->ok()) between = [&] { reference->interleave(); };
      const Timing t = time_case(*c.prepared, device, repeats, quick, between);
      if (between) copy.samples_gbps.push_back(current_copy = reference->sample());
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
    r.copy_gbps = current_copy;
    r.cache_resident = device.type == DeviceType::cpu && r.bytes > 0 && r.bytes <= machine.llc_bytes;
    if (device.type == DeviceType::cpu && !r.cache_resident && std::isfinite(r.gbps / r.copy_gbps)) {
      r.target_share = cpu_target_share(op);
      if (std::isfinite(r.target_share)) r.mark = r.gbps / r.copy_gbps >= r.target_share ? "pass" : "miss";
    }
    if (tty) fmt::print(stderr, "\r\033[K");
    not_passed += r.outcome != Outcome::pass;

    std::string ratio = "-", med = "-", gbps = "-", pct = "-";
    if (std::isfinite(r.max_error)) ratio = fmt::format("{:.2f}", r.max_error == 0 ? 0.0 : r.max_error / r.tolerance);
    if (std::isfinite(r.median_us)) med = fmt::format("{:.1f}", r.median_us);
    if (std::isfinite(r.gbps)) gbps = fmt::format("{:.2f}", r.gbps);
    if (r.cache_resident) pct = "cache";
    else if (std::isfinite(r.gbps / r.copy_gbps)) pct = fmt::format("{:.0f}%", 100 * r.gbps / r.copy_gbps);
    if (!r.cache_resident && r.gbps > r.copy_gbps) {
      pct += "!";  // faster than the copy: the reference or the case was disturbed
      ++above_copy;
    }
    std::string target;
    if (r.mark) {
      target = fmt::format("{} {:.2f}", r.mark, r.target_share);
      ++(r.mark == std::string_view("pass") ? marks_pass : marks_miss);
    } else if (device.type == DeviceType::cpu && !r.cache_resident && std::isfinite(r.gbps)) {
      target = "- (core-bound)";
    }
    row(pl.label, r.dtype, pl.shape_label, r.impl.empty() ? "-" : r.impl, outcome_name(r.outcome), ratio, med, gbps,
        pct, target);
    if (r.outcome != Outcome::pass) fmt::print("  {}\n", r.detail);
    std::fflush(stdout);
    results.push_back(std::move(r));
    if (!json_path.empty())
      json_ok = write_json(json_path, run, copy, results, i + 1 == plan.size() && device.type != DeviceType::cpu);
  }

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (device.type == DeviceType::cpu) {
    if (reference && reference->ok()) copy.samples_gbps.push_back(copy.gbps_end = reference->measure_all(quick ? 3 : 5).gbps);
    const auto [lo, hi] = std::minmax_element(copy.samples_gbps.begin(), copy.samples_gbps.end());
    fmt::print("\ncopy over the run: {} samples, {:.1f} to {:.1f} GB/s (spread {:.0f}% of the lowest; first "
               "{:.1f}, last {:.1f}); each case's copy% uses the copy runs interleaved with its own\n",
               copy.samples_gbps.size(), *lo, *hi, 100 * (*hi / *lo - 1), copy.gbps, copy.gbps_end);
    if (marks_pass + marks_miss)
      fmt::print("targets (share of copy, docs/performance.md): {} cases pass, {} miss\n", marks_pass, marks_miss);
    if (above_copy)
      fmt::print("{} cases (marked !) ran faster than the copy reference: with working sets beyond the cache "
                 "this means the machine was busy while the reference or those cases were measured\n",
                 above_copy);
    if (*hi > 1.2 * *lo)
      fmt::print("the machine's bandwidth moved by more than 20% during the run (other load?): copy% deserves "
                 "less trust\n");
    if (!json_path.empty()) json_ok = write_json(json_path, run, copy, results, true);
  }
  fmt::print("\n{} cases: {} passed and timed, {} did not pass ({}, seed {})\n", results.size(),
             results.size() - static_cast<std::size_t>(not_passed), not_passed, duration_label(seconds), seed);
  if (!json_path.empty()) {
    if (!json_ok) {
      fmt::print(stderr, "gradops bench: could not write {}\n", json_path);
      return kExitFailures;
    }
    fmt::print("wrote {}\n", json_path);
  }
  return not_passed ? kExitFailures : kExitOk;
}

}  // namespace gradops::cli
