// Bad input must end the CLI with a non-zero status and exactly one readable line on
// stderr: no abort, no signal, no stack dump, nothing on stdout.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

// Checks the error contract and that the message mentions `expected_word`.
void expect_clean_failure(const CliResult& r, const std::string& expected_word) {
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << "stdout:\n" << r.out;
  EXPECT_LT(r.exit_code, 128) << "killed by a signal; stderr:\n" << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << "stderr:\n" << r.err;
  EXPECT_TRUE(r.out.empty()) << "stdout:\n" << r.out;
  EXPECT_NE(r.err.find("error"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(expected_word), std::string::npos)
      << "expected '" << expected_word << "' in: " << r.err;
}

std::filesystem::path stories() { return model_path("stories260K.gguf"); }

TEST(CliErrors, MissingModelFileNamesThePath) {
  FDL_REQUIRE_CLI();
  const std::string missing = (scratch_dir() / "does-not-exist.gguf").string();
  expect_clean_failure(run_cli({"info", "-m", missing}), "does-not-exist.gguf");
  expect_clean_failure(run_cli({"generate", "-m", missing, "-p", "hi"}), "does-not-exist.gguf");
  expect_clean_failure(run_cli({"bench", "-m", missing}), "does-not-exist.gguf");
}

TEST(CliErrors, NoModelAnywhereSaysHowToGetOne) {
  FDL_REQUIRE_CLI();
  // An empty working directory and no FLASHDLLM_MODEL: none of the defaults exist.
  const auto empty_dir = scratch_dir() / "empty-cwd";
  std::filesystem::create_directories(empty_dir);
  const CliResult r = run_cli({"info"}, {"FLASHDLLM_MODEL="}, empty_dir);
  expect_clean_failure(r, "FLASHDLLM_MODEL");
  EXPECT_NE(r.err.find("-m"), std::string::npos) << r.err;
}

TEST(CliErrors, GarbageFileIsRejectedAsNotGguf) {
  FDL_REQUIRE_CLI();
  const auto garbage = scratch_dir() / "garbage.gguf";
  std::mt19937 rng(7);
  std::string bytes(4096, '\0');
  for (char& c : bytes) c = static_cast<char>(rng());
  write_file(garbage, bytes);
  expect_clean_failure(run_cli({"info", "-m", garbage.string()}), "garbage.gguf");
  expect_clean_failure(run_cli({"generate", "-m", garbage.string(), "-p", "x"}), "garbage.gguf");
  expect_clean_failure(run_cli({"tokenize", "-m", garbage.string(), "--text", "x"}), "garbage.gguf");
}

TEST(CliErrors, TruncatedModelIsRejected) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  // Keep the header and part of the metadata, cut the rest.
  std::ifstream in(stories(), std::ios::binary);
  std::string head(3000, '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  const auto truncated = scratch_dir() / "truncated.gguf";
  write_file(truncated, head);
  expect_clean_failure(run_cli({"generate", "-m", truncated.string(), "-p", "x"}), "truncated.gguf");
}

TEST(CliErrors, BadFlagValuesNameTheFlag) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "-n", "-5"}), "-n");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--temp", "nan"}), "--temp");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--temp", "-1"}), "--temp");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--top-p", "1.5"}), "--top-p must be a number in (0, 1]");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--top-p", "0"}), "--top-p must be a number in (0, 1]");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--min-p", "inf"}), "--min-p");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--top-k", "-2"}), "--top-k");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--repeat-penalty", "0"}),
                       "--repeat-penalty");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--block-size", "0"}), "--block-size");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "--stop", ""}), "--stop");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "-n", "abc"}), "abc");
  expect_clean_failure(run_cli({"generate", "-m", m, "-p", "x", "-t", "100000"}), "-t");
  expect_clean_failure(run_cli({"bench", "-m", m, "-r", "0"}), "-r");
  expect_clean_failure(run_cli({"bench", "-m", m, "--block-size", "2000000000"}), "--block-size");
  expect_clean_failure(run_cli({"bench", "-m", m, "-p", "0"}), "-p");
}

TEST(CliErrors, UnknownFlagsAndMissingSubcommandAreUsageErrors) {
  FDL_REQUIRE_CLI();
  expect_clean_failure(run_cli({"generate", "--no-such-flag"}), "--no-such-flag");
  expect_clean_failure(run_cli({}), "command is required");
  expect_clean_failure(run_cli({"frobnicate"}), "frobnicate");
  expect_clean_failure(run_cli({"tools"}), "make-model");
}

TEST(CliErrors, PromptLongerThanTheContextIsRejected) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"generate", "-m", stories().string(), "-c", "8", "-p",
                               "Once upon a time there was a little girl named Lily"});
  expect_clean_failure(r, "but --ctx-size is 8");
}

TEST(CliErrors, HelpIsNotAnError) {
  FDL_REQUIRE_CLI();
  const CliResult r = run_cli({"generate", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("--temp"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--ctx-size"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace fdl::test
