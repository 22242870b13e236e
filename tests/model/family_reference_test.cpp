// Every supported family against Hugging Face Transformers (float32, eager attention) on the
// CPU: logits of 8 prompts and 32 greedy ids, from the HF directory and from the GGUF
// llama.cpp's converter made of it (family_fixtures.h), the GGUF also against llama.cpp's own
// CPU run of it, each loaded for the context its reference was made with (and for
// phi3-longrope's short-context reference too); LongRoPE's configuration, its choice of factors
// and its refusals; and the families not supported yet refused by name instead of run with the
// wrong math.
#include <cstring>
#include <limits>
#include <map>

#include "model/family_fixtures.h"

namespace fdl::test {
namespace {

std::unique_ptr<Model> load_for(const std::filesystem::path& path, const nlohmann::json& ref, int threads = 2) {
  return Model::load(path, ModelOptions{.n_threads = threads, .n_ctx = reference_n_ctx(ref)});
}

/// Checks `path` against the HF part of the short-context reference, where the family has one.
void expect_short_context_matches_hf(const std::filesystem::path& path, const nlohmann::json& ref,
                                     const std::string& what) {
  if (!ref.contains("short_context")) return;
  const nlohmann::json& shorter = ref.at("short_context");
  expect_matches_hf(check_family(*load_for(path, shorter), shorter),
                    what + " (n_ctx " + std::to_string(reference_n_ctx(shorter)) + ")");
}

class FamilyOnCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(FamilyOnCpu, HfDirectoryMatchesTransformers) {
  const std::string& f = GetParam();
  const nlohmann::json ref = family_reference(f);
  auto m = load_for(family_dir(f) / "hf", ref);
  EXPECT_EQ(m->config().arch, expected_arch(f));
  expect_matches_hf(check_family(*m, ref), f + " HF directory");
  expect_short_context_matches_hf(family_dir(f) / "hf", ref, f + " HF directory");
}

TEST_P(FamilyOnCpu, ConvertedGgufMatchesTransformers) {
  const std::string& f = GetParam();
  const nlohmann::json ref = family_reference(f);
  auto m = load_for(family_dir(f) / "model.gguf", ref);
  EXPECT_EQ(m->config().arch, expected_arch(f));
  if (!gguf_drops_window(f)) {
    expect_matches_hf(check_family(*m, ref), f + " GGUF");
    expect_short_context_matches_hf(family_dir(f) / "model.gguf", ref, f + " GGUF");
  }
  if (llama_cpp_exact(f)) {
    expect_matches_hf(check_family(*m, ref, "llama_cpp"), f + " GGUF vs llama.cpp");
  } else {  // a looser oracle: its float16 GELU table
    const FamilyCheck r = check_family(*m, ref, "llama_cpp", 5e-3);
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


// LongRoPE from config.json and from the converted GGUF: the same configuration, the attention
// factor sqrt(1 + ln(256 / 64) / ln(64)), and the long factors exactly for contexts beyond the
// original 64 tokens (0 and anything above the trained context count as the trained 256).
TEST(FamilyConfig, LongRopeConfigAndFactorChoice) {
  for (const char* source : {"hf", "model.gguf"}) {
    const auto m = Model::load(family_dir("phi3-longrope") / source, ModelOptions{.n_threads = 1});
    const ModelConfig& c = m->config();
    EXPECT_TRUE(c.rope_longrope) << source;
    EXPECT_EQ(c.rope_orig_ctx, 64) << source;
    EXPECT_EQ(c.n_ctx_train, 256) << source;
    EXPECT_EQ(c.rope_dim, 12) << source;
    EXPECT_FLOAT_EQ(c.rope_attn_factor, float(std::sqrt(1 + std::log(4.0) / std::log(64.0)))) << source;
    for (const auto& [n_ctx, long_factors] : {std::pair{0, true}, {1, false}, {64, false}, {65, true}, {256, true},
                                              {100000, true}})
      EXPECT_EQ(c.rope_long_factors(n_ctx), long_factors) << source << " n_ctx " << n_ctx;
  }
  const auto plain = Model::load(family_dir("phi3") / "model.gguf", ModelOptions{.n_threads = 1});
  EXPECT_FALSE(plain->config().rope_longrope);
  EXPECT_FALSE(plain->config().rope_long_factors(100000));
  EXPECT_EQ(plain->config().rope_attn_factor, 1.f);
}

/// Max |ours - want| / range of the last-position logits over a reference's prompts (no greedy run).
double last_logits_error(Model& m, const nlohmann::json& ref, const std::string& oracle) {
  double worst = 0;
  for (size_t p = 0; p < ref.at("prompts").size(); ++p) {
    const auto prompt = ref.at("prompts")[p].get<std::vector<int32_t>>();
    const auto want = ref.at(oracle).at("last_logits")[p].get<std::vector<double>>();
    auto pool = make_pool(m, prompt.size() + 1);
    KvCache kv(*pool);
    std::vector<std::vector<float>> steps;
    greedy_decode(m, kv, prompt, 1, false, &steps);
    const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(steps[0][i] - want[i]) / (*hi - *lo));
  }
  return worst;
}

// The fixture tells the two factor sets apart: each reference is far from the model run with the
// other set (so the matches above are not a coincidence of similar factors).
TEST(FamilyConfig, LongRopeWrongFactorsAreFarFromTheReferences) {
  const nlohmann::json ref = family_reference("phi3-longrope");
  const auto gguf = family_dir("phi3-longrope") / "model.gguf";
  auto short_model = Model::load(gguf, ModelOptions{.n_threads = 2, .n_ctx = 64});
  auto long_model = Model::load(gguf, ModelOptions{.n_threads = 2, .n_ctx = 256});
  const double long_prompts_short_factors = last_logits_error(*short_model, ref, "hf");
  const double short_prompts_long_factors = last_logits_error(*long_model, ref.at("short_context"), "hf");
  std::cout << "  wrong factors: long prompts " << long_prompts_short_factors << ", short prompts "
            << short_prompts_long_factors << " of the range\n";
  EXPECT_GT(long_prompts_short_factors, 1e-2);
  EXPECT_GT(short_prompts_long_factors, 1e-2);
  EXPECT_LT(last_logits_error(*long_model, ref, "hf"), 1e-3);
}

/// The phi3-longrope GGUF rewritten: tensor `drop` left out, tensors of `replace` given new F32
/// values, and F32 metadata `keys` set.
std::filesystem::path longrope_variant(const std::string& name, const std::string& drop,
                                       const std::map<std::string, std::vector<float>>& replace,
                                       const std::map<std::string, float>& keys = {}) {
  const GgufFile f = GgufFile::open(family_dir("phi3-longrope") / "model.gguf");
  GgufWriter w(f.alignment());
  for (const auto& [k, v] : f.metadata()) w.set_value(k, v);
  for (const auto& [k, v] : keys) w.set_float32(k, v);
  for (const GgufTensorInfo& t : f.tensors()) {
    if (t.name == drop) continue;
    if (const auto it = replace.find(t.name); it != replace.end()) {
      const std::vector<float>& v = it->second;
      w.add_tensor(t.name, GgmlType::F32, {v.size()},
                   [&v](std::span<uint8_t> out) { std::memcpy(out.data(), v.data(), out.size()); });
      continue;
    }
    w.add_tensor(t.name, t.type(), std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                 [&t](std::span<uint8_t> out) { std::copy_n(t.data, out.size(), out.begin()); });
  }
  const std::filesystem::path path = scratch_dir() / ("longrope-" + name + ".gguf");
  w.write(path);
  return path;
}

void expect_load_error(const std::filesystem::path& path, const std::string& says, const ModelOptions& opt = {}) {
  try {
    Model::load(path, opt);
    ADD_FAILURE() << path << " loaded";
  } catch (const ModelError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(says), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// A LongRoPE GGUF missing a factor set, with one of the wrong length or with a non-positive /
// non-finite factor, or with a bad attention factor, is refused by a one-line ModelError.
TEST(FamilyConfig, LongRopeRefusals) {
  const std::vector<float> ok(6, 1.5f);
  expect_load_error(longrope_variant("no-short", "rope_factors_short.weight", {}),
                    "'rope_factors_short.weight' is missing");
  expect_load_error(longrope_variant("no-long", "rope_factors_long.weight", {}), "'rope_factors_long.weight' is missing");
  expect_load_error(longrope_variant("five", "", {{"rope_factors_long.weight", std::vector<float>(5, 2.f)}}),
                    "tensor 'rope_factors_long.weight' has shape [5], expected [6]");
  for (const float bad : {0.f, -1.f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    std::vector<float> v = ok;
    v[3] = bad;
    expect_load_error(longrope_variant("bad", "", {{"rope_factors_short.weight", v}}),
                      "tensor 'rope_factors_short.weight' holds a non-positive or non-finite factor");
  }
  expect_load_error(longrope_variant("attn", "", {}, {{"phi3.rope.scaling.attn_factor", 0.f}}),
                    "'phi3.rope.scaling.attn_factor' = 0.000000 must be a positive finite number");
  expect_load_error(family_dir("phi3-longrope") / "model.gguf", "n_ctx must be >= 0", ModelOptions{.n_ctx = -1});
}

}  // namespace
}  // namespace fdl::test
