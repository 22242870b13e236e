// Loads the two real models shipped in the shared data folder and checks values that were
// read independently with the `gguf` Python package (GGUFReader).
#include <gtest/gtest.h>

#include "flashdllm/gguf.h"
#include "test_support.h"

namespace fdl {
namespace {

TEST(GgufRealModels, Stories260K) {
  const auto path = test::model_path("stories260K.gguf");
  FDL_ASSERT_INPUT(path);
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.file_size(), 1185376u);
  EXPECT_EQ(f.data_offset(), 14176u);
  EXPECT_EQ(f.metadata().size(), 19u);
  EXPECT_EQ(f.tensors().size(), 48u);
  EXPECT_EQ(f.get_uint("tokenizer.ggml.padding_token_id"), 4294967295u);
  EXPECT_FLOAT_EQ(static_cast<float>(f.get_float("llama.attention.layer_norm_rms_epsilon")), 1e-5f);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 64u);
  EXPECT_EQ(f.get_uint("llama.block_count"), 5u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 8u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 4u);
  EXPECT_EQ(f.get_uint("llama.feed_forward_length"), 172u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "llama");
  const auto tokens = f.array_strings("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(f.array_f32("tokenizer.ggml.scores").size(), 512u);
  EXPECT_EQ(f.array_int("tokenizer.ggml.token_type").size(), 512u);
  const GgufTensorInfo& emb = f.tensor("token_embd.weight");
  EXPECT_EQ(emb.n_dims, 2u);
  EXPECT_EQ(emb.ne[0], 64u);
  EXPECT_EQ(emb.ne[1], 512u);
  EXPECT_EQ(emb.type(), GgmlType::F32);
  EXPECT_EQ(emb.n_bytes, 64u * 512u * 4u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(emb.data) % 32, 0u);
  EXPECT_EQ(f.find_tensor("no.such.tensor"), nullptr);
  EXPECT_THROW(f.tensor("no.such.tensor"), GgufError);
}

TEST(GgufRealModels, Codelm16mF16) {
  const auto path = test::model_path("codelm-16m-f16.gguf");
  FDL_ASSERT_INPUT(path);
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.data_offset(), 269344u);
  EXPECT_EQ(f.metadata().size(), 23u);
  EXPECT_EQ(f.tensors().size(), 74u);
  EXPECT_EQ(f.get_string("general.name"), "flashdllm-codelm-16m");
  EXPECT_EQ(f.get_uint("general.file_type"), 1u);
  EXPECT_DOUBLE_EQ(f.get_float("llama.rope.freq_base"), 10000.0);
  EXPECT_FALSE(f.get_bool_or("tokenizer.ggml.add_bos_token", true));
  EXPECT_EQ(f.array_strings("tokenizer.ggml.merges").size(), 7935u);
  EXPECT_EQ(f.tensor("token_embd.weight").n_bytes, 6291456u);
  EXPECT_EQ(f.tensor("token_embd.weight").offset, 0u);
  EXPECT_EQ(f.tensor("output_norm.weight").offset, 6560800u - 269344u);
  EXPECT_EQ(f.get_uint("llama.embedding_length"), 384u);
  EXPECT_EQ(f.get_uint("llama.block_count"), 8u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count"), 6u);
  EXPECT_EQ(f.get_uint("llama.attention.head_count_kv"), 2u);
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.array_strings("tokenizer.ggml.tokens").size(), 8192u);
  EXPECT_EQ(f.find_tensor("output.weight"), nullptr);  // tied embeddings
  const GgufTensorInfo& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type(), GgmlType::F16);
  EXPECT_EQ(q.ne[0], 384u);
  EXPECT_EQ(q.ne[1], 384u);
  EXPECT_EQ(f.tensor("blk.0.attn_norm.weight").type(), GgmlType::F32);
  // Every tensor lies inside the file, after the data section start.
  for (const auto& t : f.tensors()) EXPECT_LE(f.data_offset() + t.offset + t.n_bytes, f.file_size());
}

}  // namespace
}  // namespace fdl
