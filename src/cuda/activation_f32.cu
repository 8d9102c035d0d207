// Activation family, CUDA: the rows' kernels for f32 tensors (see activation_rows.cuh).
#include "cuda/activation_kernels.cuh"

namespace gradops::cuda {

using Desc = detail::ActivationDesc;
template Status activation_flat<float>(std::string_view, const Desc&, const Context&, bool);
template Status activation_flat_bias<float>(std::string_view, const Desc&, const Context&);
template Status activation_bias_row<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status activation_bias_2d<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&, bool);

}  // namespace gradops::cuda
