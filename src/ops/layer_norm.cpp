// LayerNorm family, op layer: shape rules and the implementation list.
//
// ORT's kernels only count elements; we check shapes (docs/semantics.md A4), taking both forms that
// ORT's own graphs and tests feed: statistics as [d0..d(axis-1)] or with trailing 1s up to the rank
// of X, and scale-like tensors as 1-D [cols] or as the normalized dims d(axis)..d(r-1) (the
// forwards' Scale and B also with leading 1s). Nothing is broadcast: each holds exactly the values
// the kernels read.
#include "ops/layer_norm.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops::detail {
namespace {

#if GRADOPS_HAVE_CUDA
bool is_gradient(const LayerNormDesc& d) {
  return d.op != OpId::LayerNormalization && d.op != OpId::SimplifiedLayerNormalization;
}
// Each row's entries: the gradients and the forwards are compiled apart (layer_norm_grad.cu,
// layer_norm_fwd.cu), and each names the kernel K of its direction.
template <LayerNormCudaKernel K>
const char* cuda_declines(const LayerNormDesc& d) {
  return is_gradient(d) ? cuda_layer_norm_grad_declines(d, K) : cuda_layer_norm_fwd_declines(d, K);
}
template <LayerNormCudaKernel K>
Status cuda_run(const LayerNormDesc& d, const Context& ctx) {
  return is_gradient(d) ? cuda_layer_norm_grad(d, ctx, K) : cuda_layer_norm_fwd(d, ctx, K);
}
using CudaKernel = LayerNormCudaKernel;
#endif

constexpr Impl<LayerNormDesc> kImpls[] = {
    {"cpu:simd", DeviceType::cpu, nullptr, cpu_layer_norm, nullptr, cpu_simd_target},
#if GRADOPS_HAVE_CUDA
    {"cuda:rows_per_warp", DeviceType::cuda, cuda_declines<CudaKernel::rows_per_warp>,
     cuda_run<CudaKernel::rows_per_warp>},
    {"cuda:block_per_row", DeviceType::cuda, cuda_declines<CudaKernel::block_per_row>,
     cuda_run<CudaKernel::block_per_row>},
    {"cuda:cluster_per_row", DeviceType::cuda, cuda_declines<CudaKernel::cluster_per_row>,
     cuda_run<CudaKernel::cluster_per_row>},
    {"cuda:general", DeviceType::cuda, cuda_declines<CudaKernel::general>, cuda_run<CudaKernel::general>},
#endif
};
constexpr auto kRows = row_infos(kImpls);

// Where each tensor sits in the op's argument lists; -1 where the op has no such tensor.
struct Roles {
  int main;             // input whose shape defines rows x cols
  int dy, x, y, scale, bias, mean, inv_std;  // inputs
  int dx, dscale, dbias, out_y, out_mean, out_inv_std;  // outputs
};

Roles roles_of(OpId op) {
  switch (op) {
    case OpId::LayerNormalizationGrad: return {1, 0, 1, -1, 2, -1, 3, 4, 0, 1, 2, -1, -1, -1};
    // ORT takes the row structure of the invertible grad from Y_grad.
    case OpId::InvertibleLayerNormalizationGrad: return {0, 0, -1, 1, 2, 3, -1, 4, 0, 1, 2, -1, -1, -1};
    case OpId::SimplifiedLayerNormalizationGrad: return {1, 0, 1, -1, 2, -1, -1, 3, 0, 1, -1, -1, -1, -1};
    case OpId::LayerNormalization: return {0, -1, 0, -1, 1, 2, -1, -1, -1, -1, -1, 0, 1, 2};
    case OpId::SimplifiedLayerNormalization: return {0, -1, 0, -1, 1, -1, -1, -1, -1, -1, -1, 0, -1, 1};
    default: break;
  }
  return {};
}

// 'name', built by appending (GCC 12 warns falsely about "'" + std::string(...) at -O3).
std::string quoted(std::string_view name) {
  std::string r = "'";
  r += name;
  r += '\'';
  return r;
}

// The checks below compare dims in place: a call that passes them allocates nothing (the vectors
// of the messages are built only when one fails).
bool has_shape(const TensorView& t, std::span<const int64_t> shape) {
  return t.rank == static_cast<int>(shape.size()) && std::equal(shape.begin(), shape.end(), t.dims.begin());
}

// Statistics: one value per row.
Status check_per_row(const OpCall& c, std::string_view name, const TensorView& t, const TensorView& main,
                     std::string_view main_name, int axis) {
  const std::span<const int64_t> lead = main.shape().first(static_cast<std::size_t>(axis));
  const bool kept = t.rank == main.rank && std::equal(lead.begin(), lead.end(), t.dims.begin()) &&
                    std::all_of(t.dims.begin() + axis, t.dims.begin() + t.rank, [](int64_t d) { return d == 1; });
  if (kept || has_shape(t, lead)) return {};
  std::vector<int64_t> keep(lead.begin(), lead.end());
  keep.resize(static_cast<std::size_t>(main.rank), 1);
  return invalid(c, quoted(name) + " has shape " + shape_string(t.shape()) + ", expected " + shape_string(lead) +
                        " or " + shape_string(keep) + " (one value per row: the dims of " + quoted(main_name) +
                        " before axis " + std::to_string(axis) + ")");
}

// Scale, bias and their gradients: one value per column. The forwards' Scale and B may also carry
// leading 1s up to the rank of X (ONNX broadcasting, restricted to exactly cols values).
Status check_per_col(const OpCall& c, std::string_view name, const TensorView& t, const TensorView& main,
                     std::string_view main_name, int axis, int64_t cols, bool leading_ones) {
  const int64_t flat[1] = {cols};
  const std::span<const int64_t> normalized = main.shape().subspan(static_cast<std::size_t>(axis));
  if (has_shape(t, flat) || has_shape(t, normalized)) return {};
  const int extra = t.rank - static_cast<int>(normalized.size());
  if (leading_ones && extra > 0 && t.rank <= main.rank) {
    bool ok = true;
    for (int d = 0; d < t.rank; ++d) ok = ok && t.dims[d] == (d < extra ? 1 : normalized[d - extra]);
    if (ok) return {};
  }
  std::string expected = std::ranges::equal(normalized, flat) ? shape_string(flat)
                                                              : shape_string(flat) + " or " + shape_string(normalized);
  if (leading_ones && axis > 0) expected += " (leading 1s allowed)";
  return invalid(c, quoted(name) + " has shape " + shape_string(t.shape()) + " (" + std::to_string(t.numel()) +
                        " values), expected " + expected + " (one value per column: " + std::to_string(cols) +
                        " = the dims of " + quoted(main_name) + " from axis " + std::to_string(axis) + ")");
}

// Product of dims [begin, end), or -1 past int64 (possible only when another dim is 0).
int64_t checked_product(const TensorView& t, int begin, int end) {
  for (int d = begin; d < end; ++d)
    if (t.dims[d] == 0) return 0;
  int64_t p = 1;
  for (int d = begin; d < end; ++d)
    if (__builtin_mul_overflow(p, t.dims[d], &p)) return -1;
  return p;
}

}  // namespace

std::span<const RowInfo> layer_norm_rows() { return kRows; }

Status run_layer_norm(const OpCall& c, const Context& ctx) {
  const OpSchema& op = *c.op;
  const Roles r = roles_of(op.id);
  const TensorView& main = c.input(r.main);
  const std::string_view main_name = c.in_name(r.main);

  if (main.rank == 0)
    return invalid(c, quoted(main_name) + " has rank 0, expected rank >= 1 (rows are the dims before axis, "
                                          "columns the dims from axis on)");
  int axis = 0;
  if (Status s = normalize_axis(c, static_cast<int64_t>(c.attribute("axis", -1)), main.rank, &axis); !s) return s;
  // An empty X may have dims whose product overflows on one side of the axis. Columns past int64
  // leave scale no valid shape; rows past int64 mean cols = 0, and then no per-row tensor can
  // exist either (it would overflow too): there is nothing to compute.
  const int64_t cols = checked_product(main, axis, main.rank);
  if (cols < 0)
    return invalid(c, "the dims of " + quoted(main_name) + " from axis " + std::to_string(axis) + " (shape " +
                          shape_string(main.shape()) + ") multiply past 2^63 - 1; 'scale' cannot hold one value "
                          "per column");
  const int64_t rows = std::max<int64_t>(checked_product(main, 0, axis), 0);

  // Tensors of the main shape.
  for (int i : {r.dy, r.x, r.y})
    if (i >= 0 && i != r.main)
      if (Status s = require_same_shape(c, c.in_name(i), c.input(i), main_name, main); !s) return s;
  for (int o : {r.dx, r.out_y})
    if (o >= 0)
      if (Status s = require_same_shape(c, c.out_name(o), c.output(o), main_name, main); !s) return s;
  // One value per column.
  for (int i : {r.scale, r.bias})
    if (i >= 0 && c.has_input(i))
      if (Status s = check_per_col(c, c.in_name(i), c.input(i), main, main_name, axis, cols, !op.gradient); !s)
        return s;
  for (int o : {r.dscale, r.dbias})
    if (o >= 0 && c.has_output(o))
      if (Status s = check_per_col(c, c.out_name(o), c.output(o), main, main_name, axis, cols, false); !s)
        return s;
  // One value per row.
  for (int i : {r.mean, r.inv_std})
    if (i >= 0)
      if (Status s = check_per_row(c, c.in_name(i), c.input(i), main, main_name, axis); !s) return s;
  for (int o : {r.out_mean, r.out_inv_std})
    if (o >= 0 && c.has_output(o))
      if (Status s = check_per_row(c, c.out_name(o), c.output(o), main, main_name, axis); !s) return s;

  auto in = [&](int i) -> const void* { return i >= 0 && c.has_input(i) ? c.input(i).data : nullptr; };
  auto out = [&](int o) -> void* { return o >= 0 && c.has_output(o) ? c.output(o).data : nullptr; };
  LayerNormDesc d{};
  d.op = op.id;
  d.kind = layer_norm_kind(op.id);
  d.t = c.types[0];
  d.u = c.types[1];
  d.v = c.types[2];
  d.rows = rows;
  d.cols = cols;
  d.dy = in(r.dy);
  d.x = in(r.x);
  d.y = in(r.y);
  d.scale = in(r.scale);
  d.bias = in(r.bias);
  d.mean = in(r.mean);
  d.inv_std = in(r.inv_std);
  d.dx = out(r.dx);
  d.dscale = out(r.dscale);
  d.dbias = out(r.dbias);
  d.out_y = out(r.out_y);
  d.out_mean = out(r.out_mean);
  d.out_inv_std = out(r.out_inv_std);
  // stash_type is not read: the dtype of the statistics tensors (U) says what the caller wants.
  d.epsilon = static_cast<float>(c.attribute("epsilon", 0.0));
  return dispatch<LayerNormDesc>(kImpls, c, d, ctx);
}

}  // namespace gradops::detail
