// Shared helpers for the test suites: where the shared test data lives.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>

namespace fdl::test {

/// How much slower than an optimized build this one runs: time limits in tests (which catch
/// work that grows faster than it should, not slow machines) are multiplied by it.
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
inline constexpr double kSlowBuild = 10.0;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr double kSlowBuild = 10.0;
#else
inline constexpr double kSlowBuild = 1.0;
#endif
#else
inline constexpr double kSlowBuild = 1.0;
#endif

/// The project's shared data folder: $FLASHDLLM_SHARED, else ../shared beside the checkout.
inline std::filesystem::path shared_dir() {
  if (const char* env = std::getenv("FLASHDLLM_SHARED"); env && *env) return env;
  return std::filesystem::path(FLASHDLLM_SOURCE_DIR) / ".." / "shared";
}
inline std::filesystem::path model_path(const std::string& file) {
  return shared_dir() / "models" / file;
}
inline std::filesystem::path reference_path(const std::string& file) {
  return shared_dir() / "reference" / file;
}
/// The repository's own test data (tests/data): $FLASHDLLM_TEST_DATA, else the checkout's.
inline std::filesystem::path test_data_dir() {
  if (const char* env = std::getenv("FLASHDLLM_TEST_DATA"); env && *env) return env;
  return std::filesystem::path(FLASHDLLM_SOURCE_DIR) / "tests" / "data";
}
/// Fails the test (never skips it) when a test input is missing: a suite that skipped would let
/// CTest report green with part of it not run. The message says where the file was looked for.
#define FDL_ASSERT_INPUT(path)                                                             \
  do {                                                                                     \
    if (!std::filesystem::exists(path))                                                    \
      FAIL() << "test input missing: " << (path)                                           \
             << " (shared data: $FLASHDLLM_SHARED or ../shared beside the checkout)";      \
  } while (0)
/// A scratch directory unique to this test binary run, created on demand.
inline std::filesystem::path scratch_dir() {
  auto p = std::filesystem::temp_directory_path() / ("flashdllm-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(p);
  return p;
}

}  // namespace fdl::test
