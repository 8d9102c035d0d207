// Status: how every gradops entry reports success or failure. The library never throws across
// its API; a failed call returns a Status naming the op, the argument, and what was expected.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace gradops {

enum class StatusCode : int {
  ok = 0,
  invalid_argument = 1,  // the call breaks the op's contract
  unimplemented = 2,     // a valid call that no implementation in this build accepts
  out_of_memory = 3,
  device_error = 4,      // an error reported by the device runtime (CUDA)
  internal = 5,          // a bug in gradops
};

// The name of a code: "ok", "invalid_argument", ...
const char* status_code_name(StatusCode code) noexcept;

class [[nodiscard]] Status {
 public:
  Status() noexcept = default;  // ok; allocates nothing
  Status(StatusCode code, std::string message);

  static Status ok() noexcept { return {}; }

  bool is_ok() const noexcept { return rep_ == nullptr; }
  explicit operator bool() const noexcept { return is_ok(); }
  StatusCode code() const noexcept { return rep_ ? rep_->code : StatusCode::ok; }
  // Empty for ok.
  const std::string& message() const noexcept;
  // "invalid_argument: GeluGrad: ..." or "ok".
  std::string to_string() const;

 private:
  struct Rep {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;
};

}  // namespace gradops
