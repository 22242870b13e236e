// A Hugging Face model directory read as GGUF: codelm-16m-hf must give exactly the tensors,
// metadata and tokenizer of codelm-16m-f16.gguf (llama.cpp's conversion of the same weights),
// and every unsupported or malformed input must be refused with a message naming it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <tuple>

#include <sys/stat.h>

#include "flashdllm/gguf.h"
#include "flashdllm/tokenizer.h"
#include "hf/hf_checkpoint.h"
#include "hf/hf_config.h"
#include "hf/hf_tokenizer.h"
#include "hf/one_line_error.h"
#include "hf/safetensors.h"
#include "test_support.h"

namespace fdl::test {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

const GgufFile& hf_codelm() {
  static const GgufFile f = hf::open_hf_directory(model_path("codelm-16m-hf"));
  return f;
}
const GgufFile& gguf_codelm() {
  static const GgufFile f = GgufFile::open(model_path("codelm-16m-f16.gguf"));
  return f;
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return json::parse(s.str());
}

TEST(HfDirectory, TensorsEqualTheConvertedGguf) {
  const GgufFile& hf = hf_codelm();
  const GgufFile& gg = gguf_codelm();
  ASSERT_EQ(hf.tensors().size(), gg.tensors().size());
  for (const GgufTensorInfo& t : gg.tensors()) {
    const GgufTensorInfo* h = hf.find_tensor(t.name);
    ASSERT_NE(h, nullptr) << t.name;
    EXPECT_EQ(h->type_id, t.type_id) << t.name;
    EXPECT_EQ(h->n_dims, t.n_dims) << t.name;
    for (int d = 0; d < 4; ++d) EXPECT_EQ(h->ne[d], t.ne[d]) << t.name << " dim " << d;
    ASSERT_EQ(h->n_bytes, t.n_bytes) << t.name;
    // Q and K rows reordered for the interleaved RoPE, norms widened to F32: byte for byte.
    EXPECT_EQ(std::memcmp(h->data, t.data, t.n_bytes), 0) << t.name;
  }
}

TEST(HfDirectory, MetadataTheModelReadsEqualsTheGguf) {
  const GgufFile& hf = hf_codelm();
  const GgufFile& gg = gguf_codelm();
  EXPECT_EQ(hf.get_string("general.architecture"), "llama");
  for (const char* key : {"llama.context_length", "llama.embedding_length", "llama.block_count",
                          "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv"})
    EXPECT_EQ(hf.get_uint(key), gg.get_uint(key)) << key;
  for (const char* key : {"llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon"})
    EXPECT_FLOAT_EQ(float(hf.get_float(key)), float(gg.get_float(key))) << key;
  EXPECT_EQ(hf.path(), model_path("codelm-16m-hf").string());
}

TEST(HfDirectory, TokenizerEqualsTheGguf) {
  const GgufFile& hf = hf_codelm();
  const GgufFile& gg = gguf_codelm();
  EXPECT_EQ(hf.get_string("tokenizer.ggml.model"), gg.get_string("tokenizer.ggml.model"));
  EXPECT_EQ(hf.get_string("tokenizer.ggml.pre"), gg.get_string("tokenizer.ggml.pre"));
  EXPECT_EQ(hf.array_strings("tokenizer.ggml.tokens"), gg.array_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(hf.array_strings("tokenizer.ggml.merges"), gg.array_strings("tokenizer.ggml.merges"));
  EXPECT_EQ(hf.array_int("tokenizer.ggml.token_type"), gg.array_int("tokenizer.ggml.token_type"));
  EXPECT_EQ(hf.get_uint("tokenizer.ggml.bos_token_id"), gg.get_uint("tokenizer.ggml.bos_token_id"));
  EXPECT_EQ(hf.get_uint("tokenizer.ggml.eos_token_id"), gg.get_uint("tokenizer.ggml.eos_token_id"));
  EXPECT_FALSE(hf.get_bool_or("tokenizer.ggml.add_bos_token", true));
}

TEST(HfDirectory, TokenizerMatchesLlamaCppOnEveryReferenceString) {
  const auto tok = Tokenizer::from_gguf(hf_codelm());
  const json ref = read_json(reference_path("codelm_tokenizer.json"));
  ASSERT_EQ(ref["cases"].size(), 76u);
  for (const json& c : ref["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok->encode(text, false, false), c["ids"].get<std::vector<int32_t>>()) << text;
    EXPECT_EQ(tok->encode(text, false, true), c["ids_parse_special"].get<std::vector<int32_t>>()) << text;
  }
}

// --- refusals: a copy of codelm-16m-hf with one file changed ---

class HfDirectoryErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir() / ("hf-" + std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
      fs::copy_file(model_path("codelm-16m-hf") / f, dir_ / f);
    fs::create_symlink(fs::absolute(model_path("codelm-16m-hf") / "model.safetensors"), dir_ / "model.safetensors");
    config_ = read_json(dir_ / "config.json");
    tokenizer_ = read_json(dir_ / "tokenizer.json");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void write(const char* name, const json& j) { std::ofstream(dir_ / name) << j.dump(); }
  std::string error() {
    write("config.json", config_);
    write("tokenizer.json", tokenizer_);
    return one_line_error([&] { hf::open_hf_directory(dir_); });
  }
  fs::path dir_;
  json config_, tokenizer_;
};

TEST_F(HfDirectoryErrors, TheUnchangedCopyLoads) {
  write("config.json", config_);
  EXPECT_NO_THROW(hf::open_hf_directory(dir_));
}
TEST_F(HfDirectoryErrors, UnknownModelType) {
  config_["model_type"] = "gpt_neox";
  EXPECT_THAT(error(), HasSubstr("unsupported model_type 'gpt_neox'"));
  config_.erase("model_type");
  EXPECT_THAT(error(), HasSubstr("missing key 'model_type'"));
}
TEST_F(HfDirectoryErrors, MathChangingKeys) {
  config_["attention_bias"] = true;
  EXPECT_THAT(error(), HasSubstr("attention_bias"));
  config_["attention_bias"] = false;
  config_["hidden_act"] = "gelu";
  EXPECT_THAT(error(), HasSubstr("hidden_act 'gelu'"));
  config_["hidden_act"] = "silu";
  config_["hidden_activation"] = "gelu_pytorch_tanh";  // Gemma's key and activation: not llama's
  EXPECT_THAT(error(), HasSubstr("hidden_activation 'gelu_pytorch_tanh' (supported for llama: silu)"));
  config_.erase("hidden_activation");
  config_["use_bidirectional_attention"] = true;
  EXPECT_THAT(error(), HasSubstr("use_bidirectional_attention"));
  config_.erase("use_bidirectional_attention");
  config_["sliding_window"] = 4;
  config_["layer_types"] = std::vector<std::string>(8, "sliding_attention");
  config_["layer_types"][7] = "moe_attention";
  EXPECT_THAT(error(), HasSubstr("layer_types entry \"moe_attention\" is not supported"));
  config_.erase("layer_types");
  config_["sliding_window"] = -1;
  EXPECT_THAT(error(), HasSubstr("'sliding_window' must be a positive integer or null"));
  config_.erase("sliding_window");
  config_.erase("use_sliding_window");
  config_["num_local_experts"] = 8;  // experts are Mixtral's (model_type mixtral), not llama's
  EXPECT_THAT(error(), HasSubstr("'num_local_experts' is set: not supported for llama"));
  config_.erase("num_local_experts");
  config_["rope_parameters"] = {{"rope_type", "dynamic"}, {"rope_theta", 10000.0}};
  EXPECT_THAT(error(), HasSubstr("unsupported RoPE type 'dynamic'"));
  // YaRN: the defaults only; its factor and original context are required.
  config_["rope_parameters"] = {{"rope_type", "yarn"}, {"rope_theta", 10000.0}};
  EXPECT_THAT(error(), HasSubstr("rope type 'yarn' needs 'rope_parameters.factor'"));
  config_["rope_parameters"]["factor"] = 4.0;  // the original context defaults to max_position_embeddings
  write("config.json", config_);
  EXPECT_EQ(hf::open_hf_directory(dir_).get_uint("llama.rope.scaling.original_context_length"), 1024u);
  config_["rope_parameters"]["original_max_position_embeddings"] = 256;
  config_["rope_parameters"]["factor"] = 0.5;
  EXPECT_THAT(error(), HasSubstr("must be in [1, 1e6] for YaRN"));
  config_["rope_parameters"]["factor"] = 1e308;
  EXPECT_THAT(error(), HasSubstr("must be in [1, 1e6] for YaRN"));
  config_["rope_parameters"]["factor"] = 4.0;
  config_["rope_parameters"]["attention_factor"] = 1.2;
  EXPECT_THAT(error(), HasSubstr("'rope_parameters.attention_factor' is set: only YaRN's default scaling"));
  config_["rope_parameters"].erase("attention_factor");
  config_["rope_parameters"]["truncate"] = false;
  EXPECT_THAT(error(), HasSubstr("only the truncated YaRN range"));
  config_["rope_parameters"].erase("truncate");
  config_["rope_parameters"]["beta_fast"] = 16;
  write("config.json", config_);
  {
    const GgufFile f = hf::open_hf_directory(dir_);
    EXPECT_EQ(f.get_string_or("llama.rope.scaling.type", ""), "yarn");
    EXPECT_EQ(f.get_uint("llama.rope.scaling.original_context_length"), 256u);
    EXPECT_FLOAT_EQ(float(f.get_float("llama.rope.scaling.yarn_beta_fast")), 16.f);
    EXPECT_EQ(f.find("llama.rope.scaling.yarn_beta_slow"), nullptr);
  }
}
// generation_config.json's sampling settings become llama.cpp's general.sampling.* keys;
// bad values name the file and the key; other keys (do_sample, ids) are not read.
TEST_F(HfDirectoryErrors, GenerationConfigSamplingDefaults) {
  json gen = {{"do_sample", true}, {"temperature", 0.7}, {"top_k", 20}, {"top_p", 0.8},
              {"repetition_penalty", 1.05}, {"bos_token_id", 0}};
  write("config.json", config_);
  write("generation_config.json", gen);
  {
    const GgufFile f = hf::open_hf_directory(dir_);
    EXPECT_FLOAT_EQ(float(f.get_float("general.sampling.temp")), 0.7f);
    EXPECT_EQ(f.get_int_or("general.sampling.top_k", -1), 20);
    EXPECT_FLOAT_EQ(float(f.get_float("general.sampling.top_p")), 0.8f);
    EXPECT_FLOAT_EQ(float(f.get_float("general.sampling.penalty_repeat")), 1.05f);
    EXPECT_EQ(f.find("general.sampling.min_p"), nullptr);
  }
  for (const auto& [key, value, says] :
       {std::tuple{"temperature", json("hot"), "'temperature' must be a number"},
        std::tuple{"top_p", json(0), "'top_p' = 0 is out of range"},
        std::tuple{"top_k", json(-1), "'top_k' must be an integer >= 0"},
        std::tuple{"repetition_penalty", json(0), "'repetition_penalty' = 0 is out of range"}}) {
    json bad = gen;
    bad[key] = value;
    write("generation_config.json", bad);
    EXPECT_THAT(error(), AllOf(HasSubstr("generation_config.json"), HasSubstr(says))) << key;
  }
  write("generation_config.json", json::array());
  EXPECT_THAT(error(), HasSubstr("generation_config.json: not a JSON object"));
  write("generation_config.json", json());  // null
  EXPECT_THAT(error(), HasSubstr("generation_config.json: not a JSON object"));
  // do_sample = false: greedy, whatever the temperature (transformers' meaning).
  write("generation_config.json", json{{"do_sample", false}, {"temperature", 0.7}});
  write("config.json", config_);
  EXPECT_EQ(hf::open_hf_directory(dir_).get_float("general.sampling.temp"), 0.0);
  write("generation_config.json", json{{"do_sample", "no"}});
  EXPECT_THAT(error(), HasSubstr("'do_sample' must be true or false"));
}

TEST_F(HfDirectoryErrors, PartialRotaryFactor) {
  // codelm: head_dim 64; half of it would be 32 dims, but llama's rows are reordered over the
  // whole head (phi3's fixture covers a partial RoPE).
  config_["partial_rotary_factor"] = 0.5;
  EXPECT_THAT(error(), HasSubstr("partial_rotary_factor 0.500000 is not supported for llama"));
  config_["partial_rotary_factor"] = 0.3;  // 19.2 dims
  EXPECT_THAT(error(), HasSubstr("partial_rotary_factor 0.300000 of head_dim 64 is not an even number"));
  config_["partial_rotary_factor"] = 2;
  EXPECT_THAT(error(), HasSubstr("at most head_dim"));
  config_.erase("partial_rotary_factor");
  config_["rope_parameters"]["partial_rotary_factor"] = "half";
  EXPECT_THAT(error(), HasSubstr("rope_parameters.partial_rotary_factor' must be a number"));
}
// LongRoPE: two lists of rope dimensions / 2 positive factors and an original context, written
// as llama.cpp's converter writes them (F32 tensors, original context, attention factor: given,
// else from max_position_embeddings / original context), or refused by name.
TEST_F(HfDirectoryErrors, LongRope) {
  const std::vector<double> ones(32, 1.0), twos(32, 2.0);  // codelm: head_dim 64, 32 pairs
  config_["rope_parameters"] = {{"rope_type", "longrope"}, {"rope_theta", 10000.0}};
  EXPECT_THAT(error(), HasSubstr("rope type 'longrope' needs 'rope_parameters.long_factor'"));
  config_["rope_parameters"]["long_factor"] = std::vector<double>(31, 2.0);
  EXPECT_THAT(error(), HasSubstr("key 'rope_parameters.long_factor' must be a list of 32 numbers (rotated dimensions / "
                                 "2), got 31 entries"));
  config_["rope_parameters"]["long_factor"] = 2.0;
  EXPECT_THAT(error(), HasSubstr("must be a list of 32 numbers (rotated dimensions / 2), got number"));
  config_["rope_parameters"]["long_factor"] = twos;
  EXPECT_THAT(error(), HasSubstr("rope type 'longrope' needs 'rope_parameters.short_factor'"));
  config_["rope_parameters"]["short_factor"] = ones;
  config_["rope_parameters"]["short_factor"][5] = 0.0;
  EXPECT_THAT(error(), HasSubstr("key 'rope_parameters.short_factor[5]' = 0.0 must be a positive finite number"));
  config_["rope_parameters"]["short_factor"][5] = "1";
  EXPECT_THAT(error(), HasSubstr("key 'rope_parameters.short_factor[5]' must be a number"));
  config_["rope_parameters"]["short_factor"][5] = 1e300;
  EXPECT_THAT(error(), HasSubstr("short_factor[5]' = 1e+300 is out of range"));
  config_["rope_parameters"]["short_factor"] = ones;
  EXPECT_THAT(error(), HasSubstr("rope type 'longrope' needs 'original_max_position_embeddings'"));
  config_["original_max_position_embeddings"] = 256;  // Phi-3's place for it
  config_["rope_parameters"]["original_max_position_embeddings"] = 128;
  EXPECT_THAT(error(), HasSubstr("original_max_position_embeddings 256 and "
                                 "'rope_parameters.original_max_position_embeddings' 128 disagree"));
  config_["rope_parameters"]["original_max_position_embeddings"] = 256.5;
  EXPECT_THAT(error(), HasSubstr("must be an integer"));
  config_["rope_parameters"].erase("original_max_position_embeddings");
  write("config.json", config_);
  {
    const GgufFile f = hf::open_hf_directory(dir_);
    EXPECT_EQ(f.find("llama.rope.scaling.type"), nullptr);  // as the converter writes it
    EXPECT_EQ(f.get_uint("llama.rope.scaling.original_context_length"), 256u);
    // max_position_embeddings 1024 = 4 x 256.
    EXPECT_FLOAT_EQ(float(f.get_float("llama.rope.scaling.attn_factor")),
                    float(std::sqrt(1 + std::log(4.0) / std::log(256.0))));
    for (const auto& [name, value] : {std::pair{"rope_factors_long.weight", 2.f}, {"rope_factors_short.weight", 1.f}}) {
      const GgufTensorInfo* t = f.find_tensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->type(), GgmlType::F32) << name;
      ASSERT_EQ(t->n_dims, 1u) << name;
      ASSERT_EQ(t->ne[0], 32u) << name;
      for (size_t i = 0; i < 32; ++i) EXPECT_EQ(reinterpret_cast<const float*>(t->data)[i], value) << name;
    }
  }
  // transformers' attention factor: given, else from `factor`; 1 without extension. "su" is Phi-3's
  // first name for the type; the original context may be in rope_parameters instead.
  for (const auto& [key, value, want] : {std::tuple{"attention_factor", 1.25, 1.25}, {"factor", 16.0, 0.0}}) {
    json c = config_;
    c["rope_parameters"][key] = value;
    c["rope_parameters"]["rope_type"] = "su";
    write("config.json", c);
    const double expected = want > 0 ? want : std::sqrt(1 + std::log(16.0) / std::log(256.0));
    EXPECT_FLOAT_EQ(float(hf::open_hf_directory(dir_).get_float("llama.rope.scaling.attn_factor")), float(expected))
        << key;
  }
  config_.erase("original_max_position_embeddings");
  config_["rope_parameters"]["original_max_position_embeddings"] = 1024;
  write("config.json", config_);
  EXPECT_FLOAT_EQ(float(hf::open_hf_directory(dir_).get_float("llama.rope.scaling.attn_factor")), 1.f);
  config_["rope_parameters"]["attention_factor"] = -1;
  EXPECT_THAT(error(), HasSubstr("'rope_parameters.attention_factor' = -1 must be a positive finite number"));
}
TEST_F(HfDirectoryErrors, ConfigNamesItsOwnKeys) {
  config_["num_key_value_heads"] = 4;  // 6 heads
  EXPECT_THAT(error(), HasSubstr("num_attention_heads 6 is not a multiple of num_key_value_heads 4"));
  config_["num_key_value_heads"] = 2;
  config_["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 2.0}};
  EXPECT_THAT(error(), HasSubstr("both rope_parameters and rope_scaling"));
}
TEST_F(HfDirectoryErrors, BadValues) {
  config_["hidden_size"] = -4;
  EXPECT_THAT(error(), HasSubstr("hidden_size"));
  config_["hidden_size"] = "384";
  EXPECT_THAT(error(), HasSubstr("must be an integer"));
  config_.erase("hidden_size");
  EXPECT_THAT(error(), HasSubstr("missing key 'hidden_size'"));
}
TEST_F(HfDirectoryErrors, ShapeDisagreesWithConfig) {
  config_["intermediate_size"] = 1000;
  EXPECT_THAT(error(), HasSubstr("has shape [1024, 384], expected [1000, 384]"));
}
TEST_F(HfDirectoryErrors, UntiedOutputWithoutLmHead) {
  config_["tie_word_embeddings"] = false;
  EXPECT_THAT(error(), HasSubstr("missing tensor 'lm_head.weight'"));
}
TEST_F(HfDirectoryErrors, TensorsTheModelDoesNotUse) {
  config_["num_hidden_layers"] = 7;  // layer 7's tensors are left over
  EXPECT_THAT(error(), HasSubstr("model.layers.7."));
  EXPECT_THAT(error(), HasSubstr("not used"));
}
TEST_F(HfDirectoryErrors, Tokenizers) {
  tokenizer_["model"]["type"] = "Unigram";
  EXPECT_THAT(error(), HasSubstr("unsupported tokenizer model 'Unigram'"));
  tokenizer_["model"]["type"] = "BPE";
  tokenizer_["model"]["byte_fallback"] = true;  // SentencePiece-style, which a byte-level pipeline is not
  EXPECT_THAT(error(), HasSubstr("unsupported pre_tokenizer \"ByteLevel\" for SentencePiece-style BPE"));
  tokenizer_["model"]["byte_fallback"] = false;
  tokenizer_["pre_tokenizer"] = {{"type", 5}};
  EXPECT_THAT(error(), HasSubstr("tokenizer.json: unsupported pre_tokenizer {\"type\":5}"));
  tokenizer_["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_THAT(error(), HasSubstr("unsupported pre_tokenizer \"Whitespace\""));
  tokenizer_["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  tokenizer_["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_THAT(error(), HasSubstr("unsupported normalizer \"Lowercase\""));
  tokenizer_["normalizer"] = nullptr;
  tokenizer_["model"]["vocab"]["Ġzzz-new"] = 9000;
  EXPECT_THAT(error(), HasSubstr("vocab_size is 8192"));
}
TEST_F(HfDirectoryErrors, HugeVocabularyIsCheckedAgainstTheWeightsFirst) {
  config_["vocab_size"] = 300000000;  // would size the tokenizer tables before the shape check
  EXPECT_THAT(error(), HasSubstr("expected [300000000, 384]"));
  config_["num_hidden_layers"] = nlohmann::json::number_unsigned_t(1) << 63;
  EXPECT_THAT(error(), HasSubstr("num_hidden_layers' = 9223372036854775808 is out of range"));
}
TEST_F(HfDirectoryErrors, TokenizerSettingsWithoutAnEquivalentAreRefused) {
  tokenizer_["model"]["dropout"] = 0.5;
  EXPECT_THAT(error(), HasSubstr("BPE dropout"));
  tokenizer_["model"]["dropout"] = nullptr;
  tokenizer_["model"]["continuing_subword_prefix"] = "##";
  EXPECT_THAT(error(), HasSubstr("continuing_subword_prefix"));
  tokenizer_["model"]["continuing_subword_prefix"] = nullptr;
  tokenizer_["model"]["ignore_merges"] = true;
  EXPECT_THAT(error(), HasSubstr("ignore_merges"));
  tokenizer_["model"]["ignore_merges"] = false;
  tokenizer_["decoder"] = {{"type", "WordPiece"}};
  EXPECT_THAT(error(), HasSubstr("unsupported decoder \"WordPiece\""));
  tokenizer_["decoder"] = nullptr;
  tokenizer_["model"]["vocab"].erase("\u0120");  // the space byte's symbol
  EXPECT_THAT(error(), HasSubstr("lacks the byte symbol"));
}
TEST_F(HfDirectoryErrors, TokenizerConfig) {
  json tc = read_json(dir_ / "tokenizer_config.json");
  tc["add_bos_token"] = "yes";
  write("tokenizer_config.json", tc);
  EXPECT_THAT(error(), HasSubstr("tokenizer_config.json: add_bos_token must be true or false"));
  tc["add_bos_token"] = false;
  tc["bos_token"] = "<|nope|>";
  write("tokenizer_config.json", tc);
  EXPECT_THAT(error(), HasSubstr("tokenizer_config.json: bos_token \"<|nope|>\" is not in the vocabulary"));
  write("tokenizer_config.json", json::array());
  EXPECT_THAT(error(), HasSubstr("tokenizer_config.json: not a JSON object"));
}
TEST_F(HfDirectoryErrors, ChatTemplateIsCarried) {
  json tc = read_json(dir_ / "tokenizer_config.json");
  tc["chat_template"] = "{% for m in messages %}{{ m.content }}{% endfor %}";
  write("tokenizer_config.json", tc);
  write("config.json", config_);
  const GgufFile f = hf::open_hf_directory(dir_);
  EXPECT_EQ(f.get_string("tokenizer.chat_template"), tc["chat_template"].get<std::string>());
  tc["chat_template"] = json::array({{{"name", "default"}, {"template", "A"}}, {{"name", "tool_use"}, {"template", "B"}}});
  write("tokenizer_config.json", tc);
  const GgufFile g = hf::open_hf_directory(dir_);
  EXPECT_EQ(g.get_string("tokenizer.chat_template"), "A");
  EXPECT_EQ(g.get_string("tokenizer.chat_template.tool_use"), "B");
  // A chat_template.jinja file beside a config without one: the file's template.
  tc.erase("chat_template");
  write("tokenizer_config.json", tc);
  std::ofstream(dir_ / "chat_template.jinja") << "{{ messages[0].content }}";
  EXPECT_EQ(hf::open_hf_directory(dir_).get_string("tokenizer.chat_template"), "{{ messages[0].content }}");
}
TEST_F(HfDirectoryErrors, FilesThatAreNotRegularFiles) {
  fs::remove(dir_ / "tokenizer.json");
  ASSERT_EQ(::mkfifo((dir_ / "tokenizer.json").c_str(), 0644), 0);  // must not block
  write("config.json", config_);
  EXPECT_THAT(
      [&] {
        try {
          hf::open_hf_directory(dir_);
        } catch (const hf::HfError& e) {
          return std::string(e.what());
        }
        return std::string();
      }(),
      HasSubstr("tokenizer.json: is not a regular file"));
  fs::remove(dir_ / "model.safetensors");
  ASSERT_EQ(::mkfifo((dir_ / "model.safetensors").c_str(), 0644), 0);
  EXPECT_THROW(hf::open_hf_directory(dir_), hf::SafetensorsError);
}

TEST_F(HfDirectoryErrors, NotJson) {
  std::ofstream(dir_ / "config.json") << "{\"model_type\": ";
  EXPECT_THROW(
      {
        try {
          hf::open_hf_directory(dir_);
        } catch (const hf::HfError& e) {
          EXPECT_THAT(e.what(), HasSubstr("config.json: not valid JSON"));
          throw;
        }
      },
      hf::HfError);
}
TEST_F(HfDirectoryErrors, MissingFiles) {
  fs::remove(dir_ / "tokenizer.json");
  write("config.json", config_);
  EXPECT_THROW(hf::open_hf_directory(dir_), hf::HfError);
  fs::remove(dir_ / "config.json");
  EXPECT_FALSE(hf::is_hf_directory(dir_));
  EXPECT_THROW(hf::open_hf_directory(dir_), hf::HfError);
}

}  // namespace
}  // namespace fdl::test
