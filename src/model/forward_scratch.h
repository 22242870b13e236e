// forward_scratch.h — activation buffers of one forward step, sized by the largest batch seen.
//
// Buffers only grow (ensure()), so after the first step of the largest batch size a forward
// allocates nothing. Shapes are row-major, one row per batch token. Activation buffers start
// on a cache line: a matmul split across threads hands out 16-row slices (64 bytes of each
// output row), and on a misaligned buffer every slice boundary was a cache line written by
// both threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <vector>

#include "backend/cpu/attention.h"
#include "flashdllm/model.h"

namespace fdl {

/// std::allocator with 64-byte alignment.
template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};
  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) {}
  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  // The unsized form: clang declares the sized ones only with -fsized-deallocation.
  void deallocate(T* p, size_t) { ::operator delete(p, kAlign); }
  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const { return true; }
};
using AlignedFloats = std::vector<float, CacheLineAllocator<float>>;

struct ForwardScratch {
  AlignedFloats x;         ///< residual stream [n][n_embd]
  AlignedFloats xn;        ///< normed input of a sub-block [n][n_embd]
  AlignedFloats q;         ///< [n][n_head*head_dim]
  AlignedFloats k;         ///< [n][n_head_kv*head_dim]
  AlignedFloats v;         ///< [n][n_head_kv*head_dim]
  AlignedFloats attn;      ///< attention output [n][n_head*head_dim]
  AlignedFloats proj;      ///< output of wo / w_down before the residual add [n][n_embd]
  AlignedFloats gate;      ///< [n][n_ff], then silu(gate)*up
  AlignedFloats up;        ///< [n][n_ff]
  AlignedFloats rope_cs;   ///< cos/sin per token [n][rope_dim]
  AlignedFloats rope_cs_swa;  ///< the sliding layers' own (ModelConfig::rope_freq_base_swa), else empty
  AlignedFloats out_rows;  ///< final-normed rows of tokens that want logits [m][n_embd]
  std::vector<const int32_t*> block_tables;  ///< per token: its sequence's block table
  // Mixture of experts (ModelConfig::n_expert > 0), k = n_expert_used:
  AlignedFloats router;     ///< router logits [n][n_expert]
  std::vector<int32_t> route_ids;  ///< [n][k] chosen experts
  std::vector<float> route_w;      ///< [n][k] their weights
  AlignedFloats moe_in;     ///< the normed rows of one expert's tokens [<= n][n_embd]
  AlignedFloats moe_out;    ///< each (token, rank)'s expert output [n][k][n_embd]
  std::vector<int32_t> moe_rows;   ///< one expert's (token * k + rank) entries
  cpu::AttentionScratch attention;

  void ensure(const ModelConfig& c, int64_t n_tokens) {
    const auto grow = [](auto& v, int64_t size) {
      if (v.size() < size_t(size)) v.resize(size_t(size));
    };
    const int64_t q_dim = int64_t(c.n_head) * c.head_dim, kv_dim = int64_t(c.n_head_kv) * c.head_dim;
    grow(x, n_tokens * c.n_embd);
    grow(xn, n_tokens * c.n_embd);
    grow(q, n_tokens * q_dim);
    grow(k, n_tokens * kv_dim);
    grow(v, n_tokens * kv_dim);
    grow(attn, n_tokens * q_dim);
    grow(proj, n_tokens * c.n_embd);
    grow(gate, n_tokens * c.n_ff);
    grow(up, n_tokens * c.n_ff);
    grow(rope_cs, n_tokens * c.rope_dim);
    if (c.rope_freq_base_swa > 0) grow(rope_cs_swa, n_tokens * c.rope_dim);
    grow(out_rows, n_tokens * c.n_embd);
    grow(block_tables, n_tokens);
    if (c.n_expert > 0) {
      const int64_t k = c.n_expert_used;
      grow(router, n_tokens * c.n_expert);
      grow(route_ids, n_tokens * k);
      grow(route_w, n_tokens * k);
      grow(moe_in, n_tokens * c.n_embd);
      grow(moe_out, n_tokens * k * c.n_embd);
      grow(moe_rows, n_tokens);
    }
  }
};

}  // namespace fdl
