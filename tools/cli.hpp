// What the `gradops` subcommands share: option parsing, op and dtype selection, names of shapes
// and signatures, seeds, and the outcome of checking one problem against the oracle.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>

#include "gradops/schema.hpp"
#include "harness/checker.hpp"

namespace gradops::cli {

// Exit codes of every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailures = 1;  // a check failed (or could not run)
inline constexpr int kExitUsage = 2;

int list_main(std::span<char* const> args);
int check_main(std::span<char* const> args);
int bench_main(std::span<char* const> args);

// ---- options ----------------------------------------------------------------------------------

// Parses args (the words after the subcommand) with a CLI11 app. Returns -1 to go on, or the exit
// status: kExitOk after --help (printed on stdout), kExitUsage after a usage error (one line and
// a hint on stderr).
int parse_args(CLI::App& app, std::string_view command, std::span<char* const> args);
// "gradops <command>: <message>" and a hint, on stderr; returns kExitUsage.
int usage_error(std::string_view command, const std::string& message);
// Options that every subcommand with an op selection has: --op and --dtype (comma-separated values,
// each option repeatable).
void add_selection_options(CLI::App& app, std::vector<std::string>* ops, std::vector<std::string>* dtypes,
                           std::string_view dtype_help);

bool parse_int(std::string_view s, int64_t* out);
bool parse_uint(std::string_view s, uint64_t* out);
// "1024x768"; every dim >= 0.
bool parse_shape(std::string_view s, std::vector<int64_t>* out);
// "name=value" pairs for --attr.
bool parse_attr(std::string_view s, std::string* name, double* value);
// "cpu" or "cuda" (with an optional ":N"); false for devices this build cannot run.
bool parse_device(std::string_view s, Device* out, std::string* error);
std::vector<std::string> split(std::string_view s, char sep);

// ---- selection ----------------------------------------------------------------------------------

// --op and --dtype. Each --dtype value is either one or more dtypes ("f16", "f32,bf16": signatures
// whose first type variable T is one of them) or, for an op with several type variables, a whole
// signature with one dtype per variable ("f16,f32,f16").
struct Selection {
  std::vector<std::string> ops;     // empty: every op
  std::vector<std::string> dtypes;  // raw --dtype values; empty: every signature

  // Fills from the raw --op and --dtype values; false with a message naming an unknown op or dtype.
  bool parse(const std::vector<std::string>& op_values, const std::vector<std::string>& dtype_values,
             std::string* error);
  bool op_selected(const OpSchema& op) const;
  bool signature_selected(const OpSchema& op, const TypeSignature& sig) const;
};

// "f32" for one type variable, "f16,f32,f16" for several.
std::string signature_string(const OpSchema& op, const TypeSignature& sig);
// "1024x768"; "scalar" for rank 0.
std::string shape_string(std::span<const int64_t> shape);

// ---- seeds --------------------------------------------------------------------------------------

// A fresh seed for this run.
uint64_t fresh_seed();
// The seed of one problem: depends only on the run's seed and the problem's identity, so that a
// filtered re-run with the same --seed sees the same data.
uint64_t problem_seed(uint64_t run_seed, std::string_view op, std::string_view signature, std::string_view shape,
                      const oracle::Attrs& attrs);

// ---- checking one problem -------------------------------------------------------------------------

enum class Outcome {
  pass,
  fail,           // gradops ran, and an output is outside its tolerance
  error,          // gradops rejected a valid call, or something else went wrong
  unimplemented,  // gradops has no implementation for this call in this build
  no_oracle,      // the test oracle cannot make inputs for this op
};
const char* outcome_name(Outcome o);  // "PASS", "FAIL", "ERROR", "UNIMPLEMENTED", "NO-ORACLE"
// Worse outcomes first: fail, error, unimplemented, no_oracle, pass.
int outcome_rank(Outcome o);

struct Checked {
  Outcome outcome = Outcome::error;
  check::Report report;        // meaningful when gradops ran
  std::string detail;          // why it did not pass
  std::unique_ptr<check::Case> prepared;  // the case, kept for timing if it passed and keep_case is set
};

// Makes the case (oracle inputs, reference), poisons the outputs, runs gradops, compares.
Checked check_problem(const check::Problem& p, bool keep_case);

// Validates a problem with gradops itself (the op layer's rules for attributes and shapes) on a
// copy with at most two rows, without timing or touching large buffers: false with the library's
// message when gradops refuses the call as invalid. Writes the implementation that would run it.
bool validate_problem(const check::Problem& p, std::string* message, std::string* impl);

// Whether `device` can run anything: for CUDA, a driver and a device with that ordinal. false with
// a one-line reason ("no usable CUDA driver: ...").
bool device_usable(Device device, std::string* reason);

}  // namespace gradops::cli
