// gradops: training backward kernels with ONNX Runtime's operator semantics. The whole C++ API.
#pragma once

#include "gradops/context.hpp"
#include "gradops/ops.hpp"
#include "gradops/schema.hpp"
#include "gradops/status.hpp"
#include "gradops/types.hpp"
