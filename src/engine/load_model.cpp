// Convenience entry points for the CLI and the server: load a model with its tokenizer,
// and turn prompt text into the ids a GenerationRequest takes.
#include <stdexcept>

#include "flashdllm/generator.h"

namespace fdl {

LoadedModel load_model(const std::filesystem::path& path, const ModelOptions& options) {
  LoadedModel loaded;
  loaded.model = Model::load(path, options);
  loaded.tokenizer = Tokenizer::from_gguf(loaded.model->gguf());
  return loaded;
}

std::vector<int32_t> encode_prompt(const Tokenizer& tokenizer, std::string_view text,
                                   bool parse_special) {
  auto ids = tokenizer.encode(text, /*add_special=*/true, parse_special);
  if (ids.empty()) {
    // The model needs at least one token to condition on; BOS is the natural "nothing yet".
    if (tokenizer.bos_id() < 0)
      throw std::invalid_argument("empty prompt, and the vocabulary has no BOS token to use");
    ids.push_back(tokenizer.bos_id());
  }
  return ids;
}

}  // namespace fdl
