// The per-family fixtures of tests/data/families (scripts/make_family_fixtures.py): tiny
// random models made with Hugging Face Transformers, as a HF directory and as the GGUF
// llama.cpp's convert_hf_to_gguf.py writes, with HF's float32 logits and greedy ids on 8
// prompts (and llama.cpp's on the GGUF, a second oracle). One comparison shared by the CPU and
// the CUDA tests, so both backends meet the same bounds.
//
// reference.json may also say the context its oracles ran with ("n_ctx", ModelOptions::n_ctx;
// absent: the model's own) and hold a second reference of the same layout for another context
// ("short_context": phi3-longrope's short RoPE factors, HF only).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/model_test_util.h"

namespace fdl::test {

/// The families the engine runs, each loaded from its HF directory and from its GGUF
/// (qwen2-yarn: qwen2 with YaRN RoPE scaling; phi3-longrope: phi3 with LongRoPE).
inline const std::vector<std::string>& supported_families() {
  static const std::vector<std::string> f{"llama",  "qwen2",  "qwen3",   "mistral",    "phi3",
                                          "gemma2", "gemma3", "mixtral", "qwen2-yarn", "phi3-longrope"};
  return f;
}

/// The fixture's name as a test name ('-' is not allowed there).
inline std::string test_name(std::string family) {
  for (char& c : family)
    if (c == '-') c = '_';
  return family;
}

inline std::filesystem::path family_dir(const std::string& family) {
  return test_data_dir() / "families" / family;
}

inline nlohmann::json family_reference(const std::string& family) {
  std::ifstream in(family_dir(family) / "reference.json");
  if (!in) throw std::runtime_error("cannot open " + (family_dir(family) / "reference.json").string());
  return nlohmann::json::parse(in);
}

/// general.architecture of the family's files: Mistral and Mixtral are `llama` files;
/// qwen2-yarn is qwen2, phi3-longrope phi3.
inline std::string expected_arch(const std::string& family) {
  if (family == "mistral" || family == "mixtral") return "llama";
  return family.substr(0, family.find('-'));
}

/// Whether llama.cpp's CPU run is an oracle as exact as Transformers: not for Gemma, whose GELU
/// llama.cpp takes from a float16 table (logits ~1e-2 of the range off; reference.json's checks).
inline bool llama_cpp_exact(const std::string& family) { return !family.starts_with("gemma"); }

/// Whether the fixture's GGUF lacks what its HF directory says, so only llama.cpp (which runs the
/// GGUF as written) is its oracle: llama.cpp's converter drops Mistral's sliding_window.
inline bool gguf_drops_window(const std::string& family) { return family == "mistral"; }

/// `src` copied to `dst` with uint32 metadata `keys` added (or replaced), tensors unchanged.
inline void copy_gguf_with_keys(const std::filesystem::path& src, const std::filesystem::path& dst,
                                const std::vector<std::pair<std::string, uint32_t>>& keys) {
  const GgufFile f = GgufFile::open(src);
  GgufWriter w(f.alignment());
  for (const auto& [k, v] : f.metadata()) w.set_value(k, v);
  for (const auto& [k, v] : keys) w.set_uint32(k, v);
  for (const GgufTensorInfo& t : f.tensors())
    w.add_tensor(t.name, t.type(), std::vector<uint64_t>(t.ne, t.ne + t.n_dims),
                 [&t](std::span<uint8_t> out) { std::copy_n(t.data, out.size(), out.begin()); });
  w.write(dst);
}

/// The fixture's GGUF saying what its HF directory says: for gguf_drops_window families, a copy
/// (in the scratch directory) with `llama.attention.sliding_window` put back.
inline std::filesystem::path fixture_gguf(const std::string& family) {
  const std::filesystem::path gguf = family_dir(family) / "model.gguf";
  if (!gguf_drops_window(family)) return gguf;
  std::ifstream config(family_dir(family) / "hf" / "config.json");
  const uint32_t window = nlohmann::json::parse(config).at("sliding_window").get<uint32_t>();
  const std::filesystem::path copy = scratch_dir() / (family + "-window.gguf");
  copy_gguf_with_keys(gguf, copy, {{"llama.attention.sliding_window", window}});
  return copy;
}

/// The context a reference (reference.json, or its short_context) was made for: the
/// ModelOptions::n_ctx to load the model with (0: the model's own).
inline int reference_n_ctx(const nlohmann::json& ref) { return ref.value("n_ctx", 0); }

struct FamilyCheck {
  double worst_logit_error = 0;  ///< max |ours - HF| / (HF logit range), over prompts
  int greedy_equal = 0, greedy_ties = 0, prompts = 0;
};

/// Runs every reference prompt through `m`: last-position logits against HF's, then 32 greedy
/// ids. A prompt whose first differing id comes where HF's top-2 margin is below `tie`
/// (relative to the logit range) counts as a tie, not a miss.
/// `oracle` names the reference outputs: "hf" (Transformers) or "llama_cpp" (llama.cpp on the GGUF).
inline FamilyCheck check_family(Model& m, const nlohmann::json& ref, const std::string& oracle = "hf",
                                double tie = 1e-3) {
  FamilyCheck r;
  const auto& prompts = ref.at("prompts");
  const auto& hf = ref.at(oracle);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto prompt = prompts[p].get<std::vector<int32_t>>();
    const auto want = hf.at("last_logits")[p].get<std::vector<double>>();
    const auto want_ids = hf.at("greedy")[p].get<std::vector<int32_t>>();
    const auto margin = hf.at("greedy_margin")[p].get<std::vector<double>>();
    auto pool = make_pool(m, prompt.size() + want_ids.size() + 1);
    KvCache kv(*pool);
    std::vector<std::vector<float>> steps;
    const auto got_ids = greedy_decode(m, kv, prompt, int(want_ids.size()), false, &steps);
    const auto [lo, hi] = std::minmax_element(want.begin(), want.end());
    const double range = *hi - *lo;
    double err = 0;
    for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::fabs(double(steps[0][i]) - want[i]));
    r.worst_logit_error = std::max(r.worst_logit_error, err / range);
    ++r.prompts;
    size_t same = 0;
    while (same < want_ids.size() && got_ids[same] == want_ids[same]) ++same;
    if (same == want_ids.size())
      ++r.greedy_equal;
    else if (margin[same] < tie * range)
      ++r.greedy_ties;
    else
      ADD_FAILURE() << "prompt " << p << ": greedy id " << same << " is " << got_ids[same] << ", " << oracle << " chose "
                    << want_ids[same] << " by a margin of " << margin[same];
  }
  return r;
}

/// The acceptance bounds: logits within 1e-3 of the range, greedy equal on >= 95% of the
/// prompts that are not ties.
inline void expect_matches_hf(const FamilyCheck& r, const std::string& what) {
  std::cout << "  " << what << ": logits max error " << r.worst_logit_error << " of the range, greedy equal on "
            << r.greedy_equal << " of " << r.prompts << " prompts (" << r.greedy_ties << " ties)\n";
  EXPECT_LE(r.worst_logit_error, 1e-3) << what;
  EXPECT_GE(double(r.greedy_equal), 0.95 * double(r.prompts - r.greedy_ties)) << what;
}

}  // namespace fdl::test
