// graph_cache.h — the CUDA model's captured steps (CUDA graphs), least recently used evicted.
//
// A step of up to kMaxGraphTokens tokens is captured once per shape (StepShape) and input turn
// (each turn's graph reads its own input buffers) and then replayed. Steps of up to
// kGemvMaxTokens tokens are captured at once; larger ones (cuBLAS GEMMs; decode batches) once
// their shape has been seen before in either turn, so one-off shapes (a prompt) do not pay an
// instantiation. At most kMaxGraphs graphs are kept, the least recently launched evicted (a
// server's varying batches). Graphs hold device pointers: whoever moves a buffer a captured
// step reads calls invalidate(), and every graph is dropped before the next step that would
// use one. Disabled (FLASHDLLM_CUDA_GRAPHS=0, or profiling: cuda_knobs.h), run() launches
// kernel by kernel.
//
// Errors: CudaError from capture, instantiation or launch; an exception from the kernels
// during a capture ends the capture, drops it and propagates. Thread-safety: none (the
// model's thread); captures use cudaStreamCaptureModeThreadLocal.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {

class GraphCache {
 public:
  static constexpr int kMaxGraphTokens = 512;
  static constexpr size_t kMaxGraphs = 128;  // 64 shapes in both turns

  /// What a captured step's kernels depend on besides its device inputs' contents.
  struct StepShape {
    int tokens = 0;
    int logit_rows = 0;
    int splits = 0;  ///< attention context chunks
    int tiles = 0;   ///< attention tiles (0 without tiles): the tile starts are device data
    bool decode_tile_kernel = false;  ///< the tiles run the decode-tile kernel
    bool trees = false;               ///< the attention kernels' masked variants
    int tail = 0;                     ///< what the step ends with (CudaModel::Tail)
    bool host_waits = false;          ///< the kernels wait for the host midway: never graphed
  };

  explicit GraphCache(bool enabled) : enabled_(enabled) {}
  ~GraphCache();
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  /// A device pointer a captured step may hold has moved: the graphs are dropped before the
  /// next graphed step.
  void invalidate() { ++generation_; }

  /// Runs `kernels()` (which enqueues the step on `stream`) through its captured graph
  /// (capturing it first where needed), or directly where the step is not graphed.
  template <class Kernels>
  void run(const StepShape& shape, int turn, cudaStream_t stream, Kernels&& kernels) {
    const std::optional<Key> key = graph_key(shape, turn);
    if (!key) {
      kernels();
      return;
    }
    auto it = graphs_.find(*key);
    if (it == graphs_.end()) {
      evict_if_full();
      FDL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      try {
        kernels();
      } catch (...) {
        abandon_capture(stream);
        throw;
      }
      it = graphs_.emplace(*key, CapturedStep{end_capture(stream), 0}).first;
    }
    it->second.last_use = ++clock_;
    FDL_CUDA_CHECK(cudaGraphLaunch(it->second.exec, stream));
  }

 private:
  // (tokens, logit rows, splits, tiles, whether the decode-tile kernel runs them, trees, turn, tail)
  using Key = std::tuple<int, int, int, int, bool, bool, int, int>;
  struct CapturedStep {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;  // clock_ at the last launch (the least recent is evicted)
  };
  /// The graph's key, or nullopt where the step runs ungraphed; drops stale graphs.
  std::optional<Key> graph_key(const StepShape& shape, int turn);
  void evict_if_full();
  static void abandon_capture(cudaStream_t stream) noexcept;
  static cudaGraphExec_t end_capture(cudaStream_t stream);

  bool enabled_;
  std::map<Key, CapturedStep> graphs_;
  uint64_t clock_ = 0;
  std::set<Key> shapes_seen_;  // larger shapes run once ungraphed
  uint64_t generation_ = 0;        // invalidate() count
  uint64_t graphs_generation_ = 0;  // generation_ the graphs were captured in
};

}  // namespace fdl::cuda
