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
  EXPECT_EQ(m->config().arch, f.substr(0, f.find('-')));  // qwen2-yarn: qwen2
  expect_matches_hf(check_family(*m, family_reference(f)), f + " HF directory");
}

TEST_P(FamilyOnCpu, ConvertedGgufMatchesTransformers) {
  const std::string& f = GetParam();
  auto m = Model::load(family_dir(f) / "model.gguf", ModelOptions{.n_threads = 2});
  EXPECT_EQ(m->config().arch, f.substr(0, f.find('-')));  // qwen2-yarn: qwen2
  expect_matches_hf(check_family(*m, family_reference(f)), f + " GGUF");
  expect_matches_hf(check_family(*m, family_reference(f), "llama_cpp"), f + " GGUF vs llama.cpp");
}

// The directory and its converted GGUF hold the same values in the same places: the same
// logits bit for bit.
TEST_P(FamilyOnCpu, HfDirectoryAndGgufGiveIdenticalLogits) {
  const std::string& f = GetParam();
  auto a = Model::load(family_dir(f) / "hf", ModelOptions{.n_threads = 1});
  auto b = Model::load(family_dir(f) / "model.gguf", ModelOptions{.n_threads = 1});
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
// by default); Phi-3's always apply it (the switch is not theirs).
TEST(FamilyConfig, SlidingWindowSwitchIsQwensOnly) {
  namespace fs = std::filesystem;
  const auto with_window = [](const std::string& family, const nlohmann::json& keys) {
    const fs::path dir = scratch_dir() / ("window-" + family);
    fs::remove_all(dir);
    fs::copy(family_dir(family) / "hf", dir, fs::copy_options::recursive);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
    for (auto it = keys.begin(); it != keys.end(); ++it) config[it.key()] = it.value();
    std::ofstream(dir / "config.json") << config.dump();
    return dir;
  };
  EXPECT_NO_THROW(Model::load(with_window("qwen2", {{"sliding_window", 8}}), ModelOptions{.n_threads = 1}));
  EXPECT_NO_THROW(Model::load(with_window("qwen3", {{"sliding_window", 8}, {"use_sliding_window", false}}),
                              ModelOptions{.n_threads = 1}));
  for (const auto& [family, keys] :
       {std::pair{std::string("qwen2"), nlohmann::json{{"sliding_window", 8}, {"use_sliding_window", true}}},
        std::pair{std::string("phi3"), nlohmann::json{{"sliding_window", 8}, {"use_sliding_window", false}}}}) {
    try {
      Model::load(with_window(family, keys), ModelOptions{.n_threads = 1});
      ADD_FAILURE() << family << " with " << keys.dump() << " loaded";
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find("sliding-window attention is not supported"), std::string::npos) << e.what();
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
    // The mistral GGUF carries no window (llama.cpp's converter drops it, and llama.cpp runs the
    // file with full attention): it is a llama file, indistinguishable, and runs as one.
    ::testing::Values(Refusal{"mistral", "sliding-window attention is not supported", ""},
                      Refusal{"gemma2", "unsupported model_type 'gemma2'", "unsupported architecture 'gemma2'"},
                      Refusal{"gemma3", "unsupported model_type 'gemma3", "unsupported architecture 'gemma3'"},
                      Refusal{"mixtral", "unsupported model_type 'mixtral'", "expert"}),
    [](const auto& info) { return info.param.family; });

}  // namespace
}  // namespace fdl::test
