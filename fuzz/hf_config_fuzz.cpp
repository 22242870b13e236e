// libFuzzer target for a Hugging Face directory's JSON: the input is config.json, optionally
// followed by a line "---" and tokenizer.json. config.json goes through write_model_metadata,
// then (for vocabularies up to 2^16, as a real directory's weights would bound it first)
// tokenizer.json through write_tokenizer_metadata; the GGUF they describe is serialized and read
// back. HfError, a JSON parse or type error and GgufError are expected rejections; a crash,
// sanitizer report, leak or hang is a bug.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "flashdllm/gguf.h"
#include "hf/hf_config.h"
#include "hf/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t split = input.find("\n---\n");
  const std::string_view config_text = input.substr(0, split);
  const std::string_view tokenizer_text = split == std::string_view::npos ? std::string_view() : input.substr(split + 5);
  try {
    const nlohmann::json config = nlohmann::json::parse(config_text);
    fdl::GgufWriter w;
    const fdl::hf::HfModelShape s = fdl::hf::write_model_metadata(config, "config.json", w);
    if (s.family == nullptr || s.n_embd <= 0 || s.n_head <= 0 || s.n_head_kv <= 0 || s.head_dim <= 0 ||
        s.n_head % s.n_head_kv != 0)
      __builtin_trap();  // the checks promise a usable shape
    if (!tokenizer_text.empty() && s.n_vocab <= (1 << 16)) {
      const nlohmann::json tokenizer = nlohmann::json::parse(tokenizer_text);
      fdl::hf::write_tokenizer_metadata(tokenizer, nlohmann::json(), config, s.n_vocab, "tokenizer.json",
                                        "tokenizer_config.json", w);
    }
    const fdl::GgufFile f = fdl::GgufFile::from_bytes(w.to_bytes("fuzz"), "fuzz");
    if (f.get_string_or("general.architecture", "") != std::string(s.family->name)) __builtin_trap();
  } catch (const fdl::hf::HfError&) {
  } catch (const nlohmann::json::exception&) {
  } catch (const fdl::GgufError&) {
  }
  return 0;
}
