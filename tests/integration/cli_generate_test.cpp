// `flashdllm generate` behaviour beyond greedy reference ids: empty prompts, streaming vs
// JSON output, stop strings, seeded sampling, and the timing summary.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

std::string stories() { return model_path("stories260K.gguf").string(); }

TEST(CliGenerate, EmptyPromptStartsFromBos) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"generate", "-m", stories(), "-p", "", "--temp", "0", "-n", "8",
                               "--ignore-eos", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  EXPECT_EQ(j.at("prompt_token_ids"), nlohmann::json::array({1}));
  EXPECT_EQ(j.at("token_ids").size(), 8u);
  // llama.cpp from BOS alone: "Once upon a time, ..." (reference case "empty")
  EXPECT_EQ(j.at("text").get<std::string>().rfind(" Once upon a time", 0), 0u) << j.at("text");
}

// -m DIR: a Hugging Face model directory gives the prompt ids, output ids and text of the
// GGUF converted from it; `info` and `tokenize` read it too; a directory without config.json
// is one clear error.
TEST(CliGenerate, HuggingFaceDirectoryEqualsItsGguf) {
  FDL_REQUIRE_CLI();
  const std::string dir = model_path("codelm-16m-hf").string(), gguf = model_path("codelm-16m-f16.gguf").string();
  FDL_REQUIRE_FILE(gguf);
  const auto run = [](const std::string& m) {
    const CliResult r = run_cli({"generate", "-m", m, "-p", "def fibonacci(n):", "--temp", "0", "-n", "24",
                                 "--ignore-eos", "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return parse_cli_json(r);
  };
  const auto from_dir = run(dir), from_gguf = run(gguf);
  EXPECT_EQ(from_dir.at("prompt_token_ids"), from_gguf.at("prompt_token_ids"));
  EXPECT_EQ(from_dir.at("token_ids"), from_gguf.at("token_ids"));
  EXPECT_EQ(from_dir.at("text"), from_gguf.at("text"));
  const CliResult info = run_cli({"info", "-m", dir});
  EXPECT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("tokenizer:     gpt2, vocab 8192"), std::string::npos) << info.out;
  const CliResult empty = run_cli({"generate", "-m", scratch_dir().string(), "-p", "x"});
  EXPECT_EQ(empty.exit_code, 1);
  EXPECT_NE(empty.err.find("is a directory without a config.json"), std::string::npos) << empty.err;
  EXPECT_EQ(count_lines(empty.err), 1) << empty.err;
}

// --spec-tree on|off: the same greedy ids as plain decoding either way; the JSON reports the
// tree metrics (none with off).
TEST(CliGenerate, SpecTreeOnAndOffGiveThePlainIds) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::vector<std::string> base{"generate", "-m", stories(), "-p",
                                      "Lily had a red ball. Lily had a blue hat. Lily had a red", "--temp", "0",
                                      "-n", "48", "--ignore-eos", "--json"};
  const auto run = [&](std::vector<std::string> extra) {
    auto args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    const CliResult r = run_cli(args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return parse_cli_json(r);
  };
  const auto plain = run({});
  const auto on = run({"--spec", "auto", "--spec-tree", "on", "--spec-window", "6"});
  const auto off = run({"--spec", "auto", "--spec-tree", "off", "--spec-window", "6"});
  EXPECT_EQ(on.at("token_ids"), plain.at("token_ids"));
  EXPECT_EQ(off.at("token_ids"), plain.at("token_ids"));
  EXPECT_TRUE(on.at("spec").contains("tree_steps"));
  EXPECT_TRUE(on.at("spec").contains("tree_alt_accepted"));
  EXPECT_EQ(off.at("spec").at("tree_steps"), 0);
}

TEST(CliGenerate, EmptyPromptWithoutBosIsAnError) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"generate", "-m", stories(), "-p", "", "--no-bos"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("empty"), std::string::npos) << r.err;
}

TEST(CliGenerate, StreamedTextEqualsJsonTextAndSummaryGoesToStderr) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::vector<std::string> base = {"generate", "-m", stories(), "-p", "Lily and Tom",
                                         "--temp", "0", "-n", "40", "--ignore-eos"};
  const CliResult streamed = run_cli(base);
  ASSERT_EQ(streamed.exit_code, 0) << streamed.err;
  auto json_args = base;
  json_args.push_back("--json");
  const CliResult as_json = run_cli(json_args);
  ASSERT_EQ(as_json.exit_code, 0) << as_json.err;
  const auto j = parse_cli_json(as_json);
  EXPECT_EQ(streamed.out, j.at("text").get<std::string>());
  for (const char* word : {"load", "prompt", "TTFT", "generated", "tok/s"}) {
    EXPECT_NE(streamed.err.find(word), std::string::npos) << "missing " << word << " in " << streamed.err;
  }
  // stdout is a pipe here and the text does not end its line: the stats line starts on a
  // line of its own (the break goes to stderr, stdout keeps the exact text).
  ASSERT_FALSE(streamed.out.empty());
  ASSERT_NE(streamed.out.back(), '\n');
  EXPECT_EQ(streamed.err.rfind("\nflashdllm: load", 0), 0u) << streamed.err;
  EXPECT_FALSE(j.contains("kv_tiers")) << "no tier section without tiers";
  const auto& t = j.at("timings");
  EXPECT_EQ(t.at("prompt_tokens"), j.at("prompt_token_ids").size());
  EXPECT_EQ(t.at("gen_tokens"), 40);
  EXPECT_GT(t.at("decode_tok_s").get<double>(), 0.0);
  EXPECT_GE(t.at("ttft_ms").get<double>(), t.at("prompt_ms").get<double>());
}

TEST(CliGenerate, JsonHasTheTierSectionWithTiers) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"generate", "-m", stories(), "-p", "Once", "--temp", "0", "-n", "8",
                               "--kv-host-bytes", "1MiB", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  ASSERT_TRUE(j.contains("kv_tiers")) << j.dump();
  EXPECT_EQ(j.at("kv_tiers").at("enabled"), true);
  EXPECT_TRUE(j.at("kv_tiers").contains("tiers"));
}

TEST(CliGenerate, StopStringEndsGenerationAndIsNotPrinted) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  // Greedy text: ", there was a little girl named Lily. She loved ..." — stop at "Lily".
  const CliResult r = run_cli({"generate", "-m", stories(), "-p", "Once upon a time", "--temp",
                               "0", "-n", "100", "--stop", "Lily", "--stop", "zzz", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  EXPECT_EQ(j.at("text"), ", there was a little girl named ");
  EXPECT_EQ(j.at("finish_reason"), "stop");
  EXPECT_EQ(j.at("matched_stop"), "Lily");
}

TEST(CliGenerate, SameSeedSameSampleDifferentSeedDiffers) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const auto run = [&](const std::string& seed) {
    const CliResult r = run_cli({"generate", "-m", stories(), "-p", "Once", "--temp", "1.0",
                                 "--top-k", "0", "--top-p", "1", "--min-p", "0", "-n", "48",
                                 "--ignore-eos", "--seed", seed, "--json"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
    const auto j = parse_cli_json(r);
    EXPECT_EQ(j.value("seed", 0ull), std::stoull(seed));
    return j.value("token_ids", std::vector<int>{});
  };
  const auto a = run("1234");
  EXPECT_EQ(a.size(), 48u);
  EXPECT_EQ(a, run("1234"));
  EXPECT_NE(a, run("99"));  // 48 tokens at temperature 1: a collision is practically impossible
}

TEST(CliGenerate, ZeroTokensFinishesWithLength) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"generate", "-m", stories(), "-p", "Once", "-n", "0", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  EXPECT_TRUE(j.at("token_ids").empty());
  EXPECT_EQ(j.at("finish_reason"), "length");
}

TEST(CliGenerate, ContextLimitEndsWithLength) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  // -n -1 = until EOS or the context is full; with EOS ignored the 32-token context decides.
  const CliResult r = run_cli({"generate", "-m", stories(), "-p", "Once upon a time", "-c", "32",
                               "-n", "-1", "--temp", "0", "--ignore-eos", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  EXPECT_EQ(j.at("finish_reason"), "length");
  EXPECT_EQ(j.at("prompt_token_ids").size() + j.at("token_ids").size(), 32u);
}

TEST(CliGenerate, PromptFromFile) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const auto prompt_file = scratch_dir() / "prompt.txt";
  write_file(prompt_file, "Once upon a time");
  const CliResult r = run_cli({"generate", "-m", stories(), "-f", prompt_file.string(), "--temp",
                               "0", "-n", "4", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // llama.cpp ids of "Once upon a time" with BOS
  EXPECT_EQ(parse_cli_json(r).at("prompt_token_ids"), nlohmann::json::array({1, 403, 407, 261, 378}));
}

}  // namespace
}  // namespace fdl::test
