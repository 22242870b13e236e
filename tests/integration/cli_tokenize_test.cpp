// `flashdllm tokenize --json` against llama.cpp's ids for the same strings.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cli_test_support.h"

namespace fdl::test {
namespace {

std::vector<int> tokenize_via_cli(const std::string& model, const std::string& text,
                                  bool with_bos, bool parse_special) {
  std::vector<std::string> args = {"tokenize", "-m", model, "--json"};
  if (text.find('\0') != std::string::npos) {
    // argv cannot carry a NUL byte; the file form passes the exact bytes.
    const auto path = scratch_dir() / "tokenize-input.bin";
    write_file(path, text);
    args.insert(args.end(), {"--file", path.string()});
  } else {
    args.insert(args.end(), {"--text", text});
  }
  if (!with_bos) args.push_back("--no-bos");
  if (parse_special) args.push_back("--parse-special");
  const CliResult r = run_cli(args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  const auto j = parse_cli_json(r);
  return j.is_object() ? j.at("ids").get<std::vector<int>>() : std::vector<int>{};
}

TEST(CliTokenize, Stories260KMatchesLlamaCppForEveryReferenceString) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  const auto ref_path = reference_path("stories260K_tokenizer.json");
  FDL_REQUIRE_FILE(model);
  FDL_REQUIRE_FILE(ref_path);
  const auto ref = read_json_file(ref_path);
  ASSERT_GT(ref.at("cases").size(), 50u);
  for (const auto& c : ref.at("cases")) {
    const std::string text = c.at("text");
    SCOPED_TRACE("text: \"" + text + "\"");
    EXPECT_EQ(tokenize_via_cli(model, text, true, false), c.at("ids_with_bos").get<std::vector<int>>());
    EXPECT_EQ(tokenize_via_cli(model, text, false, false), c.at("ids_without_bos").get<std::vector<int>>());
    // parse_special only changes the strings that spell special tokens; check those.
    if (text.find('<') != std::string::npos) {
      EXPECT_EQ(tokenize_via_cli(model, text, true, true),
                c.at("ids_with_bos_parse_special").get<std::vector<int>>());
    }
  }
}

TEST(CliTokenize, CodeLmMatchesLlamaCppIncludingNulByte) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("codelm-16m-f16.gguf");
  const auto ref_path = reference_path("codelm_tokenizer.json");
  FDL_REQUIRE_FILE(model);
  FDL_REQUIRE_FILE(ref_path);
  const auto ref = read_json_file(ref_path);
  int checked = 0;
  for (const auto& c : ref.at("cases")) {
    const std::string text = c.at("text");
    SCOPED_TRACE("text: \"" + text + "\"");
    // codelm's metadata says add_bos=false, so the default (with BOS) gives the plain ids.
    EXPECT_EQ(tokenize_via_cli(model, text, true, false), c.at("ids").get<std::vector<int>>());
    ++checked;
  }
  EXPECT_GT(checked, 60);
}

TEST(CliTokenize, PlainModePrintsOneLinePerTokenWithItsPiece) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"tokenize", "-m", model.string(), "--text", "Once upon a time"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // llama.cpp: [1, 403, 407, 261, 378]
  EXPECT_EQ(count_lines(r.out), 5) << r.out;
  EXPECT_NE(r.out.find("403"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("<s>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("time"), std::string::npos) << r.out;
}

TEST(CliTokenize, WithoutTextOrFileIsAnError) {
  FDL_REQUIRE_CLI();
  const auto model = model_path("stories260K.gguf");
  FDL_REQUIRE_FILE(model);
  const CliResult r = run_cli({"tokenize", "-m", model.string()});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--text"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace fdl::test
