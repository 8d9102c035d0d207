// gradops check: every operator and dtype signature against the float64 oracle, on fresh random
// inputs over a few shapes per op (odd sizes, a misaligned base, non-default attributes).
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "cli.hpp"

namespace gradops::cli {
namespace {

constexpr OptionSpec kSpecs[] = {
    {"--device", "DEVICE", "cpu (default) or cuda"},
    {"--op", "NAMES", "only these operators (ORT names, comma-separated; repeatable)", true},
    {"--dtype", "DTYPES", "only signatures whose T is one of these (f32,bf16), or exactly this\n"
                          "signature of a multi-type op (f16,f32,f16); repeatable", true},
    {"--seed", "N", "the run's seed (default: a fresh one, printed)"},
    {"--threads", "N", "CPU threads per call (default: the OpenMP default)"},
    {"--verbose", "", "a line per checked problem"},
};

struct Variant {
  std::vector<int64_t> shape;
  oracle::Attrs attrs;
  bool misaligned;
  Variant(std::vector<int64_t> s, oracle::Attrs a = {}, bool m = false)
      : shape(std::move(s)), attrs(std::move(a)), misaligned(m) {}
};

// A few problems per op: a tiny one, odd sizes, a misaligned one, and the attributes that change
// the math at a non-default value.
std::vector<Variant> variants(const OpSchema& op) {
  const bool has_alpha = op.find_attribute("alpha") >= 0;
  switch (op.family) {
    case OpFamily::activation: {
      std::vector<Variant> v = {{{1}}, {{1023}}, {{17, 129}, {}, true}, {{3, 5, 7, 11}}};
      if (has_alpha) v.push_back({{9, 31}, {{"alpha", 0.5}}});
      return v;
    }
    case OpFamily::softmax: {
      const double other = op.attributes[op.find_attribute("axis")].default_value == 1 ? 2 : 1;
      return {{{1, 1}}, {{7, 1001}}, {{33, 65}, {}, true}, {{4, 6, 9}, {{"axis", 0}}}, {{4, 6, 9}, {{"axis", other}}}};
    }
    case OpFamily::layer_norm: {
      std::vector<Variant> v = {{{1, 8}}, {{7, 1001}}, {{33, 65}, {}, true}, {{4, 6, 9}, {{"axis", 1}}}};
      if (op.find_attribute("epsilon") >= 0) v.push_back({{7, 33}, {{"epsilon", 1e-2}}});
      return v;
    }
    case OpFamily::batch_norm: {
      std::vector<Variant> v = {{{3, 5}}, {{2, 3, 5, 7}}, {{2, 16, 9, 9}, {}, true}, {{2, 5, 7, 3}, {{"channels_last", 1}}}};
      if (op.find_attribute("momentum") >= 0) v.push_back({{2, 3, 5, 7}, {{"epsilon", 1e-2}, {"momentum", 0.5}}});
      return v;
    }
  }
  return {};
}

// One row of the table: an (op, signature) over its variants.
struct Row {
  const OpSchema* op;
  TypeSignature sig;
  int cases = 0, passed = 0;
  Outcome outcome = Outcome::pass;  // the worst
  double worst_ratio = -1, max_error = 0, tolerance = 0;
  std::string detail = {};  // of the first problem with the worst outcome
};

}  // namespace

int check_main(std::span<char* const> args) {
  Options o;
  std::string error;
  if (!parse_options(args, kSpecs, &o, &error)) return usage_error("check", error);
  if (o.has("--help")) {
    print_help(stdout, "gradops check [options]",
               "Checks every operator and dtype signature against the float64 oracle on fresh random\n"
               "inputs: a few shapes per op (odd sizes, a base pointer misaligned by one element,\n"
               "non-default axis and other attributes), outputs poisoned with NaN before the call, every\n"
               "element compared within the op's tolerance. Prints a table with the worst error and its\n"
               "tolerance per (op, dtype signature). Exit status 1 if anything did not pass, including\n"
               "operators this build cannot run (UNIMPLEMENTED) or the oracle cannot check (NO-ORACLE).",
               kSpecs);
    return kExitOk;
  }
  Selection sel;
  if (!sel.parse(o, &error)) return usage_error("check", error);
  Device device = Device::cpu();
  if (const std::string* d = o.last("--device"); d && !parse_device(*d, &device, &error))
    return usage_error("check", error);
  uint64_t seed = fresh_seed();
  if (const std::string* s = o.last("--seed"); s && !parse_uint(*s, &seed))
    return usage_error("check", "--seed takes a non-negative integer, got '" + *s + "'");
  int64_t threads = 0;
  if (const std::string* t = o.last("--threads"); t && (!parse_int(*t, &threads) || threads < 0 || threads > 4096))
    return usage_error("check", "--threads takes a count from 0 (the default) to 4096, got '" + *t + "'");
  const bool verbose = o.has("--verbose");

  std::printf("gradops check: %s, seed %llu (rerun with --seed %llu to reproduce)\n", device_type_name(device.type),
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  const auto start = std::chrono::steady_clock::now();

  std::vector<Row> rows;
  for (const OpSchema& op : op_schemas()) {
    if (!sel.op_selected(op)) continue;
    for (const TypeSignature& sig : op.signatures) {
      if (!sel.signature_selected(op, sig)) continue;
      Row row{&op, sig};
      const std::string sig_name = signature_string(op, sig);
      for (const Variant& v : variants(op)) {
        check::Problem p;
        p.op = op.id;
        p.sig = sig;
        p.shape = v.shape;
        p.attrs = v.attrs;
        p.misaligned = v.misaligned;
        p.threads = static_cast<int>(threads);
        p.device = device;
        p.seed = problem_seed(seed, op.name, sig_name, shape_string(v.shape), v.attrs);
        const Checked c = check_problem(p, false);
        ++row.cases;
        row.passed += c.outcome == Outcome::pass;
        if (outcome_rank(c.outcome) < outcome_rank(row.outcome)) {
          row.outcome = c.outcome;
          row.detail = c.detail;
        }
        if (c.outcome == Outcome::pass || c.outcome == Outcome::fail)
          if (c.report.worst_ratio > row.worst_ratio) {
            row.worst_ratio = c.report.worst_ratio;
            row.max_error = c.report.max_error;
            row.tolerance = c.report.tolerance;
          }
        if (verbose)
          std::fprintf(stderr, "  %-13s %s%s%s\n", outcome_name(c.outcome), check::describe(p).c_str(),
                       c.outcome == Outcome::pass ? "" : ": ", c.outcome == Outcome::pass ? "" : c.detail.c_str());
      }
      rows.push_back(std::move(row));
    }
  }
  if (rows.empty()) return usage_error("check", "no operator and dtype signature matches the filters");

  std::printf("\n%-34s %-14s %6s  %-13s %10s %10s\n", "op", "dtype", "cases", "status", "max_error", "tolerance");
  int counts[5] = {};
  for (const Row& r : rows) {
    ++counts[outcome_rank(r.outcome)];
    char cases[16], err[16] = "-", tol[16] = "-";
    std::snprintf(cases, sizeof cases, "%d/%d", r.passed, r.cases);
    if (r.worst_ratio >= 0) {
      std::snprintf(err, sizeof err, "%.3g", r.max_error);
      std::snprintf(tol, sizeof tol, "%.3g", r.tolerance);
    }
    std::printf("%-34s %-14s %6s  %-13s %10s %10s\n", std::string(r.op->name).c_str(),
                signature_string(*r.op, r.sig).c_str(), cases, outcome_name(r.outcome), err, tol);
  }

  // Why each failure failed, and how to see it again; for ops that cannot run, one line per op.
  bool header = false;
  const OpSchema* last_op = nullptr;
  for (const Row& r : rows) {
    if (r.outcome == Outcome::pass) continue;
    const bool failed = r.outcome == Outcome::fail || r.outcome == Outcome::error;
    if (!failed && r.op == last_op) continue;
    if (!header) std::printf("\n");
    header = true;
    last_op = r.op;
    std::printf("%s %s %s: %s\n", outcome_name(r.outcome), std::string(r.op->name).c_str(),
                failed ? signature_string(*r.op, r.sig).c_str() : "(every dtype)", r.detail.c_str());
    if (failed)
      std::printf("  reproduce: gradops check --op %s --dtype %s --seed %llu%s\n", std::string(r.op->name).c_str(),
                  signature_string(*r.op, r.sig).c_str(), static_cast<unsigned long long>(seed),
                  device.type == DeviceType::cpu ? "" : " --device cuda");
  }

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int passed = counts[outcome_rank(Outcome::pass)];
  std::printf("\n%zu (op, dtype) pairs: %d passed, %d failed, %d errors, %d unimplemented, %d without an oracle "
              "(%.1f s, seed %llu)\n",
              rows.size(), passed, counts[outcome_rank(Outcome::fail)], counts[outcome_rank(Outcome::error)],
              counts[outcome_rank(Outcome::unimplemented)], counts[outcome_rank(Outcome::no_oracle)], seconds,
              static_cast<unsigned long long>(seed));
  return passed == static_cast<int>(rows.size()) ? kExitOk : kExitFailures;
}

}  // namespace gradops::cli
