// Activation family, CUDA: the rows' kernels for bf16 tensors (see activation_rows.cuh).
#include "cuda/activation_kernels.cuh"

namespace gradops::cuda {

using Desc = detail::ActivationDesc;
template Status activation_flat<__nv_bfloat16>(std::string_view, const Desc&, const Context&, bool);
template Status activation_flat_bias<__nv_bfloat16>(std::string_view, const Desc&, const Context&);
template Status activation_bias_row<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status activation_bias_2d<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&, bool);

}  // namespace gradops::cuda
