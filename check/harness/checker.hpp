// The check harness shared by the tests and `gradops check`/`gradops bench`: makes inputs with the
// oracle, stores them in their dtypes (optionally at misaligned addresses, on the CPU or a GPU),
// poisons the outputs, runs gradops, and compares every output element against the float64
// reference.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
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
  int misalign_bytes = 0;       // and by this many bytes more: 1 leaves every dtype misaligned
  // Changes the oracle's inputs (special values) before the reference is computed and the buffers
  // are filled; values must be representable in each input's dtype (oracle::round_to).
  std::function<void(oracle::Tensors&)> edit_inputs;
  bool inplace = false;         // write output 0 into input 0's buffer (ops with that alias rule)
  std::vector<bool> skip_output;  // optional outputs to leave out, by index
  int threads = 0;
  uint64_t seed = 1;
  Device device = Device::cpu();
  void* cuda_stream = nullptr;
  const WorkspaceAllocator* allocator = nullptr;  // the Context's scratch allocator (nullptr: default)
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

// Zeroed host memory for tensors, 64-byte aligned. Blocks of 2 MiB and more are aligned to 2 MiB
// and advised as transparent huge pages: a fresh 4 KiB page costs a page fault at first touch,
// which on virtual machines runs at ~0.3 GB/s, so gigabyte working sets took seconds each to
// set up; with huge pages they take a tenth of a second. The copy reference of `gradops bench`
// uses the same memory, so kernels and copy see the same pages. Throws std::bad_alloc.
struct FreeHost {
  void operator()(std::byte* p) const noexcept;
};
using HostBytes = std::unique_ptr<std::byte[], FreeHost>;
HostBytes allocate_host(std::size_t bytes);

// Memory on a device other than the CPU (the CUDA backend's tests provide one); nullptr if none.
struct DeviceMemory {
  void* (*allocate)(std::size_t bytes);
  void (*release)(void* p);
  void (*to_device)(void* dst, const void* src, std::size_t bytes);
  void (*to_host)(void* dst, const void* src, std::size_t bytes);
  void (*synchronize)();
  // Whether device `ordinal` can be used at all (a driver, the device); false with a one-line reason.
  // The other functions throw std::runtime_error on failure, naming the call and CUDA's error.
  bool (*usable)(int ordinal, std::string* reason);
};
const DeviceMemory* device_memory(DeviceType t);

// The dtype of every input and output of `p` (from its signature and the schema's type variables).
DType input_dtype(const Problem& p, int i);
DType output_dtype(const Problem& p, int i);
// The attributes with defaults filled in.
oracle::Attrs full_attrs(const Problem& p);

Tolerance tolerance(const Problem& p, int output);

// A prepared case: inputs made and stored, reference computed, outputs allocated. `run` may be
// called many times (the benchmark times it); `compare` checks the outputs of the last run.
class Case {
 public:
  explicit Case(const Problem& p);
  ~Case();
  Case(const Case&) = delete;
  Case& operator=(const Case&) = delete;

  void poison_outputs();   // every output byte 0xFF: NaN in every float format
  Status run();            // one gradops call on the prepared buffers
  Report compare() const;  // outputs of the last run against the reference
  // The implementation `run` would use (gradops::implementation_name on the prepared buffers).
  Status implementation(std::string* name) const;
  // The same on the prepared buffers with other attributes (unlisted ones take the defaults): how
  // gradops judges attributes the oracle cannot make inputs for.
  Status implementation(const oracle::Attrs& attrs, std::string* name) const;
  // A case for timing only: the inputs of `checked` (the same op, dtypes and attributes with fewer
  // rows, dim 0) repeated along the rows up to p.shape[0]; outputs allocated, no reference, so no
  // compare(). What the benchmark times when checking the full size would cost minutes of oracle.
  static std::unique_ptr<Case> tiled(const Problem& p, const Case& checked);
  // The bytes model: each input read once, each output written once.
  int64_t bytes() const;
  const Problem& problem() const;

 private:
  Case();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Case(p), poison, run, compare.
Report run_case(const Problem& p);

// "GeluGrad (f32) [4,7] axis=1"
std::string describe(const Problem& p);

}  // namespace gradops::check
