// Every supported family against Hugging Face Transformers (float32, eager attention) on the
// CPU: logits of 8 prompts and 32 greedy ids, from the HF directory and from the GGUF
// llama.cpp's converter made of it (family_fixtures.h), the GGUF also against llama.cpp's own
// CPU run of it; and the families not supported yet
// refused by name instead of run with the wrong math.
#include "model/family_fixtures.h"

namespace fdl::test {
namespace {

class FamilyOnCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyOnCpu, HfDirectoryMatchesTransformers) {
  const std::string& f = GetParam();
  auto m = Model::load(family_dir(f) / "hf", ModelOptions{.n_threads = 2});
  EXPECT_EQ(m->config().arch, gguf_drops_window(f) ? "llama" : f.substr(0, f.find('-')));  // qwen2-yarn: qwen2
  expect_matches_hf(check_family(*m, family_reference(f)), f + " HF directory");
}

TEST_P(FamilyOnCpu, ConvertedGgufMatchesTransformers) {
  const std::string& f = GetParam();
  auto m = Model::load(family_dir(f) / "model.gguf", ModelOptions{.n_threads = 2});
  EXPECT_EQ(m->config().arch, gguf_drops_window(f) ? "llama" : f.substr(0, f.find('-')));  // qwen2-yarn: qwen2
  if (!gguf_drops_window(f)) expect_matches_hf(check_family(*m, family_reference(f)), f + " GGUF");
  expect_matches_hf(check_family(*m, family_reference(f), "llama_cpp"), f + " GGUF vs llama.cpp");
}

// The directory and its converted GGUF hold the same values in the same places: the same
// logits bit for bit (Mistral's GGUF with the window key its converter drops put back).
TEST_P(FamilyOnCpu, HfDirectoryAndGgufGiveIdenticalLogits) {
  const std::string& f = GetParam();
  std::filesystem::path gguf = family_dir(f) / "model.gguf";
  if (gguf_drops_window(f)) {
    const int window = nlohmann::json::parse(std::ifstream(family_dir(f) / "hf" / "config.json")).at("sliding_window");
    copy_gguf_with_keys(gguf, scratch_dir() / (f + "-window.gguf"), {{"llama.attention.sliding_window", window}});
    gguf = scratch_dir() / (f + "-window.gguf");
  }
  auto a = Model::load(family_dir(f) / "hf", ModelOptions{.n_threads = 1});
  auto b = Model::load(gguf, ModelOptions{.n_threads = 1});
  EXPECT_EQ(a->config().sliding_window, b->config().sliding_window);
  const auto prompt = family_reference(f).at("prompts")[7].get<std::vector<int32_t>>();
  auto pa = make_pool(*a, prompt.size() + 9), pb = make_pool(*b, prompt.size() + 9);
  KvCache ka(*pa), kb(*pb);
  std::vector<std::vector<float>> la, lb;
  EXPECT_EQ(greedy_decode(*a, ka, prompt, 8, false, &la), greedy_decode(*b, kb, prompt, 8, false, &lb));
  EXPECT_EQ(la, lb);
}

INSTANTIATE_TEST_SUITE_P(Families, FamilyOnCpu, ::testing::ValuesIn(supported_families()),
                         [](const auto& info) { return test_name(info.param); });

// config.json's sliding_window: Qwen's configs apply it only with use_sliding_window = true (false
// by default), to the layers layer_types names; Phi-3's always apply it (the switch is not theirs).
TEST(FamilyConfig, SlidingWindowSwitchIsQwensOnly) {
  namespace fs = std::filesystem;
  const auto with_window = [](const std::string& family, const nlohmann::json& keys) {
    const fs::path dir = scratch_dir() / ("window-" + family);
    fs::remove_all(dir);
    fs::copy(family_dir(family) / "hf", dir, fs::copy_options::recursive);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    for (auto it = keys.begin(); it != keys.end(); ++it)
      if (it.value().is_null()) config.erase(it.key());  // null: the key removed
      else config[it.key()] = it.value();
    std::ofstream(dir / "config.json") << config.dump();
    return dir;
  };
  const auto window_of = [](const fs::path& dir) {
    return Model::load(dir, ModelOptions{.n_threads = 1})->config().sliding_window;
  };
  EXPECT_EQ(window_of(with_window("qwen2", {{"sliding_window", 8}})), 0);
  EXPECT_EQ(window_of(with_window("qwen3", {{"sliding_window", 8}, {"use_sliding_window", false}})), 0);
  EXPECT_EQ(window_of(with_window("phi3", {{"sliding_window", 8}, {"use_sliding_window", false}})), 8);
  EXPECT_EQ(window_of(with_window("phi3", {{"sliding_window", 256}})), 0);  // the whole context: no window
  // Qwen2 with the switch on: the layers layer_types marks slide, the others do not.
  const auto qwen = Model::load(with_window("qwen2", {{"sliding_window", 8},
                                                       {"use_sliding_window", true},
                                                       {"layer_types", {"full_attention", "sliding_attention"}}}),
                                ModelOptions{.n_threads = 1});
  EXPECT_EQ(qwen->config().attention_window(0), 0);
  EXPECT_EQ(qwen->config().attention_window(1), 8);
  for (const auto& [keys, says] :
       {std::pair{nlohmann::json{{"sliding_window", 8}, {"use_sliding_window", true}, {"layer_types", nullptr}},
                  std::string("layer_types")},
        std::pair{nlohmann::json{{"sliding_window", 8}, {"use_sliding_window", true},
                                 {"layer_types", {"full_attention", "chunked_attention"}}},
                  std::string("\"chunked_attention\" is not supported")},
        std::pair{nlohmann::json{{"sliding_window", 8}, {"use_sliding_window", true}, {"layer_types", {"full_attention"}}},
                  std::string("array of 2 strings")}}) {
    try {
      const fs::path dir = with_window("qwen2", keys);
      Model::load(dir, ModelOptions{.n_threads = 1});
      ADD_FAILURE() << keys.dump() << " loaded";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// Families whose plan is not built: loading says what is missing, from either format.
struct Refusal {
  std::string family, hf_says, gguf_says;
};

class FamilyRefused : public ::testing::TestWithParam<Refusal> {};

TEST_P(FamilyRefused, ByNameFromBothFormats) {
  const Refusal& r = GetParam();
  for (const auto& [path, says] : {std::pair{family_dir(r.family) / "hf", r.hf_says},
                                   std::pair{family_dir(r.family) / "model.gguf", r.gguf_says}}) {
    if (says.empty()) continue;
    try {
      Model::load(path, ModelOptions{.n_threads = 1});
      ADD_FAILURE() << path << " loaded";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(says), std::string::npos) << path << ": " << what;
      EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Families, FamilyRefused,
    ::testing::Values(Refusal{"gemma2", "unsupported model_type 'gemma2'", "unsupported architecture 'gemma2'"},
                      Refusal{"gemma3", "unsupported model_type 'gemma3", "unsupported architecture 'gemma3'"},
                      Refusal{"mixtral", "unsupported model_type 'mixtral'", "expert"}),
    [](const auto& info) { return info.param.family; });

}  // namespace
}  // namespace fdl::test
