// `flashdllm tools make-model`: the written file loads, has the requested shape and dtype,
// and the other commands run on it.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

TEST(CliMakeModel, TinyQ8ModelLoadsWithOverriddenShapeAndGenerates) {
  FDL_REQUIRE_CLI();
  const auto out = scratch_dir() / "tiny-q8.gguf";
  const CliResult made = run_cli({"tools", "make-model", "--preset", "tiny", "--dtype", "q8_0",
                                  "--dim", "64", "--n-layers", "2", "--n-heads", "4",
                                  "--n-kv-heads", "2", "--ffn-dim", "128", "--vocab", "300",
                                  "--seed", "5", "-o", out.string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  ASSERT_TRUE(std::filesystem::exists(out));
  EXPECT_NE(made.out.find("wrote"), std::string::npos) << made.out;

  const CliResult info = run_cli({"info", "-m", out.string(), "--json"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = parse_cli_json(info);
  EXPECT_EQ(j.at("n_embd"), 64);
  EXPECT_EQ(j.at("n_layer"), 2);
  EXPECT_EQ(j.at("n_head"), 4);
  EXPECT_EQ(j.at("n_head_kv"), 2);
  EXPECT_EQ(j.at("n_ff"), 128);
  EXPECT_EQ(j.at("n_vocab"), 300);
  EXPECT_TRUE(j.at("tensor_types").contains("Q8_0")) << j.at("tensor_types");

  const CliResult gen = run_cli({"generate", "-m", out.string(), "-p", "hello", "-n", "8",
                                 "--temp", "0", "--ignore-eos", "--json"});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(parse_cli_json(gen).at("token_ids").size(), 8u);
}

// Experts: written, described by info (plain and JSON), and generated from on the CPU.
TEST(CliMakeModel, ExpertsAreShownByInfoAndGenerate) {
  FDL_REQUIRE_CLI();
  const auto out = scratch_dir() / "tiny-experts.gguf";
  const CliResult made = run_cli({"tools", "make-model", "--preset", "tiny", "--dtype", "f16", "--n-experts", "4",
                                  "--n-experts-used", "3", "-o", out.string()});
  ASSERT_EQ(made.exit_code, 0) << made.err;
  EXPECT_NE(made.out.find("x 4 experts (3 per token)"), std::string::npos) << made.out;
  const CliResult info = run_cli({"info", "-m", out.string(), "--json"});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  const auto j = parse_cli_json(info);
  EXPECT_EQ(j.at("n_expert"), 4);
  EXPECT_EQ(j.at("n_expert_used"), 3);
  const CliResult plain = run_cli({"info", "-m", out.string()});
  EXPECT_NE(plain.out.find("128 x 4 experts (3 per token)"), std::string::npos) << plain.out;
  const CliResult gen = run_cli({"generate", "-m", out.string(), "-p", "hello", "-n", "6", "--temp", "0",
                                 "--ignore-eos", "--json"});
  ASSERT_EQ(gen.exit_code, 0) << gen.err;
  EXPECT_EQ(parse_cli_json(gen).at("token_ids").size(), 6u);
}

TEST(CliMakeModel, SameSeedGivesIdenticalBytes) {
  FDL_REQUIRE_CLI();
  const auto a = scratch_dir() / "seed-a.gguf";
  const auto b = scratch_dir() / "seed-b.gguf";
  for (const auto& path : {a, b}) {
    const CliResult r = run_cli({"tools", "make-model", "--preset", "tiny", "--dtype", "f16",
                                 "--n-layers", "1", "--seed", "11", "-o", path.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  std::ifstream fa(a, std::ios::binary), fb(b, std::ios::binary);
  const std::string ba{std::istreambuf_iterator<char>(fa), {}};
  const std::string bb{std::istreambuf_iterator<char>(fb), {}};
  EXPECT_FALSE(ba.empty());
  EXPECT_TRUE(ba == bb);
}

TEST(CliMakeModel, BadOptionsFailWithOneLine) {
  FDL_REQUIRE_CLI();
  const auto out = (scratch_dir() / "bad.gguf").string();
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"tools", "make-model", "--preset", "huge", "-o", out},
           {"tools", "make-model", "--dtype", "q4_k", "-o", out},
           {"tools", "make-model", "--dim", "-64", "-o", out},
           {"tools", "make-model", "--dim", "100", "--n-heads", "3", "-o", out},
           {"tools", "make-model", "--preset", "tiny"},
           {"tools", "make-model", "--n-experts-used", "2", "-o", out},
           {"tools", "make-model", "--n-experts", "4", "--n-experts-used", "5", "-o", out},
           {"tools", "make-model", "--n-experts", "100000", "-o", out},
           {"tools", "make-model", "--arch", "qwen2", "--n-experts", "4", "-o", out}}) {
    const CliResult r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << args[2];
    EXPECT_LT(r.exit_code, 128) << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
}

}  // namespace
}  // namespace fdl::test
