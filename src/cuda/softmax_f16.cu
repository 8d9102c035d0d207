// Softmax family, CUDA: the rows' kernels for f16 tensors (see softmax_rows.cuh).
#include "cuda/softmax_kernels.cuh"
#include "cuda/softmax_strided.cuh"

namespace gradops::cuda {

using Desc = detail::SoftmaxDesc;
template Status softmax_warp<__half>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_block<__half>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_cluster_size<__half>(std::string_view, const Desc&, const DeviceInfo&, int*);
template Status softmax_cluster<__half>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_two_pass<__half>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided_held_fits<__half>(std::string_view, const Desc&, const StridedPlan&, const DeviceInfo&, bool*);
template Status softmax_strided_held<__half>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided<__half>(std::string_view, const Desc&, const Context&, const DeviceInfo&);

}  // namespace gradops::cuda
