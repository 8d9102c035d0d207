// Oracle for the layer_norm family (placeholder until the family lands).
#include "oracle/oracle.hpp"

namespace gradops::oracle {
bool make_layer_norm_inputs(std::string_view, std::span<const int64_t>, const Attrs&, std::span<const DType>, Rng&,
                      Tensors&) {
  return false;
}
bool layer_norm_reference(std::string_view, const Tensors&, const Attrs&, Tensors&) { return false; }
}  // namespace gradops::oracle
