// gradops check: every operator and dtype signature against the float64 oracle, on fresh random
// inputs over a few shapes per op (odd sizes, a misaligned base, non-default attributes).
#include <chrono>
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "cli.hpp"

namespace gradops::cli {
namespace {

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
  CLI::App app{
      "Checks every operator and dtype signature against the float64 oracle on fresh random\n"
      "inputs: a few shapes per op (odd sizes, a base pointer misaligned by one element,\n"
      "non-default axis and other attributes), outputs poisoned with NaN before the call, every\n"
      "element compared within the op's tolerance. Prints a table with the worst error and its\n"
      "tolerance per (op, dtype signature). Exit status 1 if anything did not pass, including\n"
      "operators this build cannot run (UNIMPLEMENTED) or the oracle cannot check (NO-ORACLE)."};
  std::string device_name = "cpu";
  std::vector<std::string> op_values, dtype_values;
  uint64_t seed = fresh_seed();
  int threads = 0;
  bool verbose = false;
  app.add_option("--device", device_name, "cpu (default) or cuda")->type_name("DEVICE");
  add_selection_options(app, &op_values, &dtype_values,
                        "only signatures whose T is one of these (f32,bf16), or exactly this\n"
                        "signature of a multi-type op (f16,f32,f16); repeatable");
  app.add_option("--seed", seed, "the run's seed (default: a fresh one, printed)")->type_name("N");
  app.add_option("--threads", threads, "CPU threads per call (default 0: the OpenMP default)")
      ->type_name("N")
      ->check(CLI::Range(0, 4096));
  app.add_flag("--verbose", verbose, "a line per checked problem");
  if (const int rc = parse_args(app, "check", args); rc >= 0) return rc;

  std::string error;
  Selection sel;
  if (!sel.parse(op_values, dtype_values, &error)) return usage_error("check", error);
  Device device = Device::cpu();
  if (!parse_device(device_name, &device, &error)) return usage_error("check", error);
  if (!device_usable(device, &error)) {
    fmt::print(stderr, "gradops check: {}\n", error);
    return kExitFailures;
  }

  fmt::print("gradops check: {}, seed {} (rerun with --seed {} to reproduce)\n", device_type_name(device.type), seed,
             seed);
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
          fmt::print(stderr, "  {:<13} {}{}{}\n", outcome_name(c.outcome), check::describe(p),
                     c.outcome == Outcome::pass ? "" : ": ", c.outcome == Outcome::pass ? "" : c.detail);
      }
      rows.push_back(std::move(row));
    }
  }
  if (rows.empty()) return usage_error("check", "no operator and dtype signature matches the filters");

  // Columns as wide as their content.
  struct Line {
    std::string op, dtype, cases, status, err = "-", tol = "-";
  };
  std::vector<Line> lines;
  int counts[5] = {};
  for (const Row& r : rows) {
    ++counts[outcome_rank(r.outcome)];
    Line l{std::string(r.op->name), signature_string(*r.op, r.sig), fmt::format("{}/{}", r.passed, r.cases),
           outcome_name(r.outcome)};
    if (r.worst_ratio >= 0) l.err = fmt::format("{:.3g}", r.max_error), l.tol = fmt::format("{:.3g}", r.tolerance);
    lines.push_back(std::move(l));
  }
  Line header{"op", "dtype", "cases", "status", "max_error", "tolerance"};
  std::size_t w[6] = {};
  auto widen = [&](const Line& l) {
    const std::string* f[6] = {&l.op, &l.dtype, &l.cases, &l.status, &l.err, &l.tol};
    for (int i = 0; i < 6; ++i) w[i] = std::max(w[i], f[i]->size());
  };
  widen(header);
  for (const Line& l : lines) widen(l);
  auto print_line = [&](const Line& l) {
    fmt::print("{:<{}}  {:<{}}  {:>{}}  {:<{}}  {:>{}}  {:>{}}\n", l.op, w[0], l.dtype, w[1], l.cases, w[2], l.status,
               w[3], l.err, w[4], l.tol, w[5]);
  };
  fmt::print("\n");
  print_line(header);
  for (const Line& l : lines) print_line(l);

  // Why each failure failed, and how to see it again; for ops that cannot run, one line per op.
  bool explained = false;
  const OpSchema* last_op = nullptr;
  for (const Row& r : rows) {
    if (r.outcome == Outcome::pass) continue;
    const bool failed = r.outcome == Outcome::fail || r.outcome == Outcome::error;
    if (!failed && r.op == last_op) continue;
    if (!explained) fmt::print("\n");
    explained = true;
    last_op = r.op;
    fmt::print("{} {} {}: {}\n", outcome_name(r.outcome), r.op->name,
               failed ? signature_string(*r.op, r.sig) : "(every dtype)", r.detail);
    if (failed)
      fmt::print("  reproduce: gradops check --op {} --dtype {} --seed {}{}\n", r.op->name,
                 signature_string(*r.op, r.sig), seed, device.type == DeviceType::cpu ? "" : " --device cuda");
  }

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int passed = counts[outcome_rank(Outcome::pass)];
  fmt::print("\n{} (op, dtype) pairs: {} passed, {} failed, {} errors, {} unimplemented, {} without an oracle "
             "({:.1f} s, seed {})\n",
             rows.size(), passed, counts[outcome_rank(Outcome::fail)], counts[outcome_rank(Outcome::error)],
             counts[outcome_rank(Outcome::unimplemented)], counts[outcome_rank(Outcome::no_oracle)], seconds, seed);
  return passed == static_cast<int>(rows.size()) ? kExitOk : kExitFailures;
}

}  // namespace gradops::cli
