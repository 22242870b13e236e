// cli_runner.h — run the built `flashdllm` binary as a child process and capture its
// exit status, stdout and stderr (the CLI integration tests talk to the tool only this way).
#pragma once

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

namespace fdl::test {

struct CliResult {
  int exit_code = -1;        ///< exit status; 128 + signal number when killed by a signal
  bool timed_out = false;    ///< killed because it ran past the deadline
  std::string out;           ///< everything written to stdout
  std::string err;           ///< everything written to stderr
};

/// build/bin/flashdllm (from the FLASHDLLM_BINARY_DIR compile definition).
std::filesystem::path cli_binary();
/// True when the binary exists and is executable; tests GTEST_SKIP otherwise.
bool cli_available();

/// Run `flashdllm args...` with stdin from /dev/null. `env_overrides` are "NAME=value"
/// entries added to (or replacing in) the inherited environment; "NAME=" with nothing after
/// removes NAME. `cwd` (when not empty) is the child's working directory. The child is
/// killed after `timeout` (times test::kSlowBuild).
CliResult run_cli(const std::vector<std::string>& args,
                  const std::vector<std::string>& env_overrides = {},
                  const std::filesystem::path& cwd = {},
                  std::chrono::milliseconds timeout = std::chrono::seconds(30));

/// Number of '\n'-terminated lines in `s` (a last line without '\n' counts too).
int count_lines(const std::string& s);

}  // namespace fdl::test
