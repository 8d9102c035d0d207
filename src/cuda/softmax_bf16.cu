// Softmax family, CUDA: the rows' kernels for bf16 tensors (see softmax_rows.cuh).
#include "cuda/softmax_kernels.cuh"
#include "cuda/softmax_strided.cuh"

namespace gradops::cuda {

using Desc = detail::SoftmaxDesc;
template Status softmax_warp<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_block<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_cluster_size<__nv_bfloat16>(std::string_view, const Desc&, const DeviceInfo&, int*);
template Status softmax_cluster<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_two_pass<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided_held_fits<__nv_bfloat16>(std::string_view, const Desc&, const StridedPlan&, const DeviceInfo&, bool*);
template Status softmax_strided_held<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided<__nv_bfloat16>(std::string_view, const Desc&, const Context&, const DeviceInfo&);

}  // namespace gradops::cuda
