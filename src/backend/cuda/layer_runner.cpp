// LayerRunner: the kernels of a forward in the CPU forward's order (layer_runner.h).
#include "backend/cuda/layer_runner.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm_k16.h"
#include "backend/cuda/gemm_quant.h"
#include "backend/cuda/gemv_quant_staged.h"

namespace fdl::cuda {

std::string batch_invariant_support(const ModelConfig& c, const CudaWeights& weights) {
  if (c.n_expert > 0) return "a mixture of experts";
  if (c.attn_softcap > 0) return "soft-capped attention scores";
  if (!attention_tiles_supported(c.head_dim, c.n_head, c.n_head_kv))
    return "head_dim " + std::to_string(c.head_dim) + " (the attention tiles take 64 or 128)";
  if (weights.output.view.quantized()) return "block-quantized weights";
  for (const CudaLayer& L : weights.layers)
    for (const DeviceMatrix* m : {&L.qkv.view, &L.wo.view, &L.gate_up.view, &L.down.view})
      if (m->quantized()) return "block-quantized weights";
  auto sixteen_bit = [](const DeviceMatrix& m) { return gemm_k16_supported(m); };
  if (!sixteen_bit(weights.output.view)) return "an output matrix that is not F16 or BF16";
  for (const CudaLayer& L : weights.layers)
    if (!sixteen_bit(L.qkv.view) || !sixteen_bit(L.wo.view) || !sixteen_bit(L.gate_up.view) ||
        !sixteen_bit(L.down.view))
      return "projection matrices that are not F16 or BF16";
  return "";
}

LayerRunner::LayerRunner(const ModelConfig& config, const CudaWeights& weights, KvDtype kv_dtype, int n_sm,
                         cudaStream_t stream, const CudaKnobs& knobs, OpProfiler& prof, bool invariant)
    : config_(config), weights_(weights), stream_(stream), prof_(prof), invariant_(invariant) {
  const ModelConfig& c = config_;
  FDL_CUBLAS_CHECK(cublasCreate(&cublas_));
  FDL_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
  // A workspace of our own, so cuBLAS never allocates while a step is captured in a graph.
  cublas_workspace_.grow(kCublasWorkspaceBytes);
  FDL_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.get(), kCublasWorkspaceBytes));
  if (knobs.gemm_tune) lt_gemm_ = std::make_unique<LtGemm>(stream_, cublas_workspace_.get(), kCublasWorkspaceBytes);
  // Plain fp32 SGEMM for F32 weights (no TF32): the F32 path stays close to the CPU's.
  FDL_CUBLAS_CHECK(cublasSetMathMode(cublas_, CUBLAS_DEFAULT_MATH));
  // The fused single-token kernels compute with fp32 activations on CUDA cores: not the
  // arithmetic of longer steps, so invariant steps of one token run the chain of longer ones.
  // Block-quantized matrices run through gemv_quant (and dequantized F16 tiles for longer
  // steps); the fused single-token kernels and the block kernels read 16- and 32-bit rows only.
  for (const CudaLayer& L : weights_.layers)
    for (const DeviceMatrix* m : {&L.qkv.view, &L.wo.view, &L.gate_up.view, &L.down.view, &L.router.view})
      quantized_ = quantized_ || m->quantized();
  if (quantized_ || weights_.output.view.quantized()) {
    const size_t widest = size_t(std::max({c.n_embd, c.n_head * c.head_dim, c.n_ff}));
    const size_t values = size_t(kGemvMaxTokens) * widest;
    q8_q_.grow(values);
    q8_d_.grow(values / 32);
    q8_s_.grow(values / 16);
    int64_t largest = 0;  // F16 bytes of the largest quantized matrix: the dequantized tiles never need more
    for (const CudaLayer& L : weights_.layers)
      for (const DeviceMatrix* m : {&L.qkv.view, &L.wo.view, &L.gate_up.view, &L.down.view, &L.router.view})
        if (m->quantized()) largest = std::max(largest, m->rows * m->cols * 2);
    if (weights_.output.view.quantized())
      largest = std::max(largest, weights_.output.view.rows * weights_.output.view.cols * 2);
    // Longer steps dequantize in tiles of knobs.dequant_tile_mb: fewer, larger GEMMs beat
    // tiles small enough to stay in L2 (docs/GPU.md).
    dq_.grow(size_t(std::min<int64_t>(largest, int64_t(knobs.dequant_tile_mb) << 20)) / 2);
    // Steps of up to kGemmQuantMaxTokens tokens multiply the blocks directly (gemm_quant);
    // its K splits need the most of any matrix and token count.
    gemm_quant_ = knobs.gemm_quant;
    size_t ws = 0;
    auto need = [&](const DeviceMatrix& m) {
      for (int n = kGemvMaxTokens + 1; n <= kGemmQuantMaxTokens; ++n) ws = std::max(ws, gemm_quant_workspace_floats(m, n));
    };
    if (gemm_quant_) {
      for (const CudaLayer& L : weights_.layers)
        for (const DeviceMatrix* m : {&L.qkv.view, &L.wo.view, &L.gate_up.view, &L.down.view, &L.router.view}) need(*m);
      need(weights_.output.view);
    }
    gemm_quant_ws_.grow(ws);
  }
  // Quantized layers run the fused one-token chain through gemv_quant_norm* where every layer's
  // quantized matrices fit them (a gate/up of one type); otherwise the unfused chain.
  bool quant_fusable = c.n_expert == 0;
  for (const CudaLayer& L : weights_.layers) {
    if (L.qkv.view.quantized() && !gemv_quant_norm_fits(L.qkv.view)) quant_fusable = false;
    if (L.gate_up.view.quantized() && !gemv_quant_norm_swiglu_fits(L.gate_up.view)) quant_fusable = false;
    if (L.qkv.view.quantized() != L.gate_up.view.quantized()) quant_fusable = false;
  }
  fuse_enabled_ = knobs.fuse && !invariant_ && (!quantized_ || quant_fusable);
  if (c.n_expert > 0) moe_offsets_host_.grow(size_t(c.n_expert) + 1);
  // Prefill attention on tensor cores (fp16 operands) where the prefill GEMMs already round
  // activations to 16 bits (F16/BF16 weights); an F32 model keeps the fp32 tiles, so it stays
  // as close to the CPU backend as before. FLASHDLLM_ATTN_TC=0/1 overrides.
  attn_tc_ = !weights_.layers.empty() && weights_.layers[0].qkv.view.type != WType::F32;
  if (knobs.attn_tc) attn_tc_ = *knobs.attn_tc;
  if (kv_dtype != KvDtype::F32 || invariant_) attn_tc_ = true;  // the fp32 tiles read an fp32 cache only
  // Invariant one-token steps: the FFN half as one kernel of the invariant arithmetic
  // (decode_ffn_block_k16) where every layer's matrices allow it (no experts, no post-norms);
  // FLASHDLLM_FFN_BLOCK=0 keeps the separate kernels (FLASHDLLM_ATTN_BLOCK=0 and
  // FLASHDLLM_OUTPUT_BLOCK=0 likewise for the other two below).
  if (invariant_ && knobs.ffn_block && !weights_.layers.empty() && c.n_expert == 0) {
    int blocks = -1;
    for (const CudaLayer& L : weights_.layers) {
      const int b = L.post_attn_norm.get() ? 0 : ffn_block_k16_blocks(L.gate_up.view, L.down.view, n_sm);
      blocks = blocks < 0 || b == blocks ? b : 0;
    }
    ffn_k16_blocks_ = std::max(blocks, 0);
  }
  // ... and the attention half (decode_attention_block_k16) for models without the family
  // additions it leaves out: per-head Q/K norms, soft-capped scores, sliding windows, post-norms.
  if (invariant_ && knobs.attn_block && !weights_.layers.empty() && !c.post_norms && c.attn_softcap == 0.f) {
    const KvLayerView shape{nullptr, 0, 0, 1, c.n_head_kv, c.head_dim, kv_dtype};
    int blocks = -1;
    for (int l = 0; l < c.n_layer; ++l) {
      const CudaLayer& L = weights_.layers[size_t(l)];
      const bool plain = L.q_norm.get() == nullptr && c.attention_window(l) == 0;
      const int b = plain ? attention_block_k16_blocks(L.qkv.view, L.wo.view, c.n_head, shape, n_sm) : 0;
      blocks = blocks < 0 || b == blocks ? b : 0;
    }
    attn_k16_blocks_ = std::max(blocks, 0);
  }
  if (ffn_k16_blocks_ > 0 || attn_k16_blocks_ > 0) block_sync_.grow(size_t(c.n_layer) * sync_per_layer());
  // ... and the output head (decode_output_block_k16).
  if (invariant_ && knobs.output_block && output_block_k16_supported(weights_.output.view) && c.final_softcap == 0.f &&
      post_ffn_norm(c.n_layer - 1) == nullptr)
    output_k16_blocks_ = n_sm;
  // Batch-1 decode: each half of a layer as one kernel (decode_attention_block,
  // decode_ffn_block) where the shapes allow; FLASHDLLM_ATTN_BLOCK=0 / FLASHDLLM_FFN_BLOCK=0
  // keep the kernels they replace.
  if (fuse_enabled_ && !weights_.layers.empty()) {
    // Every layer must pass (the weight types may differ from layer to layer: a tensor kept
    // at higher precision turns its fused matrix F32), with one block count for all; 0 = off.
    auto same_for_all_layers = [&](auto blocks_for) {
      const int first = blocks_for(weights_.layers[0]);
      for (const CudaLayer& L : weights_.layers)
        if (blocks_for(L) != first) return 0;
      return first;
    };
    const KvLayerView shape{nullptr, 0, 0, 1, c.n_head_kv, c.head_dim, kv_dtype};
    if (knobs.attn_block)
      attn_block_groups_ = same_for_all_layers([&](const CudaLayer& L) {
        // Post-norms reach the block through the previous layer's post-FFN norm (none at layer 0,
        // whose block would be planned for another instantiation): planned from the model.
        const AttentionBlockFeatures f{L.q_norm.get() != nullptr, c.post_norms, c.attn_softcap > 0};
        return attention_block_groups(L.qkv.view, L.wo.view, c.n_head, shape, n_sm, f);
      });
    if (knobs.ffn_block)
      ffn_blocks_ = same_for_all_layers(
          [&](const CudaLayer& L) { return ffn_block_blocks(L.gate_up.view, L.down.view, n_sm); });
    // The final norm and the output projection of one token (FLASHDLLM_OUTPUT_BLOCK=0: the
    // add_rms_norm + gemv pair).
    if (knobs.output_block && output_block_supported(weights_.output.view)) output_blocks_ = n_sm;
    if (attn_block_groups_ > 0)
      block_partial_.grow(attention_block_partial_floats(c.n_head, c.head_dim, attn_block_groups_));
    block_sync_.grow(size_t(c.n_layer) * sync_per_layer());
  }
  // The persistent kernels' phase stamps (FLASHDLLM_DECODE_TRACE=1), the invariant ones' included.
  if (knobs.decode_trace && trace_per_layer() > 0) {
    trace_.grow(size_t(c.n_layer) * trace_per_layer());
    FDL_CUDA_CHECK(cudaMemsetAsync(trace_.get(), 0, trace_.bytes(), stream_));
  }
}

LayerRunner::~LayerRunner() {
  if (cublas_) cublasDestroy(cublas_);
}

bool LayerRunner::ensure_scratch(int n, int m, int splits, bool steps_in_flight) {
  const ModelConfig& c = config_;
  const size_t d = size_t(c.n_embd), q = size_t(c.n_head) * c.head_dim, kvd = size_t(c.n_head_kv) * c.head_dim,
               ff = size_t(c.n_ff), nn = size_t(n), mm = size_t(std::max(m, 1));
  // A mixture of experts: k pairs per token; the routed GEMVs hold all pairs' gate/up and h
  // rows at once, the grouped path one expert's (at most n) at a time.
  const bool moe = c.n_expert > 0;
  const size_t pairs = moe ? nn * size_t(c.n_expert_used) : 0;
  const size_t ffn_rows = moe && n <= kGemvMaxTokens ? pairs : nn;
  // Visits every scratch buffer with the room this step needs: first to ask whether any must
  // grow (submitted steps still running use them: wait for those first), then to grow them.
  auto each = [&](auto&& f) {
    f(x_, nn * d);
    f(x2_, d);  // the fused single-token path's second residual buffer
    f(k_new_, kvd);
    f(xn_, nn * d);
    f(proj_, nn * d);
    f(qkv_, nn * (q + 2 * kvd));
    f(q_, nn * q);
    f(attn_, nn * q);
    f(gu_, ffn_rows * 2 * ff);
    f(h_, ffn_rows * ff);
    if (moe) {
      f(router_, nn * size_t(c.n_expert));
      f(route_w_, pairs);
      f(route_ids_, pairs);
      f(moe_y_, pairs * d);
      if (n > kGemvMaxTokens) {
        f(moe_perm_, pairs);
        f(moe_slot_, pairs);
        f(moe_offsets_, size_t(c.n_expert) + 1);
        f(moe_in_, pairs * d);
      }
    }
    f(out_rows_, mm * d);
    f(logits_, mm * size_t(c.n_vocab));
    f(partial_, attention_partial_floats(n, c.n_head, c.head_dim, splits));
    if (n > kGemvMaxTokens || invariant_) f(xh_, std::max(nn, mm) * std::max({d, q, ff}));
    if (invariant_) f(gemm_ws_, gemm_workspace_floats(n, m));
  };
  bool grows = ids_.size() < mm;
  each([&](auto& buf, size_t count) { grows |= buf.size() < count; });
  if (!grows) return false;
  if (steps_in_flight) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
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
  return moved;
}

size_t LayerRunner::gemm_workspace_floats(int n, int m) const {
  size_t most = gemm_k16_workspace_floats(weights_.output.view, m);
  for (const CudaLayer& L : weights_.layers)
    for (const DeviceMatrix* W : {&L.qkv.view, &L.wo.view, &L.gate_up.view, &L.down.view})
      if (W->data != nullptr) most = std::max(most, gemm_k16_workspace_floats(*W, n));
  return most;
}

WType LayerRunner::gemm_input_type(const DeviceMatrix& W, int n) const {
  if (W.quantized()) return n > kGemvMaxTokens ? WType::F16 : WType::F32;  // matmul_quant's inputs
  return n > kGemvMaxTokens || invariant_ ? W.type : WType::F32;
}

void LayerRunner::matmul(const DeviceMatrix& W, const void* Xv, int n, float* Y) {
  if (n <= 0) return;
  const auto* X = static_cast<const float*>(Xv);
  if (W.quantized()) return matmul_quant(W, Xv, n, Y);
  if (invariant_) return gemm_k16(W, Xv, n, Y, stream_, -1, gemm_ws_.size() > 0 ? gemm_ws_.get() : nullptr);
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

// A block-quantized W: gemv_quant up to kGemvMaxTokens tokens (X fp32); longer steps (X F16,
// gemm_input_type) gemm_quant up to kGemmQuantMaxTokens where the knob turns it on, and
// otherwise (prompts, where the multiplication outweighs the weights' bytes) W dequantized in
// tiles of rows (dq_), each tile multiplied on tensor cores by cuBLAS into its rows of Y.
void LayerRunner::matmul_quant(const DeviceMatrix& W, const void* Xv, int n, float* Y) {
  if (n <= kGemvMaxTokens) {
    const Q8Activations xq{q8_q_.get(), q8_d_.get(), q8_s_.get(), q8_q_.size()};
    return gemv_quant(W, static_cast<const float*>(Xv), n, Y, xq, stream_);
  }
  if (gemm_quant_ && gemm_quant_fits(W, n)) {
    ++gemm_quant_matmuls_;
    return gemm_quant(W, Xv, n, Y, gemm_quant_ws_.get(), stream_);
  }
  const int64_t cols = W.cols;
  // Whole multiples of 256 rows where the tile holds them, so the GEMM tiles evenly.
  const int64_t fit = int64_t(dq_.size()) / cols;
  const int64_t tile = fit >= 256 ? fit / 256 * 256 : std::max<int64_t>(1, fit);
  const float alpha = 1.f, beta = 0.f;
  for (int64_t r0 = 0; r0 < W.rows; r0 += tile) {
    const int64_t rows = std::min(tile, W.rows - r0);
    dequantize_to_f16(W, r0, rows, dq_.get(), stream_);
    FDL_CUBLAS_CHECK(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, int(rows), n, int(cols), &alpha, dq_.get(),
                                  CUDA_R_16F, int(cols), Xv, CUDA_R_16F, int(cols), &beta, Y + r0, CUDA_R_32F,
                                  int(W.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
}

void LayerRunner::run(int n, int m, const StepInputs& in) {
  const ModelConfig& c = config_;
  const int d = c.n_embd, kv_dim = c.n_head_kv * c.head_dim;
  const int block_size = in.kv.block_size;
  embed_rows(weights_.token_embd.view, in.tokens, ids_.get(), n, x_.get(), stream_, c.embed_scale);
  prof_.mark(kEmbed);
  KvLayerView kv = in.kv;
  AttentionArgs att;
  att.q = q_.get();
  att.out = attn_.get();
  att.positions = in.positions;
  att.table_off = in.table_off;
  att.tables = in.tables;
  att.n_tokens = n;
  att.n_head = c.n_head;
  att.scale = c.query_scale();
  att.n_splits = in.splits;
  att.tile_starts = in.tile_starts;
  att.n_tiles = in.n_tiles;
  att.tensor_cores = attn_tc_;
  att.tc_bf16 = weights_.layers[0].qkv.view.type == WType::BF16;  // operands in the weights' type
  att.max_tile_rows = in.max_tile_rows;
  att.partial = partial_.get();
  att.share_chunks = in.share_chunks;
  // All null (no trees, no soft-capping): the kernels without masks.
  const AttentionMasks tree{in.tree_base, in.tree_mask, nullptr, c.attn_softcap};
  const AttentionMasks sliding{in.tree_base, in.tree_mask, in.first, c.attn_softcap};  // a sliding layer's
  // One decode token: norm fused into the projections, RoPE/SwiGLU into their epilogues.
  const bool fused = n == 1 && fuse_enabled_;
  // Invariant one-token steps: each half of a layer as one kernel where planned at load (the
  // attention block only for the chunk attention's plan, which the step's inputs decide).
  const bool ffn_k16 = n == 1 && ffn_k16_blocks_ > 0;
  att.kv = kv;
  const bool attn_k16 = n == 1 && attn_k16_blocks_ > 0 && attention_invariant_chunk_partials(att) && att.n_tiles == 1 &&
                        att.n_splits <= kAttentionBlockK16MaxSplits;
  if ((fused && (attn_block_groups_ > 0 || ffn_blocks_ > 0)) || ffn_k16 || attn_k16)  // hand-off counters start at zero
    FDL_CUDA_CHECK(cudaMemsetAsync(block_sync_.get(), 0, block_sync_.bytes(), stream_));
  // The residual stream of the unfused layers. The invariant block kernels read it from one
  // buffer and write it to the other (no block may overwrite what another still reads), so
  // there it alternates between x_ and x2_.
  float* resid = x_.get();
  float* resid_other = x2_.get();
  for (int l = 0; l < c.n_layer; ++l) {
    const CudaLayer& L = weights_.layers[size_t(l)];
    kv.layer_offset = int64_t(l) * 2 * block_size * kv_dim;
    if (fused) {
      run_fused_layer(l, in, kv, att);
      continue;
    }
    if (attn_k16) {  // the attention half as one kernel; the residual moves to the other buffer
      att.kv = kv;
      run_attention_block_k16(l, in, att,
                              NormIn{resid, l == 0 ? nullptr : proj_.get(), L.attn_norm.get(), resid_other, c.rms_eps,
                                     nullptr});
      std::swap(resid, resid_other);
    } else {
      run_attention_half(l, n, in, kv, att, resid, tree, sliding);
    }
    if (c.n_expert > 0) {  // fp32 rows: the routed GEMVs and the gather read them (run_moe_ffn casts for GEMMs)
      add_rms_norm(resid, proj_.get(), L.ffn_norm.get(), xn_.get(), nullptr, n, d, c.rms_eps, true, stream_,
                   WType::F32, L.post_attn_norm.get());
      prof_.mark(kNorm);
      run_moe_ffn(l, n);
      continue;
    }
    if (ffn_k16) {
      run_ffn_block(l, NormIn{resid, proj_.get(), L.ffn_norm.get(), resid_other, c.rms_eps, nullptr});
      std::swap(resid, resid_other);
      continue;
    }
    const WType gu_in = gemm_input_type(L.gate_up.view, n);
    void* xn2 = gu_in == WType::F32 ? static_cast<void*>(xn_.get()) : static_cast<void*>(xh_.get());
    add_rms_norm(resid, proj_.get(), L.ffn_norm.get(), xn2, nullptr, n, d, c.rms_eps, true, stream_, gu_in,
                 L.post_attn_norm.get());
    prof_.mark(kNorm);
    const WType down_in = gemm_input_type(L.down.view, n);
    void* h_in = down_in == WType::F32 ? static_cast<void*>(h_.get()) : static_cast<void*>(xh_.get());
    if (down_in == WType::F32 && gu_in == WType::F32 && gemv_quant_swiglu_fits(L.gate_up.view, n)) {
      gemv_quant_swiglu(L.gate_up.view, xn_.get(), n, h_.get(), c.ffn_gelu, stream_);  // silu_mul's bits
      prof_.mark(kGateUp);
    } else {
      matmul(L.gate_up.view, xn2, n, gu_.get());
      prof_.mark(kGateUp);
      silu_mul(gu_.get(), h_in, n, c.n_ff, stream_, down_in, c.ffn_gelu);
      prof_.mark(kSilu);
    }
    matmul(L.down.view, h_in, n, proj_.get());
    prof_.mark(kDown);
  }
  if (m == 0) return;
  if (n == 1 && m == 1 && output_k16_blocks_ > 0) {  // invariant: the final norm and the head in one kernel
    OutputBlockArgs o;
    o.type = weights_.output.view.type;
    o.w = weights_.output.view.data;
    o.rows = weights_.output.view.rows;
    o.cols = int(weights_.output.view.cols);
    o.in = NormIn{resid, proj_.get(), weights_.output_norm.get(), nullptr, c.rms_eps, nullptr};
    o.y = logits_.get();
    o.blocks = output_k16_blocks_;
    decode_output_block_k16(o, stream_);
    prof_.mark(kOutput);
    return;
  }
  if (fused && output_blocks_ > 0) {  // one token (m == 1): norm and projection in one kernel
    OutputBlockArgs o;
    o.type = weights_.output.view.type;
    o.w = weights_.output.view.data;
    o.rows = weights_.output.view.rows;
    o.cols = int(weights_.output.view.cols);
    o.in = NormIn{x_.get(), proj_.get(), weights_.output_norm.get(), nullptr, c.rms_eps, post_ffn_norm(c.n_layer - 1)};
    o.y = logits_.get();
    o.blocks = output_blocks_;
    o.softcap = c.final_softcap;
    decode_output_block(o, stream_);
    prof_.mark(kOutput);
    return;
  }
  // Only the rows that want logits: x + last FFN output, final norm, output projection.
  const WType out_in = gemm_input_type(weights_.output.view, m);
  void* rows_in = out_in == WType::F32 ? static_cast<void*>(out_rows_.get()) : static_cast<void*>(xh_.get());
  add_rms_norm(resid, proj_.get(), weights_.output_norm.get(), rows_in, in.row_idx, m, d, c.rms_eps, false, stream_,
               out_in, post_ffn_norm(c.n_layer - 1));
  matmul(weights_.output.view, rows_in, m, logits_.get());
  if (c.final_softcap > 0) softcap(logits_.get(), size_t(m) * size_t(c.n_vocab), c.final_softcap, stream_);
  prof_.mark(kOutput);
}

// Residual stream: x_ -> (attention norm, fused into qkv) -> x2_ -> (FFN norm, fused into
// gate_up) -> x_, so a layer ends with it in x_ as on the unfused path. A kernel reads one
// buffer and its block 0 writes the other: no block overwrites what another still reads.
void LayerRunner::run_fused_layer(int l, const StepInputs& in, const KvLayerView& kv, AttentionArgs& att) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  const NormIn attn_in{x_.get(), l == 0 ? nullptr : proj_.get(), L.attn_norm.get(), x2_.get(), c.rms_eps,
                       post_ffn_norm(l - 1)};
  if (attn_block_groups_ > 0) {
    run_attention_block(l, in, kv, attn_in, att.scale);
  } else {
    if (L.qkv.view.quantized()) {  // no RoPE epilogue in the quantized GEMV
      gemv_quant_norm(L.qkv.view, attn_in, qkv_.get(), stream_);
      rope_qkv_store(qkv_.get(), cos_sin(l, in), in.positions, in.dst_block, 1, c.n_head, c.rope_dim, kv, q_.get(),
                     stream_, extras(L));
    } else if (L.q_norm.get()) {  // per-head norms need whole heads: the projection, then the extras and RoPE
      gemv_norm_qkv(L.qkv.view, attn_in, qkv_.get(), stream_);
      rope_qkv_store(qkv_.get(), cos_sin(l, in), in.positions, in.dst_block, 1, c.n_head, c.rope_dim, kv, q_.get(),
                     stream_, extras(L));
    } else {
      gemv_norm_rope_qkv(L.qkv.view, attn_in, cos_sin(l, in), in.positions, in.dst_block, c.n_head, c.rope_dim, kv,
                         q_.get(), stream_, L.qkv_bias.get());
    }
    prof_.mark(kQkv);
    att.kv = kv;
    paged_attention(att, stream_,
                    AttentionMasks{nullptr, nullptr, c.attention_window(l) > 0 ? in.first : nullptr, c.attn_softcap});
    prof_.mark(kAttention);
    matmul(L.wo.view, attn_.get(), 1, proj_.get());  // gemv, or gemv_quant for a quantized wo
    prof_.mark(kWo);
  }
  if (c.n_expert > 0) {
    // The norm in place on x2_, the experts, then the residual back in x_ where the next
    // layer's fused kernels read it.
    add_rms_norm(x2_.get(), proj_.get(), L.ffn_norm.get(), xn_.get(), nullptr, 1, c.n_embd, c.rms_eps, true, stream_,
                 WType::F32, L.post_attn_norm.get());
    prof_.mark(kNorm);
    run_moe_ffn(l, 1);
    FDL_CUDA_CHECK(cudaMemcpyAsync(x_.get(), x2_.get(), size_t(c.n_embd) * sizeof(float), cudaMemcpyDeviceToDevice,
                                   stream_));
    return;
  }
  const NormIn ffn_in{x2_.get(), proj_.get(), L.ffn_norm.get(), x_.get(), c.rms_eps, L.post_attn_norm.get()};
  if (ffn_blocks_ > 0) {
    run_ffn_block(l, ffn_in);
  } else {
    if (L.gate_up.view.quantized())
      gemv_quant_norm_swiglu(L.gate_up.view, ffn_in, h_.get(), c.ffn_gelu, stream_);
    else
      gemv_norm_swiglu(L.gate_up.view, ffn_in, h_.get(), stream_, c.ffn_gelu);
    prof_.mark(kGateUp);
    matmul(L.down.view, h_.get(), 1, proj_.get());
    prof_.mark(kDown);
  }
}

// route_top_k on the device, then the experts: routed GEMVs for a few tokens, else the pairs
// grouped by expert (their counts read back: the one host wait) and one GEMM per expert; the
// CPU's order of the weighted sum (moe_forward.cpp).
void LayerRunner::run_moe_ffn(int l, int n) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  const int d = c.n_embd, k = c.n_expert_used, pairs = n * k;
  if (gemm_input_type(L.router.view, n) != WType::F32) {
    cast_f32(xn_.get(), size_t(n) * d, L.router.view.type, xh_.get(), stream_);
    matmul(L.router.view, xh_.get(), n, router_.get());
  } else {
    matmul(L.router.view, xn_.get(), n, router_.get());
  }
  moe_route(router_.get(), n, c.n_expert, k, route_ids_.get(), route_w_.get(), stream_);
  prof_.mark(kRoute);
  const ExpertMatrices gate_up = L.gate_up_experts(), down = L.down_experts();
  if (n <= kGemvMaxTokens) {
    moe_gemv(gate_up, route_ids_.get(), xn_.get(), k, pairs, gu_.get(), stream_);
    prof_.mark(kGateUp);
    silu_mul(gu_.get(), h_.get(), pairs, c.n_ff, stream_, WType::F32, c.ffn_gelu);
    prof_.mark(kSilu);
    moe_gemv(down, route_ids_.get(), h_.get(), 1, pairs, moe_y_.get(), stream_);
    moe_combine(moe_y_.get(), nullptr, route_w_.get(), n, k, d, proj_.get(), stream_);
    prof_.mark(kDown);
    return;
  }
  moe_group(route_ids_.get(), pairs, c.n_expert, moe_offsets_.get(), moe_perm_.get(), moe_slot_.get(), stream_);
  moe_gather(xn_.get(), moe_perm_.get(), pairs, k, d, moe_in_.get(), stream_);
  FDL_CUDA_CHECK(cudaMemcpyAsync(moe_offsets_host_.get(), moe_offsets_.get(), size_t(c.n_expert + 1) * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, stream_));
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  prof_.mark(kRoute);
  const int32_t* off = moe_offsets_host_.get();
  for (int e = 0; e < c.n_expert; ++e) {
    const int m = off[e + 1] - off[e];
    if (m == 0) continue;
    const DeviceMatrix gu = gate_up.expert(e), dn = down.expert(e);
    const float* rows = moe_in_.get() + size_t(off[e]) * d;
    if (gemm_input_type(gu, m) != WType::F32) {
      cast_f32(rows, size_t(m) * d, gu.type, xh_.get(), stream_);
      matmul(gu, xh_.get(), m, gu_.get());
    } else {
      matmul(gu, rows, m, gu_.get());
    }
    prof_.mark(kGateUp);
    const WType down_in = gemm_input_type(dn, m);
    void* h_in = down_in == WType::F32 ? static_cast<void*>(h_.get()) : static_cast<void*>(xh_.get());
    silu_mul(gu_.get(), h_in, m, c.n_ff, stream_, down_in, c.ffn_gelu);
    prof_.mark(kSilu);
    matmul(dn, h_in, m, moe_y_.get() + size_t(off[e]) * d);
    prof_.mark(kDown);
  }
  moe_combine(moe_y_.get(), moe_slot_.get(), route_w_.get(), n, k, d, proj_.get(), stream_);
  prof_.mark(kDown);
}

// The attention half of layer l on n tokens as separate kernels: norm, QKV, RoPE + K/V store,
// attention, wo; the residual in `resid` (updated in place), the output in proj_.
void LayerRunner::run_attention_half(int l, int n, const StepInputs& in, const KvLayerView& kv, AttentionArgs& att,
                                     float* resid, const AttentionMasks& tree, const AttentionMasks& sliding) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  const int d = c.n_embd;
  // x += (previous layer's FFN output); xn = norm(x). Layer 0 has nothing to add.
  const WType qkv_in = gemm_input_type(L.qkv.view, n);
  void* xn_in = qkv_in == WType::F32 ? static_cast<void*>(xn_.get()) : static_cast<void*>(xh_.get());
  add_rms_norm(resid, l == 0 ? nullptr : proj_.get(), L.attn_norm.get(), xn_in, nullptr, n, d, c.rms_eps, true,
               stream_, qkv_in, post_ffn_norm(l - 1));
  prof_.mark(kNorm);
  matmul(L.qkv.view, xn_in, n, qkv_.get());
  prof_.mark(kQkv);
  rope_qkv_store(qkv_.get(), cos_sin(l, in), in.positions, in.dst_block, n, c.n_head, c.rope_dim, kv, q_.get(),
                 stream_, extras(L));
  prof_.mark(kRope);
  att.kv = kv;
  paged_attention(att, stream_, c.attention_window(l) > 0 ? sliding : tree);
  prof_.mark(kAttention);
  if (gemm_input_type(L.wo.view, n) != WType::F32) {
    cast_f32(attn_.get(), size_t(n) * size_t(c.n_head) * c.head_dim, L.wo.view.type, xh_.get(), stream_);
    matmul(L.wo.view, xh_.get(), n, proj_.get());
  } else {
    matmul(L.wo.view, attn_.get(), n, proj_.get());
  }
  prof_.mark(kWo);
}

// The attention half of an invariant one-token layer as one kernel (kernels.h:
// decode_attention_block_k16): q into q_, the attention output rounded into xh_, wo's output
// in proj_.
void LayerRunner::run_attention_block_k16(int l, const StepInputs& in, const AttentionArgs& att, const NormIn& attn_in) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  AttentionBlockK16Args b;
  b.type = L.qkv.view.type;
  b.wqkv = L.qkv.view.data;
  b.wo = L.wo.view.data;
  b.wo_rows = int(L.wo.view.rows);
  b.cols = int(L.qkv.view.cols);
  b.in = attn_in;
  b.att = att;
  b.cos_sin = cos_sin(l, in);
  b.dst_block = in.dst_block;
  b.rope_dim = c.rope_dim;
  b.bias = L.qkv_bias.get();
  b.q_out = q_.get();
  b.attn16 = xh_.get();
  b.y = proj_.get();
  b.sync = block_sync_.get() + size_t(l) * sync_per_layer();
  b.blocks = attn_k16_blocks_;
  if (trace_.get()) b.trace = trace_.get() + size_t(l) * trace_per_layer();
  decode_attention_block_k16(b, stream_);
  prof_.mark(kAttnBlock);
}

// The FFN half of a batch-1 layer as one kernel: norm, gate/up + SwiGLU, down (kernels.h:
// decode_ffn_block, or decode_ffn_block_k16 in invariant steps: h_ then holds 16-bit h), its
// output in proj_ as down's would be.
void LayerRunner::run_ffn_block(int l, const NormIn& ffn_in) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  FfnBlockArgs f;
  f.type = L.gate_up.view.type;
  f.w_gate_up = L.gate_up.view.data;
  f.w_down = L.down.view.data;
  f.down_rows = L.down.view.rows;
  f.cols = int(L.gate_up.view.cols);
  f.n_ff = c.n_ff;
  f.gelu = c.ffn_gelu;
  f.in = ffn_in;
  f.h = h_.get();
  f.y = proj_.get();
  f.sync = block_sync_.get() + size_t(l) * sync_per_layer() + ffn_sync_offset();
  if (trace_.get())
    f.trace = trace_.get() + size_t(l) * trace_per_layer() + size_t(kAttnTraceEvents) * attn_trace_blocks();
  if (invariant_) {
    f.blocks = ffn_k16_blocks_;
    decode_ffn_block_k16(f, stream_);
    prof_.mark(kFfnBlock);
    return;
  }
  f.blocks = ffn_blocks_;
  decode_ffn_block(f, stream_);
  prof_.mark(kFfnBlock);
}

// The attention half of a batch-1 layer as one kernel: norm, QKV, RoPE/KV store, attention,
// wo (kernels.h: decode_attention_block), its output in proj_ as wo's would be.
void LayerRunner::run_attention_block(int l, const StepInputs& in, const KvLayerView& kv, const NormIn& attn_in,
                                      float scale) {
  const ModelConfig& c = config_;
  const CudaLayer& L = weights_.layers[size_t(l)];
  AttentionBlockArgs b;
  b.type = L.qkv.view.type;
  b.wqkv = L.qkv.view.data;
  b.wo = L.wo.view.data;
  b.wo_rows = L.wo.view.rows;
  b.cols = int(L.qkv.view.cols);
  b.in = attn_in;
  b.cos_sin = cos_sin(l, in);
  b.positions = in.positions;
  b.dst_block = in.dst_block;
  b.tables = in.tables;
  b.table_off = in.table_off;
  b.n_head = c.n_head;
  b.window = c.attention_window(l);
  b.rope_dim = c.rope_dim;
  b.scale = scale;
  b.softcap = c.attn_softcap;
  b.kv = kv;
  b.q_out = q_.get();
  b.extras = extras(L);
  b.k_new = k_new_.get();
  b.attn_out = attn_.get();
  b.partial = block_partial_.get();
  b.y = proj_.get();
  b.sync = block_sync_.get() + size_t(l) * sync_per_layer();
  b.blocks_per_group = attn_block_groups_;
  if (trace_.get()) b.trace = trace_.get() + size_t(l) * trace_per_layer();
  decode_attention_block(b, stream_);
  prof_.mark(kAttnBlock);
}

const float* LayerRunner::post_ffn_norm(int l) const {
  return l < 0 ? nullptr : weights_.layers[size_t(l)].post_ffn_norm.get();
}

const float* LayerRunner::cos_sin(int l, const StepInputs& in) const {
  return in.cos_sin_swa != nullptr && config_.attention_window(l) > 0 ? in.cos_sin_swa : in.cos_sin;
}

QkvExtras LayerRunner::extras(const CudaLayer& L) const {
  return QkvExtras{L.qkv_bias.get(), L.q_norm.get(), L.k_norm.get(), config_.rms_eps};
}

size_t LayerRunner::trace_per_layer() const {
  return size_t(kAttnTraceEvents) * attn_trace_blocks() + size_t(kFfnTraceEvents) * ffn_trace_blocks();
}

void LayerRunner::clear_decode_trace() {
  if (trace_.get()) FDL_CUDA_CHECK(cudaMemsetAsync(trace_.get(), 0, trace_.bytes(), stream_));
}

DecodeTrace LayerRunner::decode_trace() const {
  DecodeTrace t;
  if (trace_.get() == nullptr) return t;
  FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<uint64_t> all(trace_.size());
  FDL_CUDA_CHECK(cudaMemcpy(all.data(), trace_.get(), trace_.bytes(), cudaMemcpyDeviceToHost));
  t.n_layer = config_.n_layer;
  t.attn_events = kAttnTraceEvents;
  t.attn_blocks = int(attn_trace_blocks());
  t.ffn_events = kFfnTraceEvents;
  t.ffn_blocks = int(ffn_trace_blocks());
  const size_t na = size_t(t.attn_events) * size_t(t.attn_blocks), nf = size_t(t.ffn_events) * size_t(t.ffn_blocks);
  for (int l = 0; l < t.n_layer; ++l) {
    const uint64_t* p = all.data() + size_t(l) * trace_per_layer();
    t.attn.insert(t.attn.end(), p, p + na);
    t.ffn.insert(t.ffn.end(), p + na, p + na + nf);
  }
  return t;
}

}  // namespace fdl::cuda
