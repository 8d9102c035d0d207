// Activation family, CUDA: the rows' kernels for f64 tensors (see activation_rows.cuh).
#include "cuda/activation_kernels.cuh"

namespace gradops::cuda {

using Desc = detail::ActivationDesc;
template Status activation_flat<double>(std::string_view, const Desc&, const Context&, bool);
template Status activation_flat_bias<double>(std::string_view, const Desc&, const Context&);
template Status activation_bias_row<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status activation_bias_2d<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&, bool);

}  // namespace gradops::cuda
