// BatchNorm family, CPU: each op's descriptor as the Job the kernel runs (batch_norm.hpp); the
// kernels and their dispatch are batch_norm.cpp's. The split's halves fill the fused ops' Job with
// their own inputs, so that all six go through the same code.
#include "cpu/batch_norm.hpp"

namespace gradops::cpu::batch_norm {
namespace {
Job grad_job(const detail::BatchNormGradDesc& d, Mode mode) {
  Job j;
  static_cast<detail::BatchNormShape&>(j) = d.shape;
  j.grad = true;
  j.mode = mode;
  j.x = d.x, j.scale = d.scale, j.dy = d.dy, j.mean = d.mean, j.inv_std = d.inv_std;
  j.dx = d.dx, j.dscale = d.dscale, j.dbias = d.dbias;
  return j;
}

Job forward_job(const detail::BatchNormForwardDesc& d, Mode mode) {
  Job j;
  static_cast<detail::BatchNormShape&>(j) = d.shape;
  j.mode = mode;
  j.x = d.x, j.scale = d.scale, j.bias = d.bias, j.input_mean = d.input_mean, j.input_var = d.input_var;
  j.y = d.y, j.running_mean = d.running_mean, j.running_var = d.running_var;
  j.saved_mean = d.saved_mean, j.saved_inv_std = d.saved_inv_std;
  j.epsilon = d.epsilon, j.momentum = d.momentum;
  return j;
}
}  // namespace
}  // namespace gradops::cpu::batch_norm

namespace gradops::detail {
using cpu::batch_norm::Mode;
using cpu::batch_norm::forward_job;
using cpu::batch_norm::grad_job;

Status cpu_batch_norm_grad(const BatchNormGradDesc& d, const Context& ctx) {
  cpu::batch_norm::Job j = grad_job(d, Mode::fused);
  j.op_name = "BatchNormalizationGrad";
  return cpu::batch_norm::run(j, ctx);
}
Status cpu_batch_norm_forward(const BatchNormForwardDesc& d, const Context& ctx) {
  cpu::batch_norm::Job j = forward_job(d, Mode::fused);
  j.op_name = "BatchNormInternal";
  return cpu::batch_norm::run(j, ctx);
}
Status cpu_batch_norm_grad_reduce(const BatchNormGradReduceDesc& d, const Context& ctx) {
  BatchNormGradDesc g{};
  g.shape = d.shape, g.dy = d.dy, g.x = d.x, g.mean = d.mean, g.inv_std = d.inv_std;
  cpu::batch_norm::Job j = grad_job(g, Mode::reduce);
  j.op_name = "BatchNormGradReduce";
  j.sums_out = d.sums;
  return cpu::batch_norm::run(j, ctx);
}
Status cpu_batch_norm_grad_apply(const BatchNormGradApplyDesc& d, const Context& ctx) {
  cpu::batch_norm::Job j = grad_job(d.grad, Mode::apply);
  j.op_name = "BatchNormGradApply";
  j.sums_in = d.sums;
  return cpu::batch_norm::run(j, ctx);
}
Status cpu_batch_norm_stats_reduce(const BatchNormStatsReduceDesc& d, const Context& ctx) {
  BatchNormForwardDesc f{};
  f.shape = d.shape, f.x = d.x, f.input_mean = d.input_mean;
  cpu::batch_norm::Job j = forward_job(f, Mode::reduce);
  j.op_name = "BatchNormStatsReduce";
  j.sums_out = d.sums;
  return cpu::batch_norm::run(j, ctx);
}
Status cpu_batch_norm_stats_apply(const BatchNormStatsApplyDesc& d, const Context& ctx) {
  cpu::batch_norm::Job j = forward_job(d.fwd, Mode::apply);
  j.op_name = "BatchNormStatsApply";
  j.sums_in = d.sums;
  return cpu::batch_norm::run(j, ctx);
}
}  // namespace gradops::detail
