// cli_test_support.h — skip conditions and file helpers shared by the CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_runner.h"
#include "test_support.h"

/// Fails (never skips) when the tool has not been built, with a message saying how to build it.
#define FDL_REQUIRE_CLI()                                                                  \
  do {                                                                                     \
    if (!::fdl::test::cli_available())                                                     \
      FAIL() << "CLI not built at " << ::fdl::test::cli_binary()                           \
             << " (build the `flashdllm` target)";                                         \
  } while (0)

/// Fails when a shared data file is missing (the data lives outside the repository).
#define FDL_REQUIRE_FILE(path) FDL_ASSERT_INPUT(path)

namespace fdl::test {

inline nlohmann::json read_json_file(const std::filesystem::path& p) {
  std::ifstream in(p);
  return nlohmann::json::parse(in);
}

inline void write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
}

/// Parse the single JSON object a `--json` command prints; fails the test on bad JSON.
inline nlohmann::json parse_cli_json(const CliResult& r) {
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stdout is not one JSON object (" << e.what() << "):\n"
                  << r.out << "\nstderr:\n" << r.err;
    return {};
  }
}

}  // namespace fdl::test
