// The CUDA model end to end: greedy ids equal the reference ids for every reference prompt
// (stories260K: llama.cpp; codelm-16m: HF fp32), logits close to the CPU model's (fp32
// prefill through SGEMM, F16 prefill through the tensor-core path), a mixed batch equal to
// separate runs, the batch-1 decode kernels equal to the chains they replace (and their
// profiling stamps in order), and a one-line error where no GPU is present.
#include <algorithm>
#include <limits>
#include <cstdlib>

#include "backend/cuda/cuda_model.h"
#include "backend/cuda/kernels.h"
#include "gpu/gpu_test_util.h"
#include "model/model_test_util.h"
#include "model/pipelined_decode_checks.h"
#include "model/tiny_llama_gguf.h"

namespace fdl::test {
namespace {

struct GreedyCase {
  std::string reference;
  std::string model;
  size_t index;
  bool batch_invariant = false;  // --batch-invariant on (the default) instead of off
};

class CudaGreedy : public ::testing::TestWithParam<GreedyCase> {};

TEST_P(CudaGreedy, MatchesReferenceIds) {
  FDL_SKIP_WITHOUT_GPU();
  const GreedyCase& gc = GetParam();
  const nlohmann::json ref = load_reference(gc.reference)[gc.index];
  const auto prompt = ref["prompt_token_ids"].get<std::vector<int32_t>>();
  const auto expected = ref["output_token_ids"].get<std::vector<int32_t>>();
  Model& m = cuda_model(gc.model, std::nullopt, gc.batch_invariant);
  ASSERT_EQ(m.batch_invariant(), gc.batch_invariant);
  auto pool = make_pool(m, prompt.size() + expected.size());
  KvCache kv(*pool);
  const std::vector<int32_t> got = greedy_decode(m, kv, prompt, int(expected.size()));
  const size_t binding = binding_prefix(ref);
  size_t same = 0;
  while (same < got.size() && same < expected.size() && got[same] == expected[same]) ++same;
  std::cout << "  " << same << " of " << expected.size() << " ids equal the reference (binding: " << binding << ")\n";
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < binding; ++i) ASSERT_EQ(got[i], expected[i]) << "first difference at output step " << i;
}

std::vector<GreedyCase> cases(const std::string& reference, const std::string& model, bool batch_invariant = false) {
  std::vector<GreedyCase> out;
  const size_t n = reference_case_count(reference);
  for (size_t i = 0; i < n; ++i) out.push_back({reference, model, i, batch_invariant});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stories260K, CudaGreedy,
                         ::testing::ValuesIn(cases("stories260K_greedy.json", "stories260K.gguf")),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });
INSTANTIATE_TEST_SUITE_P(CodeLm16M, CudaGreedy, ::testing::ValuesIn(cases("codelm_greedy.json", "codelm-16m-f16.gguf")),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });
INSTANTIATE_TEST_SUITE_P(CodeLm16MBatchInvariant, CudaGreedy,
                         ::testing::ValuesIn(cases("codelm_greedy.json", "codelm-16m-f16.gguf", true)),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });
INSTANTIATE_TEST_SUITE_P(CodeLm16MHfDirectory, CudaGreedy,
                         ::testing::ValuesIn(cases("codelm_greedy.json", "codelm-16m-hf")),
                         [](const auto& info) { return "case" + std::to_string(info.param.index); });

/// Logits of the last prompt token (one forward over the whole prompt), then of `extra`
/// decode steps feeding back the CPU's greedy choice, on both models.
double max_rel_error_vs_cpu(const std::string& file, const std::vector<int32_t>& prompt, int extra,
                            std::optional<KvDtype> kv = std::nullopt) {
  Model& gpu = cuda_model(file, kv);
  Model& cpu = shared_model(file, 2);
  auto pool_g = make_pool(gpu, prompt.size() + size_t(extra) + 1), pool_c = make_pool(cpu, prompt.size() + size_t(extra) + 1);
  KvCache kv_g(*pool_g), kv_c(*pool_c);
  std::vector<std::vector<float>> lg, lc;
  greedy_decode(cpu, kv_c, prompt, extra + 1, false, &lc);
  // Feed the GPU the CPU's ids so both see the same inputs even if an argmax differs.
  const SeqId seq = kv_g.create_sequence();
  StepBatch b;
  std::vector<float> logits;
  const size_t first = kv_g.append_slots(seq, prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(first + i), seq, i + 1 == prompt.size());
  gpu.forward(b, kv_g, logits);
  lg.push_back(logits);
  for (int s = 0; s < extra; ++s) {
    b.clear();
    b.add(argmax(lc[size_t(s)].data(), cpu.config().n_vocab), int32_t(kv_g.append_slots(seq, 1)), seq, true);
    gpu.forward(b, kv_g, logits);
    lg.push_back(logits);
  }
  double worst = 0;
  for (size_t s = 0; s < lg.size(); ++s)
    worst = std::max(worst, rel_error(lg[s], std::vector<double>(lc[s].begin(), lc[s].end())));
  return worst;
}

TEST(CudaModel, Fp32LogitsMatchCpuThroughPrefillGemmAndDecode) {
  FDL_SKIP_WITHOUT_GPU();
  const auto prompt = load_reference("stories260K_greedy.json")[6]["prompt_token_ids"].get<std::vector<int32_t>>();
  ASSERT_GT(prompt.size(), 16u);  // exercises the SGEMM path
  EXPECT_LT(max_rel_error_vs_cpu("stories260K.gguf", prompt, 20), 1e-5);
}

TEST(CudaModel, F16LogitsCloseToCpuThroughTensorCorePrefill) {
  FDL_SKIP_WITHOUT_GPU();
  std::vector<int32_t> prompt;
  std::uniform_int_distribution<int32_t> tok(1, 8191);
  for (int i = 0; i < 57; ++i) prompt.push_back(tok(rng()));
  // Prefill rounds activations to F16 for cuBLAS (see cuda_model.h); decode keeps fp32, and
  // so does an fp32 KV cache.
  EXPECT_LT(max_rel_error_vs_cpu("codelm-16m-f16.gguf", prompt, 10, KvDtype::F32), 3e-3);
  // The default cache of an F16 model holds K/V in fp16 (~2^-11 relative per element).
  const double f16_kv = max_rel_error_vs_cpu("codelm-16m-f16.gguf", prompt, 10);
  std::cout << "  fp16 KV cache: logits rel error " << f16_kv << "\n";
  EXPECT_LT(f16_kv, 3e-3);
  prompt.resize(9);  // GEMV path for the prompt too
  EXPECT_LT(max_rel_error_vs_cpu("codelm-16m-f16.gguf", prompt, 10, KvDtype::F32), 1e-5);
  const double f16_kv_gemv = max_rel_error_vs_cpu("codelm-16m-f16.gguf", prompt, 10);
  std::cout << "  fp16 KV cache, GEMV prompt: logits rel error " << f16_kv_gemv << "\n";
  EXPECT_GT(f16_kv_gemv, 0.0) << "the fp16 cache did not round anything";
  EXPECT_LT(f16_kv_gemv, 3e-3);
}

// --kv-cache-dtype: auto follows the weights (F16 model: f16; F32 model: f32), f32 is always
// allowed, a 16-bit type other than the weights' is refused with a one-line error, and the
// CPU model refuses a 16-bit cache; the pool's block bytes follow the dtype.
TEST(CudaModel, KvCacheDtypeFollowsTheWeightsAndRefusesOthers) {
  FDL_SKIP_WITHOUT_GPU();
  EXPECT_EQ(cuda_model("codelm-16m-f16.gguf").kv_shape(16).dtype, KvDtype::F16);
  EXPECT_EQ(cuda_model("codelm-16m-f16.gguf", KvDtype::F32).kv_shape(16).dtype, KvDtype::F32);
  EXPECT_EQ(cuda_model("stories260K.gguf").kv_shape(16).dtype, KvDtype::F32);
  EXPECT_EQ(cuda_model("codelm-16m-f16.gguf").kv_shape(16).block_bytes() * 2,
            cuda_model("codelm-16m-f16.gguf", KvDtype::F32).kv_shape(16).block_bytes());
  for (const auto& [file, kv] : {std::pair{"codelm-16m-f16.gguf", KvDtype::BF16}, {"stories260K.gguf", KvDtype::F16}}) {
    try {
      Model::load(model_path(file), ModelOptions{.device = Device::Cuda, .kv_dtype = kv, .batch_invariant = false});
      ADD_FAILURE() << file << " loaded with a " << kv_dtype_name(kv) << " cache";
    } catch (const ModelError& e) {
      EXPECT_NE(std::string(e.what()).find("--kv-cache-dtype"), std::string::npos) << e.what();
    }
  }
  // A pool of another dtype than the model's is refused before anything runs.
  Model& m = cuda_model("codelm-16m-f16.gguf");
  BlockPool pool(cuda_model("codelm-16m-f16.gguf", KvDtype::F32).kv_shape(16), 4);
  KvCache kv(pool);
  const SeqId s = kv.create_sequence();
  StepBatch b;
  b.add(1, int32_t(kv.append_slots(s, 1)), s, true);
  std::vector<float> logits;
  EXPECT_THROW(m.forward(b, kv, logits), std::invalid_argument);
}

TEST(CudaModel, TensorCorePrefillAttentionCloseToFp32Tiles) {
  FDL_SKIP_WITHOUT_GPU();
  // F16 weights: tensor cores by default; FLASHDLLM_ATTN_TC=0 (read by the constructor)
  // keeps the fp32 tiles.
  ::setenv("FLASHDLLM_ATTN_TC", "0", 1);
  // (An fp32 cache: a 16-bit one always runs its tiles on tensor cores.)
  std::unique_ptr<Model> fp32_model = Model::load(model_path("codelm-16m-f16.gguf"),
                                                  ModelOptions{.device = Device::Cuda, .kv_dtype = KvDtype::F32, .batch_invariant = false});
  ::unsetenv("FLASHDLLM_ATTN_TC");
  Model& fp32 = *fp32_model;
  Model& tc = cuda_model("codelm-16m-f16.gguf", KvDtype::F32);
  ASSERT_TRUE(cuda::attention_tiles_supported(fp32.config().head_dim, fp32.config().n_head, fp32.config().n_head_kv));
  std::vector<int32_t> prompt;
  std::uniform_int_distribution<int32_t> tok(1, 8191);
  for (int i = 0; i < 300; ++i) prompt.push_back(tok(rng()));  // several tiles and splits
  const std::vector<float> a = prefill_logits(tc, prompt), b = prefill_logits(fp32, prompt);
  const double err = rel_error(a, std::vector<double>(b.begin(), b.end()));
  std::cout << "  tensor-core vs fp32 tiles: logits rel error " << err << "\n";
  EXPECT_GT(err, 0.0) << "the tensor-core path did not run (identical logits)";
  EXPECT_LT(err, 1e-2);
}

TEST(CudaModel, BatchOneDecodeKernelsMatchTheKernelsTheyReplace) {
  FDL_SKIP_WITHOUT_GPU();
  // FLASHDLLM_ATTN_BLOCK=0 / FLASHDLLM_FFN_BLOCK=0 / FLASHDLLM_OUTPUT_BLOCK=0 (read by the
  // constructor) keep the kernel chains; the default model runs decode_attention_block,
  // decode_ffn_block and decode_output_block for one token. Both paths compute K/V equal to fp32 rounding (~1e-7); an fp32 cache keeps that, while
  // a 16-bit cache (codelm's default, fp16) rounds a few elements one fp16 step apart
  // (2^-11 relative), so its bound is looser.
  struct Case {
    std::string file, reference;
    std::optional<KvDtype> kv;
    double bound;
  };
  for (const Case& c : {Case{"stories260K.gguf", "stories260K_greedy.json", std::nullopt, 1e-5},
                        Case{"codelm-16m-f16.gguf", "codelm_greedy.json", KvDtype::F32, 1e-5},
                        Case{"codelm-16m-f16.gguf", "codelm_greedy.json", std::nullopt, 1e-3}}) {
    ::setenv("FLASHDLLM_ATTN_BLOCK", "0", 1);
    ::setenv("FLASHDLLM_FFN_BLOCK", "0", 1);
    ::setenv("FLASHDLLM_OUTPUT_BLOCK", "0", 1);
    std::unique_ptr<Model> chain =
        Model::load(model_path(c.file), ModelOptions{.device = Device::Cuda, .kv_dtype = c.kv, .batch_invariant = false});
    ::unsetenv("FLASHDLLM_ATTN_BLOCK");
    ::unsetenv("FLASHDLLM_FFN_BLOCK");
    ::unsetenv("FLASHDLLM_OUTPUT_BLOCK");
    Model& blocks = cuda_model(c.file, c.kv);
    const std::string what = c.file + " KV " + kv_dtype_name(blocks.kv_shape(16).dtype);
    const auto prompt = load_reference(c.reference)[0]["prompt_token_ids"].get<std::vector<int32_t>>();
    const int steps = 40;
    auto pool_a = make_pool(blocks, prompt.size() + steps), pool_b = make_pool(*chain, prompt.size() + steps);
    KvCache kv_a(*pool_a), kv_b(*pool_b);
    std::vector<std::vector<float>> la, lb;
    const auto ids_a = greedy_decode(blocks, kv_a, prompt, steps, false, &la);
    const auto ids_b = greedy_decode(*chain, kv_b, prompt, steps, false, &lb);
    size_t same = 0;  // logits are comparable while both saw the same ids
    while (same < ids_a.size() && ids_a[same] == ids_b[same]) ++same;
    EXPECT_GE(same, size_t(20)) << what;
    double worst = 0;
    for (size_t s = 0; s <= std::min(same, ids_a.size() - 1); ++s)
      worst = std::max(worst, rel_error(la[s], std::vector<double>(lb[s].begin(), lb[s].end())));
    std::cout << "  " << what << ": worst logits rel error " << worst << "\n";
    EXPECT_LT(worst, c.bound) << what;
  }
}

// FLASHDLLM_DECODE_TRACE=1 (bench_gpu --trace): tracing changes no greedy id; after a clear,
// one decode step has every block of both persistent kernels stamp every phase edge, in
// program order, and no kernel passes its PDL wait before the previous kernel's last block
// has ended (the stamps are one global clock). Without the variable: nothing is recorded.
TEST(CudaModel, DecodeTraceStampsEveryPhaseInOrder) {
  FDL_SKIP_WITHOUT_GPU();
  const char* before = std::getenv("FLASHDLLM_DECODE_TRACE");
  const std::string saved = before ? before : "";
  ::setenv("FLASHDLLM_DECODE_TRACE", "1", 1);
  // The persistent kernels run on the fast path only.
  const ModelOptions fast{.device = Device::Cuda, .batch_invariant = false};
  std::unique_ptr<Model> traced = Model::load(model_path("codelm-16m-f16.gguf"), fast);
  ::unsetenv("FLASHDLLM_DECODE_TRACE");
  std::unique_ptr<Model> plain = Model::load(model_path("codelm-16m-f16.gguf"), fast);
  if (before) ::setenv("FLASHDLLM_DECODE_TRACE", saved.c_str(), 1);
  auto& traced_cuda = dynamic_cast<cuda::CudaModel&>(*traced);
  const std::vector<int32_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17};
  auto pool = make_pool(*traced, prompt.size() + 8), pool_plain = make_pool(*plain, prompt.size() + 8);
  KvCache kv(*pool), kv_plain(*pool_plain);
  // Tracing changes no result: the same greedy ids as the model without it.
  const auto ids = greedy_decode(*traced, kv, prompt, 6);
  EXPECT_EQ(ids, greedy_decode(*plain, kv_plain, prompt, 6));
  // A prefill (the persistent kernels do not run for it), a clear, then one decode step:
  // every stamp checked below comes from that step.
  const SeqId seq = kv.create_sequence();
  StepBatch step;
  std::vector<int32_t> next;
  const size_t first = kv.append_slots(seq, prompt.size());
  for (size_t i = 0; i < prompt.size(); ++i) step.add(prompt[i], int32_t(first + i), seq, i + 1 == prompt.size());
  traced->forward_argmax(step, kv, next);
  traced_cuda.clear_decode_trace();
  step.clear();
  step.add(next.at(0), int32_t(kv.append_slots(seq, 1)), seq, true);
  traced->forward_argmax(step, kv, next);
  const auto t = traced_cuda.decode_trace();
  ASSERT_EQ(t.n_layer, traced->config().n_layer);
  ASSERT_GT(t.attn_blocks, 0) << "the persistent attention kernel did not run";
  ASSERT_GT(t.ffn_blocks, 0) << "the persistent FFN kernel did not run";
  ASSERT_EQ(t.attn_events, int(cuda::kAttnTraceEvents));
  ASSERT_EQ(t.ffn_events, int(cuda::kFfnTraceEvents));
  auto at = [](const std::vector<uint64_t>& v, int l, int e, int events, int blocks, int b) {
    return v[(size_t(l) * size_t(events) + size_t(e)) * size_t(blocks) + size_t(b)];
  };
  auto last = [&](const std::vector<uint64_t>& v, int l, int e, int events, int blocks) {
    uint64_t m = 0;
    for (int b = 0; b < blocks; ++b) m = std::max(m, at(v, l, e, events, blocks, b));
    return m;
  };
  for (int l = 0; l < t.n_layer; ++l) {
    for (int b = 0; b < t.attn_blocks; ++b)
      for (int e = 0; e < t.attn_events; ++e) {
        ASSERT_NE(at(t.attn, l, e, t.attn_events, t.attn_blocks, b), 0u) << "layer " << l << " block " << b << " event " << e;
        if (e > 0) {
          ASSERT_GE(at(t.attn, l, e, t.attn_events, t.attn_blocks, b), at(t.attn, l, e - 1, t.attn_events, t.attn_blocks, b))
              << "layer " << l << " block " << b << " event " << e;
        }
      }
    for (int b = 0; b < t.ffn_blocks; ++b) {
      for (int e = 0; e < t.ffn_events; ++e) {
        ASSERT_NE(at(t.ffn, l, e, t.ffn_events, t.ffn_blocks, b), 0u) << "layer " << l << " block " << b << " event " << e;
        if (e > 0) {
          ASSERT_GE(at(t.ffn, l, e, t.ffn_events, t.ffn_blocks, b), at(t.ffn, l, e - 1, t.ffn_events, t.ffn_blocks, b))
              << "layer " << l << " block " << b << " event " << e;
        }
      }
      ASSERT_GE(at(t.ffn, l, cuda::kFfnAfterPdlWait, t.ffn_events, t.ffn_blocks, b),
                last(t.attn, l, cuda::kAttnEnd, t.attn_events, t.attn_blocks))
          << "layer " << l << ": an FFN block passed its wait before the attention kernel ended";
    }
    for (int b = 0; l > 0 && b < t.attn_blocks; ++b) {
      ASSERT_GE(at(t.attn, l, cuda::kAttnAfterPdlWait, t.attn_events, t.attn_blocks, b),
                last(t.ffn, l - 1, cuda::kFfnEnd, t.ffn_events, t.ffn_blocks))
          << "layer " << l << ": an attention block passed its wait before the previous FFN kernel ended";
    }
  }
  // A model loaded without the variable records nothing.
  EXPECT_TRUE(dynamic_cast<cuda::CudaModel&>(*plain).decode_trace().attn.empty());
}

TEST(CudaModel, MixedBatchOfPrefillAndDecodeEqualsSeparateRuns) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("codelm-16m-f16.gguf");
  const int V = m.config().n_vocab;
  const std::vector<int32_t> a = {791, 1529, 369, 515, 199, 473, 12}, bp = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  // Separate: a's prompt; b's prompt then one decode token.
  auto pool = make_pool(m, 64);
  KvCache kv(*pool);
  std::vector<float> la, lb, tmp;
  const SeqId sa = kv.create_sequence(), sb = kv.create_sequence();
  StepBatch batch;
  size_t f = kv.append_slots(sb, bp.size());
  for (size_t i = 0; i < bp.size(); ++i) batch.add(bp[i], int32_t(f + i), sb, false);
  m.forward(batch, kv, tmp);
  EXPECT_TRUE(tmp.empty());
  // One batch: a's whole prompt (logits at its last two tokens) + b's decode token.
  batch.clear();
  f = kv.append_slots(sa, a.size());
  for (size_t i = 0; i < a.size(); ++i) batch.add(a[i], int32_t(f + i), sa, i + 2 >= a.size());
  batch.add(42, int32_t(kv.append_slots(sb, 1)), sb, true);
  std::vector<float> mixed;
  m.forward(batch, kv, mixed);
  ASSERT_EQ(mixed.size(), size_t(3) * V);

  auto pool2 = make_pool(m, 64);
  KvCache kv2(*pool2);
  const SeqId s2 = kv2.create_sequence();
  batch.clear();
  f = kv2.append_slots(s2, a.size());
  for (size_t i = 0; i < a.size(); ++i) batch.add(a[i], int32_t(f + i), s2, i + 2 >= a.size());
  m.forward(batch, kv2, la);
  const SeqId s3 = kv2.create_sequence();
  batch.clear();
  f = kv2.append_slots(s3, bp.size() + 1);
  for (size_t i = 0; i < bp.size(); ++i) batch.add(bp[i], int32_t(f + i), s3, false);
  batch.add(42, int32_t(f + bp.size()), s3, true);
  m.forward(batch, kv2, lb);
  const std::vector<float> got_a(mixed.begin(), mixed.begin() + 2 * V), got_b(mixed.begin() + 2 * V, mixed.end());
  EXPECT_LT(rel_error(got_a, std::vector<double>(la.begin(), la.end())), 1e-6);
  EXPECT_LT(rel_error(got_b, std::vector<double>(lb.begin(), lb.end())), 1e-6);
}

// A decode batch above the GEMV size (24 sequences of 1..150 tokens, three steps) takes the
// batched path: cuBLASLt GEMMs on 16-bit activations, one-token tensor-core attention tiles,
// and from its second occurrence a CUDA graph. Its logits stay within the 16-bit rounding
// bound of each sequence decoded alone (the fp32 GEMV path).
TEST(CudaModel, BatchedDecodeOfManySequencesCloseToDecodingEachAlone) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("codelm-16m-f16.gguf");
  const int V = m.config().n_vocab, S = 24, steps = 3;
  std::uniform_int_distribution<int32_t> tok(1, 8191), len(1, 150);
  std::vector<std::vector<int32_t>> prompts(S), inputs(S);
  size_t total = 0;
  for (int s = 0; s < S; ++s) {
    prompts[size_t(s)].resize(size_t(len(rng())));
    for (int32_t& t : prompts[size_t(s)]) t = tok(rng());
    for (int k = 0; k < steps; ++k) inputs[size_t(s)].push_back(tok(rng()));
    total += prompts[size_t(s)].size() + steps;
  }
  auto prefill = [&](KvCache& kv, SeqId seq, const std::vector<int32_t>& p) {
    StepBatch b;
    std::vector<float> none;
    const size_t f = kv.append_slots(seq, p.size());
    for (size_t i = 0; i < p.size(); ++i) b.add(p[i], int32_t(f + i), seq, false);
    m.forward(b, kv, none);
  };
  std::vector<std::vector<float>> batched(steps);
  {
    auto pool = make_pool(m, total + size_t(S) * 16);  // room for each sequence's partial block
    KvCache kv(*pool);
    std::vector<SeqId> seqs;
    for (int s = 0; s < S; ++s) {
      seqs.push_back(kv.create_sequence());
      prefill(kv, seqs.back(), prompts[size_t(s)]);
    }
    for (int k = 0; k < steps; ++k) {
      StepBatch b;
      for (int s = 0; s < S; ++s)
        b.add(inputs[size_t(s)][size_t(k)], int32_t(kv.append_slots(seqs[size_t(s)], 1)), seqs[size_t(s)], true);
      m.forward(b, kv, batched[size_t(k)]);
      ASSERT_EQ(batched[size_t(k)].size(), size_t(S) * V);
    }
  }
  auto pool = make_pool(m, total + size_t(S) * 16);  // room for each sequence's partial block
  KvCache kv(*pool);
  double worst = 0;
  for (int s = 0; s < S; ++s) {
    const SeqId seq = kv.create_sequence();
    prefill(kv, seq, prompts[size_t(s)]);
    for (int k = 0; k < steps; ++k) {
      StepBatch b;
      std::vector<float> alone;
      b.add(inputs[size_t(s)][size_t(k)], int32_t(kv.append_slots(seq, 1)), seq, true);
      m.forward(b, kv, alone);
      const std::vector<float> got(batched[size_t(k)].begin() + int64_t(s) * V,
                                   batched[size_t(k)].begin() + int64_t(s + 1) * V);
      const double err = rel_error(got, std::vector<double>(alone.begin(), alone.end()));
      worst = std::max(worst, err);
      EXPECT_LT(err, 3e-3) << "sequence " << s << " (prompt " << prompts[size_t(s)].size() << ") step " << k;
    }
  }
  std::cout << "  batched decode vs alone: worst logits rel error " << worst << "\n";
}

TEST(CudaModel, RejectsBadBatchesBeforeWriting) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model("stories260K.gguf");
  auto pool = make_pool(m, 32);
  KvCache kv(*pool);
  const SeqId s = kv.create_sequence();
  kv.append_slots(s, 2);
  StepBatch b;
  std::vector<float> logits;
  b.add(100000, 0, s, true);
  EXPECT_THROW(m.forward(b, kv, logits), std::out_of_range);
  b.clear();
  b.add(1, 5, s, true);
  EXPECT_THROW(m.forward(b, kv, logits), std::out_of_range);
  auto other = std::make_unique<BlockPool>(KvShape{.n_layer = 1, .n_kv_head = 1, .head_dim = 8, .block_size = 16}, 2);
  KvCache kv_bad(*other);
  const SeqId s2 = kv_bad.create_sequence();
  kv_bad.append_slots(s2, 1);
  b.clear();
  b.add(1, 0, s2, true);
  EXPECT_THROW(m.forward(b, kv_bad, logits), std::invalid_argument);
  // Token trees are verified (cuda_tree_test.cpp); malformed ones are refused before
  // anything is written, with the CPU model's checks.
  EXPECT_TRUE(m.supports_tree_verification());
  b.clear();
  b.add(1, 0, s, true);
  b.tree_parent = {-1, -1};  // ragged
  EXPECT_THROW(m.forward(b, kv, logits), std::invalid_argument);
  b.clear();
  b.add(1, 0, s, false);
  b.add_child(2, 0, true);
  b.add_child(3, 1, true);  // slot 2 is not reserved
  EXPECT_THROW(m.forward(b, kv, logits), std::out_of_range);
  b.tree_parent[2] = 2;  // its own parent
  EXPECT_THROW(m.forward(b, kv, logits), std::invalid_argument);
  b.clear();
  b.add(1, 0, s, false);
  b.add_child(2, 0, true);
  EXPECT_NO_THROW(m.forward(b, kv, logits));
  EXPECT_EQ(logits.size(), size_t(m.config().n_vocab));
}

TEST(CudaModel, WithoutGpuLoadFailsWithOneLineError) {
  std::string why;
  if (cuda::device_available(&why)) GTEST_SKIP() << "a GPU is present; this checks the GPU-less path";
  try {
    Model::load(model_path("stories260K.gguf"), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
    FAIL() << "expected ModelError";
  } catch (const ModelError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--device cuda"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace fdl::test

namespace fdl::test {
namespace {

// Pipelined decode (submit_sample / collect_ids): the ids of a step in flight feed the next
// step on the device; the tokens equal the synchronous loop's, greedy and sampled, for
// batches of three sequences (rows reordered every step) and for one sequence (the persistent
// batch-1 kernels and their graphs).
class CudaPipelined : public ::testing::TestWithParam<const char*> {};

TEST_P(CudaPipelined, DrawsTheTokensOfTheSynchronousLoop) {
  FDL_SKIP_WITHOUT_GPU();
  Model& m = cuda_model(GetParam());
  expect_pipelined_equals_synchronous(m);
  auto pool = make_pool(m, 128);
  KvCache kv(*pool);
  const std::vector<std::vector<int32_t>> one = {{1, 29, 31, 400}};
  EXPECT_EQ(decode_prompts(m, kv, one, 40, true), decode_prompts(m, kv, one, 40, false));
}

TEST_P(CudaPipelined, RulesAreEnforced) {
  FDL_SKIP_WITHOUT_GPU();
  expect_pipeline_rules_enforced(cuda_model(GetParam()));
}

TEST_P(CudaPipelined, ChainSurvivesScratchGrowth) {
  FDL_SKIP_WITHOUT_GPU();
  auto m = Model::load(model_path(GetParam()), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  expect_chain_survives_scratch_growth(*m);
}

// A step whose row holds NaN fails at its collect_ids, and so does the chained step after it
// (whose embedding read the failed row's -1 as row 0); nothing stays submitted.
TEST(CudaPipelinedFailure, FailedRowsFailTheirStepAndTheChainedOne) {
  FDL_SKIP_WITHOUT_GPU();
  TinyLlamaSpec spec;
  spec.set_values["output.weight"][0] = std::numeric_limits<float>::quiet_NaN();
  auto m = Model::load(write_tiny_llama("nan_logits_gpu.gguf", spec), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  expect_failed_rows_fail_their_steps(*m);
}

// A vocabulary large enough that the greedy argmax splits each row over several blocks
// (70000 ids: 5 at batch 1): pipelined greedy steps (the argmax at the end of the graph,
// ids in the landing buffer) give the host's argmax of the same model's logits.
TEST(CudaPipelinedFailure, LargeVocabularyArgmaxSplitOverBlocks) {
  FDL_SKIP_WITHOUT_GPU();
  TinyLlamaSpec spec;
  spec.n_vocab = 70000;
  auto m = Model::load(write_tiny_llama("large_vocab_gpu.gguf", spec), ModelOptions{.device = Device::Cuda, .batch_invariant = false});
  auto pool = make_pool(*m, 256);
  KvCache kv(*pool);
  const std::vector<std::vector<int32_t>> prompts = {{1, 60000, 22, 9}, {1, 69999}, {1, 300, 45000, 302}};
  const auto piped = decode_prompts(*m, kv, prompts, 12, true, false);
  const auto host = decode_prompts(*m, kv, prompts, 12, false, false, true);  // same batches, host argmax
  for (size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(piped[p], host[p]) << "prompt " << p;
}

INSTANTIATE_TEST_SUITE_P(Models, CudaPipelined, ::testing::Values("stories260K.gguf", "codelm-16m-f16.gguf"),
                         [](const auto& info) { return std::string(info.param[0] == 's' ? "stories" : "codelm"); });

}  // namespace
}  // namespace fdl::test
