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
  EXPECT_EQ(m->config().arch, expected_arch(f));
  expect_matches_hf(check_family(*m, family_reference(f)), f + " HF directory");
}

TEST_P(FamilyOnCpu, ConvertedGgufMatchesTransformers) {
  const std::string& f = GetParam();
  auto m = Model::load(family_dir(f) / "model.gguf", ModelOptions{.n_threads = 2});
  EXPECT_EQ(m->config().arch, expected_arch(f));
  if (!gguf_drops_window(f)) expect_matches_hf(check_family(*m, family_reference(f)), f + " GGUF");
  if (llama_cpp_exact(f)) {
    expect_matches_hf(check_family(*m, family_reference(f), "llama_cpp"), f + " GGUF vs llama.cpp");
  } else {  // a looser oracle: its float16 GELU table
    const FamilyCheck r = check_family(*m, family_reference(f), "llama_cpp", 5e-3);
    std::cout << "  " << f << " GGUF vs llama.cpp: logits max error " << r.worst_logit_error << " of the range\n";
    EXPECT_LE(r.worst_logit_error, 5e-3) << f;
  }
}

// The directory and its converted GGUF hold the same values in the same places: the same
// logits bit for bit (Mistral's GGUF with the window key its converter drops put back).
TEST_P(FamilyOnCpu, HfDirectoryAndGgufGiveIdenticalLogits) {
  const std::string& f = GetParam();
  auto a = Model::load(family_dir(f) / "hf", ModelOptions{.n_threads = 1});
  auto b = Model::load(fixture_gguf(f), ModelOptions{.n_threads = 1});
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

// Gemma 3's per-layer-type RoPE and layers from config.json (both transformers layouts) and from
// the GGUF: five sliding layers (base 10000) to one global (base 1e6); a scaled sliding RoPE is
// refused.
TEST(FamilyConfig, Gemma3LayerTypesAndTheirRope) {
  namespace fs = std::filesystem;
  const auto check = [](const ModelConfig& c, const std::string& what) {
    EXPECT_EQ(c.sliding_window, 8) << what;
    for (int il = 0; il < 6; ++il) EXPECT_EQ(c.attention_window(il), il == 5 ? 0 : 8) << what << " layer " << il;
    EXPECT_EQ(c.rope_freq_base, 1e6f) << what;
    EXPECT_EQ(c.rope_freq_base_swa, 1e4f) << what;
    EXPECT_NEAR(c.query_scale(), 0.25f, 1e-7) << what;  // query_pre_attn_scalar 16
    EXPECT_EQ(c.embed_scale, 8.f) << what;               // sqrt(64)
  };
  check(Model::load(family_dir("gemma3") / "hf", ModelOptions{.n_threads = 1})->config(), "HF");
  check(Model::load(family_dir("gemma3") / "model.gguf", ModelOptions{.n_threads = 1})->config(), "GGUF");
  const fs::path dir = scratch_dir() / "gemma3-t4";
  fs::remove_all(dir);
  fs::copy(family_dir("gemma3") / "hf", dir, fs::copy_options::recursive);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  config.erase("rope_parameters");
  config.erase("layer_types");
  config["rope_theta"] = 1e6;
  config["rope_local_base_freq"] = 1e4;
  config["sliding_window_pattern"] = 6;
  std::ofstream(dir / "config.json") << config.dump();
  check(Model::load(dir, ModelOptions{.n_threads = 1})->config(), "transformers 4 layout");
  config = nlohmann::json::parse(std::ifstream(family_dir("gemma3") / "hf" / "config.json"));
  config["rope_parameters"]["sliding_attention"]["rope_type"] = "linear";
  std::ofstream(dir / "config.json") << config.dump();
  try {
    Model::load(dir, ModelOptions{.n_threads = 1});
    ADD_FAILURE() << "a scaled sliding RoPE loaded";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("must be unscaled"), std::string::npos) << e.what();
  }
}


}  // namespace
}  // namespace fdl::test
