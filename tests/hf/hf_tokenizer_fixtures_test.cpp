// tokenizer.json fixtures (tests/data/tokenizers, scripts/make_tokenizer_fixtures.py) read as
// GGUF metadata: the metadata equals what llama.cpp's converter writes (vocab.gguf), the ids
// equal llama.cpp's on it for every text, and equal Hugging Face `tokenizers`' wherever the two
// agree; where they do not, the known cases are pinned. Then Llama 2's 32k vocabulary
// (ggml-vocab-llama-spm.gguf) as the tokenizer.json transformers would write for it must give
// llama.cpp's ids on llama.cpp's own test strings.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "hf/hf_checkpoint.h"
#include "hf/tokenizer_json_support.h"

namespace fdl::test {
namespace {

using nlohmann::json;

struct Fixture {
  std::string name;
  size_t hf_differences;  ///< texts where `tokenizers` and llama.cpp disagree (see expected.json's note)
};

void PrintTo(const Fixture& f, std::ostream* os) { *os << f.name; }

class TokenizerJsonFixture : public ::testing::TestWithParam<Fixture> {
 protected:
  void SetUp() override {
    const auto dir = tokenizer_fixture_dir(GetParam().name);
    expected_ = read_json_file(dir / "expected.json");
    converted_ = std::make_unique<GgufFile>(convert_tokenizer_json(read_json_file(dir / "tokenizer.json"),
                                                                   read_json_file(dir / "tokenizer_config.json"),
                                                                   expected_["n_vocab"].get<int>(), dir / "tokenizer.json"));
    reference_ = std::make_unique<GgufFile>(GgufFile::open(dir / "vocab.gguf"));
    tokenizer_ = Tokenizer::from_gguf(*converted_);
  }
  json expected_;
  std::unique_ptr<GgufFile> converted_, reference_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(TokenizerJsonFixture, MetadataEqualsLlamaCppConversion) {
  const GgufFile& hf = *converted_;
  const GgufFile& gg = *reference_;
  for (const char* key : {"tokenizer.ggml.model", "tokenizer.ggml.pre"}) EXPECT_EQ(hf.get_string(key), gg.get_string(key)) << key;
  EXPECT_EQ(hf.array_strings("tokenizer.ggml.tokens"), gg.array_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(hf.array_int("tokenizer.ggml.token_type"), gg.array_int("tokenizer.ggml.token_type"));
  for (const char* key : {"tokenizer.ggml.scores", "tokenizer.ggml.merges", "tokenizer.ggml.unknown_token_id",
                          "tokenizer.ggml.add_space_prefix"})
    EXPECT_EQ(hf.find(key) != nullptr, gg.find(key) != nullptr) << key;
  if (gg.find("tokenizer.ggml.scores")) {
    EXPECT_EQ(hf.array_f32("tokenizer.ggml.scores"), gg.array_f32("tokenizer.ggml.scores"));
  }
  if (gg.find("tokenizer.ggml.merges")) {
    EXPECT_EQ(hf.array_strings("tokenizer.ggml.merges"), gg.array_strings("tokenizer.ggml.merges"));
  }
  if (gg.find("tokenizer.ggml.unknown_token_id")) {
    EXPECT_EQ(hf.get_uint("tokenizer.ggml.unknown_token_id"), gg.get_uint("tokenizer.ggml.unknown_token_id"));
  }
  if (gg.find("tokenizer.ggml.add_space_prefix")) {
    EXPECT_EQ(hf.get_bool_or("tokenizer.ggml.add_space_prefix", false), gg.get_bool_or("tokenizer.ggml.add_space_prefix", true));
  }
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) EXPECT_EQ(hf.get_uint(key), gg.get_uint(key)) << key;
  EXPECT_EQ(hf.get_bool_or("tokenizer.ggml.add_bos_token", false), gg.get_bool_or("tokenizer.ggml.add_bos_token", false));
}

TEST_P(TokenizerJsonFixture, IdsEqualLlamaCppOnEveryText) {
  for (const json& c : expected_["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tokenizer_->encode(text, false, false), c["llama_cpp"].get<std::vector<int32_t>>()) << json(text).dump();
    EXPECT_EQ(tokenizer_->encode(text, false, true), c["llama_cpp_parse_special"].get<std::vector<int32_t>>())
        << json(text).dump();
  }
}

TEST_P(TokenizerJsonFixture, IdsEqualHuggingFaceWhereItAgreesWithLlamaCpp) {
  size_t differences = 0;
  for (const json& c : expected_["cases"]) {
    if (!c["hf_equal"].get<bool>()) {
      ++differences;
      continue;
    }
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tokenizer_->encode(text, false, true), c["hf"].get<std::vector<int32_t>>()) << json(text).dump();
    // BOS from add_bos_token, as HF's post-processor adds it.
    EXPECT_EQ(tokenizer_->encode(text, true, true), c["hf_with_special"].get<std::vector<int32_t>>()) << json(text).dump();
  }
  EXPECT_EQ(differences, GetParam().hf_differences) << expected_["note"].get<std::string>();
}

INSTANTIATE_TEST_SUITE_P(TokenizerJson, TokenizerJsonFixture,
                         ::testing::Values(Fixture{"spm-legacy", 2}, Fixture{"spm-metaspace", 7}, Fixture{"spm-gemma", 0},
                                           Fixture{"tekken", 2}),
                         [](const auto& info) {
                           std::string n = info.param.name;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(TokenizerJsonDirectory, ASentencePieceTokenizerLoadsWithItsModel) {
  // codelm-16m-hf's config and weights with the spm-legacy tokenizer: the ids past its 515
  // tokens, up to the model's 8192, are padding.
  namespace fs = std::filesystem;
  const fs::path dir = scratch_dir() / "hf-spm-directory";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(model_path("codelm-16m-hf") / "config.json", dir / "config.json");
  fs::create_symlink(fs::absolute(model_path("codelm-16m-hf") / "model.safetensors"), dir / "model.safetensors");
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(tokenizer_fixture_dir("spm-legacy") / f, dir / f);
  const GgufFile f = hf::open_hf_directory(dir);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f.array_strings("tokenizer.ggml.tokens").size(), 8192u);
  const auto tok = Tokenizer::from_gguf(f);
  // Named: a range-for over a member of a temporary would walk the freed temporary.
  const json expected = read_json_file(tokenizer_fixture_dir("spm-legacy") / "expected.json");
  for (const json& c : expected["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok->encode(text, false, true), c["llama_cpp_parse_special"].get<std::vector<int32_t>>()) << json(text).dump();
  }
  fs::remove_all(dir);
}

// --- Llama 2's vocabulary, as the tokenizer.json transformers' LlamaConverter writes ---

/// Characters (code points) in UTF-8 text.
size_t char_count(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

/// Every split of a piece into two pieces is a merge; merges are ordered by the piece's score
/// (the three special pieces count 0), then longer left part, then longer right part, ties
/// kept in piece order and, within a piece, by the parts' ids (transformers' generate_merges).
json llama2_tokenizer_json(const GgufFile& f) {
  const std::vector<std::string_view> pieces = f.array_strings("tokenizer.ggml.tokens");
  const std::vector<float> scores = f.array_f32("tokenizer.ggml.scores");
  std::map<std::string_view, int32_t> ids;
  for (size_t i = 0; i < pieces.size(); ++i) ids.emplace(pieces[i], int32_t(i));
  struct Merge {
    float score;
    size_t left_chars, right_chars;
    int32_t left, right;
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < pieces.size(); ++id) {
    const std::string piece(pieces[id]);
    std::vector<Merge> local;
    for (size_t cut = 1; cut < piece.size(); ++cut) {
      if ((static_cast<unsigned char>(piece[cut]) & 0xC0) == 0x80) continue;  // inside a character
      const auto l = ids.find(std::string_view(piece).substr(0, cut)), r = ids.find(std::string_view(piece).substr(cut));
      if (l == ids.end() || r == ids.end()) continue;
      local.push_back({id < 3 ? 0.f : scores[id], char_count(piece.substr(0, cut)), char_count(piece.substr(cut)),
                       l->second, r->second});
    }
    std::sort(local.begin(), local.end(),
              [](const Merge& a, const Merge& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::tuple(a.score, a.left_chars, a.right_chars) > std::tuple(b.score, b.left_chars, b.right_chars);
  });
  json vocab = json::object(), merge_list = json::array();
  for (size_t i = 0; i < pieces.size(); ++i) vocab[std::string(pieces[i])] = i;
  for (const Merge& m : merges) merge_list.push_back({std::string(pieces[size_t(m.left)]), std::string(pieces[size_t(m.right)])});
  json added = json::array();
  for (int i = 0; i < 3; ++i) added.push_back({{"id", i}, {"content", std::string(pieces[size_t(i)])}, {"special", true}});
  return {
      {"model",
       {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}, {"byte_fallback", true}, {"fuse_unk", true},
        {"unk_token", "<unk>"}, {"dropout", nullptr}, {"ignore_merges", false}}},
      {"added_tokens", added},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}}},
      {"pre_tokenizer", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
  };
}

TEST(TokenizerJsonLlama2, ThirtyTwoThousandPiecesGiveLlamaCppIdsOnItsOwnTestStrings) {
  const auto base = shared_dir() / "llama-cpp-vocab-fixtures" / "ggml-vocab-llama-spm.gguf";
  const GgufFile gg = GgufFile::open(base);
  const json tj = llama2_tokenizer_json(gg);
  ASSERT_EQ(tj["model"]["merges"].size(), 61249u);  // what transformers derives for this vocabulary
  const json config = {{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}, {"add_bos_token", true}};
  const GgufFile hf = convert_tokenizer_json(tj, config, int(gg.array_strings("tokenizer.ggml.tokens").size()));
  EXPECT_EQ(hf.array_strings("tokenizer.ggml.tokens"), gg.array_strings("tokenizer.ggml.tokens"));
  const auto tok = Tokenizer::from_gguf(hf);

  std::ifstream inp_file(base.string() + ".inp", std::ios::binary), out_file(base.string() + ".out");
  std::stringstream inp_text;
  inp_text << inp_file.rdbuf();
  const std::string inp = inp_text.str(), sep = "\n__ggml_vocab_test__\n";
  size_t cases = 0;
  std::string line;
  for (size_t pos = 0, next; (next = inp.find(sep, pos)) != std::string::npos; pos = next + sep.size()) {
    ASSERT_TRUE(std::getline(out_file, line));
    std::vector<int32_t> want;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) want.push_back(id);
    const std::string text = inp.substr(pos, next - pos);
    EXPECT_EQ(tok->encode(text, false, false), want) << json(text).dump();
    ++cases;
  }
  EXPECT_EQ(cases, 46u);
}

}  // namespace
}  // namespace fdl::test
