// A CPU model's quantized matrices rearranged into panels at load (model/weight_panels.h): which
// matrices move, that a zero-copy mapping stays untouched, and that the model's outputs stay
// those of its rows up to the kernels' last bits.
#include "model/weight_panels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <utility>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "flashdllm/model.h"
#include "model/model_test_util.h"
#include "test_support.h"
#include "tools/make_model.h"

namespace fdl::test {
namespace {

// A model of `dtype`: 2 layers, every layer matrix a whole number of panels; a vocab of 600
// rows (not a multiple of 16) keeps the output in rows.
std::filesystem::path model_of(GgmlType dtype = GgmlType::Q4_K, bool tied = false) {
  tools::MakeModelOptions opt;
  opt.output = scratch_dir() / ("panels-" + ggml_type_name(static_cast<uint32_t>(dtype)) + (tied ? "-tied" : "") + ".gguf");
  opt.dtype = dtype;
  opt.tied_embeddings = tied;
  if (tied) opt.vocab = 512;  // rows that would fit panels: the embedding must still stay in rows
  opt.dim = 256, opt.ffn_dim = 512, opt.vocab = 600, opt.n_layers = 2;
  opt.weight_std = 0.05f;
  tools::make_model(opt);
  return opt.output;
}

// The file held as `backing`, and its weights bound (views into the file's bytes, which stay
// where they are when the GgufFile moves).
struct Bound {
  GgufFile file;
  LlamaWeights weights;
};
Bound bind(const std::filesystem::path& path, GgufBacking backing) {
  GgufFile f = GgufFile::open(path, {}, backing);
  LlamaWeights w = bind_llama_weights(f, ModelConfig::from_gguf(f));
  return Bound{std::move(f), std::move(w)};
}

TEST(WeightPanels, LayerMatricesMoveAndTheRestStaysInRows) {
  for (GgmlType dtype : {GgmlType::Q4_K, GgmlType::Q8_0}) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(dtype)));
    auto [f, w] = bind(model_of(dtype), GgufBacking::HugePageCopy);
    cpu::ThreadPool pool(2);
    const int marked = prepare_weight_panels(w, f, pool);
    if (!cpu::use_avx512_vnni()) {
      EXPECT_EQ(marked, 0);
      GTEST_SKIP() << "AVX-512 BW/VNNI kernels unavailable here: every matrix stays in rows";
    }
    EXPECT_EQ(marked, 2 * 7);  // q, k, v, o, gate, up, down per layer
    for (const LlamaLayerWeights& L : w.layers)
      for (const cpu::WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) EXPECT_TRUE(m->panels);
    EXPECT_FALSE(w.output.panels);
    EXPECT_FALSE(w.token_embd.panels);
    EXPECT_EQ(prepare_weight_panels(w, f, pool), 0);  // nothing left to move
  }
}

// An output tied to the embedding stays in rows (the embedding's rows are looked up by token),
// though its 512 rows would make panels.
TEST(WeightPanels, AnOutputTiedToTheEmbeddingStaysInRows) {
  auto [f, w] = bind(model_of(GgmlType::Q4_K, true), GgufBacking::HugePageCopy);
  cpu::ThreadPool pool(2);
  const int marked = prepare_weight_panels(w, f, pool);
  ASSERT_EQ(w.output.data, w.token_embd.data);
  EXPECT_FALSE(w.output.panels);
  EXPECT_EQ(marked, cpu::use_avx512_vnni() ? 2 * 7 : 0);
}

TEST(WeightPanels, ZeroCopyMappingStaysInRows) {
  const auto path = model_of();
  auto [f, w] = bind(path, GgufBacking::Mmap);
  cpu::ThreadPool pool(1);
  EXPECT_EQ(prepare_weight_panels(w, f, pool), 0);
  EXPECT_FALSE(w.layers[0].wq.panels);
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> disk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* t = f.find_tensor("blk.0.attn_q.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(std::memcmp(t->data, disk.data() + f.data_offset() + t->offset, t->n_bytes), 0);
  EXPECT_THROW(f.edit_in_place(disk.data(), 1, [](uint8_t*) {}), std::invalid_argument);  // not the file's bytes
}

// The same model with its matrices in rows (FLASHDLLM_NO_WEIGHT_PANELS) and in panels: K-quant
// kernels differ in float steps only (exact integer block sums); Q8_0's 16-bit activations
// round each value to 1/65534 of its block's largest. The logits agree closely.
// FLASHDLLM_NO_WEIGHT_PANELS set for a scope, unset after it whatever happens.
struct NoPanelsInScope {
  NoPanelsInScope() { ::setenv("FLASHDLLM_NO_WEIGHT_PANELS", "1", 1); }
  ~NoPanelsInScope() { ::unsetenv("FLASHDLLM_NO_WEIGHT_PANELS"); }
};

TEST(WeightPanels, PanelsGiveTheLogitsOfTheRowsUpToRounding) {
  if (!cpu::use_avx512_vnni()) GTEST_SKIP() << "AVX-512 BW/VNNI kernels unavailable here";
  for (GgmlType dtype : {GgmlType::Q4_K, GgmlType::Q8_0}) {
    SCOPED_TRACE(ggml_type_name(static_cast<uint32_t>(dtype)));
    const auto path = model_of(dtype);
    const std::vector<int32_t> prompt = {1, 300, 17, 42, 599, 5, 77, 123};
    std::unique_ptr<Model> rows;
    {
      const NoPanelsInScope no_panels;
      rows = Model::load(path, ModelOptions{.n_threads = 2});
    }
    auto panels = Model::load(path, ModelOptions{.n_threads = 2});
    const std::vector<float> a = prefill_logits(*rows, prompt), b = prefill_logits(*panels, prompt);
    ASSERT_EQ(a.size(), b.size());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), norm += double(a[i]) * a[i];
    EXPECT_LT(std::sqrt(diff / norm), 1e-4);
    EXPECT_NE(a, b);  // the panel kernels really ran
  }
}

}  // namespace
}  // namespace fdl::test
