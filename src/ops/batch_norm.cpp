// BatchNorm family, op layer: layout and shape rules, one descriptor per op, the implementation
// lists.
#include "ops/batch_norm.hpp"

#include <array>
#include <cmath>
#include <string>

#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {
namespace {

// One list per op (each has its own descriptor). A backend that covers several ops adds a row to
// each, and the family's rows below once, with `implements` naming its ops where it lacks some.
// The CUDA rows, one per kernel and the same for every op, in the order tried
// (src/cuda/batch_norm_rows.cu says what each takes).
template <class Desc>
constexpr auto impls(Status (*cpu)(const Desc&, const Context&)) {
#if GRADOPS_HAVE_CUDA
  using K = CudaBatchNormKernel;
#endif
  return std::array{
      Impl<Desc>{"cpu:simd", DeviceType::cpu, nullptr, cpu, nullptr, cpu_simd_target},
#if GRADOPS_HAVE_CUDA
      Impl<Desc>{"cuda:runs_vec16", DeviceType::cuda, cuda_batch_norm_declines<Desc, K::runs_vec16>,
                 cuda_batch_norm_run<Desc, K::runs_vec16>},
      Impl<Desc>{"cuda:runs_vec8", DeviceType::cuda, cuda_batch_norm_declines<Desc, K::runs_vec8>,
                 cuda_batch_norm_run<Desc, K::runs_vec8>},
      Impl<Desc>{"cuda:runs", DeviceType::cuda, cuda_batch_norm_declines<Desc, K::runs>,
                 cuda_batch_norm_run<Desc, K::runs>},
      Impl<Desc>{"cuda:columns_vec16", DeviceType::cuda, cuda_batch_norm_declines<Desc, K::columns_vec16>,
                 cuda_batch_norm_run<Desc, K::columns_vec16>},
      Impl<Desc>{"cuda:columns", DeviceType::cuda, cuda_batch_norm_declines<Desc, K::columns>,
                 cuda_batch_norm_run<Desc, K::columns>},
#endif
  };
}
constexpr auto kGradImpls = impls<BatchNormGradDesc>(cpu_batch_norm_grad);
constexpr auto kForwardImpls = impls<BatchNormForwardDesc>(cpu_batch_norm_forward);
constexpr auto kStatsReduceImpls = impls<BatchNormStatsReduceDesc>(cpu_batch_norm_stats_reduce);
constexpr auto kStatsApplyImpls = impls<BatchNormStatsApplyDesc>(cpu_batch_norm_stats_apply);
constexpr auto kGradReduceImpls = impls<BatchNormGradReduceDesc>(cpu_batch_norm_grad_reduce);
constexpr auto kGradApplyImpls = impls<BatchNormGradApplyDesc>(cpu_batch_norm_grad_apply);
// What supports(), implementations() and `gradops list` read: every row runs every op.
constexpr auto kRows = [] {
  std::array<RowInfo, kGradImpls.size()> r{};
  for (std::size_t i = 0; i < r.size(); ++i) r[i] = {kGradImpls[i].name, kGradImpls[i].device, kGradImpls[i].implements};
  return r;
}();

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

// Where each tensor sits in the op's argument lists; -1 where the op has none.
struct Roles {
  int x, dy, scale, bias, mean, inv_std, input_mean, input_var, sums;  // inputs
  int out_main, out_sums;                                              // outputs: X_grad or Y; sums
};
Roles roles_of(OpId op) {
  switch (op) {
    case OpId::BatchNormalizationGrad: return {1, 0, 2, -1, 3, 4, -1, -1, -1, 0, -1};
    case OpId::BatchNormGradReduce: return {1, 0, -1, -1, 2, 3, -1, -1, -1, -1, 0};
    case OpId::BatchNormGradApply: return {1, 0, 2, -1, 3, 4, -1, -1, 5, 0, -1};
    case OpId::BatchNormStatsReduce: return {0, -1, -1, -1, -1, -1, 1, -1, -1, -1, 0};
    case OpId::BatchNormStatsApply: return {0, -1, 1, 2, -1, -1, 3, 4, 5, 0, -1};
    default: return {0, -1, 1, 2, -1, -1, 3, 4, -1, 0, -1};  // BatchNormInternal
  }
}

// Every per-channel tensor is 1-D with C values; where() says where C came from (called only when
// the check fails, so that a valid call builds no message).
template <class Where>
Status require_channels(const OpCall& c, std::string_view name, const TensorView& t, int64_t channels,
                        const Where& where) {
  if (t.rank == 1 && t.dims[0] == channels) return {};
  const int64_t want[] = {channels};
  return invalid(c, quoted(name) + " has shape " + shape_string(t.shape()) + ", expected " + shape_string(want) +
                        " (1-D, one value per channel; " + where() + ")");
}

// The split's sums: 1-D, two per channel and the count.
template <class Where>
Status require_sums(const OpCall& c, std::string_view name, const TensorView& t, int64_t channels,
                    const Where& where) {
  if (t.rank == 1 && t.dims[0] == batch_norm_sums_size(channels)) return {};
  const int64_t want[] = {batch_norm_sums_size(channels)};
  return invalid(c, quoted(name) + " has shape " + shape_string(t.shape()) + ", expected " + shape_string(want) +
                        " (1-D, 2·C + 1: two sums per channel, then the count; " + where() + ")");
}

}  // namespace

std::span<const RowInfo> batch_norm_rows() { return kRows; }

Status run_batch_norm(const OpCall& c, const Context& ctx) {
  const OpSchema& op = *c.op;
  const OpId id = op.id;
  const Roles r = roles_of(id);
  const bool reduce_half = id == OpId::BatchNormGradReduce || id == OpId::BatchNormStatsReduce;
  const bool forward = id == OpId::BatchNormInternal || id == OpId::BatchNormStatsApply;

  BatchNormShape sh{};
  // (T, T1, T2[, S]), or (T, T2, S) for the reduce halves, which have no T1.
  sh.t = c.types[0];
  sh.t1 = reduce_half ? c.types[0] : c.types[1];
  sh.t2 = reduce_half ? c.types[1] : c.types[2];

  const double layout = c.attribute("channels_last");
  if (layout != 0 && layout != 1)
    return invalid(c, "attribute 'channels_last' is " + std::to_string(static_cast<int64_t>(layout)) +
                          ", expected 0 (NCHW, channels on axis 1) or 1 (NHWC, channels on the last axis)");
  sh.channels_last = layout == 1;
  float epsilon = 0, momentum = 0;
  if (forward) {
    if (op.find_attribute("training_mode") >= 0) {
      const double mode = c.attribute("training_mode");
      if (mode != 1)
        return invalid(c, "attribute 'training_mode' is " + std::to_string(static_cast<int64_t>(mode)) +
                              ", expected 1: gradops runs BatchNormInternal in its training form only (inference "
                              "is an elementwise scale and shift by the running statistics)");
    }
    const double eps = c.attribute("epsilon"), mom = c.attribute("momentum");
    if (!(eps >= 0) || std::isinf(eps))
      return invalid(c, "attribute 'epsilon' is " + std::to_string(eps) + ", expected a finite value >= 0");
    if (std::isinf(mom))
      return invalid(c, "attribute 'momentum' is " + std::to_string(mom) + ", expected a finite value");
    epsilon = static_cast<float>(eps);
    momentum = static_cast<float>(mom);
  }
  // BatchNormalizationGrad's epsilon is not read: the saved inverse std includes it.

  const TensorView& x = c.input(r.x);
  const std::string_view xname = c.in_name(r.x);
  if (x.rank < 1)
    return invalid(c, quoted(xname) + " has rank 0, expected rank >= 1 (a batch of values per channel)");
  if (x.rank == 1) {
    // No channel axis in either layout: N values of a single channel, as ORT reads rank 1.
    sh.n = x.dims[0], sh.c = 1, sh.spatial = 1;
  } else if (sh.channels_last) {
    sh.n = x.dims[0], sh.c = x.dims[x.rank - 1], sh.spatial = dims_product(x, 1, x.rank - 1);
  } else {
    sh.n = x.dims[0], sh.c = x.dims[1], sh.spatial = dims_product(x, 2, x.rank);
  }
  // Where C came from, for the messages of the checks below.
  auto where = [&]() -> std::string {
    if (x.rank == 1) return "rank-1 " + quoted(xname) + " has a single channel";
    return "C = " + std::to_string(sh.c) + (sh.channels_last ? " is the last dim of " : " is dim 1 of ") +
           quoted(xname) + ", shape " + shape_string(x.shape()) + (sh.channels_last ? ", channels_last = 1" : "");
  };

  if (r.dy >= 0)
    if (Status s = require_same_shape(c, c.in_name(r.dy), c.input(r.dy), c.in_name(r.x), x); !s) return s;
  if (r.out_main >= 0)
    if (Status s = require_same_shape(c, c.out_name(r.out_main), c.output(r.out_main), c.in_name(r.x), x); !s)
      return s;
  for (int i : {r.scale, r.bias, r.mean, r.inv_std, r.input_mean, r.input_var})
    if (i >= 0)
      if (Status s = require_channels(c, c.in_name(i), c.input(i), sh.c, where); !s) return s;
  if (r.sums >= 0)
    if (Status s = require_sums(c, c.in_name(r.sums), c.input(r.sums), sh.c, where); !s) return s;
  if (r.out_sums >= 0)
    if (Status s = require_sums(c, c.out_name(r.out_sums), c.output(r.out_sums), sh.c, where); !s) return s;
  for (int o = 0; o < static_cast<int>(op.outputs.size()); ++o)
    if (o != r.out_main && o != r.out_sums && c.has_output(o))
      if (Status s = require_channels(c, c.out_name(o), c.output(o), sh.c, where); !s) return s;

  auto in = [&](int i) -> const void* { return i >= 0 ? c.input(i).data : nullptr; };
  auto out = [&](int o) -> void* { return o >= 0 && c.has_output(o) ? c.output(o).data : nullptr; };
  auto grad_desc = [&] {
    return BatchNormGradDesc{sh,          in(r.dy), in(r.x), in(r.scale), in(r.mean), in(r.inv_std), out(0),
                             out(1),      out(2)};
  };
  auto forward_desc = [&] {
    return BatchNormForwardDesc{sh,     in(r.x), in(r.scale), in(r.bias), in(r.input_mean), in(r.input_var),
                                out(0), out(1),  out(2),      out(3),     out(4),           epsilon,
                                momentum};
  };
  const auto* sums_in = static_cast<const double*>(in(r.sums));
  switch (id) {
    case OpId::BatchNormalizationGrad: return dispatch<BatchNormGradDesc>(kGradImpls, c, grad_desc(), ctx);
    case OpId::BatchNormInternal: return dispatch<BatchNormForwardDesc>(kForwardImpls, c, forward_desc(), ctx);
    case OpId::BatchNormGradApply:
      return dispatch<BatchNormGradApplyDesc>(kGradApplyImpls, c, {grad_desc(), sums_in}, ctx);
    case OpId::BatchNormStatsApply:
      return dispatch<BatchNormStatsApplyDesc>(kStatsApplyImpls, c, {forward_desc(), sums_in}, ctx);
    case OpId::BatchNormGradReduce:
      return dispatch<BatchNormGradReduceDesc>(
          kGradReduceImpls, c,
          {sh, in(r.dy), in(r.x), in(r.mean), in(r.inv_std), static_cast<double*>(out(r.out_sums))}, ctx);
    case OpId::BatchNormStatsReduce:
      return dispatch<BatchNormStatsReduceDesc>(
          kStatsReduceImpls, c, {sh, in(r.x), in(r.input_mean), static_cast<double*>(out(r.out_sums))}, ctx);
    default: break;
  }
  return Status(StatusCode::internal, std::string(op.name) + ": not a BatchNorm op");
}

}  // namespace gradops::detail
