// cli_test_support.h — skip conditions and file helpers shared by the CLI tests.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "cli_runner.h"
#include "test_support.h"

/// Skip (not fail) when the tool has not been built, with a message saying how to build it.
#define FDL_REQUIRE_CLI()                                                                  \
  do {                                                                                     \
    if (!::fdl::test::cli_available())                                                     \
      GTEST_SKIP() << "CLI not built at " << ::fdl::test::cli_binary()                     \
                   << " (build the `flashdllm` target)";                                   \
  } while (0)

/// Skip when a shared data file is missing (the data lives outside the repository).
#define FDL_REQUIRE_FILE(path)                                                             \
  do {                                                                                     \
    if (!std::filesystem::exists(path))                                                    \
      GTEST_SKIP() << "shared data file missing: " << (path);                              \
  } while (0)

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
