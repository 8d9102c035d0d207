// Softmax family, CUDA: the rows' kernels for f32 tensors (see softmax_rows.cuh).
#include "cuda/softmax_kernels.cuh"
#include "cuda/softmax_strided.cuh"

namespace gradops::cuda {

using Desc = detail::SoftmaxDesc;
template Status softmax_warp<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_block<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_cluster_size<float>(std::string_view, const Desc&, const DeviceInfo&, int*);
template Status softmax_cluster<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_two_pass<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided_held_fits<float>(std::string_view, const Desc&, const StridedPlan&, const DeviceInfo&, bool*);
template Status softmax_strided_held<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided<float>(std::string_view, const Desc&, const Context&, const DeviceInfo&);

}  // namespace gradops::cuda
