// The forward pass of the layer plan (src/arch/family.h) over a batch of tokens from any number
// of sequences; the family's optional parts (Q/K/V biases, Q/K norms, post-norms, GeGLU,
// soft-caps, scaled embeddings, the sliding layers' RoPE) where it has them.
//
// Orchestration only: every numeric step is one of a small set of backend ops (embedding
// gather, rms_norm, matmul, rope, paged attention, silu_mul, add), so another backend can
// implement the same sequence. Q/K/V and gate/up (+ silu_mul) go through matmul_multi: the
// same arithmetic as separate calls, in one parallel region each (fewer hand-offs between
// the threads of a small model's step). Batch invariance follows from each op being per row with a
// fixed reduction order (matmul.h, ops.h, attention.h): nothing here mixes rows.
#include <algorithm>
#include <cmath>
#include <string>

#include "backend/cpu/attention.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "model/llama_model.h"
#include "model/step_batch_check.h"

namespace fdl {

void LlamaModel::validate(const StepBatch& b, const KvCache& kv) {
  check_step_batch(b, kv, config_, KvDtype::F32, tree_);
}

void LlamaModel::run_layer(int layer, int64_t n, const StepBatch& batch, KvCache& kv) {
  const ModelConfig& c = config_;
  const LlamaLayerWeights& w = weights_.layers[size_t(layer)];
  ForwardScratch& s = scratch_;
  const int64_t kv_dim = int64_t(c.n_head_kv) * c.head_dim;
  const int64_t q_dim = int64_t(c.n_head) * c.head_dim;

  // Attention block: x += wo · attention(rope(qn(wq·norm(x) + bq)), rope(kn(wk·norm(x) + bk)),
  // wv·norm(x) + bv), with the biases and the per-head norms qn/kn only where the family has them.
  cpu::rms_norm_rows(s.x.data(), w.attn_norm, s.xn.data(), n, c.n_embd, c.rms_eps);
  {
    const cpu::WeightMatrix* mats[] = {&w.wq, &w.wk, &w.wv};
    float* outs[] = {s.q.data(), s.k.data(), s.v.data()};
    cpu::matmul_multi(threads_, mats, outs, 3, s.xn.data(), n);
  }
  if (w.bq)  // qwen2: Q/K/V biases
    for (int64_t t = 0; t < n; ++t) {
      cpu::add_inplace(s.q.data() + t * q_dim, w.bq, q_dim);
      cpu::add_inplace(s.k.data() + t * kv_dim, w.bk, kv_dim);
      cpu::add_inplace(s.v.data() + t * kv_dim, w.bv, kv_dim);
    }
  if (w.q_norm) {  // qwen3: RMSNorm over each Q and K head, before RoPE
    cpu::rms_norm_rows(s.q.data(), w.q_norm, s.q.data(), n * c.n_head, c.head_dim, c.rms_eps);
    cpu::rms_norm_rows(s.k.data(), w.k_norm, s.k.data(), n * c.n_head_kv, c.head_dim, c.rms_eps);
  }
  // Gemma 3's sliding layers rotate with a RoPE of their own.
  const bool own_rope = c.rope_freq_base_swa > 0 && c.attention_window(layer) > 0;
  const cpu::RopeParams& rope = own_rope ? rope_swa_ : rope_;
  const AlignedFloats& rope_cs = own_rope ? s.rope_cs_swa : s.rope_cs;
  for (int64_t t = 0; t < n; ++t) {
    const float* cs = rope_cs.data() + t * c.rope_dim;
    cpu::rope_apply(rope, cs, s.q.data() + t * q_dim, c.n_head);
    cpu::rope_apply(rope, cs, s.k.data() + t * kv_dim, c.n_head_kv);
    // Store this token's K/V in its reserved slot (in place; the slot is private to the
    // sequence because append_slots copied a shared tail block).
    const SeqId seq = batch.seqs[size_t(t)];
    const size_t pos = size_t(tree_.slot(size_t(t)));  // the position, unless a tree token
    std::copy_n(s.k.data() + t * kv_dim, kv_dim, kv.k_slot(seq, layer, pos));
    std::copy_n(s.v.data() + t * kv_dim, kv_dim, kv.v_slot(seq, layer, pos));
  }
  BlockPool& pool = kv.pool();
  cpu::PagedAttentionArgs args;
  args.kv.k_base = pool.k_ptr(0, layer, 0);
  args.kv.v_base = pool.v_ptr(0, layer, 0);
  args.kv.block_stride = int64_t(pool.shape().block_bytes() / sizeof(float));
  args.kv.block_size = pool.shape().block_size;
  args.n_tokens = n;
  args.n_head = c.n_head;
  args.n_head_kv = c.n_head_kv;
  args.head_dim = c.head_dim;
  args.scale = c.query_scale();
  args.softcap = c.attn_softcap;
  args.q = s.q.data();
  args.block_tables = s.block_tables.data();
  args.positions = batch.positions.data();
  args.out = s.attn.data();
  args.tree_slots = tree_.tree_slots();  // nullptr without trees that leave slot order
  args.tree_base = tree_.tree_base();
  args.window = c.attention_window(layer);
  cpu::paged_attention(threads_, args, s.attention);
  cpu::matmul(threads_, w.wo, s.attn.data(), n, s.proj.data());
  if (w.post_attn_norm) cpu::rms_norm_rows(s.proj.data(), w.post_attn_norm, s.proj.data(), n, c.n_embd, c.rms_eps);
  cpu::add_inplace(s.x.data(), s.proj.data(), n * c.n_embd);

  // FFN block (SwiGLU): x += w_down · (silu(w_gate·norm(x)) * (w_up·norm(x))).
  cpu::rms_norm_rows(s.x.data(), w.ffn_norm, s.xn.data(), n, c.n_embd, c.rms_eps);
  if (c.n_expert > 0) {
    run_moe_ffn(w, n);
  } else {
    const cpu::WeightMatrix* mats[] = {&w.w_gate, &w.w_up};
    float* outs[] = {s.gate.data(), s.up.data()};
    // gate = silu(gate) * up, fused; GeGLU after the products.
    cpu::matmul_multi(threads_, mats, outs, 2, s.xn.data(), n, /*swiglu=*/!c.ffn_gelu);
    if (c.ffn_gelu) cpu::gelu_tanh_mul(s.gate.data(), s.up.data(), s.gate.data(), n * c.n_ff);
    cpu::matmul(threads_, w.w_down, s.gate.data(), n, s.proj.data());
  }
  if (w.post_ffn_norm) cpu::rms_norm_rows(s.proj.data(), w.post_ffn_norm, s.proj.data(), n, c.n_embd, c.rms_eps);
  cpu::add_inplace(s.x.data(), s.proj.data(), n * c.n_embd);
}

void LlamaModel::forward(const StepBatch& batch, KvCache& kv, std::vector<float>& logits) {
  note_plain_forward("forward");
  validate(batch, kv);
  const ModelConfig& c = config_;
  const int64_t n = int64_t(batch.size());
  if (n == 0) {
    logits.clear();
    return;
  }
  ForwardScratch& s = scratch_;
  s.ensure(c, n);

  for (int64_t t = 0; t < n; ++t) {
    s.block_tables[size_t(t)] = kv.block_table(batch.seqs[size_t(t)]).data();
    cpu::rope_cos_sin(rope_, batch.positions[size_t(t)], s.rope_cs.data() + t * c.rope_dim);
    if (c.rope_freq_base_swa > 0)
      cpu::rope_cos_sin(rope_swa_, batch.positions[size_t(t)], s.rope_cs_swa.data() + t * c.rope_dim);
  }
  const cpu::WeightMatrix& embd = weights_.token_embd;
  cpu::gather_rows_f32(embd.type, embd.data, embd.rows, embd.cols, batch.tokens.data(), n, s.x.data());
  if (c.embed_scale != 1.f) cpu::scale_inplace(s.x.data(), n * c.n_embd, c.embed_scale);

  for (int l = 0; l < c.n_layer; ++l) run_layer(l, n, batch, kv);

  // Only the rows that want logits go through the final norm and the output projection.
  int64_t m = 0;
  for (int64_t t = 0; t < n; ++t)
    if (batch.want_logits[size_t(t)]) {
      cpu::rms_norm_rows(s.x.data() + t * c.n_embd, weights_.output_norm,
                         s.out_rows.data() + m * c.n_embd, 1, c.n_embd, c.rms_eps);
      ++m;
    }
  logits.resize(size_t(m) * size_t(c.n_vocab));
  cpu::matmul(threads_, weights_.output, s.out_rows.data(), m, logits.data());
  if (c.final_softcap > 0) cpu::softcap_inplace(logits.data(), int64_t(logits.size()), c.final_softcap);
}

}  // namespace fdl
