#include "server/generation_params.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "server/json_fields.h"
#include "server/openai_error.h"

namespace fdl::server {
namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

std::vector<std::string> parse_stop(const nlohmann::json& body) {
  const nlohmann::json* v = find_field(body, "stop");
  if (v == nullptr) return {};
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > kMaxStops) {
      throw invalid_param("stop", "'stop' accepts at most " + std::to_string(kMaxStops) +
                                      " strings, got " + std::to_string(v->size()));
    }
    for (const auto& s : *v) {
      if (!s.is_string()) {
        throw invalid_param("stop", "'stop' must be a string or an array of strings; found " +
                                        json_type_name(s) + " in the array");
      }
      stops.push_back(s.get<std::string>());
    }
  } else {
    throw invalid_param("stop", "'stop' must be a string or an array of strings, got " +
                                    json_type_name(*v));
  }
  for (const auto& s : stops) {
    if (s.empty()) throw invalid_param("stop", "'stop' strings must not be empty");
  }
  return stops;
}

void parse_stream(const nlohmann::json& body, GenerationParams& p) {
  p.stream = read_bool(body, "stream").value_or(false);
  const nlohmann::json* opts = find_field(body, "stream_options");
  if (opts == nullptr) return;
  if (!p.stream) {
    throw invalid_param("stream_options",
                        "'stream_options' is only allowed when 'stream' is true");
  }
  if (!opts->is_object()) {
    throw invalid_param("stream_options", "'stream_options' must be an object, got " +
                                              json_type_name(*opts));
  }
  try {
    p.include_usage = read_bool(*opts, "include_usage").value_or(false);
  } catch (const ApiError& e) {
    throw invalid_param("stream_options.include_usage", e.what());
  }
}

void parse_sampling(const nlohmann::json& body, GenerationParams& p, const SamplingParams& d) {
  SamplingParams& s = p.sampling;
  s.temperature = float(read_number(body, "temperature", 0.0, 2.0).value_or(d.temperature));
  const double top_p = read_number(body, "top_p", 0.0, 1.0).value_or(d.top_p);
  s.top_k = int32_t(read_int(body, "top_k", 0, kInt32Max).value_or(d.top_k));
  if (top_p == 0.0) {
    // The nucleus of mass 0 is the single most likely token; the sampler needs top_p > 0,
    // and top_k = 1 keeps exactly that token (lowest id on ties, like the argmax).
    s.top_p = 1.0f;
    s.top_k = 1;
  } else {
    s.top_p = float(top_p);
  }
  s.min_p = float(read_number(body, "min_p", 0.0, 1.0).value_or(d.min_p));
  s.presence_penalty = float(read_number(body, "presence_penalty", -2.0, 2.0).value_or(0.0));
  s.frequency_penalty = float(read_number(body, "frequency_penalty", -2.0, 2.0).value_or(0.0));
  const double rep = read_number(body, "repetition_penalty", 0.0, 10.0).value_or(d.repeat_penalty);
  if (rep == 0.0) {
    throw invalid_param("repetition_penalty", "'repetition_penalty' must be > 0 (1 = off)");
  }
  s.repeat_penalty = float(rep);
  s.repeat_last_n = int32_t(read_int(body, "repeat_last_n", -1, kInt32Max).value_or(64));
  const nlohmann::json* seed = find_field(body, "seed");
  if (seed != nullptr) {
    if (seed->is_number_unsigned()) {
      s.seed = seed->get<uint64_t>();
    } else if (seed->is_number_integer()) {
      s.seed = uint64_t(seed->get<int64_t>());  // two's complement wrap, documented
    } else if (seed->is_number_float() && std::isfinite(seed->get<double>()) &&
               seed->get<double>() == std::floor(seed->get<double>())) {
      // A whole number JSON could not hold in 64 bits (nlohmann parses it as a double).
      throw invalid_param("seed", "'seed' must be an integer in [-2^63, 2^64 - 1]; the one given does not fit "
                                  "in 64 bits");
    } else {
      throw invalid_param("seed", "'seed' must be an integer, got " + json_type_name(*seed));
    }
    p.seed_given = true;
  }
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100], ...}, each id written as a plain
// decimal number (so no two keys name one token); ids beyond the vocabulary are refused by
// prepare_generation, which knows it.
void parse_logit_bias(const nlohmann::json& body, GenerationParams& p) {
  constexpr size_t kMaxBiases = 1024;
  const nlohmann::json* v = find_field(body, "logit_bias");
  if (v == nullptr) return;
  if (!v->is_object()) {
    throw invalid_param("logit_bias", "'logit_bias' must be an object of token id to bias, got " + json_type_name(*v));
  }
  if (v->size() > kMaxBiases) throw invalid_param("logit_bias", "'logit_bias' holds more than 1024 tokens");
  for (const auto& [key, bias] : v->items()) {
    const bool plain = !key.empty() && key.size() <= 18 && (key.size() == 1 || key[0] != '0') &&
                       std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (!plain)
      throw invalid_param("logit_bias", "'logit_bias' key '" + key +
                                            "' is not a token id (a decimal number without sign, spaces or leading zeros)");
    const long long id = std::stoll(key);  // at most 18 digits: no overflow
    if (id > kInt32Max) throw invalid_param("logit_bias", "'logit_bias' token " + key + " is outside the vocabulary");
    if (!bias.is_number() || !(bias.get<double>() >= -100.0 && bias.get<double>() <= 100.0))
      throw invalid_param("logit_bias", "'logit_bias' value for token " + key + " must be a number in [-100, 100]");
    p.sampling.logit_bias.emplace_back(int32_t(id), bias.get<float>());
  }
}

}  // namespace

GenerationParams parse_generation_params(const nlohmann::json& body, Endpoint endpoint,
                                         const SamplingParams& defaults) {
  if (!body.is_object()) {
    throw ApiError(400, "the request body must be a JSON object, got " + json_type_name(body));
  }
  GenerationParams p;
  p.model = read_string(body, "model").value_or("");
  read_string(body, "user");  // type-checked, otherwise ignored

  std::optional<int64_t> max_tokens;
  if (endpoint == Endpoint::Chat) max_tokens = read_int(body, "max_completion_tokens", 1, kInt32Max);
  if (max_tokens) {
    read_int(body, "max_tokens", 1, kInt32Max);  // still type-checked
  } else {
    max_tokens = read_int(body, "max_tokens", 1, kInt32Max);
  }
  p.max_new_tokens = max_tokens ? int32_t(*max_tokens)
                                : (endpoint == Endpoint::Completions ? kCompletionsDefaultMaxTokens
                                                                     : -1);
  parse_sampling(body, p, defaults);
  p.stop = parse_stop(body);
  p.n = int(read_int(body, "n", 1, kMaxChoices).value_or(1));
  parse_stream(body, p);
  p.ignore_eos = read_bool(body, "ignore_eos").value_or(false);
  parse_logit_bias(body, p);
  return p;
}

std::vector<GenerationRequest> make_engine_requests(const GenerationParams& params,
                                                    const std::vector<int32_t>& prompt_ids,
                                                    const std::vector<std::string>& extra_stops,
                                                    uint64_t random_seed) {
  std::vector<GenerationRequest> out;
  out.reserve(size_t(params.n));
  const uint64_t base = params.seed_given ? params.sampling.seed : random_seed;
  for (int i = 0; i < params.n; ++i) {
    GenerationRequest r;
    r.prompt_ids = prompt_ids;
    r.sampling = params.sampling;
    r.sampling.seed = base + uint64_t(i);  // wraps modulo 2^64 by design
    r.max_new_tokens = params.max_new_tokens;
    r.stop = params.stop;
    r.stop.insert(r.stop.end(), extra_stops.begin(), extra_stops.end());
    r.ignore_eos = params.ignore_eos;
    r.logprobs = params.logprobs;
    r.grammar = params.grammar;
    r.skip_special_tokens = params.skip_special_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

void check_prompt_fits(size_t prompt_tokens, int n_ctx, const std::string& param) {
  if (prompt_tokens >= size_t(n_ctx)) {
    throw ApiError(400,
                   "the prompt has " + std::to_string(prompt_tokens) +
                       " tokens but the context is " + std::to_string(n_ctx) +
                       " tokens: no room for a new token; shorten the prompt",
                   param, "invalid_request_error", "context_length_exceeded");
  }
}

}  // namespace fdl::server
