// The float64 oracle: plain reference implementations written from the math in docs/semantics.md,
// sharing no code with src/. Ops are named by their ORT names. Every input it makes is exactly
// representable in the dtype asked for, so that the library and the oracle see the same values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gradops/types.hpp"  // DType only: the vocabulary, not the implementation

namespace gradops::oracle {

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<double> v;

  Tensor() = default;
  explicit Tensor(std::vector<int64_t> s) : shape(std::move(s)), v(static_cast<std::size_t>(numel()), 0.0) {}
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};
using Tensors = std::vector<std::optional<Tensor>>;
using Attrs = std::map<std::string, double, std::less<>>;  // every attribute, defaults filled in
using Rng = std::mt19937_64;

// Rounds to the nearest value of dtype t, ties to even (own implementation, via frexp/ldexp).
double round_to(DType t, double v);
// Fills with draws from U(lo, hi) rounded to t.
void fill_uniform(Tensor& x, DType t, double lo, double hi, Rng& rng);

// Valid inputs for `op` whose main tensor (X, dY, ...) has `shape`, in the schema's input order;
// input_dtypes[i] is the dtype input i will be stored in. Statistics inputs are computed from the
// (rounded) data, as the forward would have saved them. Empty optional = absent input.
Tensors make_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                    std::span<const DType> input_dtypes, Rng& rng);

// Reference values of every output (optional ones too), in float64, from the given inputs.
Tensors reference(std::string_view op, const Tensors& inputs, const Attrs& attrs);

// Per family (check/oracle/<family>.cpp); each returns false if it does not know the op.
bool make_activation_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                            std::span<const DType> dt, Rng& rng, Tensors& out);
bool activation_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out);
// The activation op's k for the tolerances (check/harness/tolerance.cpp): the roundings of its
// formula times its amplification of the compute type's error; 0 for an op it does not know.
double activation_amplification(std::string_view op);
bool make_softmax_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                         std::span<const DType> dt, Rng& rng, Tensors& out);
bool softmax_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out);
bool make_layer_norm_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                            std::span<const DType> dt, Rng& rng, Tensors& out);
bool layer_norm_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out);
bool make_batch_norm_inputs(std::string_view op, std::span<const int64_t> shape, const Attrs& attrs,
                            std::span<const DType> dt, Rng& rng, Tensors& out);
bool batch_norm_reference(std::string_view op, const Tensors& in, const Attrs& attrs, Tensors& out);

// Scalar references shared by the activation oracle and its finite-difference tests.
double gelu(double x);
double gelu_grad(double x);  // d gelu / dx
double fast_gelu(double x);
double fast_gelu_grad(double x);
double quick_gelu(double x, double alpha);
double quick_gelu_grad(double x, double alpha);
double sigmoid(double x);

}  // namespace gradops::oracle
