// layer_norm family, op layer (placeholder until the family lands).
#include "ops/op_call.hpp"

namespace gradops::detail {
Status run_layer_norm(const OpCall& c, const Context&) {
  return Status(StatusCode::unimplemented, std::string(c.op->name) + ": not implemented yet");
}
}  // namespace gradops::detail
