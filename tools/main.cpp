// gradops: list the operators, check them against the float64 oracle, time them.
#include <cstdio>
#include <span>
#include <string_view>

#include "cli.hpp"

namespace {

constexpr const char* kOverview =
    "usage: gradops <command> [options]\n"
    "\n"
    "commands:\n"
    "  list    every operator with its ONNX Runtime signature, and the devices and dtype\n"
    "          signatures this build supports\n"
    "  check   every operator and dtype signature against the float64 oracle on fresh random\n"
    "          inputs; PASS/FAIL table, exit status 1 on any failure\n"
    "  bench   check, then time, the default suite (or chosen ops and shapes); GB/s and the\n"
    "          share of a same-run copy, optionally as JSON\n"
    "\n"
    "gradops <command> --help describes a command's options.\n"
    "exit status: 0 ok, 1 check failures, 2 usage errors.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace gradops::cli;
  if (argc < 2) {
    std::fputs(kOverview, stderr);
    return kExitUsage;
  }
  const std::string_view command = argv[1];
  const std::span<char* const> rest(argv + 2, static_cast<std::size_t>(argc - 2));
  if (command == "list") return list_main(rest);
  if (command == "check") return check_main(rest);
  if (command == "bench") return bench_main(rest);
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kOverview, stdout);
    return kExitOk;
  }
  if (command == "--version") {
    std::printf("gradops %s\n", GRADOPS_VERSION);
    return kExitOk;
  }
  std::fprintf(stderr, "gradops: unknown command '%s'\n\n%s", argv[1], kOverview);
  return kExitUsage;
}
