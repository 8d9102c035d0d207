// BatchNorm family, op layer: layout and shape rules, then the implementation list.
#include "ops/batch_norm.hpp"

#include <cmath>
#include <string>

#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {
namespace {

constexpr Impl<BatchNormDesc> kImpls[] = {
    {"cpu:simd", DeviceType::cpu, nullptr, cpu_batch_norm, nullptr, cpu_simd_target},
#if GRADOPS_HAVE_CUDA
    // One row per kernel, in the order tried (src/cuda/batch_norm_rows.cu says what each takes).
    {"cuda:runs_vec16", DeviceType::cuda, cuda_batch_norm_runs_vec16_declines, cuda_batch_norm_runs_vec16},
    {"cuda:runs_vec8", DeviceType::cuda, cuda_batch_norm_runs_vec8_declines, cuda_batch_norm_runs_vec8},
    {"cuda:runs", DeviceType::cuda, cuda_batch_norm_runs_declines, cuda_batch_norm_runs},
    {"cuda:columns_vec16", DeviceType::cuda, cuda_batch_norm_columns_vec16_declines, cuda_batch_norm_columns_vec16},
    {"cuda:columns", DeviceType::cuda, cuda_batch_norm_columns_declines, cuda_batch_norm_columns},
#endif
};
constexpr auto kRows = row_infos(kImpls);

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

// Every per-channel tensor is 1-D with C values; `where` says where C came from.
Status require_channels(const OpCall& c, std::string_view name, const TensorView& t, int64_t channels,
                        const std::string& where) {
  if (t.rank == 1 && t.dims[0] == channels) return {};
  const int64_t want[] = {channels};
  return invalid(c, quoted(name) + " has shape " + shape_string(t.shape()) + ", expected " + shape_string(want) +
                        " (1-D, one value per channel; " + where + ")");
}

}  // namespace

std::span<const RowInfo> batch_norm_rows() { return kRows; }

Status run_batch_norm(const OpCall& c, const Context& ctx) {
  const OpSchema& op = *c.op;
  const bool grad = op.id == OpId::BatchNormalizationGrad;
  BatchNormDesc d{};
  d.op = op.id;
  d.t = c.types[0];
  d.t1 = c.types[1];
  d.t2 = c.types[2];

  const double layout = c.attribute("channels_last");
  if (layout != 0 && layout != 1)
    return invalid(c, "attribute 'channels_last' is " + std::to_string(static_cast<int64_t>(layout)) +
                          ", expected 0 (NCHW, channels on axis 1) or 1 (NHWC, channels on the last axis)");
  d.channels_last = layout == 1;
  if (!grad) {
    const double mode = c.attribute("training_mode");
    if (mode != 1)
      return invalid(c, "attribute 'training_mode' is " + std::to_string(static_cast<int64_t>(mode)) +
                            ", expected 1: gradops runs BatchNormInternal in its training form only (inference "
                            "is an elementwise scale and shift by the running statistics)");
    const double eps = c.attribute("epsilon"), momentum = c.attribute("momentum");
    if (!(eps >= 0) || std::isinf(eps))
      return invalid(c, "attribute 'epsilon' is " + std::to_string(eps) + ", expected a finite value >= 0");
    if (std::isinf(momentum))
      return invalid(c, "attribute 'momentum' is " + std::to_string(momentum) + ", expected a finite value");
    d.epsilon = static_cast<float>(eps);
    d.momentum = static_cast<float>(momentum);
  } else {
    d.epsilon = static_cast<float>(c.attribute("epsilon"));  // unused: the saved inverse std includes it
  }

  // Grad: (dY, X, scale, mean, variance) -> (X_grad[, scale_grad][, bias_grad]).
  // Forward: (X, scale, B, input_mean, input_var) -> (Y[, running_mean, running_var, saved_mean,
  // saved_inv_std]).
  const int xi = grad ? 1 : 0;
  const TensorView& x = c.input(xi);
  const std::string xname = quoted(c.in_name(xi));
  if (x.rank < 1)
    return invalid(c, xname + " has rank 0, expected rank >= 1 (a batch of values per channel)");
  std::string where;
  if (x.rank == 1) {
    // No channel axis in either layout: N values of a single channel, as ORT reads rank 1.
    d.n = x.dims[0], d.c = 1, d.spatial = 1;
    where = "rank-1 " + xname + " has a single channel";
  } else if (d.channels_last) {
    d.n = x.dims[0], d.c = x.dims[x.rank - 1], d.spatial = dims_product(x, 1, x.rank - 1);
    where = "C = " + std::to_string(d.c) + " is the last dim of " + xname + ", shape " + shape_string(x.shape()) +
            ", channels_last = 1";
  } else {
    d.n = x.dims[0], d.c = x.dims[1], d.spatial = dims_product(x, 2, x.rank);
    where = "C = " + std::to_string(d.c) + " is dim 1 of " + xname + ", shape " + shape_string(x.shape());
  }

  if (grad) {
    if (Status s = require_same_shape(c, c.in_name(0), c.input(0), c.in_name(1), x); !s) return s;
    if (Status s = require_same_shape(c, c.out_name(0), c.output(0), c.in_name(1), x); !s) return s;
  } else {
    if (Status s = require_same_shape(c, c.out_name(0), c.output(0), c.in_name(0), x); !s) return s;
  }
  for (int i = grad ? 2 : 1; i < static_cast<int>(op.inputs.size()); ++i)
    if (Status s = require_channels(c, c.in_name(i), c.input(i), d.c, where); !s) return s;
  for (int o = 1; o < static_cast<int>(op.outputs.size()); ++o)
    if (c.has_output(o))
      if (Status s = require_channels(c, c.out_name(o), c.output(o), d.c, where); !s) return s;

  auto out_or_null = [&](int o) { return c.has_output(o) ? c.output(o).data : nullptr; };
  d.x = x.data;
  d.scale = c.input(grad ? 2 : 1).data;
  if (grad) {
    d.dy = c.input(0).data;
    d.mean = c.input(3).data;
    d.inv_std = c.input(4).data;
    d.dx = c.output(0).data;
    d.dscale = out_or_null(1);
    d.dbias = out_or_null(2);
  } else {
    d.bias = c.input(2).data;
    d.input_mean = c.input(3).data;
    d.input_var = c.input(4).data;
    d.y = c.output(0).data;
    d.running_mean = out_or_null(1);
    d.running_var = out_or_null(2);
    d.saved_mean = out_or_null(3);
    d.saved_inv_std = out_or_null(4);
  }
  return dispatch<BatchNormDesc>(kImpls, c, d, ctx);
}

}  // namespace gradops::detail
