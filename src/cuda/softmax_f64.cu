// Softmax family, CUDA: the rows' kernels for f64 tensors (see softmax_rows.cuh).
#include "cuda/softmax_kernels.cuh"
#include "cuda/softmax_strided.cuh"

namespace gradops::cuda {

using Desc = detail::SoftmaxDesc;
template Status softmax_warp<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_block<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_cluster_size<double>(std::string_view, const Desc&, const DeviceInfo&, int*);
template Status softmax_cluster<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_two_pass<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided_held_fits<double>(std::string_view, const Desc&, const StridedPlan&, const DeviceInfo&, bool*);
template Status softmax_strided_held<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);
template Status softmax_strided<double>(std::string_view, const Desc&, const Context&, const DeviceInfo&);

}  // namespace gradops::cuda
