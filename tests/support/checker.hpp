// The check harness shared by the tests and `gradops check`/`gradops bench`: makes inputs with the
// oracle, stores them in their dtypes (optionally at misaligned addresses), poisons the outputs,
// runs gradops, and compares every output element against the float64 reference.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "oracle/oracle.hpp"

namespace gradops::check {

// Pass iff |actual - expected| <= abs + rel * |expected| (NaN matches NaN, inf matches exactly).
struct Tolerance {
  double abs = 0;
  double rel = 0;
};

struct Problem {
  OpId op = OpId::GeluGrad;
  TypeSignature sig{{DType::f32, DType::f32, DType::f32}};
  std::vector<int64_t> shape;   // the main tensor (X, dY, ...)
  oracle::Attrs attrs;          // overrides; the rest take the schema's defaults
  bool misaligned = false;      // every base pointer offset by one element from 64-byte alignment
  bool inplace = false;         // write output 0 into input 0's buffer (ops with that alias rule)
  std::vector<bool> skip_output;  // optional outputs to leave out, by index
  int threads = 0;
  uint64_t seed = 1;
  Device device = Device::cpu();
};

struct Report {
  Status status;              // of the gradops call
  bool pass = false;
  std::string detail;         // why it failed, or empty
  double max_error = 0;       // |actual - expected| at the worst element (worst by error/tolerance)
  double tolerance = 0;       // the tolerance there
  double worst_ratio = 0;     // max over elements of error / tolerance
  std::string worst;          // "dX[123]"
  std::vector<std::vector<double>> outputs;  // actual outputs, as double, for invariance tests
};

// The dtype of every input and output of `p` (from its signature and the schema's type variables).
DType input_dtype(const Problem& p, int i);
DType output_dtype(const Problem& p, int i);
// The attributes with defaults filled in.
oracle::Attrs full_attrs(const Problem& p);

Tolerance tolerance(const Problem& p, int output);

Report run_case(const Problem& p);

// "GeluGrad f32 [4, 7] axis=1"
std::string describe(const Problem& p);

}  // namespace gradops::check
