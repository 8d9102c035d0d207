// Google Benchmark microbenchmarks of the public C++ API on CPU tensors. Each op family's file
// describes its cases; this header is what they share: how a case is described and registered.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "gradops/gradops.hpp"

namespace gradops::bench {

// The dtypes every family is timed in: the natural signature of each (statistics stay f32).
inline constexpr DType kDTypes[] = {DType::f32, DType::bf16};

// One tensor of a case: inputs are filled with uniform values in [lo, hi) (rounded to the dtype),
// so that the kernels see the magnitudes they meet in training rather than zeros or denormals.
struct Spec {
  DType dtype;
  std::vector<int64_t> shape;
  float lo = 0, hi = 0;
};

using Views = std::span<const TensorView>;

struct Case {
  const char* op;                 // ORT name: the benchmark's name starts with it
  DType dtype;                    // shown in the name
  std::vector<int64_t> shape;     // shown in the name
  std::string variant;            // appended to the name ("channels_last", "dX_only"); may be empty
  std::vector<Spec> inputs;       // in the schema's order
  std::vector<Spec> outputs;      // in the schema's order; trailing optional ones left out are absent
  std::vector<Attribute> attrs;   // only to name the implementation (the label), as `run` would see them
  std::function<Status(Views in, Views out, const Context& ctx)> call;  // the typed entry point
};

// Registers "<op>/<dtype>/<shape>[/<variant>]". Bytes processed per call follow `gradops bench`:
// every input read once, every output written once, at their storage dtypes.
void add(Case c);

void register_activation();
void register_softmax();
void register_layer_norm();
void register_batch_norm();

}  // namespace gradops::bench
