// `flashdllm bench --json`: the statistics are present, consistent and positive.
#include <gtest/gtest.h>

#include <string>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

TEST(CliBench, JsonReportsPrefillDecodeAndLatencyStatistics) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r =
      run_cli({"bench", "-m", model.string(), "-p", "32", "-n", "16", "-r", "3", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  ASSERT_TRUE(j.is_object());
  EXPECT_EQ(j.at("n_prompt"), 32);
  EXPECT_EQ(j.at("n_gen"), 16);
  EXPECT_EQ(j.at("repetitions"), 3);
  EXPECT_EQ(j.at("pp_tok_s_samples").size(), 3u);
  EXPECT_EQ(j.at("tg_tok_s_samples").size(), 3u);
  for (const char* key : {"pp_tok_s", "tg_tok_s", "ttft_ms", "itl_ms"}) {
    const auto& s = j.at(key);
    SCOPED_TRACE(key);
    EXPECT_GT(s.at("mean").get<double>(), 0.0);
    EXPECT_GE(s.at("stddev").get<double>(), 0.0);
    EXPECT_LE(s.at("min").get<double>(), s.at("median").get<double>());
    EXPECT_LE(s.at("median").get<double>(), s.at("p95").get<double>());
    EXPECT_LE(s.at("p95").get<double>(), s.at("max").get<double>());
  }
  // The prompt is seeded: ids are in the vocab and the same on every run.
  const auto ids = j.at("prompt_token_ids").get<std::vector<int>>();
  ASSERT_EQ(ids.size(), 32u);
  for (const int id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 512);
  }
  const CliResult again =
      run_cli({"bench", "-m", model.string(), "-p", "32", "-n", "1", "-r", "1", "--json"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(parse_cli_json(again).at("prompt_token_ids").get<std::vector<int>>(), ids);
}

TEST(CliBench, PlainModePrintsALlamaBenchStyleTable) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"bench", "-m", model.string(), "-p", "16", "-n", "8", "-r", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pp16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tg8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("TTFT"), std::string::npos) << r.out;
}

TEST(CliBench, PromptPlusGenerationBeyondTheModelContextIsRejected) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("codelm-16m-f16.gguf");  // context 1024
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"bench", "-m", model.string(), "-p", "1000", "-n", "100"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fdl::test
