// Request validation (see request_validation.h).
#include "engine/request_validation.h"

#include <stdexcept>
#include <string>

namespace fdl::engine {

void validate_request(const GenerationRequest& request, size_t index, int32_t n_vocab,
                      int n_ctx) {
  const std::string where = "request #" + std::to_string(index) + ": ";
  const auto& prompt = request.prompt_ids;
  if (prompt.empty())
    throw std::invalid_argument(where + "prompt_ids is empty (pass [BOS] for an empty prompt)");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= n_vocab)
      throw std::invalid_argument(where + "prompt token #" + std::to_string(i) + " = " +
                                  std::to_string(prompt[i]) + " is outside the vocabulary [0, " +
                                  std::to_string(n_vocab) + ")");
  // At least one token must fit after the prompt (see GenerationRun::on_token).
  if (prompt.size() >= size_t(n_ctx))
    throw std::invalid_argument(where + "prompt has " + std::to_string(prompt.size()) +
                                " tokens, which leaves no room in the context of " +
                                std::to_string(n_ctx) + " tokens");
  if (request.max_new_tokens < -1)
    throw std::invalid_argument(where + "max_new_tokens = " +
                                std::to_string(request.max_new_tokens) +
                                " is invalid (-1 = unlimited, 0 = none)");
  if (request.spec_window < -1 || request.spec_window > 64)
    throw std::invalid_argument(where + "spec_window = " + std::to_string(request.spec_window) +
                                " is invalid (-1 = generator default, 0 = off, up to 64)");
  try {
    request.sampling.validate();
  } catch (const std::invalid_argument& e) {
    throw std::invalid_argument(where + e.what());
  }
  for (const auto& [token, bias] : request.sampling.logit_bias)
    if (token >= n_vocab)
      throw std::invalid_argument(where + "logit_bias token " + std::to_string(token) + " is outside the vocabulary [0, " +
                                  std::to_string(n_vocab) + ")");
  for (size_t i = 0; i < request.stop.size(); ++i)
    if (request.stop[i].empty())
      throw std::invalid_argument(where + "stop string #" + std::to_string(i) + " is empty");
}

}  // namespace fdl::engine
