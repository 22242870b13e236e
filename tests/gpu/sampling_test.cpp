// Sampling on the GPU (kernels.h: sample_rows; CudaModel::forward_sample) against the host
// Sampler (flashdllm/sampling.h).
//
// The kernel walks the survivors in id order, so for a draw u it must return the token whose
// interval of the host distribution's cumulative sum, laid out in id order, holds u. Placing u
// at the middle of every survivor's interval then checks the survivor set and every
// probability at once (a missing, extra or misweighted token moves the intervals); a u at an
// interval's edge may fall either way within rounding, so the middles are used, and tokens
// whose interval is narrower than the rounding are checked only for membership.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <vector>

#include "decode/draw_arithmetic.h"
#include "engine/engine_test_support.h"
#include "flashdllm/grammar.h"
#include "flashdllm/sampling.h"
#include "gpu/gpu_test_util.h"

namespace fdl::test {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

cuda::RowSamplingDev dev(const SamplingParams& p, double u) {
  const RowSampling r = Sampler::row_sampling(p, u);
  return cuda::RowSamplingDev{r.temperature,    r.top_k,
                              r.top_p,          r.min_p,
                              r.uniform,        r.repeat_penalty,
                              r.frequency_penalty, r.presence_penalty,
                              0};
}

// Runs the kernel on `row` once per uniform (one kernel row each).
std::vector<int32_t> gpu_draws(const std::vector<float>& row, const SamplingParams& p, const std::vector<double>& us) {
  std::vector<float> rows;
  std::vector<cuda::RowSamplingDev> params;
  for (double u : us) {
    rows.insert(rows.end(), row.begin(), row.end());
    params.push_back(dev(p, u));
  }
  auto d_rows = to_device(rows);
  auto d_params = to_device(params);
  cuda::DeviceBuffer<int32_t> d_ids(us.size());
  poison(d_ids);
  cuda::sample_rows(d_rows.get(), int(us.size()), int(row.size()), d_params.get(), d_ids.get(), nullptr);
  FDL_CUDA_CHECK(cudaGetLastError());
  return to_host(d_ids, us.size());
}

struct Interval {
  int32_t id;
  double lo, hi;
};
// The host distribution's survivors in id order, with their cumulative intervals.
std::vector<Interval> host_intervals(const std::vector<float>& row, const SamplingParams& p) {
  Sampler s(p, int32_t(row.size()));
  auto dist = s.distribution(row);
  std::sort(dist.begin(), dist.end(), [](const TokenProb& a, const TokenProb& b) { return a.id < b.id; });
  std::vector<Interval> out;
  double c = 0.0;
  for (const auto& t : dist) {
    out.push_back({t.id, c, c + double(t.prob)});
    c += double(t.prob);
  }
  return out;
}

// Checks the kernel against the host distribution for one row and parameter set.
void expect_same_distribution(const std::vector<float>& row, const SamplingParams& p, const std::string& what) {
  const auto iv = host_intervals(row, p);
  ASSERT_FALSE(iv.empty());
  // Middles of the widest intervals (at most 400 kernel rows), plus random uniforms.
  std::vector<size_t> order(iv.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return iv[a].hi - iv[a].lo > iv[b].hi - iv[b].lo; });
  order.resize(std::min<size_t>(order.size(), 300));
  constexpr double kEdge = 2e-5;  // float probabilities
  std::vector<double> us;
  std::vector<int32_t> want;
  for (size_t i : order)
    if (iv[i].hi - iv[i].lo > 2 * kEdge) {
      us.push_back(0.5 * (iv[i].lo + iv[i].hi));
      want.push_back(iv[i].id);
    }
  const size_t n_mid = us.size();
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int i = 0; i < 100; ++i) us.push_back(u01(rng()));
  us.push_back(0.0);
  us.push_back(std::nextafter(1.0, 0.0));
  const auto got = gpu_draws(row, p, us);
  std::map<int32_t, Interval> by_id;
  for (const auto& v : iv) by_id[v.id] = v;
  for (size_t i = 0; i < us.size(); ++i) {
    const auto it = by_id.find(got[i]);
    ASSERT_NE(it, by_id.end()) << what << ": u = " << us[i] << " drew " << got[i] << ", not a host survivor";
    if (i < n_mid) {
      EXPECT_EQ(got[i], want[i]) << what << ": the middle of token " << want[i] << "'s interval";
    } else {
      EXPECT_GE(us[i], it->second.lo - kEdge) << what << ": u = " << us[i] << " drew " << got[i];
      EXPECT_LE(us[i], it->second.hi + kEdge) << what << ": u = " << us[i] << " drew " << got[i];
    }
  }
}

std::vector<SamplingParams> parameter_sets() {
  std::vector<SamplingParams> out;
  auto add = [&](float t, int k, float top_p, float min_p) {
    SamplingParams p;
    p.temperature = t;
    p.top_k = k;
    p.top_p = top_p;
    p.min_p = min_p;
    out.push_back(p);
  };
  add(1.0f, 0, 1.0f, 0.0f);    // temperature only
  add(0.6f, 0, 1.0f, 0.0f);
  add(0.8f, 40, 1.0f, 0.0f);   // top-k
  add(1.0f, 0, 0.9f, 0.0f);    // top-p alone
  add(1.3f, 0, 1.0f, 0.05f);   // min-p alone
  add(0.8f, 40, 0.95f, 0.05f); // llama.cpp's defaults
  add(0.7f, 3, 0.5f, 0.0f);    // top-p cuts inside top-k
  add(2.0f, 1000, 0.99f, 0.0f);
  add(1e-30f, 0, 1.0f, 0.0f);  // tiny temperature: all mass on the argmax
  add(1.0f, 0, 0.95f, 0.05f);  // top-p and min-p without top-k: min-p may bound the list first
  add(1.0f, 0, 0.5f, 0.3f);
  return out;
}

TEST(GpuSampling, DrawsFromTheHostSamplersDistribution) {
  FDL_SKIP_WITHOUT_GPU();
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const int n : {5, 1000, 32003, 128256}) {
    std::vector<float> row(static_cast<size_t>(n));
    for (float& v : row) v = normal(rng());
    if (n > 100) {
      for (int i = 0; i < n / 50; ++i) row[size_t(rng()() % uint64_t(n))] = kNegInf;  // masked tokens
      // ties, also at the top (the lowest id must win at a cut)
      const float top = *std::max_element(row.begin(), row.end());
      for (int i = 0; i < 6; ++i) row[size_t(rng()() % uint64_t(n))] = top + 0.5f;
      for (int i = 0; i < 60; ++i) row[size_t(rng()() % uint64_t(n))] = top - 1.0f;
    }
    for (const SamplingParams& p : parameter_sets())
      expect_same_distribution(row, p,
                               "n " + std::to_string(n) + ", t " + std::to_string(p.temperature) + ", k " +
                                   std::to_string(p.top_k) + ", p " + std::to_string(p.top_p) + ", min_p " +
                                   std::to_string(p.min_p));
  }
}

// The uniforms at the exact edges of the draw's integer intervals (decode/draw_arithmetic.h):
// C_i / total for the running mass C_i of the survivors in id order, and its neighbours.
std::vector<double> edge_uniforms(const std::vector<float>& row, const SamplingParams& p, size_t most) {
  Sampler s(p, int32_t(row.size()));
  auto dist = s.distribution(row);
  std::sort(dist.begin(), dist.end(), [](const TokenProb& a, const TokenProb& b) { return a.id < b.id; });
  const float top = *std::max_element(row.begin(), row.end());
  std::vector<draw::Mass> running;
  draw::Mass c = 0;
  for (const TokenProb& t : dist) running.push_back(c += draw::to_mass(draw::tempered(row[size_t(t.id)], top, p.temperature)));
  std::vector<double> us;
  for (size_t i = 0; i < running.size() && us.size() < most; ++i) {
    const double u = double(running[i]) / double(c);
    for (const double v : {u, std::nextafter(u, 0.0), std::nextafter(u, 2.0)})
      if (v < 1.0) us.push_back(v);
  }
  return us;
}

// The same arithmetic on both sides (decode/draw_arithmetic.h): the kernel returns the host's
// token for random uniforms and at the exact edges of the intervals — what makes a seeded
// request's text independent of where its steps are sampled (host for speculative
// verification, device otherwise).
TEST(GpuSampling, DrawsTheHostSamplersToken) {
  FDL_SKIP_WITHOUT_GPU();
  std::normal_distribution<float> normal(0.0f, 3.0f), narrow(0.0f, 0.2f);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (const int n : {7, 1000, 32003, 128256}) {
    for (const bool flat : {false, true}) {
      std::vector<float> row(static_cast<size_t>(n));
      for (float& v : row) v = flat ? narrow(rng()) : normal(rng());
      if (n > 100)
        for (int i = 0; i < n / 50; ++i) row[size_t(rng()() % uint64_t(n))] = kNegInf;
      for (const SamplingParams& p : parameter_sets()) {
        // Random uniforms, and the exact edges of the intervals (where a rounded running sum
        // would tip the draw to a neighbour).
        std::vector<double> us = {0.0, std::nextafter(1.0, 0.0)};
        for (int i = 0; i < 150; ++i) us.push_back(u01(rng()));
        for (const double u : edge_uniforms(row, p, 300)) us.push_back(u);
        const auto got = gpu_draws(row, p, us);
        Sampler host(p, n);
        for (size_t i = 0; i < us.size(); ++i)
          ASSERT_EQ(got[i], host.sample_with_uniform(row, us[i]))
              << "n " << n << (flat ? " flat" : "") << ", t " << p.temperature << ", k " << p.top_k << ", p "
              << p.top_p << ", min_p " << p.min_p << ", u " << us[i];
      }
    }
  }
}

TEST(GpuSampling, RowsWithMoreCandidatesThanSharedMemoryCutOverTheWholeRow) {
  FDL_SKIP_WITHOUT_GPU();
  // A flat row: every logit within ~1 nat of the maximum, so the bound of each cut holds far
  // more than the 4096 candidates shared memory takes, and the exact cuts run in global memory.
  std::normal_distribution<float> narrow(0.0f, 0.2f);
  std::vector<float> row(128256);
  for (float& v : row) v = narrow(rng());
  row[99] = kNegInf;
  auto add = [](float t, int k, float top_p, float min_p) {
    SamplingParams p;
    p.temperature = t, p.top_k = k, p.top_p = top_p, p.min_p = min_p;
    return p;
  };
  for (const SamplingParams& p : {add(1.0f, 0, 0.9f, 0.0f), add(0.8f, 5000, 1.0f, 0.0f), add(1.0f, 0, 0.9f, 0.05f),
                                  add(1.0f, 6000, 0.5f, 0.0f)})
    expect_same_distribution(row, p,
                             "flat row, k " + std::to_string(p.top_k) + ", p " + std::to_string(p.top_p) +
                                 ", min_p " + std::to_string(p.min_p));
}

TEST(GpuSampling, TopKAtTiesKeepsTheLowestIds) {
  FDL_SKIP_WITHOUT_GPU();
  // Ten tokens tied at the top: top-k 4 keeps ids 3, 10, 20, 30 (the four lowest), equally.
  std::vector<float> row(64, 0.0f);
  for (int id : {3, 10, 20, 30, 40, 41, 50, 51, 60, 63}) row[size_t(id)] = 5.0f;
  SamplingParams p;
  p.top_k = 4;
  const auto got = gpu_draws(row, p, {0.1, 0.3, 0.6, 0.9});
  EXPECT_EQ(got, (std::vector<int32_t>{3, 10, 20, 30}));
  expect_same_distribution(row, p, "ties at the top-k cut");
  p.top_k = 0;
  p.top_p = 0.35f;  // 4 of the 10 tied tokens reach 0.35 of (almost all) the mass
  expect_same_distribution(row, p, "ties at the top-p cut");
}

TEST(GpuSampling, GreedyAndMalformedRows) {
  FDL_SKIP_WITHOUT_GPU();
  SamplingParams g;
  g.temperature = 0.0f;
  const float lowest = std::numeric_limits<float>::lowest();
  EXPECT_EQ(gpu_draws({0.f, 3.f, 1.f, 3.f}, g, {0.5})[0], 1);  // lowest id on ties
  EXPECT_EQ(gpu_draws({kNegInf, lowest, lowest}, g, {0.5})[0], 1);
  SamplingParams p;
  for (const SamplingParams& q : {g, p}) {
    EXPECT_EQ(gpu_draws({0.f, std::nanf(""), 1.f}, q, {0.5})[0], -1);
    EXPECT_EQ(gpu_draws({0.f, std::numeric_limits<float>::infinity()}, q, {0.5})[0], -1);
    EXPECT_EQ(gpu_draws({kNegInf, kNegInf, kNegInf}, q, {0.5})[0], -1);
  }
  // -Inf tokens are never drawn, however u falls.
  const auto got = gpu_draws({kNegInf, 1.f, kNegInf, 1.f, kNegInf}, p, {0.0, 0.49, 0.51, std::nextafter(1.0, 0.0)});
  EXPECT_EQ(got, (std::vector<int32_t>{1, 1, 3, 3}));
}

TEST(GpuSampling, PenaltiesEqualTheHostSamplersBitForBit) {
  FDL_SKIP_WITHOUT_GPU();
  const int n = 3001;
  std::vector<float> row = random_floats(size_t(n), -4.f, 4.f);
  row[7] = 0.0f;  // the boundary between divided and multiplied
  SamplingParams p;
  p.repeat_penalty = 1.37f;
  p.frequency_penalty = 0.21f;
  p.presence_penalty = 0.9f;
  p.repeat_last_n = 40;
  Sampler host(p, n);
  std::uniform_int_distribution<int32_t> tok(0, 60);  // repeats within the window
  for (int i = 0; i < 100; ++i) host.accept(i == 50 ? 7 : tok(rng()));
  std::vector<PenaltyToken> pens;
  host.append_penalty_tokens(0, pens);
  ASSERT_FALSE(pens.empty());
  const auto want = host.penalized_logits(row);
  std::vector<cuda::PenaltyTokenDev> dp;
  for (const auto& t : pens) dp.push_back({t.row, t.token, t.count});
  auto d_row = to_device(row);
  auto d_pen = to_device(dp);
  auto d_params = to_device(std::vector<cuda::RowSamplingDev>{dev(p, 0.5)});
  cuda::apply_penalties(d_row.get(), n, d_pen.get(), int(dp.size()), d_params.get(), nullptr);
  FDL_CUDA_CHECK(cudaGetLastError());
  const auto got = to_host(d_row, size_t(n));
  for (int i = 0; i < n; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << "token " << i;
  // Extreme but valid penalties saturate at +-FLT_MAX on both sides (never Inf / NaN), and
  // non-finite logits pass through unchanged.
  SamplingParams x = p;
  x.repeat_penalty = 1e-38f;
  x.frequency_penalty = -1e38f;
  std::vector<float> row2 = random_floats(size_t(n), -50.f, 50.f);
  row2[size_t(pens[0].token)] = kNegInf;
  std::vector<float> want2 = row2;
  for (const auto& t : pens)
    want2[size_t(t.token)] = penalize_logit(row2[size_t(t.token)], t.count, x.repeat_penalty, x.frequency_penalty,
                                            x.presence_penalty);
  auto d_row2 = to_device(row2);
  auto d_params2 = to_device(std::vector<cuda::RowSamplingDev>{dev(x, 0.5)});
  cuda::apply_penalties(d_row2.get(), n, d_pen.get(), int(dp.size()), d_params2.get(), nullptr);
  FDL_CUDA_CHECK(cudaGetLastError());
  const auto got2 = to_host(d_row2, size_t(n));
  for (int i = 0; i < n; ++i) ASSERT_EQ(got2[size_t(i)], want2[size_t(i)]) << "token " << i << " (extreme)";
  EXPECT_EQ(got2[size_t(pens[0].token)], kNegInf);
}

TEST(GpuSampling, TokenMasksSetTheDisallowedLogitsToMinusInf) {
  FDL_SKIP_WITHOUT_GPU();
  const int n = 3001, rows = 3;  // a vocabulary that ends inside a 64-bit word
  const std::vector<float> logits = random_floats(size_t(rows) * size_t(n), -4.f, 4.f);
  const size_t wpr = TokenMasks::words_per_row(n);
  std::vector<uint64_t> words(2 * wpr, 0);
  std::uniform_int_distribution<uint64_t> bits;
  for (size_t w = 0; w < wpr; ++w) words[w] = bits(rng());
  words[wpr + 3] = 1u;  // the second mask allows token 192 alone
  words[wpr - 1] |= ~uint64_t(0);  // bits past the vocabulary are ignored
  const std::vector<int32_t> masked_rows{2, 0}, which{0, 1};
  auto d_logits = to_device(logits);
  auto d_rows = to_device(masked_rows);
  auto d_which = to_device(which);
  auto d_words = to_device(words);
  cuda::apply_token_masks(d_logits.get(), n, d_rows.get(), d_which.get(),
                          reinterpret_cast<const uint32_t*>(d_words.get()), int(masked_rows.size()), nullptr);
  FDL_CUDA_CHECK(cudaGetLastError());
  const auto got = to_host(d_logits, logits.size());
  for (int r = 0; r < rows; ++r) {
    const uint64_t* mask = r == 2 ? words.data() : r == 0 ? words.data() + wpr : nullptr;
    for (int t = 0; t < n; ++t) {
      const float was = logits[size_t(r) * size_t(n) + size_t(t)];
      const bool keep = mask == nullptr || ((mask[size_t(t) / 64] >> (size_t(t) % 64)) & 1u);
      ASSERT_EQ(got[size_t(r) * size_t(n) + size_t(t)], keep ? was : kNegInf) << "row " << r << " token " << t;
    }
  }
}

// A CudaModel seen only through Model's interface with forward_sample left at the default
// (forward, then the host sampler): the engine then takes its logits path.
class HostSamplingModel final : public Model {
 public:
  explicit HostSamplingModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  const GgufFile& gguf() const override { return inner_.gguf(); }
  KvShape kv_shape(int block_size) const override { return inner_.kv_shape(block_size); }
  int n_threads() const override { return inner_.n_threads(); }
  void forward(const StepBatch& b, KvCache& kv, std::vector<float>& logits) override { inner_.forward(b, kv, logits); }

 private:
  Model& inner_;
};

TEST(GpuSampling, EngineSamplesOnTheDeviceLikeTheHost) {
  FDL_SKIP_WITHOUT_GPU();
  // Temperature-only draws walk the same order on both sides: with the same seeds the ids-only
  // engine path (sampling on the GPU) must produce the host path's tokens on the same logits.
  for (const std::string file : {"stories260K.gguf", "codelm-16m-f16.gguf"}) {
    SCOPED_TRACE(file);
    const LoadedModel m = load_model(model_path(file), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
    ASSERT_TRUE(m.model->prefers_device_sampling());
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r = sampled_request({1, int32_t(100 + 9 * i), int32_t(200 + i)}, 40, uint64_t(5 + i));
      r.sampling.top_k = 0;
      r.sampling.top_p = 1.0f;
      r.sampling.temperature = 0.6f + 0.3f * float(i);
      reqs.push_back(r);
    }
    Generator device_path = make_generator(m);
    HostSamplingModel host(*m.model);
    Generator host_path(host, *m.tokenizer, {});
    const auto a = device_path.generate(reqs);
    const auto b = host_path.generate(reqs);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].generated_ids, b[i].generated_ids) << "request " << i;
    // Penalties go to the device as the window's tokens: the same tokens again, greedy and
    // temperature-only.
    std::vector<GenerationRequest> pen = reqs;
    pen[0].sampling.repeat_penalty = 1.3f;
    pen[1].sampling.frequency_penalty = 0.5f;
    pen[2].sampling.presence_penalty = 0.7f, pen[2].sampling.repeat_last_n = 6;
    pen.push_back(greedy_request({1, 100, 200, 100}, 40));
    pen.back().sampling.repeat_penalty = 1.2f, pen.back().sampling.presence_penalty = 0.3f;
    const auto pa = device_path.generate(pen);
    const auto pb = host_path.generate(pen);
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].generated_ids, pb[i].generated_ids) << "penalized request " << i;
    // With llama.cpp's default cuts the device and the host both walk the survivors in id
    // order: the same tokens again, so a seeded request does not depend on whether its steps
    // sample on the GPU or copy logits (e.g. next to a request that wants logprobs).
    for (auto& r : reqs) r.sampling.top_k = 40, r.sampling.top_p = 0.95f, r.sampling.min_p = 0.05f;
    const auto ca = device_path.generate(reqs);
    const auto cb = host_path.generate(reqs);
    for (size_t i = 0; i < ca.size(); ++i) EXPECT_EQ(ca[i].generated_ids, cb[i].generated_ids) << "cut request " << i;
    GenerationRequest lp = greedy_request({1, 42, 43}, 40);
    lp.logprobs = 2;
    EXPECT_EQ(device_path.generate({reqs[0], lp}).at(0).generated_ids, ca[0].generated_ids);
  }
}

// A grammar's masks go up with the step and the draws stay on the GPU, forced drafts
// included: the host path's tokens (HostSamplingModel copies every row and masks it there).
TEST(GpuSampling, GrammarMasksOnTheDeviceGiveTheHostPathsTokens) {
  FDL_SKIP_WITHOUT_GPU();
  const LoadedModel m =
      load_model(model_path("codelm-16m-f16.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  const auto g = Grammar::compile(
      R"(root ::= "{\"name\": \"" [a-zA-Z ]{1,20} "\", \"age\": " [1-9] [0-9]? ", \"city\": \"" [a-zA-Z ]{1,20} "\"}")");
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.prompt_ids = m.tokenizer->encode(i % 2 ? "# a person\nperson = " : "# record " + std::to_string(i) + "\nr = ", true);
    r.max_new_tokens = 120;
    r.sampling.temperature = i < 3 ? 0.0f : 0.8f;
    r.sampling.seed = uint64_t(3 + i);
    r.spec_window = i < 3 ? -1 : 0;  // the sampled one without forced drafts: it draws on the device too
    r.grammar = g;
    reqs.push_back(r);
  }
  Generator device_path = make_generator(m, GeneratorOptions{.max_sequences = 8});
  HostSamplingModel host(*m.model);
  Generator host_path(host, *m.tokenizer, GeneratorOptions{.max_sequences = 8});
  const auto a = device_path.generate(reqs);
  const auto b = host_path.generate(reqs);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].generated_ids, b[i].generated_ids) << "request " << i << ": " << a[i].text << " / " << b[i].text;
    EXPECT_EQ(a[i].finish_reason, "stop") << a[i].text;
    GrammarMatcher check(g);
    EXPECT_TRUE(check.accept_bytes(a[i].text) && check.can_end()) << a[i].text;
  }
  EXPECT_GT(device_path.spec_metrics().forced_accepted, 0);
}

}  // namespace
}  // namespace fdl::test
