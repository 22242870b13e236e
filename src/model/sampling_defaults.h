// sampling_defaults.h — the sampling settings a model file recommends, as llama.cpp stores them
// (general.sampling.temp, .top_k, .top_p, .min_p, .penalty_repeat; its converter writes them
// from generation_config.json, and so does flashdllm's reading of a Hugging Face directory).
//
// They replace a caller's defaults, never a value the user gave: the CLI's flags left unset
// and the fields an OpenAI request leaves out take them (vLLM's and llama.cpp's behaviour).
// Errors: ModelError naming the key for a value of the wrong type or out of range.
// Thread-safety: stateless.
#pragma once

#include <cstdint>
#include <optional>

#include "flashdllm/gguf.h"
#include "flashdllm/sampling.h"

namespace fdl {

struct ModelSamplingDefaults {
  std::optional<float> temperature;     ///< general.sampling.temp, >= 0
  std::optional<int32_t> top_k;         ///< general.sampling.top_k, >= 0
  std::optional<float> top_p;           ///< general.sampling.top_p, in (0, 1]
  std::optional<float> min_p;           ///< general.sampling.min_p, in [0, 1]
  std::optional<float> repeat_penalty;  ///< general.sampling.penalty_repeat, > 0
  bool empty() const { return !temperature && !top_k && !top_p && !min_p && !repeat_penalty; }
};

/// Reads the general.sampling.* keys of `f` (absent keys stay unset).
ModelSamplingDefaults model_sampling_defaults(const GgufFile& f);

/// `base` with every field the model sets replaced.
SamplingParams with_model_defaults(SamplingParams base, const ModelSamplingDefaults& d);

}  // namespace fdl
