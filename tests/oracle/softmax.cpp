// Oracle for the softmax family (placeholder until the family lands).
#include "oracle/oracle.hpp"

namespace gradops::oracle {
bool make_softmax_inputs(std::string_view, std::span<const int64_t>, const Attrs&, std::span<const DType>, Rng&,
                      Tensors&) {
  return false;
}
bool softmax_reference(std::string_view, const Tensors&, const Attrs&, Tensors&) { return false; }
}  // namespace gradops::oracle
