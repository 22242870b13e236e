// GraphCache: which steps are graphed, capture, instantiation and LRU eviction (graph_cache.h).
#include "backend/cuda/graph_cache.h"

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

GraphCache::~GraphCache() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
}

std::optional<GraphCache::Key> GraphCache::graph_key(const StepShape& s, int turn) {
  bool graph = enabled_ && s.tokens <= kMaxGraphTokens && !s.host_waits;
  if (graph && graphs_generation_ != generation_) {
    for (auto& [k, g] : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    shapes_seen_.clear();
    graphs_generation_ = generation_;
  }
  Key key = std::make_tuple(s.tokens, s.logit_rows, s.splits, s.tiles, s.decode_tile_kernel, s.trees, 0, s.tail);
  if (graph && s.tokens > kGemvMaxTokens && !graphs_.count(key)) {
    if (shapes_seen_.size() >= 64 * kMaxGraphs) shapes_seen_.clear();  // bounded memory
    graph = shapes_seen_.insert(key).second == false;  // seen in either turn
  }
  if (!graph) return std::nullopt;
  std::get<6>(key) = turn;  // each turn's graph reads its own input buffers
  return key;
}

void GraphCache::evict_if_full() {
  if (graphs_.size() < kMaxGraphs) return;
  // Many shapes (a server's varying batches): drop the least recently used one.
  auto lru = graphs_.begin();
  for (auto g = graphs_.begin(); g != graphs_.end(); ++g)
    if (g->second.last_use < lru->second.last_use) lru = g;
  cudaGraphExecDestroy(lru->second.exec);
  graphs_.erase(lru);
}

void GraphCache::abandon_capture(cudaStream_t stream) noexcept {
  cudaGraph_t captured = nullptr;
  cudaStreamEndCapture(stream, &captured);
  if (captured) cudaGraphDestroy(captured);
}

cudaGraphExec_t GraphCache::end_capture(cudaStream_t stream) {
  cudaGraph_t captured = nullptr;
  FDL_CUDA_CHECK(cudaStreamEndCapture(stream, &captured));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t e = cudaGraphInstantiate(&exec, captured, 0);
  cudaGraphDestroy(captured);
  FDL_CUDA_CHECK(e);
  return exec;
}

}  // namespace fdl::cuda
