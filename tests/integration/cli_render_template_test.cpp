// `flashdllm render-template`: a real template over a JSON request, and the refusals (a template
// that raises, a request that is not JSON) as one-line errors with exit status 1.
#include <gtest/gtest.h>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

TEST(CliRenderTemplate, RendersARealTemplateAndRefusesWhatItRaises) {
  FDL_REQUIRE_CLI();
  const auto tmpl = shared_dir() / "chat-templates" / "templates" / "google-gemma-2-2b-it.jinja";
  FDL_REQUIRE_FILE(tmpl);
  const auto request = scratch_dir() / "render-request.json";
  write_file(request, R"({"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": true,
                          "bos_token": "<bos>"})");
  const CliResult ok = run_cli({"render-template", "-t", tmpl.string(), "--request", request.string()});
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.out, "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n");

  write_file(request, R"({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "Hi"}]})");
  const CliResult raised = run_cli({"render-template", "-t", tmpl.string(), "--request", request.string()});
  EXPECT_EQ(raised.exit_code, 1);
  EXPECT_NE(raised.err.find("System role not supported"), std::string::npos) << raised.err;
  EXPECT_EQ(count_lines(raised.err), 1);

  write_file(request, "{not json");
  const CliResult bad = run_cli({"render-template", "-t", tmpl.string(), "--request", request.string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("not JSON"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace fdl::test
