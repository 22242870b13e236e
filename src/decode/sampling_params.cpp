// Validation of SamplingParams: every rejected value names the parameter, so an API user
// (CLI flag, HTTP field) learns exactly what to fix.
#include <cmath>
#include <stdexcept>
#include <string>

#include "flashdllm/sampling.h"

namespace fdl {
namespace {

[[noreturn]] void reject(const char* name, const std::string& value, const char* requirement) {
  throw std::invalid_argument(std::string("sampling parameter ") + name + " = " + value +
                              " is invalid: " + requirement);
}

std::string show(float v) {
  if (std::isnan(v)) return "nan";
  return std::to_string(v);
}

}  // namespace

void SamplingParams::validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0f)
    reject("temperature", show(temperature), "must be a finite number >= 0 (0 = greedy)");
  if (top_k < 0) reject("top_k", std::to_string(top_k), "must be >= 0 (0 = off)");
  // Written as !(inside) so that NaN is rejected too.
  if (!(top_p > 0.0f && top_p <= 1.0f))
    reject("top_p", show(top_p), "must be in (0, 1] (1 = off)");
  if (!(min_p >= 0.0f && min_p <= 1.0f))
    reject("min_p", show(min_p), "must be in [0, 1] (0 = off)");
  if (!std::isfinite(repeat_penalty) || repeat_penalty <= 0.0f)
    reject("repeat_penalty", show(repeat_penalty), "must be a finite number > 0 (1 = off)");
  if (repeat_last_n < -1)
    reject("repeat_last_n", std::to_string(repeat_last_n),
           "must be >= -1 (-1 = whole context, 0 = off)");
  if (!std::isfinite(frequency_penalty))
    reject("frequency_penalty", show(frequency_penalty), "must be a finite number");
  if (!std::isfinite(presence_penalty))
    reject("presence_penalty", show(presence_penalty), "must be a finite number");
  for (const auto& [token, bias] : logit_bias) {
    if (token < 0) reject("logit_bias", std::to_string(token), "token ids must be >= 0");
    if (!(bias >= -100.0f && bias <= 100.0f))
      reject("logit_bias", show(bias), "biases must be in [-100, 100]");
  }
}

}  // namespace fdl
