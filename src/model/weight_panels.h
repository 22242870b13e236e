// weight_panels.h — rearranges a CPU model's block-quantized matrices (Q4_K, Q5_K, Q6_K, Q8_0)
// in place into the panels of 16 rows that the AVX-512 VNNI kernels read
// (backend/cpu/q8k_panels.h), where
// those kernels run and the weights are held as a private copy (GgufBacking::HugePageCopy, or
// a model built in memory). Same bytes, no extra memory; matmul then runs each such matrix
// through the panel kernels, whose arithmetic differs from the row kernels' in the last bits
// (each is batch-invariant).
// FLASHDLLM_NO_WEIGHT_PANELS (set, not "0") keeps every matrix in GGUF rows.
#pragma once

#include "backend/cpu/thread_pool.h"
#include "flashdllm/gguf.h"
#include "model/llama_weights.h"

namespace fdl {

/// Rearranges every matrix of `w` the panel kernels can take, using `pool` (each panel is
/// rewritten on its own), and marks its views (WeightMatrix::panels). A tensor is rearranged
/// only when the layer and output views that point into it cover it whole, each starting and
/// ending on a 16-row boundary; the token embedding (and an output tied to it) stays in rows,
/// as does everything when the CPU lacks AVX-512 BW/VNNI, and every file tensor when the file
/// is a zero-copy mapping (the model's own reordered copies, LlamaWeights::owned_rows, still
/// move).
/// Returns the number of views marked. Call before the model runs: nothing may read the
/// weights meanwhile.
int prepare_weight_panels(LlamaWeights& w, GgufFile& file, cpu::ThreadPool& pool);

}  // namespace fdl
