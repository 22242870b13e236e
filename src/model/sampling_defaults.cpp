// general.sampling.* keys as sampling defaults (sampling_defaults.h).
#include "model/sampling_defaults.h"

#include <cmath>
#include <cstdint>
#include <string>

#include "flashdllm/model.h"

namespace fdl {
namespace {

std::optional<double> number(const GgufFile& f, const char* key, double lo, double hi, bool lo_open) {
  if (!f.find(key)) return std::nullopt;
  double v = 0;
  try {
    v = f.get_float(key);
  } catch (const GgufError& e) {
    throw ModelError(f.path() + ": metadata key '" + key + "' must be a number: " + e.what());
  }
  if (!std::isfinite(v) || v > hi || v < lo || (lo_open && v == lo))
    throw ModelError(f.path() + ": metadata key '" + key + "' = " + std::to_string(v) + " is out of range (" +
                     (lo_open ? "(" : "[") + std::to_string(lo) + ", " + std::to_string(hi) + "])");
  return v;
}

}  // namespace

ModelSamplingDefaults model_sampling_defaults(const GgufFile& f) {
  ModelSamplingDefaults d;
  if (auto v = number(f, "general.sampling.temp", 0, 1e6, false)) d.temperature = float(*v);
  if (f.find("general.sampling.top_k")) {
    int64_t k = 0;
    try {
      k = f.get_int_or("general.sampling.top_k", 0);
    } catch (const GgufError& e) {
      throw ModelError(f.path() + ": metadata key 'general.sampling.top_k' must be an integer: " + e.what());
    }
    if (k < 0 || k > int64_t(INT32_MAX))
      throw ModelError(f.path() + ": metadata key 'general.sampling.top_k' = " + std::to_string(k) + " is out of range");
    d.top_k = int32_t(k);
  }
  if (auto v = number(f, "general.sampling.top_p", 0, 1, true)) d.top_p = float(*v);
  if (auto v = number(f, "general.sampling.min_p", 0, 1, false)) d.min_p = float(*v);
  if (auto v = number(f, "general.sampling.penalty_repeat", 0, 1e6, true)) d.repeat_penalty = float(*v);
  return d;
}

SamplingParams with_model_defaults(SamplingParams p, const ModelSamplingDefaults& d) {
  if (d.temperature) p.temperature = *d.temperature;
  if (d.top_k) p.top_k = *d.top_k;
  if (d.top_p) p.top_p = *d.top_p;
  if (d.min_p) p.min_p = *d.min_p;
  if (d.repeat_penalty) p.repeat_penalty = *d.repeat_penalty;
  return p;
}

}  // namespace fdl
