// Messages that name the flag or file at fault (--seed, --ctx-size, -f, --vocab-from), `info`
// on GGUFs flashdllm cannot generate with, tokenize's escaping of partial UTF-8, and the
// bench JSON keys for -n 0.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

std::filesystem::path stories() { return model_path("stories260K.gguf"); }
std::filesystem::path vocab_fixture(const std::string& name) {
  return shared_dir() / "llama-cpp-vocab-fixtures" / name;
}

void expect_error(const CliResult& r, const std::string& text) {
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 1) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("flashdllm: error: " + text), std::string::npos)
      << "expected '" << text << "' in: " << r.err;
}

/// True when `s` is well-formed UTF-8 (no stray, truncated, overlong or surrogate bytes).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t len = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3
               : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

TEST(CliValidation, SeedMinusOneIsRandomOtherBadSeedsNameTheFlag) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  const CliResult random = run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "-s", "-1"});
  EXPECT_EQ(random.exit_code, 0) << random.err;
  EXPECT_EQ(random.err.find("seed 18446744073709551615"), std::string::npos) << random.err;
  expect_error(run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "-s", "-2"}), "--seed -2:");
  expect_error(run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "-s", "99999999999999999999"}),
               "--seed 99999999999999999999: out of range");
  expect_error(run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "--seed", "12abc"}),
               "--seed 12abc:");
  const CliResult max = run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "-s",
                                 "18446744073709551615", "--json"});
  ASSERT_EQ(max.exit_code, 0) << max.err;
  EXPECT_EQ(parse_cli_json(max).at("seed").get<uint64_t>(), 18446744073709551615ull);
  expect_error(run_cli({"bench", "-m", m, "-p", "2", "-n", "1", "-r", "1", "--seed", "-1"}),
               "--seed -1:");
}

TEST(CliValidation, ContextAndPromptFileErrorsNameTheFlag) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  expect_error(run_cli({"generate", "-m", m, "-p", "Once", "-c", "1"}),
               "--ctx-size 1: must be at least 2");
  expect_error(run_cli({"generate", "-m", m, "-p", "Once", "-c", "100000"}),
               "--ctx-size 100000: exceeds the model's context of 2048 tokens");
  const auto long_prompt = scratch_dir() / "validation-long-prompt.txt";
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "hello ";
  write_file(long_prompt, text);
  const CliResult r = run_cli({"generate", "-m", m, "-f", long_prompt.string(), "-n", "1"});
  expect_error(r, "prompt has ");
  EXPECT_NE(r.err.find(" tokens but --ctx-size is 2048"), std::string::npos) << r.err;
  const std::string dir = scratch_dir().string();
  expect_error(run_cli({"generate", "-m", m, "-f", dir, "-n", "1"}), "-f " + dir + ": is a directory");
  expect_error(run_cli({"tokenize", "-m", m, "-f", dir}), "-f " + dir + ": is a directory");
  const std::string missing = (scratch_dir() / "no-such-prompt.txt").string();
  expect_error(run_cli({"generate", "-m", m, "-f", missing}), "-f " + missing + ": cannot open");
}

// Tier-0 sizes and placements that cannot work are reported in the flags' own terms (the
// pool's internal name, a "fraction" for 0, or a silent fallback to recompute were reported).
TEST(CliValidation, KvTierFlagErrorsNameTheFlag) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  const std::vector<std::string> base = {"generate", "-m", m, "-p", "Once", "-n", "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return run_cli(a);
  };
  expect_error(with({"--kv-tier0-bytes", "0"}), "--kv-tier0-bytes must be a positive size");
  expect_error(with({"--kv-tier0-bytes", "0.5"}), "--kv-tier0-bytes takes a size in bytes");
  expect_error(with({"--kv-tier0-bytes", "-5"}), "--kv-tier0-bytes takes a size in bytes (e.g. 64MiB, 2GiB), got '-5'");
  expect_error(with({"--kv-tier0-bytes", "lots"}), "--kv-tier0-bytes takes a size in bytes (e.g. 64MiB, 2GiB), got 'lots'");
  // stories260K: 20480-byte blocks of 16 tokens; the default context (2048) needs 128.
  expect_error(with({"--kv-tier0-bytes", "100KiB"}),
               "--kv-tier0-bytes 100KiB holds 5 KV blocks; one full context (the default context of 2048 tokens) "
               "needs 128 blocks of 16 tokens = 2.5 MiB");
  expect_error(with({"--kv-tier0-bytes", "100KiB", "-c", "96"}),
               "--kv-tier0-bytes 100KiB holds 5 KV blocks; one full context (--ctx-size 96) needs 6 blocks");
  EXPECT_EQ(with({"--kv-tier0-bytes", "100KiB", "-c", "80"}).exit_code, 0);  // 5 blocks = 80 tokens
  // A placement whose tier is absent or sized 0 would silently run as recompute.
  const std::string dir = scratch_dir().string();
  expect_error(with({"--kv-placement", "disk"}), "--kv-placement disk needs KV tier 2");
  expect_error(with({"--kv-placement", "disk", "--kv-host-bytes", "1MiB"}), "--kv-placement disk needs KV tier 2");
  expect_error(with({"--kv-placement", "host"}), "--kv-placement host needs KV tier 1");
  expect_error(with({"--kv-placement", "host", "--kv-host-bytes", "0"}), "--kv-placement host needs KV tier 1");
  expect_error(with({"--kv-placement", "host", "--kv-disk-path", dir, "--kv-disk-bytes", "4MiB"}),
               "--kv-placement host needs KV tier 1");
  EXPECT_EQ(with({"--kv-placement", "host", "--kv-host-bytes", "1MiB"}).exit_code, 0);
  EXPECT_EQ(with({"--kv-placement", "disk", "--kv-disk-path", dir, "--kv-disk-bytes", "4MiB"}).exit_code, 0);
  // The same checks in the other commands that take the flags.
  expect_error(run_cli({"multiturn", "-m", m, "--kv-tier0-bytes", "100KiB"}), "--kv-tier0-bytes 100KiB holds 5 KV blocks");
  expect_error(run_cli({"serve", "-m", m, "--host", "127.0.0.1", "--port", "0", "--kv-placement", "host"}),
               "--kv-placement host needs KV tier 1");
}

// Flags with a fixed set of choices are command-line syntax: exit status 2, like --device.
TEST(CliValidation, ChoiceFlagsExitTwoAndNameTheFlag) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--device", "tpu"}, {"--spec", "fast"}, {"--spec-tree", "maybe"}, {"--kv-placement", "ram"},
           {"--kv-cache-dtype", "q8"}, {"--batch-invariant", "yes"}}) {
    const CliResult r = run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", flag, value});
    EXPECT_EQ(r.exit_code, 2) << flag << "\n" << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find("flashdllm: error: " + flag + ": " + value + " not in {"), std::string::npos) << r.err;
  }
}

// A 16-bit KV cache is a --device cuda choice: on the CPU it is a one-line error (exit 1),
// and f32 / auto run.
TEST(CliValidation, KvCacheDtypeOnTheCpu) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  const CliResult r = run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "--kv-cache-dtype", "f16"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--kv-cache-dtype f16: the CPU backend keeps an f32 KV cache"), std::string::npos) << r.err;
  for (const char* t : {"f32", "auto"})
    EXPECT_EQ(run_cli({"generate", "-m", m, "-p", "Once", "-n", "2", "--kv-cache-dtype", t}).exit_code, 0) << t;
}

// The CPU is batch-invariant either way: --batch-invariant off changes nothing there.
TEST(CliValidation, BatchInvariantOffOnTheCpuGivesTheSameText) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  const CliResult on = run_cli({"generate", "-m", m, "-p", "Once", "-n", "8", "--temp", "0", "--batch-invariant", "on"});
  const CliResult off = run_cli({"generate", "-m", m, "-p", "Once", "-n", "8", "--temp", "0", "--batch-invariant", "off"});
  ASSERT_EQ(on.exit_code, 0) << on.err;
  ASSERT_EQ(off.exit_code, 0) << off.err;
  EXPECT_EQ(on.out, off.out);
}

// tools check-invariance: every schedule gives every sequence its tokens alone (the CPU is
// batch-invariant), the cached schedule really starts from the prefix cache, and bad sizes
// name their flag.
TEST(CliValidation, CheckInvarianceAgreesOnTheCpu) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const std::string m = stories().string();
  for (const char* decoding : {"greedy", "--sampling"}) {
    std::vector<std::string> args{"tools", "check-invariance", "-m", m, "--prompts", "6", "--min-len", "3",
                                  "--max-len", "90", "-n", "12", "--wave", "2", "--small-chunk", "5",
                                  "--mid-chunk", "32", "--json"};
    if (std::string(decoding) == "--sampling") args.emplace_back("--sampling");
    const CliResult r = run_cli(args);
    ASSERT_EQ(r.exit_code, 0) << decoding << ": " << r.err;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["differing"], 0);
    ASSERT_EQ(j["schedules"].size(), 7u);
    for (const auto& s : j["schedules"]) {
      if (s.contains("reference")) continue;
      EXPECT_EQ(s["identical"], 6) << decoding << " " << s["name"];
      if (s["name"] == "cached") {
        EXPECT_GT(s["cached_prompt_tokens"].get<int64_t>(), 0);
      }
    }
  }
  expect_error(run_cli({"tools", "check-invariance", "-m", m, "--min-len", "10", "--max-len", "3"}), "--max-len");
  // A --max-len the model's context cannot hold beside -n is refused; the default one is cut to
  // fit (codelm-16m: 1024 tokens of context, against the default 1500 + 128).
  const auto codelm = model_path("codelm-16m-f16.gguf");
  FDL_REQUIRE_FILE(codelm);
  expect_error(run_cli({"tools", "check-invariance", "-m", codelm.string(), "--prompts", "1", "--max-len", "1000",
                        "-n", "64"}),
               "--max-len + --n-predict need a context of 1064 tokens");
  const CliResult cut = run_cli({"tools", "check-invariance", "-m", codelm.string(), "--prompts", "2", "-n", "2",
                                 "--wave", "1", "--json"});
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  const auto cj = nlohmann::json::parse(cut.out);
  EXPECT_EQ(cj["differing"], 0);
  EXPECT_EQ(cj["prompt_lengths"][1], 1024 - 2) << cut.out;
  expect_error(run_cli({"tools", "check-invariance", "-m", m, "--prompts", "0"}), "--prompts");
}

TEST(CliValidation, TokenizeEscapesPartialUtf8Bytes) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  // stories260K has no piece for these characters: they fall back to byte tokens.
  const CliResult r = run_cli({"tokenize", "-m", stories().string(), "--text", "a\u2713 \U0001F642 \u00e9"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(valid_utf8(r.out)) << r.out;
  EXPECT_NE(r.out.find("'\\xe2'"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("'\\xf0'"), std::string::npos) << r.out;
}

TEST(CliValidation, BenchJsonWithoutDecodeHasNullDecodeStats) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"bench", "-m", stories().string(), "-p", "4", "-n", "0", "-r", "1", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  ASSERT_TRUE(j.contains("tg_tok_s"));
  ASSERT_TRUE(j.contains("itl_ms"));
  EXPECT_TRUE(j.at("tg_tok_s").is_null());
  EXPECT_TRUE(j.at("itl_ms").is_null());
  EXPECT_TRUE(j.at("pp_tok_s").is_object());
}

TEST(CliValidation, InfoDescribesUnsupportedAndVocabOnlyFiles) {
  FDL_REQUIRE_CLI();
  const auto bert = vocab_fixture("ggml-vocab-bert-bge.gguf");
  FDL_REQUIRE_FILE(bert);
  const CliResult plain = run_cli({"info", "-m", bert.string()});
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  EXPECT_NE(plain.out.find("architecture:  bert"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("tensors:       0\n"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("tokenizer:     bert, vocab 30522"), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("supported:     no ("), std::string::npos) << plain.out;
  EXPECT_NE(plain.out.find("'bert'"), std::string::npos) << plain.out;
  const CliResult json = run_cli({"info", "-m", bert.string(), "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  const auto j = parse_cli_json(json);
  EXPECT_EQ(j.at("architecture"), "bert");
  EXPECT_EQ(j.at("n_tensors"), 0);
  EXPECT_EQ(j.at("supported"), false);
  EXPECT_EQ(j.at("tokenizer").at("model"), "bert");
  EXPECT_EQ(j.at("tokenizer").at("n_vocab"), 30522);

  const auto spm = vocab_fixture("ggml-vocab-llama-spm.gguf");
  FDL_REQUIRE_FILE(spm);
  const CliResult vocab_only = run_cli({"info", "-m", spm.string()});
  ASSERT_EQ(vocab_only.exit_code, 0) << vocab_only.err;
  EXPECT_NE(vocab_only.out.find("tensors:       0\n"), std::string::npos) << vocab_only.out;
  EXPECT_NE(vocab_only.out.find("supported:     no (no tensors"), std::string::npos) << vocab_only.out;
}

TEST(CliValidation, InfoSaysSupportedForAUsableModel) {
  FDL_REQUIRE_CLI();
  FDL_REQUIRE_FILE(stories());
  const CliResult r = run_cli({"info", "-m", stories().string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("supported:     yes\n"), std::string::npos) << r.out;
}

TEST(CliValidation, MakeModelRejectsAVocabFlashdllmCannotUse) {
  FDL_REQUIRE_CLI();
  const auto bert = vocab_fixture("ggml-vocab-bert-bge.gguf");
  FDL_REQUIRE_FILE(bert);
  const auto out = scratch_dir() / "validation-bert-vocab.gguf";
  std::filesystem::remove(out);
  const CliResult r = run_cli({"tools", "make-model", "-o", out.string(), "--vocab-from", bert.string()});
  expect_error(r, "--vocab-from " + bert.string() + ": ");
  EXPECT_NE(r.err.find("'bert'"), std::string::npos) << r.err;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(CliValidation, MakeModelRefusesToReplaceAFifo) {
  FDL_REQUIRE_CLI();
  const auto dir = scratch_dir() / "validation-fifo";
  std::filesystem::create_directories(dir);
  const auto fifo = dir / "out.gguf";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const CliResult r = run_cli({"tools", "make-model", "-o", fifo.string()});
  expect_error(r, "refusing to overwrite " + fifo.string() + ": not a regular file");
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
}

}  // namespace
}  // namespace fdl::test
