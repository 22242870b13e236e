// flashdllm/model.h — Llama-family transformer: config from GGUF metadata, weights, and a
// batched forward over the paged KV cache.
//
// Architecture: GGUF `general.architecture = llama` (Llama 1/2/3, Mistral, TinyLlama,
// SmolLM, ...): token embedding, pre-norm RMSNorm, RoPE (llama.cpp's "normal" mode: adjacent
// pairs (2i, 2i+1) rotated — GGUF converters permute Q/K rows for this), GQA/MQA attention,
// SwiGLU FFN, final RMSNorm, output projection (tied to token_embd when output.weight is
// absent). Llama-3 rope scaling ("llama3" rope type), YaRN and LongRoPE when the metadata has
// them.
//
// Weight dtypes: F32, F16, BF16, Q8_0; anything else is rejected with a message listing them.
//
// Thread-safety: a Model is immutable after load; forward() is not reentrant (it uses
// internal scratch) — the engine thread calls it.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "flashdllm/gguf.h"
#include "flashdllm/kv_cache.h"
#include "flashdllm/sampling.h"  // RowSampling, PenaltyToken

namespace fdl {

class ModelError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ModelConfig {
  std::string arch = "llama";
  std::string name;
  int n_vocab = 0;
  int n_embd = 0;
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;         ///< n_embd / n_head
  int n_ff = 0;
  int n_ctx_train = 0;
  int rope_dim = 0;         ///< rope.dimension_count (defaults to head_dim)
  float rope_freq_base = 10000.f;
  float rope_freq_scale = 1.f;  ///< linear rope scaling ("linear" type): 1 / factor
  float rms_eps = 1e-5f;
  // Llama-3 rope scaling ("rope.scaling.type" == "llama3" or rope_freqs tensor present; the
  // tensor's per-pair factors win over the four values below when both exist)
  bool rope_llama3 = false;
  float rope_scale_factor = 1.f;
  float rope_low_freq_factor = 1.f;
  float rope_high_freq_factor = 4.f;
  int rope_orig_ctx = 8192;   ///< llama3, YaRN and LongRoPE: the context the model was pretrained with
  // YaRN ("rope.scaling.type" == "yarn", Peng et al. 2023, arXiv:2309.00071): rope_freq_scale is
  // 1 / factor; pair i rotates at a mix of the interpolated and the original frequency (the
  // original for fast pairs, beta_fast rotations over rope_orig_ctx, the interpolated for slow
  // ones, beta_slow), and cos/sin are scaled by 1 + 0.1 ln(factor).
  bool rope_yarn = false;
  float yarn_beta_fast = 32.f;
  float yarn_beta_slow = 1.f;
  // LongRoPE (Phi-3-mini-128k, Phi-3.5-mini, Phi-4-mini; arXiv:2402.13753): the tensors
  // rope_factors_long.weight and rope_factors_short.weight hold rope_dim/2 per-pair frequency
  // divisors each (as llama.cpp's converter writes them; `rope.scaling.type` "longrope" or
  // absent). A model run with contexts beyond rope_orig_ctx (`rope.scaling.original_context_length`,
  // default n_ctx_train) rotates with the long set, otherwise with the short one: see
  // rope_long_factors. Not combined with llama3 or YaRN scaling.
  bool rope_longrope = false;
  /// cos and sin of every rotation are multiplied by this (`rope.scaling.attn_factor`, as
  /// llama.cpp applies it: LongRoPE's sqrt(1 + ln(n_ctx_train / rope_orig_ctx) / ln(rope_orig_ctx))
  /// in Phi-3 files); 1 = none. Not applied to the sliding layers' own RoPE (rope_freq_base_swa).
  float rope_attn_factor = 1.f;
  /// Whether a LongRoPE model run with sequences of up to `n_ctx` tokens (ModelOptions::n_ctx;
  /// 0 or above n_ctx_train = n_ctx_train) rotates with its long factors: when that context
  /// exceeds rope_orig_ctx (llama.cpp's rule; Transformers switches per forward on the sequence
  /// length, so the two agree whenever every sequence fits the context the rule was given).
  /// False for other models.
  bool rope_long_factors(int n_ctx) const;
  bool tied_output = false;
  // The family's optional parts of the layer plan (src/arch/family.h).
  bool qkv_bias = false;     ///< Q, K and V projections add a bias vector (qwen2)
  bool qk_norm = false;      ///< RMSNorm over each Q and K head (weights [head_dim]) before RoPE (qwen3)
  bool fused_qkv = false;      ///< the file holds Q, K, V as one attn_qkv matrix (phi3)
  bool fused_gate_up = false;  ///< the file holds gate and up as one ffn_up matrix (phi3)
  /// The file keeps a RoPE pair in dims (i, i + rope_dim/2) of a head ("NEOX", qwen2/qwen3/phi3).
  /// The backends rotate interleaved pairs (2i, 2i+1): such a model's Q/K rows, their biases and
  /// norm weights are reordered once at load (attention scores are unchanged: q and k move alike).
  bool rope_halves = false;
  /// Sliding-window attention (Mistral 7B v0.1, Phi-3-mini, Gemma 2/3's local layers): a token at
  /// position p of a sliding layer attends to positions (p - sliding_window, p] only, as HF
  /// Transformers and llama.cpp mask it. 0 = none. `layer_sliding[il]` (n_layer entries when
  /// sliding_window > 0) says which layers slide; the others attend to the whole context. The KV
  /// cache still holds every position (global layers and prefix sharing read them).
  int sliding_window = 0;
  std::vector<uint8_t> layer_sliding;
  // Gemma 2/3's parts of the plan (src/arch/gemma2.cpp, gemma3.cpp).
  float embed_scale = 1.f;   ///< token embeddings are multiplied by this (Gemma: sqrt(n_embd))
  bool post_norms = false;   ///< RMSNorm of the attention and FFN outputs before each residual add
  bool ffn_gelu = false;     ///< GeGLU: gelu_tanh(gate) * up instead of silu(gate) * up
  float attn_scale = 0.f;    ///< query scale (`attention.scale`); 0 = 1/sqrt(head_dim)
  float attn_softcap = 0.f;  ///< scores s -> cap * tanh(s / cap) before the softmax; 0 = none
  float final_softcap = 0.f; ///< the same on the logits (`final_logit_softcapping`)
  /// Sliding layers' RoPE base (`rope.freq_base_swa`, Gemma 3: unscaled); 0 = the global RoPE.
  float rope_freq_base_swa = 0.f;
  /// The query scale actually applied.
  float query_scale() const { return attn_scale > 0 ? attn_scale : 1.f / std::sqrt(float(head_dim)); }
  /// Mixture of experts (Mixtral: `expert_count`, `expert_used_count`): each layer's FFN is
  /// n_expert SwiGLU experts of n_ff; a token runs the n_expert_used whose router logits are
  /// highest (ties: the lower index), weighted by the softmax of those logits. 0 = dense.
  int n_expert = 0;
  int n_expert_used = 0;
  /// Positions layer `il` attends to behind and including the current one; 0 = all of them.
  int attention_window(int il) const {
    return sliding_window > 0 && layer_sliding[size_t(il)] ? sliding_window : 0;
  }
  /// Reads `general.architecture` (a family of src/arch: llama, qwen2, qwen3, phi3) and its
  /// `<arch>.*` keys.
  /// Required: embedding_length, block_count, feed_forward_length, attention.head_count,
  /// context_length, attention.layer_norm_rms_epsilon. n_vocab comes from `<arch>.vocab_size`,
  /// else the `tokenizer.ggml.tokens` count, else token_embd.weight's row count.
  /// Throws ModelError naming the file and the missing/invalid key or the unknown architecture.
  static ModelConfig from_gguf(const GgufFile& f);
  uint64_t n_params() const;
};

/// One forward step: tokens of any number of sequences, each at its own positions.
/// The KV slots for every token must already be reserved (KvCache::append_slots) — the
/// forward writes K/V for token i at `positions[i]` of `seqs[i]` and attends causally to
/// positions [0, positions[i]] of that sequence.
///
/// Token trees (speculative tree verification, docs/SPECULATIVE.md): `tree_parent` is empty
/// (no trees) or has n_tokens entries. -1 marks an ordinary token (above). An entry p >= 0
/// makes token i a child of batch token p, which must satisfy: p < i, seqs[p] == seqs[i],
/// positions[i] == positions[p] + 1, and token i - 1 is p or belongs to the same tree. A tree
/// is thus a run of consecutive batch tokens of one sequence starting at its root r (an
/// ordinary token, tree_parent[r] == -1), parents before children. Token i of the tree
/// writes its K/V at slot positions[r] + (i - r) (which must be reserved; `positions[i]` is
/// then only its RoPE position, the root's position plus its depth) and attends to slots
/// [0, positions[r]], then to its ancestors' slots below the root in depth order, then to its
/// own: exactly the keys and values, in the same order, that a plain step at the end of that
/// path would see, so on the CPU its logits are bit-identical to that step's. Only models
/// whose supports_tree_verification() is true accept trees (std::invalid_argument
/// otherwise, before anything is written); so do malformed entries.
struct StepBatch {
  std::vector<int32_t> tokens;      ///< token ids, n_tokens
  std::vector<int32_t> positions;   ///< absolute positions, n_tokens
  std::vector<SeqId> seqs;          ///< sequence of each token, n_tokens
  std::vector<uint8_t> want_logits; ///< 1 where logits are needed, n_tokens
  std::vector<int32_t> tree_parent; ///< empty, or n_tokens batch indices / -1 (see above)
  size_t size() const { return tokens.size(); }
  /// Tokens with want_logits set: the rows forward writes.
  size_t n_wanted() const {
    size_t m = 0;
    for (const uint8_t w : want_logits) m += w ? 1 : 0;
    return m;
  }
  void add(int32_t token, int32_t pos, SeqId seq, bool logits) {
    tokens.push_back(token); positions.push_back(pos); seqs.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
    if (!tree_parent.empty()) tree_parent.push_back(-1);
  }
  /// Adds a tree token whose parent is batch token `parent`, at position
  /// positions[parent] + 1 (the first call fills tree_parent with -1 for earlier tokens).
  void add_child(int32_t token, size_t parent, bool logits) {
    tree_parent.resize(tokens.size(), -1);
    const int32_t pos = positions[parent] + 1;
    const SeqId seq = seqs[parent];
    tokens.push_back(token); positions.push_back(pos); seqs.push_back(seq);
    want_logits.push_back(logits ? 1 : 0);
    tree_parent.push_back(static_cast<int32_t>(parent));
  }
  /// Whether any token has a parent (an all -1 tree_parent holds no tree).
  bool has_tree() const {
    for (const int32_t p : tree_parent)
      if (p != -1) return true;
    return false;
  }
  void clear() { tokens.clear(); positions.clear(); seqs.clear(); want_logits.clear(); tree_parent.clear(); }
};

/// Model::forward_sample's preconditions: one row per token that wants logits, valid
/// parameters, penalties inside the rows and the vocabulary with counts >= 1, each (row,
/// token) at most once; masks (TokenMasks) on distinct rows inside the step, each naming an
/// entry of its words, whose length is a whole number of masks. Throws std::invalid_argument.
void check_sampling_rows(const StepBatch& batch, std::span<const RowSampling> rows,
                         std::span<const PenaltyToken> penalties, int32_t n_vocab, const TokenMasks& masks = {});

/// Where the forward pass runs. Cuda needs a build with FLASHDLLM_CUDA and an NVIDIA GPU;
/// Model::load throws a one-line ModelError otherwise (see src/backend/cuda/cuda_model.h for
/// what the CUDA model keeps in device memory and how its numerics differ from the CPU's).
enum class Device { Cpu, Cuda };

struct ModelOptions {
  int n_threads = 0;  ///< 0 = hardware concurrency (ModelError if negative); CPU only
  /// How the weights are held: a huge-page copy by default (faster decode: fewer TLB misses
  /// while streaming every weight once per token), or a zero-copy mmap (`--mmap`) for models
  /// that should share the page cache or load lazily. See GgufBacking. With the copy, a CPU
  /// with AVX-512 VNNI gets the quantized layer matrices rearranged in it into its kernels'
  /// panels (src/model/weight_panels.h), so Model::gguf()'s tensor bytes are then not all
  /// GGUF rows.
  /// (CPU only: the CUDA model maps the file and copies the weights to the GPU once.)
  GgufBacking weights = GgufBacking::HugePageCopy;
  Device device = Device::Cpu;  ///< `--device cpu|cuda`
  /// Element type of the KV cache (`--kv-cache-dtype auto|f32|f16|bf16`, vLLM's flag):
  /// nullopt = auto. The CPU model keeps F32 (ModelError for another). The CUDA model's auto is
  /// the 16-bit type its weight matrices are held in (F16, or Q8_0 dequantized to F16 -> F16;
  /// BF16 -> BF16), the precision its tensor-core attention already rounds K and V to, where
  /// its kernels support a 16-bit cache (head_dim 64 or 128), else F32; a 16-bit type other
  /// than the weights' is refused (ModelError). kv_shape() reports the choice.
  std::optional<KvDtype> kv_dtype = std::nullopt;
  /// The longest sequence (prompt + generated tokens) the caller will run, in tokens; 0 = the
  /// model's trained context (n_ctx_train), as are values above it (the engine refuses contexts
  /// beyond it). ModelError if negative. Only LongRoPE models read it: it picks their long or
  /// short RoPE factors once, at load (ModelConfig::rope_long_factors), so a sequence longer
  /// than this context still runs, with the factors chosen for it. The CLI passes --ctx-size
  /// (or the engine's default context).
  int n_ctx = 0;
  /// `--batch-invariant on|off` (default on): a token's logits do not depend on the other
  /// tokens of its step, on how its prompt was chunked or on whether its KV came from the
  /// cache (token trees excepted on CUDA). The CPU model always is. The CUDA model then runs
  /// every projection through the same tensor-core chains (gemm_k16.h) and every attention
  /// through the tile kernel with fixed context splits, for every step size; off, it picks
  /// the fastest kernels per step (cuBLAS, the batch-1 persistent kernels), which round
  /// differently. Where the CUDA model has no invariant kernels for a model (a GPU other than
  /// sm_90, weights other than F16/BF16, experts, soft-capped scores, head_dim other than
  /// 64/128), it runs as with off and warns; Model::batch_invariant() says which. On the H200
  /// off is 1.02x faster at batch 1 and 1.11x at batch 64 (docs/BENCHMARKS.md,
  /// "Batch-invariant decoding on the H200").
  bool batch_invariant = true;
};
/// Parses a --kv-cache-dtype value: "auto" -> nullopt, "f32"/"fp32"/"float32",
/// "f16"/"fp16"/"float16"/"half", "bf16"/"bfloat16". Throws std::invalid_argument otherwise.
std::optional<KvDtype> parse_kv_dtype(const std::string& s);

class Model {
 public:
  virtual ~Model() = default;
  /// Load a model for `opt.device` from a GGUF file (kept mapped) or a Hugging Face model
  /// directory (config.json, safetensors, tokenizer.json; read as a GGUF in memory, see
  /// src/hf/hf_checkpoint.h). Throws GgufError / ModelError (also for Device::Cuda in a build
  /// without CUDA or on a machine without a GPU, and for a directory that cannot be read).
  static std::unique_ptr<Model> load(const std::filesystem::path& path, const ModelOptions& opt = {});
  /// The GGUF a model is loaded from: `path` opened with `backing`, or a Hugging Face model
  /// directory read into memory. Throws GgufError, or ModelError for a directory.
  static GgufFile open_file(const std::filesystem::path& path, GgufBacking backing = GgufBacking::Mmap);

  virtual const ModelConfig& config() const = 0;
  virtual const GgufFile& gguf() const = 0;
  virtual KvShape kv_shape(int block_size) const = 0;
  /// Run one step. Writes n_vocab floats per token with want_logits=1, in batch order, to
  /// `logits` (resized; row-major [n_wanted][n_vocab]). On the CPU a token's logits are
  /// bit-identical whatever else is in the batch and whatever the thread count (the CUDA
  /// model rounds activations to 16 bits in steps above 16 tokens: docs/GPU.md). K/V of every token are
  /// written (fp32) into its reserved slot before any token attends, so a prompt may be fed
  /// in one step. An empty batch clears `logits`.
  /// Throws, before anything is written: std::invalid_argument for ragged StepBatch vectors,
  /// a KV cache whose shape differs from kv_shape(), a slot in a block shared with another
  /// sequence, or a malformed / unsupported tree (StepBatch::tree_parent); std::out_of_range for a token id outside [0, n_vocab), a dead sequence, or a
  /// position not reserved by append_slots.
  /// Allocates nothing once scratch has grown to the largest batch / context seen.
  virtual void forward(const StepBatch& batch, KvCache& kv, std::vector<float>& logits) = 0;
  /// As forward, but writes for each token with want_logits=1 only the index of its largest
  /// logit (lowest index on ties: the token greedy sampling without penalties picks) to `ids`
  /// (resized to n_wanted). For steps whose every row is sampled that way. The default runs
  /// forward and scans the rows on the host; a GPU model computes the ids on the device, so
  /// n_wanted int32 cross PCIe instead of n_wanted * n_vocab floats. Throws as forward.
  virtual void forward_argmax(const StepBatch& batch, KvCache& kv, std::vector<int32_t>& ids);
  /// As forward, but turns each row that wants logits into a token by `rows[r]` and the
  /// `penalties` whose row is r (flashdllm/sampling.h's pipeline; temperature 0 = the argmax
  /// of the penalized row) and writes only the ids (resized to n_wanted). rows.size() must
  /// be n_wanted, every penalty's row in [0, n_wanted), token in [0, n_vocab) and count >= 1,
  /// and the parameters valid as for Sampler (std::invalid_argument otherwise, before
  /// anything runs). The token equals what a Sampler with those parameters and that penalty
  /// window returns from sample_with_uniform(row, rows[r].uniform) (one arithmetic on both
  /// sides, flashdllm/sampling.h, and the survivors walked in id order, so a seeded
  /// request draws the same tokens whichever path its steps take). `masks` restrict rows to
  /// the tokens a grammar allows (TokenMasks: the others are -inf before the penalties): a
  /// grammar's mask goes up instead of its row coming down. A row with NaN or +Inf, or only -Inf
  /// (masked or not), throws std::invalid_argument (after the forward: the K/V are written). The
  /// default runs forward and samples on the host; a GPU model samples on the device, so
  /// n_wanted int32 cross PCIe instead of n_wanted * n_vocab floats. Otherwise throws as forward.
  virtual void forward_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                              std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids,
                              const TokenMasks& masks = {});
  /// Pipelined decode: queues the step of forward_sample and returns before its ids exist,
  /// so the host can prepare and queue the next step while the device runs this one (the
  /// overlap vLLM's async scheduling and SGLang's overlap scheduler make). The ids come from
  /// collect_ids(), in submission order. A token of `batch` may be previous_step_id(r): the
  /// id that row r of the previous submit_sample step draws, resolved on the device, so a
  /// decode step can be queued before the host knows its input token.
  /// Rules (std::logic_error when broken, before anything runs): at most kMaxSubmitted steps
  /// uncollected; no forward / forward_argmax / forward_sample while any is. A
  /// previous_step_id needs a previous submit_sample step with no other forward since and
  /// r < its n_wanted (std::invalid_argument / std::out_of_range otherwise, before anything
  /// runs). Otherwise throws as forward_sample: what it checks before running, at submit;
  /// what the results show (NaN / +Inf rows), at the collect_ids of that step — and the
  /// collect_ids of the next step, if it has previous_step_id tokens, throws
  /// std::invalid_argument too (whichever rows they name: the CUDA model does not track
  /// rows). The default runs the whole step inside submit_sample (so every error is thrown
  /// there) and keeps the ids for collect_ids; the CUDA model queues it on its stream and its
  /// kernels write the ids into page-locked memory (a mixture-of-experts step of more than 16
  /// tokens waits inside submit_sample for each layer's routing, so errors of earlier steps can
  /// surface there).
  /// Greedy is RowSampling{} (temperature 0), as for forward_sample.
  virtual void submit_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                             std::span<const PenaltyToken> penalties);
  /// Waits for the oldest uncollected submit_sample step and writes its ids (resized to its
  /// n_wanted). std::logic_error when none is uncollected.
  virtual void collect_ids(std::vector<int32_t>& ids);
  /// Submitted steps whose ids were not collected yet.
  virtual size_t submitted_steps() const { return default_pipeline_.queued.size(); }
  static constexpr size_t kMaxSubmitted = 2;
  /// Whether forward_argmax / forward_sample save work over forward plus host sampling (the
  /// CUDA model): the engine then asks for ids in every step that needs no logits on the host.
  virtual bool prefers_device_sampling() const { return false; }
  /// Whether forward accepts token trees (StepBatch::tree_parent): true for the CPU and CUDA models;
  /// the engine verifies several candidate drafts per sequence only where it is.
  virtual bool supports_tree_verification() const { return false; }
  /// Prepares the backend for `pool` before the first forward (a GPU model allocates its KV
  /// arena and registers as the pool's BlockMirror, kv_cache.h). Optional: forward does it too.
  virtual void bind_kv_pool(BlockPool& /*pool*/) {}
  virtual int n_threads() const = 0;
  /// Whether this model's logits are batch-invariant (ModelOptions::batch_invariant).
  virtual bool batch_invariant() const { return true; }

 protected:
  /// For models that keep the default submit_sample: call at the start of forward (and of
  /// any forward_* they override). Throws std::logic_error while submitted steps are
  /// uncollected, and forgets the previous step (previous_step_id refers to nothing after
  /// another forward). A no-op inside the default submit_sample's own forward.
  void note_plain_forward(const char* what);

 private:
  // The default submit_sample / collect_ids: ids of steps run at submit, oldest first, and
  // the n_wanted of the last one (-1: none to refer to).
  struct DefaultPipeline {
    std::vector<std::vector<int32_t>> queued;
    std::vector<int32_t> last_ids;
    long chain_rows = -1;
    bool in_submit = false;
  };
  DefaultPipeline default_pipeline_;
};

/// A token id for StepBatch::tokens in Model::submit_sample: the id that row `row` of the
/// previous submit_sample step draws (negative, so it never collides with a real id).
constexpr int32_t previous_step_id(int32_t row) { return -1 - row; }
/// The row a previous_step_id token refers to (token < 0).
constexpr int32_t previous_step_row(int32_t token) { return -1 - token; }

}  // namespace fdl
