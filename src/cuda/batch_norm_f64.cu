// BatchNorm family, CUDA: the rows' kernels for f64 tensors (see batch_norm_rows.cuh).
#include "cuda/batch_norm_kernels.cuh"

namespace gradops::cuda {

template Status batch_norm_run<double>(std::string_view, const BnCall&, const Context&, const DeviceInfo&, BnKernel);

}  // namespace gradops::cuda
