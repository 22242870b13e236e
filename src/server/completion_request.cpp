#include "server/completion_request.h"

#include "server/json_fields.h"
#include "server/openai_error.h"

namespace fdl::server {
namespace {

std::vector<int32_t> parse_ids(const nlohmann::json& arr, int32_t n_vocab) {
  std::vector<int32_t> ids;
  ids.reserve(arr.size());
  for (const auto& v : arr) {
    if (!v.is_number_integer() && !v.is_number_unsigned()) {
      throw invalid_param("prompt", "a token-id prompt must hold only integers; found " +
                                        json_type_name(v));
    }
    const bool in_range = v.is_number_unsigned() ? v.get<uint64_t>() < uint64_t(n_vocab)
                                                 : v.get<int64_t>() >= 0 &&
                                                       v.get<int64_t>() < int64_t(n_vocab);
    if (!in_range) {
      throw invalid_param("prompt", "token id " + v.dump() + " is outside the vocabulary [0, " +
                                        std::to_string(n_vocab) + ")");
    }
    ids.push_back(int32_t(v.get<int64_t>()));
  }
  return ids;
}

void parse_prompt(const nlohmann::json& body, int32_t n_vocab, CompletionRequest& r) {
  const nlohmann::json* p = find_field(body, "prompt");
  if (p == nullptr) throw invalid_param("prompt", "'prompt' is required");
  const nlohmann::json* one = p;
  if (p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array())) {
    if (p->size() != 1) {
      throw invalid_param("prompt", "only one prompt per request is supported, got " +
                                        std::to_string(p->size()) +
                                        " (send one request per prompt, or use 'n')");
    }
    one = &p->front();
  }
  if (one->is_string()) {
    if (one->get_ref<const std::string&>().empty()) {
      throw invalid_param("prompt", "'prompt' must not be empty");
    }
    r.prompt_text = one->get<std::string>();
  } else if (one->is_array()) {
    if (one->empty()) throw invalid_param("prompt", "'prompt' must not be empty");
    r.prompt_ids = parse_ids(*one, n_vocab);
  } else {
    throw invalid_param("prompt", "'prompt' must be a string, an array of token ids, or an "
                                  "array holding one of those; got " + json_type_name(*one));
  }
}

}  // namespace

CompletionRequest parse_completion_request(const nlohmann::json& body, int32_t n_vocab,
                                           const SamplingParams& defaults) {
  CompletionRequest r;
  r.params = parse_generation_params(body, Endpoint::Completions, defaults);
  parse_prompt(body, n_vocab, r);
  if (const auto lp = read_int(body, "logprobs", 0, kMaxCompletionLogprobs)) {
    r.params.logprobs = int32_t(*lp);
  }
  r.echo = read_bool(body, "echo").value_or(false);
  if (r.echo && r.params.logprobs >= 0)
    throw invalid_param("echo", "'echo' with 'logprobs' is not supported (the prompt's logprobs are not computed)");
  if (const auto suffix = read_string(body, "suffix"); suffix && !suffix->empty()) {
    throw invalid_param("suffix", "'suffix' (insertion) is not supported");
  }
  if (const auto best_of = read_int(body, "best_of", 1, 1'000'000); best_of && *best_of != 1) {
    throw invalid_param("best_of", "'best_of' other than 1 is not supported (use 'n')");
  }
  return r;
}

}  // namespace fdl::server
