// CudaModel: load, per-step input packing, the forward orchestration and graph replay
// (design in cuda_model.h). Numeric steps are the kernels of kernels.h in the same order as
// the CPU forward (src/model/llama_forward.cpp).
#include "backend/cuda/cuda_model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <string>

#include "flashdllm/sampling.h"

namespace fdl::cuda {

namespace {
/// Offsets (in int32 words) of the packed per-step inputs; fixed for a given (n, m), so the
/// device pointers a captured graph holds stay valid across steps of the same shape.
struct Layout {
  size_t tokens, positions, dst_block, table_off, row_idx, cos_sin, tables;
  Layout(int n, int m, int rope_dim)
      : tokens(0), positions(size_t(n)), dst_block(2 * size_t(n)), table_off(3 * size_t(n)),
        row_idx(4 * size_t(n)), cos_sin(4 * size_t(n) + size_t(m)),
        tables(cos_sin + size_t(n) * size_t(rope_dim)) {}
};
enum ProfKind {
  kEmbed, kNorm, kQkv, kRope, kAttention, kWo, kAttnBlock, kGateUp, kSilu, kDown, kFfnBlock, kOutput, kSample, kUpload,
  kProfKinds
};
constexpr const char* kProfNames[kProfKinds] = {"embed",   "norm",      "qkv",  "rope",   "attention", "wo",
                                                "attn_block", "gate_up", "silu", "down", "ffn_block", "output",
                                                "sample", "upload"};
}  // namespace

CudaModel::CudaModel(GgufFile file, const ModelOptions& opt)
    : file_(std::move(file)),
      config_(ModelConfig::from_gguf(file_)),
      host_weights_(bind_llama_weights(file_, config_)) {
  const ModelConfig& c = config_;
  if (c.head_dim % 4 != 0 || c.head_dim > 256)
    throw ModelError(file_.path() + ": --device cuda supports head dimensions that are multiples of 4 up to 256, got " +
                     std::to_string(c.head_dim));
  rope_.head_dim = c.head_dim;
  rope_.rope_dim = c.rope_dim;
  rope_.freq_base = c.rope_freq_base;
  rope_.freq_scale = c.rope_freq_scale;
  rope_.freq_factors = host_weights_.rope_freq_factors;
  // Before any upload or CUDA resource: a refused --kv-cache-dtype costs nothing.
  kv_dtype_ = resolve_kv_dtype(opt.kv_dtype);

  FDL_CUDA_CHECK(cudaDeviceGetAttribute(&n_sm_, cudaDevAttrMultiProcessorCount, 0));
  size_t free_b = 0, total_b = 0;
  FDL_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const uint64_t need = device_weight_bytes(host_weights_, c);
  if (need + (256u << 20) > free_b)
    throw ModelError(file_.path() + ": --device cuda: the weights need " + std::to_string(need >> 20) +
                     " MiB of device memory, " + std::to_string(free_b >> 20) + " MiB are free");
  weights_ = upload_weights(host_weights_, c);
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  FDL_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  FDL_CUDA_CHECK(cudaEventCreateWithFlags(&push_done_, cudaEventDisableTiming));
  tier_copier_ = std::make_unique<TierCopier>(stream_, [this] { replay_pool_log(); });
  for (UploadTurn& u : upload_turn_) {
    FDL_CUDA_CHECK(cudaEventCreateWithFlags(&u.uploaded, cudaEventDisableTiming));
    FDL_CUDA_CHECK(cudaEventCreateWithFlags(&u.consumed, cudaEventDisableTiming));
  }
  FDL_CUBLAS_CHECK(cublasCreate(&cublas_));
  FDL_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // A workspace of our own, so cuBLAS never allocates while a step is captured in a graph.
  cublas_workspace_.grow(kCublasWorkspaceBytes);
  FDL_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.get(), kCublasWorkspaceBytes));
  if (const char* g = std::getenv("FLASHDLLM_GEMM_TUNE"); !(g && std::string(g) == "0"))
    lt_gemm_ = std::make_unique<LtGemm>(stream_, cublas_workspace_.get(), kCublasWorkspaceBytes);
  // Plain fp32 SGEMM for F32 weights (no TF32): the F32 path stays close to the CPU's.
  FDL_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  if (const char* g = std::getenv("FLASHDLLM_CUDA_GRAPHS"); g && std::string(g) == "0") use_graphs_ = false;
  if (const char* t = std::getenv("FLASHDLLM_ATTN_TILES"); t && std::string(t) == "0") tiles_enabled_ = false;
  if (const char* f = std::getenv("FLASHDLLM_CUDA_FUSE"); f && std::string(f) == "0") fuse_enabled_ = false;
  // Prefill attention on tensor cores (fp16 operands) where the prefill GEMMs already round
  // activations to 16 bits (F16/BF16 weights); an F32 model keeps the fp32 tiles, so it stays
  // as close to the CPU backend as before. FLASHDLLM_ATTN_TC=0/1 overrides.
  attn_tc_ = !weights_.layers.empty() && weights_.layers[0].qkv.view.type != WType::F32;
  if (const char* t = std::getenv("FLASHDLLM_ATTN_TC"); t) attn_tc_ = std::string(t) == "1";
  if (kv_dtype_ != KvDtype::F32) attn_tc_ = true;  // the fp32 tiles read an fp32 cache only
  if (const char* t = std::getenv("FLASHDLLM_DECODE_TILES"); t && std::string(t) == "0") decode_tiles_ = false;
  // Batch-1 decode: each half of a layer as one kernel (decode_attention_block,
  // decode_ffn_block) where the shapes allow; FLASHDLLM_ATTN_BLOCK=0 / FLASHDLLM_FFN_BLOCK=0
  // keep the kernels they replace.
  auto env_off = [](const char* name) {
    const char* v = std::getenv(name);
    return v && std::string(v) == "0";
  };
  if (fuse_enabled_ && !weights_.layers.empty()) {
    // Every layer must pass (the weight types may differ from layer to layer: a tensor kept
    // at higher precision turns its fused matrix F32), with one block count for all; 0 = off.
    auto same_for_all_layers = [&](auto blocks_for) {
      const int first = blocks_for(weights_.layers[0]);
      for (const CudaLayer& L : weights_.layers)
        if (blocks_for(L) != first) return 0;
      return first;
    };
    const KvLayerView shape{nullptr, 0, 0, 1, c.n_head_kv, c.head_dim, kv_dtype_};
    if (!env_off("FLASHDLLM_ATTN_BLOCK"))
      attn_block_groups_ = same_for_all_layers([&](const CudaLayer& L) {
        return attention_block_groups(L.qkv.view, L.wo.view, c.n_head, shape, n_sm_);
      });
    if (!env_off("FLASHDLLM_FFN_BLOCK"))
      ffn_blocks_ = same_for_all_layers(
          [&](const CudaLayer& L) { return ffn_block_blocks(L.gate_up.view, L.down.view, n_sm_); });
    // The final norm and the output projection of one token (FLASHDLLM_OUTPUT_BLOCK=0: the
    // add_rms_norm + gemv pair).
    if (!env_off("FLASHDLLM_OUTPUT_BLOCK") && output_block_supported(weights_.output.view)) output_blocks_ = n_sm_;
    if (attn_block_groups_ > 0)
      block_partial_.grow(attention_block_partial_floats(c.n_head, c.head_dim, attn_block_groups_));
    block_sync_.grow(size_t(c.n_layer) * sync_per_layer());
    if (const char* t = std::getenv("FLASHDLLM_DECODE_TRACE"); t && std::string(t) == "1" && trace_per_layer() > 0) {
      trace_.grow(size_t(c.n_layer) * trace_per_layer());
      FDL_CUDA_CHECK(cudaMemsetAsync(trace_.get(), 0, trace_.bytes(), stream_));
    }
  }
  if (const char* p = std::getenv("FLASHDLLM_CUDA_PROFILE"); p && std::string(p) == "1") {
    profile_ = true;
    use_graphs_ = false;
    prof_ms_.assign(kProfKinds, 0.0);
  }
}

void CudaModel::prof(int kind) {
  if (!profile_) return;
  if (prof_used_ == prof_events_.size()) {
    cudaEvent_t e;
    FDL_CUDA_CHECK(cudaEventCreate(&e));
    prof_events_.push_back(e);
    prof_kinds_.push_back(0);
  }
  FDL_CUDA_CHECK(cudaEventRecord(prof_events_[prof_used_], stream_));
  prof_kinds_[prof_used_++] = kind;
}

void CudaModel::collect_profile() {
  if (!profile_) return;
  for (size_t i = 1; i < prof_used_; ++i) {
    float ms = 0;
    FDL_CUDA_CHECK(cudaEventElapsedTime(&ms, prof_events_[i - 1], prof_events_[i]));
    prof_ms_[size_t(prof_kinds_[i])] += ms;
  }
  prof_used_ = 0;
}

std::vector<std::pair<std::string, double>> CudaModel::profile() const {
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < prof_ms_.size(); ++k) out.emplace_back(kProfNames[k], prof_ms_[k]);
  return out;
}

void CudaModel::reset_profile() { prof_ms_.assign(prof_ms_.size(), 0.0); }

CudaModel::~CudaModel() {
  for (cudaEvent_t e : prof_events_) cudaEventDestroy(e);
  if (stream_) cudaStreamSynchronize(stream_);  // uncollected submitted steps still write into our buffers
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  tier_copier_.reset();  // waits for tier copies into and out of the arena
  for (SubmittedStep& s : submitted_)
    if (s.copied) cudaEventDestroy(s.copied);
  for (UploadTurn& u : upload_turn_) {
    if (u.uploaded) cudaEventDestroy(u.uploaded);
    if (u.consumed) cudaEventDestroy(u.consumed);
  }
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (push_done_) cudaEventDestroy(push_done_);
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  if (cublas_) cublasDestroy(cublas_);
  if (stream_) cudaStreamDestroy(stream_);
}

KvShape CudaModel::kv_shape(int block_size) const {
  if (block_size <= 0)
    throw std::invalid_argument("kv_shape: block size must be positive, got " + std::to_string(block_size));
  return KvShape{.n_layer = config_.n_layer, .n_kv_head = config_.n_head_kv, .head_dim = config_.head_dim,
                 .block_size = block_size, .dtype = kv_dtype_};
}

// ModelOptions::kv_dtype: auto is the weights' 16-bit type where every layer's matrices share
// it and the tensor-core tiles handle the head size; a 16-bit cache must be that type (the
// kernels read a 16-bit cache's bytes as their mma operands, and the batch-1 attention kernel
// is instantiated for fp32 or the weights' type).
KvDtype CudaModel::resolve_kv_dtype(std::optional<KvDtype> want) const {
  const ModelConfig& c = config_;
  std::optional<KvDtype> native;
  if (!host_weights_.layers.empty() && attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv)) {
    const WType t = device_qkv_type(host_weights_.layers[0]);
    bool same = t != WType::F32;
    for (const LlamaLayerWeights& L : host_weights_.layers)
      same = same && device_qkv_type(L) == t && device_wo_type(L) == t;
    if (same) native = t == WType::F16 ? KvDtype::F16 : KvDtype::BF16;
  }
  if (!want) return native.value_or(KvDtype::F32);
  if (*want != KvDtype::F32 && want != native)
    throw ModelError(file_.path() + ": --kv-cache-dtype " + kv_dtype_name(*want) + ": --device cuda keeps a 16-bit KV " +
                     "cache only in the type of a model's 16-bit weights (head_dim 64 or 128); this model allows " +
                     (native ? std::string(kv_dtype_name(*native)) + " or f32" : std::string("f32 only")));
  return *want;
}

// The same checks, messages and exception types as the CPU model's validate (trees through
// the same TokenTreeLayout), plus the size limit of the ancestor masks.
void CudaModel::validate(const StepBatch& b, const KvCache& kv, long chain_rows) {
  const size_t n = b.tokens.size();
  if (b.positions.size() != n || b.seqs.size() != n || b.want_logits.size() != n)
    throw std::invalid_argument("forward: StepBatch vectors differ in length (tokens " + std::to_string(n) +
                                ", positions " + std::to_string(b.positions.size()) + ", seqs " +
                                std::to_string(b.seqs.size()) + ", want_logits " +
                                std::to_string(b.want_logits.size()) + ")");
  const KvShape& s = kv.pool().shape();
  if (s.n_layer != config_.n_layer || s.n_kv_head != config_.n_head_kv || s.head_dim != config_.head_dim ||
      s.dtype != kv_dtype_)
    throw std::invalid_argument("forward: KV cache shape (layers " + std::to_string(s.n_layer) + ", kv heads " +
                                std::to_string(s.n_kv_head) + ", head dim " + std::to_string(s.head_dim) + ", " +
                                kv_dtype_name(s.dtype) + ") does not match the model (" + kv_dtype_name(kv_dtype_) +
                                ")");
  tree_.resolve(b);  // throws std::invalid_argument for a malformed tree
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 && chain_rows != kNoChain) {  // submit_sample's previous_step_id
      if (chain_rows < 0)
        throw std::invalid_argument("submit_sample: token " + std::to_string(i) +
                                    " refers to the previous step's ids, but no submit_sample step ran since the "
                                    "last other forward");
      if (previous_step_row(b.tokens[i]) >= chain_rows)
        throw std::out_of_range("submit_sample: token " + std::to_string(i) + " refers to row " +
                                std::to_string(previous_step_row(b.tokens[i])) + " of a previous step with " +
                                std::to_string(chain_rows) + " rows");
    } else if (b.tokens[i] < 0 || b.tokens[i] >= config_.n_vocab)
      throw std::out_of_range("forward: token " + std::to_string(i) + " has id " + std::to_string(b.tokens[i]) +
                              " outside [0, " + std::to_string(config_.n_vocab) + ")");
    const size_t len = kv.length(b.seqs[i]);  // throws std::out_of_range for a dead sequence
    const int32_t slot = tree_.slot(i);        // the position, unless a tree token
    if (slot < 0 || size_t(slot) >= len)
      throw std::out_of_range("forward: token " + std::to_string(i) + " position " + std::to_string(b.positions[i]) +
                              (slot != b.positions[i] ? " (tree slot " + std::to_string(slot) + ")" : std::string()) +
                              " is not a reserved slot of sequence " + std::to_string(b.seqs[i]) + " (length " +
                              std::to_string(len) + "; call append_slots first)");
    const BlockId block = kv.block_table(b.seqs[i])[size_t(slot) / size_t(s.block_size)];
    if (kv.pool().meta(block).ref_count != 1)
      throw std::invalid_argument("forward: token " + std::to_string(i) + " slot " + std::to_string(slot) +
                                  " of sequence " + std::to_string(b.seqs[i]) + " lies in block " +
                                  std::to_string(block) +
                                  " shared with another sequence (forked); truncate and append_slots to get a "
                                  "private slot");
  }
  // After the per-token checks, so a batch the CPU model refuses with std::out_of_range is
  // refused the same way here whatever its tree's size.
  if (tree_.window() > TokenTreeLayout::kMaskWindow)
    throw std::invalid_argument("forward: --device cuda verifies token trees of at most " +
                                std::to_string(TokenTreeLayout::kMaskWindow) + " nodes below their root, got " +
                                std::to_string(tree_.window()));
  if (const auto it = cache_copies_.find(kv.uid()); it != cache_copies_.end()) {
    const CacheCopies& cc = it->second;
    if (kv.blocks_copied() >= cc.seen && kv.blocks_copied() - cc.seen != cc.reported->copies)
      throw std::logic_error("forward: --device cuda: " + std::to_string(kv.blocks_copied() - cc.seen) +
                             " copy-on-write block copies since the last forward but " +
                             std::to_string(cc.reported->copies) +
                             " reported to the CUDA model (was its KvCache block-copy observer replaced?)");
    if (kv.slots_moved() >= cc.moves_seen && kv.slots_moved() - cc.moves_seen != cc.reported->moves)
      throw std::logic_error("forward: --device cuda: " + std::to_string(kv.slots_moved() - cc.moves_seen) +
                             " KV slot moves since the last forward but " + std::to_string(cc.reported->moves) +
                             " reported to the CUDA model (was its KvCache slot-move observer replaced?)");
  }
}

void CudaModel::replay_pool_log() {
  if (arena_.get() != nullptr && !pool_log_->ops.empty() && tier_copier_->pulls_pending()) {
    // A copy logged after a block's pull was queued (the block went back to the pool and was
    // handed out again) must not overwrite it before the pull has read it.
    replay_targets_.clear();
    for (const KvCopy& op : pool_log_->ops) replay_targets_.push_back(op.dst);
    tier_copier_->fence_writes(replay_targets_);
  }
  if (arena_.get() != nullptr) {
    const size_t block_bytes = arena_shape_.block_bytes();
    const size_t slot_bytes = arena_shape_.elems_per_token_per_layer() * kv_dtype_bytes(arena_shape_.dtype);
    auto* arena = reinterpret_cast<uint8_t*>(arena_.get());
    // In order: a block or slot copied to may itself be the source of a later copy.
    for (const KvCopy& op : pool_log_->ops) {
      uint8_t* dst = arena + size_t(op.dst) * block_bytes;
      const uint8_t* src = arena + size_t(op.src) * block_bytes;
      if (op.src_slot < 0) {
        FDL_CUDA_CHECK(cudaMemcpyAsync(dst, src, block_bytes, cudaMemcpyDeviceToDevice, stream_));
        continue;
      }
      // One slot's K and V in every layer: 2 * n_layer rows of slot_bytes, one row per
      // [layer][k|v] at a stride of block_size slots (the pool's layout, kv_cache.h).
      const size_t pitch = size_t(arena_shape_.block_size) * slot_bytes;
      FDL_CUDA_CHECK(cudaMemcpy2DAsync(dst + size_t(op.dst_slot) * slot_bytes, pitch,
                                       src + size_t(op.src_slot) * slot_bytes, pitch, slot_bytes,
                                       2 * size_t(arena_shape_.n_layer), cudaMemcpyDeviceToDevice, stream_));
    }
  }
  pool_log_->ops.clear();
}

// Called after ensure_arena(kv.pool()): the log is the pool's. Before this cache's kernels,
// every copy and move any cache of the pool made runs on the device, in host order.
void CudaModel::sync_block_copies(KvCache& kv) {
  replay_pool_log();
  std::erase_if(cache_copies_, [](const auto& e) { return e.second.cache_alive.expired(); });  // destroyed caches
  CacheCopies& cc = cache_copies_[kv.uid()];
  cc.pool_uid = kv.pool().uid();
  cc.cache_alive = kv.lifetime();
  cc.seen = kv.blocks_copied();
  cc.moves_seen = kv.slots_moved();
  *cc.reported = Reported{pool_log_, 0, 0};
  // Re-registered every step: cheap (the weak_ptr fits std::function's inline storage).
  kv.set_block_copy_observer([rep = std::weak_ptr<Reported>(cc.reported)](BlockId src, BlockId dst) {
    if (const auto r = rep.lock()) {
      ++r->copies;
      if (const auto l = r->log.lock()) l->ops.push_back(KvCopy{src, dst, -1, -1});
    }
  });
  kv.set_slot_move_observer([rep = std::weak_ptr<Reported>(cc.reported)](BlockId src, int src_slot, BlockId dst,
                                                                          int dst_slot) {
    if (const auto r = rep.lock()) {
      ++r->moves;
      if (const auto l = r->log.lock()) l->ops.push_back(KvCopy{src, dst, src_slot, dst_slot});
    }
  });
}

// The tier manager's view of the device arena (BlockMirror): the arena has the pool's
// per-block layout, so a block is one contiguous copy, on the compute stream, so it is ordered
// with the kernels and copy-on-write replays around it. A pull (demotion) is synchronous: the
// host needs the bytes. A push (promotion) is only queued: the host goes on (the next block's
// checksum, the next disk completion) while the DMA runs, and the next forward's kernels
// follow it in stream order; host writes to the arena wait for it first
// (host_write_fence, through BlockPool::block_bytes_for_write). Copies are from page-locked
// memory: on the first copy the mirror pins the pool's host arena (cudaHostRegister: ~60 ms
// per GiB on the H200, so a pool without KV tiers, which never copies, does not pay it), and
// each copy is one DMA at PCIe speed instead of a staged pageable copy (a pageable push is
// staged before cudaMemcpyAsync returns); if the system refuses, copies stay pageable. The pin
// is released, after the pushes in flight, when the pool closes or the mirror goes, whichever
// comes first.
namespace {
// Page-locks host memory the KV tiers own (BlockMirror::pin_host), released with the handle.
std::shared_ptr<void> pin_host_memory(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return nullptr;
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    throw std::runtime_error("cannot page-lock " + std::to_string(bytes >> 20) + " MiB of host memory for KV tier copies: " +
                             cudaGetErrorString(e));
  }
  return std::shared_ptr<void>(p, [](void* q) {
    if (cudaHostUnregister(q) != cudaSuccess) (void)cudaGetLastError();
  });
}
}  // namespace

class CudaModel::ArenaMirror final : public BlockMirror {
 public:
  ArenaMirror(CudaModel& model, BlockPool& pool) : model_(model), pool_uid_(pool.uid()), arena_(pool.arena_bytes()) {}
  ~ArenaMirror() override { unpin(); }
  void pull(BlockId id, std::span<uint8_t> host) override {
    pin_once();
    model_.copy_block(pool_uid_, id, host.data(), true);
  }
  void push(BlockId id, std::span<const uint8_t> host) override {
    pin_once();
    model_.copy_block(pool_uid_, id, const_cast<uint8_t*>(host.data()), false);
  }
  void host_write_fence(BlockId id) noexcept override { model_.settle_pushes(id); }

  // Asynchronous direct copies (BlockMirror): the model's TierCopier.
  bool copies_async() const override { return model_.arena_shape_.block_bytes() % 8 == 0; }
  std::shared_ptr<void> pin_host(void* p, size_t bytes) override { return pin_host_memory(p, bytes); }
  CopyHandle queue_copy(BlockId id, uint8_t* host, bool to_host) override {
    check_live();
    return model_.tier_copier_->queue(id, host, to_host);
  }
  void flush() override { model_.tier_copier_->flush(); }
  bool copy_done(CopyHandle h) override { return model_.tier_copier_->done(h); }
  void wait_copy(CopyHandle h) override { model_.tier_copier_->wait(h); }
  uint64_t collect_copy(CopyHandle h) override { return model_.tier_copier_->collect(h); }
  CopyTotals copy_totals() const override { return model_.tier_copier_->totals(); }
  std::pair<double, double> measure_link(uint8_t* host, size_t bytes) override {
    check_live();
    return model_.tier_copier_->measure_link(host, bytes);
  }

  void pool_closing() override {
    model_.settle_pushes();  // before the arena goes
    unpin();
    closed_ = true;  // the arena is going: never pin it again
  }
  bool pinned() const { return pinned_ != nullptr; }

 private:
  void pin_once() {
    if (tried_ || closed_ || arena_.empty()) return;
    tried_ = true;
    if (cudaHostRegister(arena_.data(), arena_.size(), cudaHostRegisterDefault) == cudaSuccess)
      pinned_ = arena_.data();
    else
      (void)cudaGetLastError();  // not pinned: clear the error, copy from pageable memory
  }
  void unpin() {
    if (pinned_ && cudaHostUnregister(pinned_) != cudaSuccess) (void)cudaGetLastError();
    pinned_ = nullptr;
  }
  void check_live() const {
    if (model_.arena_uid_ != pool_uid_)
      throw std::logic_error("CudaModel: a tier copy for a pool the device arena no longer holds");
  }
  CudaModel& model_;
  uint64_t pool_uid_;
  std::span<uint8_t> arena_;
  void* pinned_ = nullptr;
  bool tried_ = false, closed_ = false;
};

bool CudaModel::kv_host_pinned() const { return mirror_ && mirror_->pinned(); }

void CudaModel::copy_block(uint64_t pool_uid, BlockId id, void* host, bool to_host) {
  // A mirror is registered only by ensure_arena and expires when the arena moves to another
  // pool, so a call for another pool or an out-of-range block is a bug, not a no-op.
  if (pool_uid != arena_uid_ || arena_.get() == nullptr || id < 0 || size_t(id) >= arena_blocks_)
    throw std::logic_error("CudaModel: block copy for block " + std::to_string(id) +
                           " of a pool the device arena does not hold");
  replay_pool_log();  // a pending copy-on-write or slot move may target `id`
  const size_t bytes = arena_shape_.block_bytes();
  uint8_t* dev = reinterpret_cast<uint8_t*>(arena_.get()) + size_t(id) * bytes;
  if (to_host) {
    FDL_CUDA_CHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    pushed_.clear();  // queued before the pull, so done too
  } else {
    // Tracked before queueing: whatever fails after, a fence still waits for (or rules out) it.
    pushed_.insert(id);
    FDL_CUDA_CHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    if (cudaEventRecord(push_done_, stream_) != cudaSuccess) {
      (void)cudaGetLastError();
      FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // no event: wait for the copy here
      pushed_.clear();
    }
  }
}

void CudaModel::bind_kv_pool(BlockPool& pool) { ensure_arena(pool); }

void CudaModel::fence_tier_pulls(const StepBatch& batch, KvCache& kv) {
  if (!tier_copier_->pulls_pending()) return;
  // The blocks this step writes: its tokens' blocks (from each sequence's first token of the
  // step to the end of its table: tree nodes sit in slots right of their positions) and the
  // targets of pending copy-on-write copies and slot moves.
  written_.clear();
  const int bs = kv.pool().shape().block_size;
  for (size_t t = 0; t < batch.size(); ++t) {
    const SeqId s = batch.seqs[t];
    if (t > 0 && batch.seqs[t - 1] == s && batch.positions[t] >= batch.positions[t - 1]) continue;
    const auto table = kv.block_table(s);
    for (size_t i = size_t(batch.positions[t] / bs); i < table.size(); ++i) written_.push_back(table[i]);
  }
  for (const KvCopy& op : pool_log_->ops) written_.push_back(op.dst);
  tier_copier_->fence_writes(written_);
}

void CudaModel::settle_pushes(BlockId id) noexcept {
  if (pushed_.empty() || (id >= 0 && !pushed_.contains(id))) return;
  // One event after the latest push: waiting for it waits for all of them.
  if (cudaEventSynchronize(push_done_) != cudaSuccess) (void)cudaGetLastError();  // a device fault: see above
  pushed_.clear();
}

size_t CudaModel::arena_block_elems() const {
  return arena_shape_.block_bytes() / kv_dtype_bytes(arena_shape_.dtype);
}

void CudaModel::ensure_arena(BlockPool& pool) {
  if (arena_uid_ == pool.uid() && arena_blocks_ == pool.capacity()) return;
  if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // submitted steps use the old arena
  settle_pushes();  // pushes in flight write the old arena and read the old pool's host arena
  tier_copier_->flush();
  tier_copier_->synchronize();  // tier copies in flight address the old arena
  // Nothing refers to the old arena from here on, also if the allocation below fails.
  arena_uid_ = 0;
  arena_blocks_ = 0;
  mirror_.reset();
  // Pending copies and moves of the old pool have nothing left to replay into (its blocks
  // leave the device with the arena): a fresh log, which the old pool's caches' observers do
  // not reach (theirs expires); a cache that comes back registers anew at its next forward.
  pool_log_ = std::make_shared<CopyLog>();
  std::erase_if(cache_copies_, [&](const auto& e) { return e.second.pool_uid != pool.uid(); });
  // fp32 storage for any dtype (a 16-bit block holds an even number of elements).
  const size_t floats = pool.capacity() * (pool.shape().block_bytes() / sizeof(float));
  arena_.reset();
  try {
    arena_.grow(floats);
  } catch (const CudaError& e) {
    throw KvCacheFull("--device cuda: cannot allocate the KV arena of " + std::to_string(pool.capacity()) +
                      " blocks (" + std::to_string(floats * 4 >> 20) + " MiB) on the device: " + e.what());
  }
  FDL_CUDA_CHECK(cudaMemsetAsync(arena_.get(), 0, floats * sizeof(float), stream_));
  arena_uid_ = pool.uid();
  arena_shape_ = pool.shape();
  arena_blocks_ = pool.capacity();
  if (arena_shape_.block_bytes() % 8 == 0)
    tier_copier_->set_arena(reinterpret_cast<uint8_t*>(arena_.get()), arena_shape_.block_bytes(), arena_blocks_);
  mirror_ = std::make_shared<ArenaMirror>(*this, pool);  // the previous pool's mirror expires
  pool.set_mirror(mirror_);
  ++generation_;
}

void CudaModel::ensure_scratch(int n, int m, int splits) {
  const ModelConfig& c = config_;
  const size_t d = size_t(c.n_embd), q = size_t(c.n_head) * c.head_dim, kvd = size_t(c.n_head_kv) * c.head_dim,
               ff = size_t(c.n_ff), nn = size_t(n), mm = size_t(std::max(m, 1));
  // Visits every scratch buffer with the room this step needs: first to ask whether any must
  // grow (submitted steps still running use them: wait for those first), then to grow them.
  auto each = [&](auto&& f) {
    f(x_, nn * d);
    f(x2_, d);  // the fused single-token path's second residual buffer
    f(xn_, nn * d);
    f(proj_, nn * d);
    f(qkv_, nn * (q + 2 * kvd));
    f(q_, nn * q);
    f(attn_, nn * q);
    f(gu_, nn * 2 * ff);
    f(h_, nn * ff);
    f(out_rows_, mm * d);
    f(logits_, mm * size_t(c.n_vocab));
    f(partial_, attention_partial_floats(n, c.n_head, c.head_dim, splits));
    if (n > kGemvMaxTokens) f(xh_, std::max(nn, mm) * std::max({d, q, ff}));
  };
  bool grows = ids_.size() < mm;
  each([&](auto& buf, size_t count) { grows |= buf.size() < count; });
  if (!grows) return;
  if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  bool moved = false;
  each([&](auto& buf, size_t count) { moved |= buf.grow(count); });
  if (ids_.size() < mm) {
    // The last step's ids move along: a previous_step_id of the next step reads them.
    DeviceBuffer<int32_t> ids(mm);
    if (ids_.size() > 0)
      FDL_CUDA_CHECK(cudaMemcpyAsync(ids.get(), ids_.get(), ids_.bytes(), cudaMemcpyDeviceToDevice, stream_));
    FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // before the old buffer is freed
    ids_ = std::move(ids);
    moved = true;
  }
  if (moved) ++generation_;
}

WType CudaModel::gemm_input_type(const DeviceMatrix& W, int n) const {
  return n > kGemvMaxTokens ? W.type : WType::F32;
}

void CudaModel::matmul(const DeviceMatrix& W, const void* Xv, int n, float* Y) {
  if (n <= 0) return;
  const auto* X = static_cast<const float*>(Xv);
  if (n <= kGemvMaxTokens) return gemv(W, X, n, Y, stream_);
  const float alpha = 1.f, beta = 0.f;
  const int rows = int(W.rows), cols = int(W.cols);
  // Row-major Y[n][rows] = X[n][cols] · Wᵀ is column-major Yᵀ = W(ᵀ as stored) · Xᵀ.
  if (W.type == WType::F32) {
    FDL_CUBLAS_CHECK(cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha,
                                 static_cast<const float*>(W.data), cols, X, cols, &beta, Y, rows));
    return;
  }
  // X is already in W's type when it comes from a producer that wrote gemm_input_type().
  if (lt_gemm_ && n <= kTunedGemmMaxTokens) return lt_gemm_->run(W, Xv, n, Y);
  const cudaDataType_t t = W.type == WType::F16 ? CUDA_R_16F : CUDA_R_16BF;
  FDL_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, rows, n, cols, &alpha, W.data, t, cols,
                                Xv, t, cols, &beta, Y, CUDA_R_32F, rows, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CudaModel::run_kernels(int n, int m) {
  const ModelConfig& c = config_;
  const int d = c.n_embd, kv_dim = c.n_head_kv * c.head_dim;
  const int block_size = arena_shape_.block_size;
  embed_rows(weights_.token_embd.view, d_tokens_, ids_.get(), n, x_.get(), stream_);
  prof(kEmbed);
  KvLayerView kv{arena_.get(), 0, int64_t(arena_block_elems()), block_size, c.n_head_kv, c.head_dim,
                 arena_shape_.dtype};
  AttentionArgs att;
  att.q = q_.get();
  att.out = attn_.get();
  att.positions = d_positions_;
  att.table_off = d_table_off_;
  att.tables = d_tables_;
  att.n_tokens = n;
  att.n_head = c.n_head;
  att.scale = 1.0f / std::sqrt(float(c.head_dim));
  att.n_splits = splits_;
  att.tile_starts = d_tiles_;
  att.n_tiles = n_tiles_;
  att.tensor_cores = attn_tc_;
  att.tc_bf16 = weights_.layers[0].qkv.view.type == WType::BF16;  // operands in the weights' type
  att.max_tile_rows = max_tile_rows_;
  att.partial = partial_.get();
  const AttentionTree tree{d_tree_base_, d_tree_mask_};  // null without trees: the kernels without masks
  // One decode token: norm fused into the projections, RoPE/SwiGLU into their epilogues.
  const bool fused = n == 1 && fuse_enabled_;
  if (fused && (attn_block_groups_ > 0 || ffn_blocks_ > 0))  // every layer's hand-off counters start at zero
    FDL_CUDA_CHECK(cudaMemsetAsync(block_sync_.get(), 0, block_sync_.bytes(), stream_));
  for (int l = 0; l < c.n_layer; ++l) {
    const CudaLayer& L = weights_.layers[size_t(l)];
    kv.layer_offset = int64_t(l) * 2 * block_size * kv_dim;
    if (fused) {
      run_fused_layer(l, kv, att);
      continue;
    }
    // x += (previous layer's FFN output); xn = norm(x). Layer 0 has nothing to add.
    const WType qkv_in = gemm_input_type(L.qkv.view, n);
    void* xn_in = qkv_in == WType::F32 ? static_cast<void*>(xn_.get()) : static_cast<void*>(xh_.get());
    add_rms_norm(x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm.get(), xn_in, nullptr, n, d, c.rms_eps,
                 true, stream_, qkv_in);
    prof(kNorm);
    matmul(L.qkv.view, xn_in, n, qkv_.get());
    prof(kQkv);
    rope_qkv_store(qkv_.get(), d_cos_sin_, d_positions_, d_dst_block_, n, c.n_head, c.rope_dim, kv, q_.get(), stream_);
    prof(kRope);
    att.kv = kv;
    paged_attention(att, stream_, tree);
    prof(kAttention);
    if (gemm_input_type(L.wo.view, n) != WType::F32) {
      cast_f32(attn_.get(), size_t(n) * size_t(c.n_head) * c.head_dim, L.wo.view.type, xh_.get(), stream_);
      matmul(L.wo.view, xh_.get(), n, proj_.get());
    } else {
      matmul(L.wo.view, attn_.get(), n, proj_.get());
    }
    prof(kWo);
    const WType gu_in = gemm_input_type(L.gate_up.view, n);
    void* xn2 = gu_in == WType::F32 ? static_cast<void*>(xn_.get()) : static_cast<void*>(xh_.get());
    add_rms_norm(x_.get(), proj_.get(), L.ffn_norm.get(), xn2, nullptr, n, d, c.rms_eps, true, stream_, gu_in);
    prof(kNorm);
    matmul(L.gate_up.view, xn2, n, gu_.get());
    prof(kGateUp);
    const WType down_in = gemm_input_type(L.down.view, n);
    void* h_in = down_in == WType::F32 ? static_cast<void*>(h_.get()) : static_cast<void*>(xh_.get());
    silu_mul(gu_.get(), h_in, n, c.n_ff, stream_, down_in);
    prof(kSilu);
    matmul(L.down.view, h_in, n, proj_.get());
    prof(kDown);
  }
  if (m == 0) return;
  if (fused && output_blocks_ > 0) {  // one token (m == 1): norm and projection in one kernel
    OutputBlockArgs o;
    o.type = weights_.output.view.type;
    o.w = weights_.output.view.data;
    o.rows = weights_.output.view.rows;
    o.cols = int(weights_.output.view.cols);
    o.in = NormIn{x_.get(), proj_.get(), weights_.output_norm.get(), nullptr, c.rms_eps};
    o.y = logits_.get();
    o.blocks = output_blocks_;
    decode_output_block(o, stream_);
    prof(kOutput);
    return;
  }
  // Only the rows that want logits: x + last FFN output, final norm, output projection.
  const WType out_in = gemm_input_type(weights_.output.view, m);
  void* rows_in = out_in == WType::F32 ? static_cast<void*>(out_rows_.get()) : static_cast<void*>(xh_.get());
  add_rms_norm(x_.get(), proj_.get(), weights_.output_norm.get(), rows_in, d_row_idx_, m, d, c.rms_eps, false, stream_,
               out_in);
  matmul(weights_.output.view, rows_in, m, logits_.get());
  prof(kOutput);
}

// Residual stream: x_ -> (attention norm, fused into qkv) -> x2_ -> (FFN norm, fused into
// gate_up) -> x_, so a layer ends with it in x_ as on the unfused path. A kernel reads one
// buffer and its block 0 writes the other: no block overwrites what another still reads.
void CudaModel::run_fused_layer(int l, const KvLayerView& kv, AttentionArgs& att) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  const NormIn attn_in{x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm.get(), x2_.get(), c.rms_eps};
  if (attn_block_groups_ > 0) {
    run_attention_block(l, kv, attn_in, att.scale);
  } else {
    gemv_norm_rope_qkv(L.qkv.view, attn_in, d_cos_sin_, d_positions_, d_dst_block_, c.n_head, c.rope_dim, kv,
                       q_.get(), stream_);
    prof(kQkv);
    att.kv = kv;
    paged_attention(att, stream_);
    prof(kAttention);
    gemv(L.wo.view, attn_.get(), 1, proj_.get(), stream_);
    prof(kWo);
  }
  const NormIn ffn_in{x2_.get(), proj_.get(), L.ffn_norm.get(), x_.get(), c.rms_eps};
  if (ffn_blocks_ > 0) {
    run_ffn_block(l, ffn_in);
  } else {
    gemv_norm_swiglu(L.gate_up.view, ffn_in, h_.get(), stream_);
    prof(kGateUp);
    gemv(L.down.view, h_.get(), 1, proj_.get(), stream_);
    prof(kDown);
  }
}

// The FFN half of a batch-1 layer as one kernel: norm, gate/up + SwiGLU, down (kernels.h:
// decode_ffn_block), its output in proj_ as down's would be.
void CudaModel::run_ffn_block(int l, const NormIn& ffn_in) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  FfnBlockArgs f;
  f.type = L.gate_up.view.type;
  f.w_gate_up = L.gate_up.view.data;
  f.w_down = L.down.view.data;
  f.down_rows = L.down.view.rows;
  f.cols = int(L.gate_up.view.cols);
  f.n_ff = c.n_ff;
  f.in = ffn_in;
  f.h = h_.get();
  f.y = proj_.get();
  f.sync = block_sync_.get() + size_t(l) * sync_per_layer() + size_t(c.n_head_kv) + 1;
  f.blocks = ffn_blocks_;
  if (trace_.get())
    f.trace = trace_.get() + size_t(l) * trace_per_layer() + size_t(kAttnTraceEvents) * attn_trace_blocks();
  decode_ffn_block(f, stream_);
  prof(kFfnBlock);
}

// The attention half of a batch-1 layer as one kernel: norm, QKV, RoPE/KV store, attention,
// wo (kernels.h: decode_attention_block), its output in proj_ as wo's would be.
void CudaModel::run_attention_block(int l, const KvLayerView& kv, const NormIn& attn_in, float scale) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  AttentionBlockArgs b;
  b.type = L.qkv.view.type;
  b.wqkv = L.qkv.view.data;
  b.wo = L.wo.view.data;
  b.wo_rows = L.wo.view.rows;
  b.cols = int(L.qkv.view.cols);
  b.in = attn_in;
  b.cos_sin = d_cos_sin_;
  b.positions = d_positions_;
  b.dst_block = d_dst_block_;
  b.tables = d_tables_;
  b.table_off = d_table_off_;
  b.n_head = c.n_head;
  b.rope_dim = c.rope_dim;
  b.scale = scale;
  b.kv = kv;
  b.q_out = q_.get();
  b.attn_out = attn_.get();
  b.partial = block_partial_.get();
  b.y = proj_.get();
  b.sync = block_sync_.get() + size_t(l) * sync_per_layer();
  b.blocks_per_group = attn_block_groups_;
  if (trace_.get()) b.trace = trace_.get() + size_t(l) * trace_per_layer();
  decode_attention_block(b, stream_);
  prof(kAttnBlock);
}

size_t CudaModel::trace_per_layer() const {
  return size_t(kAttnTraceEvents) * attn_trace_blocks() + size_t(kFfnTraceEvents) * size_t(ffn_blocks_);
}

void CudaModel::clear_decode_trace() {
  if (trace_.get()) FDL_CUDA_CHECK(cudaMemsetAsync(trace_.get(), 0, trace_.bytes(), stream_));
}

CudaModel::DecodeTrace CudaModel::decode_trace() const {
  DecodeTrace t;
  if (trace_.get() == nullptr) return t;
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<uint64_t> all(trace_.size());
  FDL_CUDA_CHECK(cudaMemcpy(all.data(), trace_.get(), trace_.bytes(), cudaMemcpyDeviceToHost));
  t.n_layer = config_.n_layer;
  t.attn_events = kAttnTraceEvents;
  t.attn_blocks = int(attn_trace_blocks());
  t.ffn_events = kFfnTraceEvents;
  t.ffn_blocks = ffn_blocks_;
  const size_t na = size_t(t.attn_events) * size_t(t.attn_blocks), nf = size_t(t.ffn_events) * size_t(t.ffn_blocks);
  for (int l = 0; l < t.n_layer; ++l) {
    const uint64_t* p = all.data() + size_t(l) * trace_per_layer();
    t.attn.insert(t.attn.end(), p, p + na);
    t.ffn.insert(t.ffn.end(), p + na, p + na + nf);
  }
  return t;
}

void CudaModel::begin_plain_forward(const char* what) {
  if (pending_count_ > 0)
    throw std::logic_error(std::string(what) + ": " + std::to_string(pending_count_) +
                           " submitted step(s) not collected yet (collect_ids first)");
  chain_rows_ = -1;  // ids_ will hold this forward's ids (or nothing): no chain to continue
}

void CudaModel::forward(const StepBatch& batch, KvCache& kv, std::vector<float>& logits) {
  begin_plain_forward("forward");
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = launch_step(batch, kv, turn, kNoChain);
  logits.resize(size_t(m) * size_t(config_.n_vocab));
  if (m > 0)
    FDL_CUDA_CHECK(cudaMemcpyAsync(logits.data(), logits_.get(), logits.size() * sizeof(float),
                                   cudaMemcpyDeviceToHost, stream_));
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  collect_profile();
}

void CudaModel::forward_argmax(const StepBatch& batch, KvCache& kv, std::vector<int32_t>& ids) {
  begin_plain_forward("forward_argmax");
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = launch_step(batch, kv, turn, kNoChain, nullptr, Tail::Argmax);
  ids.resize(size_t(m));
  if (m > 0)
    FDL_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_.get(), size_t(m) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  collect_profile();
}

static_assert(sizeof(RowSampling) == sizeof(RowSamplingDev) && alignof(RowSampling) == alignof(RowSamplingDev));
static_assert(offsetof(RowSampling, temperature) == offsetof(RowSamplingDev, temperature) &&
              offsetof(RowSampling, top_k) == offsetof(RowSamplingDev, top_k) &&
              offsetof(RowSampling, top_p) == offsetof(RowSamplingDev, top_p) &&
              offsetof(RowSampling, min_p) == offsetof(RowSamplingDev, min_p) &&
              offsetof(RowSampling, uniform) == offsetof(RowSamplingDev, uniform) &&
              offsetof(RowSampling, repeat_penalty) == offsetof(RowSamplingDev, repeat_penalty) &&
              offsetof(RowSampling, frequency_penalty) == offsetof(RowSamplingDev, frequency_penalty) &&
              offsetof(RowSampling, presence_penalty) == offsetof(RowSamplingDev, presence_penalty));
static_assert(sizeof(PenaltyToken) == sizeof(PenaltyTokenDev) && offsetof(PenaltyToken, row) == offsetof(PenaltyTokenDev, row) &&
              offsetof(PenaltyToken, token) == offsetof(PenaltyTokenDev, token) &&
              offsetof(PenaltyToken, count) == offsetof(PenaltyTokenDev, count));

bool CudaModel::alternates(const StepBatch& batch) { return batch.size() <= size_t(kGemvMaxTokens); }

int CudaModel::acquire_upload_turn(const StepBatch& batch) {
  const int turn = alternates(batch) ? turn_ : 0;
  UploadTurn& u = upload_turn_[turn];
  if (u.pending) {  // the last upload from this turn's page-locked buffers may not have run yet
    FDL_CUDA_CHECK(cudaEventSynchronize(u.uploaded));
    u.pending = false;
  }
  return turn;  // launch_step moves on to the other turn once a small step uploads into this one
}

void CudaModel::end_step(int turn) noexcept {
  // No throw: this also runs while an exception unwinds (StepEnd); a failing record leaves
  // the turn's previous event, and the error is sticky for the next CUDA call to report.
  if (cudaEventRecord(upload_turn_[turn].consumed, stream_) == cudaSuccess) upload_turn_[turn].in_use = true;
}

ArgmaxScratch CudaModel::argmax_scratch(int m) {
  const size_t partials = argmax_partial_bytes(m, config_.n_vocab, n_sm_);
  if (partials == 0) return {};
  if (argmax_counters_.size() < size_t(m) || argmax_partials_.size() < partials) {
    if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // submitted steps use them
    if (argmax_counters_.grow(size_t(m))) {
      FDL_CUDA_CHECK(cudaMemsetAsync(argmax_counters_.get(), 0, argmax_counters_.bytes(), stream_));
      ++generation_;  // graphs with an argmax tail hold the old pointers
    }
    if (argmax_partials_.grow(partials)) ++generation_;
  }
  return ArgmaxScratch{argmax_counters_.get(), argmax_partials_.get(), n_sm_};
}

void CudaModel::enqueue_sampling(int m, int turn, const SamplingInput& in, int32_t* ids_copy) {
  const unsigned char* dev = sampling_dev_[turn].get();
  const auto* d_rows = reinterpret_cast<const RowSamplingDev*>(dev);
  apply_penalties(logits_.get(), config_.n_vocab, reinterpret_cast<const PenaltyTokenDev*>(dev + in.rows.size_bytes()),
                  int(in.penalties.size()), d_rows, stream_);
  // Greedy rows need only pass 1 of sample_rows (maximum and the NaN / +Inf check): the
  // argmax kernel does that with the row split over several SMs at small batches, and without
  // sample_rows' shared-memory footprint.
  const bool all_greedy =
      std::all_of(in.rows.begin(), in.rows.end(), [](const RowSampling& r) { return r.temperature == 0.0f; });
  if (all_greedy)
    argmax_rows(logits_.get(), m, config_.n_vocab, ids_.get(), stream_, true, argmax_scratch(m), ids_copy);
  else
    sample_rows(logits_.get(), m, config_.n_vocab, d_rows, ids_.get(), stream_, ids_copy);
  prof(kSample);  // penalties and the draw (or the checked argmax)
}

namespace {
void throw_failed_row(const std::vector<int32_t>& ids, const char* what) {
  for (size_t r = 0; r < ids.size(); ++r)
    if (ids[r] < 0)
      throw std::invalid_argument(std::string(what) + ": logits row " + std::to_string(r) +
                                  " holds NaN or +Inf, or only -Inf: nothing to sample");
}
}  // namespace

void CudaModel::forward_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                               std::span<const PenaltyToken> penalties, std::vector<int32_t>& ids) {
  begin_plain_forward("forward_sample");
  check_sampling_rows(batch, rows, penalties, config_.n_vocab);
  const SamplingInput in{rows, penalties};
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = launch_step(batch, kv, turn, kNoChain, &in);
  ids.resize(size_t(m));
  if (m > 0) {
    enqueue_sampling(m, turn, in);
    FDL_CUDA_CHECK(cudaMemcpyAsync(ids.data(), ids_.get(), size_t(m) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  }
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  collect_profile();
  throw_failed_row(ids, "forward_sample");
}

void CudaModel::submit_sample(const StepBatch& batch, KvCache& kv, std::span<const RowSampling> rows,
                              std::span<const PenaltyToken> penalties) {
  if (pending_count_ >= kMaxSubmitted)
    throw std::logic_error("submit_sample: " + std::to_string(pending_count_) +
                           " steps already submitted and not collected (at most " + std::to_string(kMaxSubmitted) + ")");
  check_sampling_rows(batch, rows, penalties, config_.n_vocab);
  const SamplingInput in{rows, penalties};
  // Greedy rows without penalties need no sampling input: the graph ends with the checked
  // argmax, which writes the ids into the turn's landing buffer (safe to reuse: the step two
  // submissions later, the next to use this turn, comes after this one's collect_ids).
  const bool greedy = penalties.empty() && alternates(batch) &&
                      std::all_of(rows.begin(), rows.end(), [](const RowSampling& r) { return r.temperature == 0.0f; });
  const int turn = acquire_upload_turn(batch);
  const StepEnd step_end{*this, turn};
  const int m = greedy ? launch_step(batch, kv, turn, chain_rows_, nullptr, Tail::CheckedArgmax)
                       : launch_step(batch, kv, turn, chain_rows_, &in);
  SubmittedStep& st = submitted_[(pending_first_ + pending_count_) % kMaxSubmitted];
  if (st.ids.grow(size_t(std::max(m, 1))))  // the kernel writes the ids straight into it
    FDL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&st.ids_dev), st.ids.get(), 0));
  if (st.copied == nullptr) FDL_CUDA_CHECK(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming));
  st.ids_at = greedy && m > 0 ? landing_[turn].get() : st.ids.get();
  if (m > 0 && !greedy) enqueue_sampling(m, turn, in, st.ids_dev);
  FDL_CUDA_CHECK(cudaEventRecord(st.copied, stream_));
  st.rows = m;
  st.chained = std::any_of(batch.tokens.begin(), batch.tokens.end(), [](int32_t t) { return t < 0; });
  ++pending_count_;
  chain_rows_ = m;
}

void CudaModel::collect_ids(std::vector<int32_t>& ids) {
  if (pending_count_ == 0) throw std::logic_error("collect_ids: no submitted step to collect");
  SubmittedStep& st = submitted_[pending_first_];
  // Off the queue first: a step whose wait fails (a device fault) is gone either way, so a
  // drain after the error ends.
  pending_first_ = (pending_first_ + 1) % kMaxSubmitted;
  --pending_count_;
  FDL_CUDA_CHECK(cudaEventSynchronize(st.copied));
  ids.assign(st.ids_at, st.ids_at + st.rows);
  if (pending_count_ == 0) collect_profile();
  const bool inherited = st.chained && chain_failed_;
  chain_failed_ = std::any_of(ids.begin(), ids.end(), [](int32_t t) { return t < 0; });
  if (inherited) {
    chain_failed_ = true;  // and so on down the chain
    throw std::invalid_argument(
        "collect_ids: this step's previous_step_id tokens came from a step whose sampling failed");
  }
  throw_failed_row(ids, "collect_ids");
}

int CudaModel::launch_step(const StepBatch& batch, KvCache& kv, int turn, long chain_rows, const SamplingInput* sampling,
                           Tail tail) {
  validate(batch, kv, chain_rows);
  const int n = int(batch.size());
  if (n == 0) return 0;
  const ModelConfig& c = config_;
  ensure_arena(kv.pool());
  fence_tier_pulls(batch, kv);
  sync_block_copies(kv);
  int m = 0, max_ctx = 0;
  m = int(batch.n_wanted());
  tree_step_ = tree_.has_tree();
  // Attention works on KV slots: a token's position, but further right for tree nodes, whose
  // trees thus are runs of consecutive slots (tiles like a prefill run).
  const int32_t* attn_pos = batch.positions.data();
  if (tree_step_) {
    tree_slots_.resize(size_t(n));
    for (int t = 0; t < n; ++t) tree_slots_[size_t(t)] = tree_.slot(size_t(t));
    attn_pos = tree_slots_.data();
  }
  for (int t = 0; t < n; ++t) max_ctx = std::max(max_ctx, attn_pos[t] + 1);

  // Pack the step's inputs into one pinned buffer; block tables of distinct sequences last.
  const Layout lay(n, m, c.rope_dim);
  const int block_size = kv.pool().shape().block_size;
  size_t tables_len = 0;
  for (int t = 0; t < n; ++t) {
    const SeqId s = batch.seqs[size_t(t)];
    if (size_t(s) >= seq_table_off_.size()) seq_table_off_.resize(size_t(s) + 1, -1);
    if (seq_table_off_[size_t(s)] < 0) {
      seq_table_off_[size_t(s)] = int32_t(tables_len);
      tables_len += kv.block_table(s).size();
    }
  }
  // Steps above the GEMV size use the tiled attention kernel when it fits. On fp32 CUDA cores
  // tiles pay off only for runs of several tokens (a batch of single decode tokens is faster
  // per token); on tensor cores a tile of one token is a memory-bound K/V stream with its
  // query heads as the rows (GQA), so every such step uses them.
  use_tiles_ = n > kGemvMaxTokens && tiles_enabled_ && attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv);
  if (use_tiles_) {
    tile_starts_.resize(size_t(n) + 1);
    n_tiles_ = attention_tiles(batch.seqs.data(), attn_pos, n, c.n_head, c.n_head_kv, tile_starts_.data());
    use_tiles_ = (attn_tc_ && decode_tiles_) || n_tiles_ * 8 <= n;
    max_tile_rows_ = 0;
    for (int i = 0; i < n_tiles_; ++i)
      max_tile_rows_ = std::max(max_tile_rows_, (tile_starts_[size_t(i) + 1] - tile_starts_[size_t(i)]) * (c.n_head / c.n_head_kv));
  }
  // Scratch (the split-K partials above all) is sized for the kernel that will run.
  splits_ = use_tiles_ ? attention_tile_splits(n_tiles_, c.n_head_kv, n_sm_, max_ctx)
                       : attention_splits(n, c.n_head, c.n_head_kv, n_sm_, max_ctx);
  ensure_scratch(n, m, splits_);
  // Tile starts and tree masks before the tables: the offsets then depend only on (n,
  // use_tiles_, tree_step_), which a captured graph's shape fixes (the tables' length varies
  // from step to step).
  const size_t tiles_at = lay.tables;
  const size_t tree_at = tiles_at + (use_tiles_ ? size_t(n) + 1 : 0);  // [n] base, then [2n] mask words
  const size_t tables_at = tree_at + (tree_step_ ? 3 * size_t(n) : 0);
  const size_t total = tables_at + tables_len;
  const size_t sampling_bytes = sampling ? sampling->rows.size_bytes() + sampling->penalties.size_bytes() : 0;
  if (total > staging_cap_ || sampling_dev_[turn].size() < sampling_bytes) {
    if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // submitted steps read them
  }
  if (total > staging_cap_) {  // grown by half again: the tables grow a little most steps,
    staging_cap_ = total + total / 2;  // and every move of the buffers drops the CUDA graphs
    for (DeviceBuffer<int32_t>& d : staging_dev_)
      if (d.grow(staging_cap_)) ++generation_;
  }
  sampling_dev_[turn].grow(sampling_bytes);
  staging_host_[turn].grow(staging_cap_);
  int32_t* h = staging_host_[turn].get();
  int row = 0;
  for (int t = 0; t < n; ++t) {
    const SeqId s = batch.seqs[size_t(t)];
    const int32_t pos = batch.positions[size_t(t)];  // RoPE position (the cos/sin row below)
    const int32_t slot = attn_pos[t];                  // where K/V go and attention ends: pos but in a tree
    const std::span<const BlockId> table = kv.block_table(s);
    h[lay.tokens + size_t(t)] = batch.tokens[size_t(t)];
    h[lay.positions + size_t(t)] = slot;
    h[lay.dst_block + size_t(t)] = table[size_t(slot / block_size)];
    if (tree_step_) {
      // Ordinary tokens: nothing masked (the base lies past their last slot).
      const uint64_t mask = tree_.ancestor_mask(size_t(t));
      h[tree_at + size_t(t)] = batch.tree_parent[size_t(t)] == -1 ? slot + 1 : tree_.tree_base()[t];
      h[tree_at + size_t(n) + 2 * size_t(t)] = int32_t(uint32_t(mask));
      h[tree_at + size_t(n) + 2 * size_t(t) + 1] = int32_t(uint32_t(mask >> 32));
    }
    h[lay.table_off + size_t(t)] = seq_table_off_[size_t(s)];
    if (batch.want_logits[size_t(t)]) h[lay.row_idx + size_t(row++)] = t;
    cpu::rope_cos_sin(rope_, pos, reinterpret_cast<float*>(h + lay.cos_sin) + size_t(t) * size_t(c.rope_dim));
  }
  for (int t = 0; t < n; ++t) {
    const SeqId s = batch.seqs[size_t(t)];
    if (seq_table_off_[size_t(s)] < 0) continue;
    const std::span<const BlockId> table = kv.block_table(s);
    std::memcpy(h + tables_at + size_t(seq_table_off_[size_t(s)]), table.data(), table.size() * sizeof(int32_t));
    seq_table_off_[size_t(s)] = -1;  // copied; also resets the map for the next step
  }
  if (use_tiles_) std::memcpy(h + tiles_at, tile_starts_.data(), (size_t(n_tiles_) + 1) * sizeof(int32_t));
  prof(kUpload);  // start mark
  // The uploads run on the copy stream, beside the previous step's kernels, once the kernels
  // that read this turn's device buffers two steps ago are done; the kernels wait for them.
  UploadTurn& u = upload_turn_[turn];
  const cudaStream_t up = upload_stream();
  if (u.in_use) FDL_CUDA_CHECK(cudaStreamWaitEvent(up, u.consumed, 0));
  FDL_CUDA_CHECK(cudaMemcpyAsync(staging_dev_[turn].get(), h, total * sizeof(int32_t), cudaMemcpyHostToDevice, up));
  if (sampling_bytes > 0) {
    // The rows' parameters, then the penalty tokens (8-byte aligned after the 40-byte rows).
    PinnedBuffer<unsigned char>& host = sampling_host_[turn];
    host.grow(sampling_bytes);
    std::memcpy(host.get(), sampling->rows.data(), sampling->rows.size_bytes());
    if (!sampling->penalties.empty())
      std::memcpy(host.get() + sampling->rows.size_bytes(), sampling->penalties.data(), sampling->penalties.size_bytes());
    FDL_CUDA_CHECK(cudaMemcpyAsync(sampling_dev_[turn].get(), host.get(), sampling_bytes, cudaMemcpyHostToDevice, up));
  }
  FDL_CUDA_CHECK(cudaEventRecord(u.uploaded, up));
  u.pending = true;
  if (alternates(batch)) turn_ = turn ^ 1;  // the next small step uploads into the other turn's buffers
  if (up != stream_) FDL_CUDA_CHECK(cudaStreamWaitEvent(stream_, u.uploaded, 0));
  prof(kUpload);
  const int32_t* d = staging_dev_[turn].get();
  d_tokens_ = d + lay.tokens;
  d_positions_ = d + lay.positions;
  d_dst_block_ = d + lay.dst_block;
  d_table_off_ = d + lay.table_off;
  d_row_idx_ = d + lay.row_idx;
  d_cos_sin_ = reinterpret_cast<const float*>(d + lay.cos_sin);
  d_tables_ = d + tables_at;
  d_tiles_ = use_tiles_ ? d + tiles_at : nullptr;
  d_tree_base_ = tree_step_ ? d + tree_at : nullptr;
  d_tree_mask_ = tree_step_ ? reinterpret_cast<const uint32_t*>(d + tree_at + size_t(n)) : nullptr;

  // Graphs: steps of up to kGemvMaxTokens tokens are captured at once; larger ones (cuBLAS
  // GEMMs; decode batches) once their shape has been seen before, so one-off shapes (a
  // prompt) do not pay an instantiation. The tile starts are device data: the number of
  // tiles is part of the shape.
  // The argmax tail's buffers are captured with the kernels: grown (and zeroed) here, not
  // while a graph is being captured.
  ArgmaxScratch tail_scratch;
  if (tail != Tail::None && m > 0) {
    tail_scratch = argmax_scratch(m);
    if (tail == Tail::CheckedArgmax && landing_[turn].size() < size_t(m)) {
      if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
      landing_[turn].grow(size_t(std::max(m, 64)));
      FDL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&landing_dev_[turn]), landing_[turn].get(), 0));
      ++generation_;
    }
  }
  auto kernels = [&] {
    run_kernels(n, m);
    if (tail != Tail::None && m > 0) {
      argmax_rows(logits_.get(), m, c.n_vocab, ids_.get(), stream_, tail == Tail::CheckedArgmax, tail_scratch,
                  tail == Tail::CheckedArgmax ? landing_dev_[turn] : nullptr);
      prof(kSample);
    }
  };
  bool graph = use_graphs_ && n <= kMaxGraphTokens;
  if (graph && graphs_generation_ != generation_) {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    graph_shapes_seen_.clear();
    graphs_generation_ = generation_;
  }
  auto key = std::make_tuple(n, m, splits_, use_tiles_ ? n_tiles_ : 0, use_tiles_ && max_tile_rows_ <= 16, tree_step_, 0,
                             int(tail));
  if (graph && n > kGemvMaxTokens && !graphs_.count(key)) {
    if (graph_shapes_seen_.size() >= 64 * kMaxGraphs) graph_shapes_seen_.clear();  // bounded memory
    graph = graph_shapes_seen_.insert(key).second == false;  // seen in either turn
  }
  std::get<6>(key) = turn;  // each turn's graph reads its own input buffers
  if (graph) {
    auto it = graphs_.find(key);
    if (it == graphs_.end()) {
      if (graphs_.size() >= kMaxGraphs) {  // many shapes (a server's varying batches): drop the LRU one
        auto lru = graphs_.begin();
        for (auto g = graphs_.begin(); g != graphs_.end(); ++g)
          if (g->second.last_use < lru->second.last_use) lru = g;
        cudaGraphExecDestroy(lru->second.exec);
        graphs_.erase(lru);
      }
      cudaGraph_t captured = nullptr;
      FDL_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
      try {
        kernels();
      } catch (...) {
        cudaStreamEndCapture(stream_, &captured);
        if (captured) cudaGraphDestroy(captured);
        throw;
      }
      FDL_CUDA_CHECK(cudaStreamEndCapture(stream_, &captured));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t e = cudaGraphInstantiate(&exec, captured, 0);
      cudaGraphDestroy(captured);
      FDL_CUDA_CHECK(e);
      it = graphs_.emplace(key, CapturedStep{exec, 0}).first;
    }
    it->second.last_use = ++graph_clock_;
    FDL_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream_));
  } else {
    kernels();
  }
  return m;
}

}  // namespace fdl::cuda
