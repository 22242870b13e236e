// `flashdllm info` on the shared models: the numbers must be the ones the README states.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <span>

#include "cli_test_support.h"
#include "flashdllm/gguf.h"

namespace fdl::test {
namespace {

TEST(CliInfo, Stories260KJsonHasTheDocumentedShape) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"info", "-m", model.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("architecture"), "llama");
  EXPECT_EQ(j.at("n_vocab"), 512);
  EXPECT_EQ(j.at("n_embd"), 64);
  EXPECT_EQ(j.at("n_layer"), 5);
  EXPECT_EQ(j.at("n_head"), 8);
  EXPECT_EQ(j.at("n_head_kv"), 4);
  EXPECT_EQ(j.at("head_dim"), 8);
  EXPECT_EQ(j.at("n_ff"), 172);
  EXPECT_EQ(j.at("n_ctx_train"), 2048);
  EXPECT_EQ(j.at("file_size").get<uint64_t>(), std::filesystem::file_size(model));
  EXPECT_EQ(j.at("tokenizer").at("model"), "llama");
  EXPECT_EQ(j.at("tokenizer").at("n_vocab"), 512);
  // All F32: the per-type counts add up to the tensor count and hold only F32.
  EXPECT_EQ(j.at("tensor_types").size(), 1u);
  EXPECT_EQ(j.at("tensor_types").at("F32"), j.at("n_tensors"));
  // 260K is the model's nickname; the exact count from its shape is in that range.
  EXPECT_GT(j.at("n_params").get<uint64_t>(), 200'000u);
  EXPECT_LT(j.at("n_params").get<uint64_t>(), 320'000u);
}

TEST(CliInfo, CodeLmReportsF16MatricesGpt2TokenizerAndTiedOutput) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("codelm-16m-f16.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"info", "-m", model.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("n_embd"), 384);
  EXPECT_EQ(j.at("n_layer"), 8);
  EXPECT_EQ(j.at("n_head"), 6);
  EXPECT_EQ(j.at("n_head_kv"), 2);
  EXPECT_EQ(j.at("head_dim"), 64);
  EXPECT_EQ(j.at("n_ff"), 1024);
  EXPECT_EQ(j.at("tied_output"), true);
  EXPECT_EQ(j.at("tokenizer").at("model"), "gpt2");
  EXPECT_EQ(j.at("tokenizer").at("n_vocab"), 8192);
  EXPECT_TRUE(j.at("tensor_types").contains("F16"));
  EXPECT_TRUE(j.at("tensor_types").contains("F32"));
  EXPECT_NEAR(j.at("n_params").get<double>() / 1e6, 15.7, 0.3);
}

TEST(CliInfo, PlainModeNamesTheDimensions) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"info", "-m", model.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"llama", "layers", "heads", "parameters", "tokenizer", "F32"}) {
    EXPECT_NE(r.out.find(word), std::string::npos) << "missing '" << word << "' in\n" << r.out;
  }
}

TEST(CliInfo, ModelComesFromTheEnvironmentWhenNoFlagIsGiven) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("codelm-16m-f16.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"info", "--json"}, {"FLASHDLLM_MODEL=" + model.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(parse_cli_json(r).value("n_embd", 0), 384);
}

// A file whose tensors include a type no backend computes with (an IQ quant) is described,
// with "supported: no" and the loader's reason, not "yes".
TEST(CliInfo, UnsupportedTensorTypesMakeTheFileUnsupported) {
  FDL_REQUIRE_CLI();
  const auto path = scratch_dir() / "iq4.gguf";
  GgufWriter w;
  w.set_string("general.architecture", "llama");
  auto zeros = [](std::span<uint8_t> b) { std::fill(b.begin(), b.end(), uint8_t{0}); };
  w.add_tensor("blk.0.attn_q.weight", GgmlType::IQ4_NL, {64, 4}, zeros);
  w.add_tensor("blk.0.attn_k.weight", GgmlType::IQ4_NL, {64, 4}, zeros);
  w.add_tensor("blk.0.attn_norm.weight", GgmlType::F32, {64}, zeros);
  w.write(path);
  const CliResult r = run_cli({"info", "-m", path.string(), "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  EXPECT_EQ(j.at("supported"), false);
  EXPECT_NE(j.at("unsupported_reason").get<std::string>().find(
                "tensor 'blk.0.attn_q.weight' has unsupported type IQ4_NL (and 1 more tensors); supported weight types:"),
            std::string::npos)
      << j.at("unsupported_reason");
  EXPECT_EQ(j.at("tensor_types").at("IQ4_NL"), 2);
}

}  // namespace
}  // namespace fdl::test
