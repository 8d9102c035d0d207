// Status, dtype and device names, tensor sizes, the dispatch log.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gradops/status.hpp"
#include "gradops/types.hpp"
#include "ops/dispatch.hpp"
#include "ops/op_call.hpp"

namespace gradops {

const char* status_code_name(StatusCode code) noexcept {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::unimplemented: return "unimplemented";
    case StatusCode::out_of_memory: return "out_of_memory";
    case StatusCode::device_error: return "device_error";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::ok) rep_ = std::make_shared<const Rep>(Rep{code, std::move(message)});
}

const std::string& Status::message() const noexcept {
  static const std::string empty;
  return rep_ ? rep_->message : empty;
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(status_code_name(code())) + ": " + message();
}

const char* dtype_name(DType t) noexcept {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

bool parse_dtype(std::string_view name, DType* out) noexcept {
  struct Alias { std::string_view name; DType t; };
  static constexpr Alias kNames[] = {
      {"f32", DType::f32}, {"float32", DType::f32}, {"float", DType::f32},
      {"f64", DType::f64}, {"float64", DType::f64}, {"double", DType::f64},
      {"f16", DType::f16}, {"float16", DType::f16}, {"half", DType::f16},
      {"bf16", DType::bf16}, {"bfloat16", DType::bf16}};
  for (const Alias& a : kNames)
    if (a.name == name) {
      *out = a.t;
      return true;
    }
  return false;
}

const char* device_type_name(DeviceType t) noexcept {
  return t == DeviceType::cpu ? "cpu" : t == DeviceType::cuda ? "cuda" : "?";
}

int64_t TensorView::numel() const noexcept {
  if (rank < 0 || rank > kMaxRank) return -1;
  int64_t n = 1;
  bool empty = false;  // a zero dim makes the product 0, but only once no dim is negative
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 0) return -1;
    empty = empty || dims[i] == 0;
  }
  if (empty) return 0;
  for (int i = 0; i < rank; ++i)
    if (__builtin_mul_overflow(n, dims[i], &n)) return -1;
  return n;
}

int64_t TensorView::nbytes() const noexcept {
  const int64_t n = numel();
  int64_t b;
  if (n < 0 || __builtin_mul_overflow(n, static_cast<int64_t>(dtype_size(dtype)), &b)) return -1;
  return b;
}

namespace detail {

bool verbose_dispatch() {
  static const bool on = [] {
    const char* v = std::getenv("GRADOPS_VERBOSE");
    return v && (std::strstr(v, "dispatch") || std::strcmp(v, "all") == 0);
  }();
  return on;
}

void log_dispatch(std::string_view op, const char* impl, const char* verdict, const char* target) {
  std::fprintf(stderr, "gradops: dispatch %.*s: %s%s%s%s %s\n", static_cast<int>(op.size()), op.data(), impl,
               target ? " [" : "", target ? target : "", target ? "]" : "", verdict);
}

namespace {
const Status g_out_of_memory(StatusCode::out_of_memory, "out of host memory");
}  // namespace

const Status& out_of_memory_status() noexcept { return g_out_of_memory; }

}  // namespace detail
}  // namespace gradops
