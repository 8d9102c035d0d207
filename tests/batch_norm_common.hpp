// What the BatchNorm tests (batch_norm_test.cpp, batch_norm_split_test.cpp) share besides the
// harness's HostTensor: element counts and bitwise comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "harness/checker.hpp"
#include "harness/host_tensor.hpp"

namespace gradops::check {

inline int64_t count_of(const std::vector<int64_t>& s) { return element_count(s); }

inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  // memcmp's pointers must not be null even for zero bytes, and an empty vector's data() may be.
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

}  // namespace gradops::check
