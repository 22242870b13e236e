// device_sampling.h — the CUDA model's sampling on the GPU and its pipelined steps.
//
// Sampling: a step's wanted logits rows are penalized and sampled (kernels.h:
// apply_penalties, then sample_rows; rows that are all greedy take the checked argmax) into
// the runner's ids; every row, greedy ones included, is checked for NaN / +Inf / all -Inf (a
// failed row's id is negative: throw_failed_row). The rows' parameters (RowSampling, copied as
// is: cuda_model.cpp checks the layout against RowSamplingDev) and penalty tokens go up with
// the step's inputs, into per-turn staging (page-locked host and device buffers).
//
// Pipelined steps (Model::submit_sample / collect_ids): per uncollected step, in a ring of
// Model::kMaxSubmitted, its ids' page-locked landing place and the event after their copy.
// A greedy step without penalties ends its graph with the checked argmax, which writes the
// ids into its turn's mapped landing buffer (ensure_landing); other steps' sampling writes
// them into the ring slot's own mapped buffer. The chain: previous_step_id tokens of a
// submitted step read the ids the previous submitted step left in device memory
// (chain_rows); a collected step with a failed row makes the next chained step fail too.
//
// Every buffer a captured graph may hold (argmax scratch, landing buffers) invalidates the
// graphs when it moves (GraphCache::invalidate); a buffer submitted steps may still use grows
// only after the compute stream has drained.
// Errors: CudaError; std::logic_error for broken pipelining rules; std::invalid_argument for
// a failed row (messages as Model documents). Thread-safety: none (the model's thread).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "backend/cuda/device_buffer.h"
#include "backend/cuda/graph_cache.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/op_profiler.h"
#include "flashdllm/model.h"

namespace fdl::cuda {

/// Rows, penalty tokens and grammar masks of a sampled step, uploaded with its inputs.
struct SamplingInput {
  std::span<const RowSampling> rows;
  std::span<const PenaltyToken> penalties;
  TokenMasks masks;
};

/// Throws std::invalid_argument naming the first negative id's row ("<what>: logits row r
/// holds NaN or +Inf, or only -Inf: nothing to sample").
void throw_failed_row(const std::vector<int32_t>& ids, const char* what);

class DeviceSampling {
 public:
  /// `stream`: the compute stream. `prof` and `graphs` must outlive this object.
  DeviceSampling(cudaStream_t stream, int n_vocab, int n_sm, OpProfiler& prof, GraphCache& graphs);
  ~DeviceSampling();
  DeviceSampling(const DeviceSampling&) = delete;
  DeviceSampling& operator=(const DeviceSampling&) = delete;

  // --- per-turn staging of the sampling input ---
  /// Bytes `in` takes on the device: the rows' parameters, then the penalty tokens (8-byte
  /// aligned after the 40-byte rows), then the masked rows, their mask indices and the masks
  /// (each part 16-byte aligned); 0 for none.
  static size_t input_bytes(const SamplingInput* in);
  bool input_fits(int turn, size_t bytes) const { return sampling_dev_[turn].size() >= bytes; }
  void grow_input(int turn, size_t bytes) { sampling_dev_[turn].grow(bytes); }
  /// Copies `in` into the turn's page-locked buffer and queues its upload on `upload`.
  void upload_input(int turn, const SamplingInput& in, cudaStream_t upload);

  // --- kernels on the compute stream ---
  /// argmax_rows' scratch for m rows (grown and zeroed here).
  ArgmaxScratch argmax_scratch(int m);
  /// Grows the turn's landing buffer (mapped page-locked) to m ids at least.
  void ensure_landing(int turn, int m);
  /// Device address of the turn's landing buffer (what a CheckedArgmax tail writes).
  int32_t* landing_dev(int turn) const { return landing_dev_[turn]; }
  /// Enqueues masks + penalties + sampling of the step's m rows of `logits` into `ids` (and
  /// ids_copy, if given: mapped page-locked memory) from turn's uploaded SamplingInput; rows
  /// that are all greedy (temperature 0) take the checked argmax instead of sample_rows.
  void enqueue(int m, int turn, const SamplingInput& in, float* logits, int32_t* ids, int32_t* ids_copy = nullptr);

  // --- pipelined steps ---
  size_t submitted() const { return pending_count_; }
  bool steps_in_flight() const { return pending_count_ > 0; }
  /// Rows of the last submit_sample step's ids in device memory; -1: none.
  long chain_rows() const { return chain_rows_; }
  /// Throws std::logic_error when submitted steps are uncollected (a plain forward now would
  /// be ordered between them), and forgets the chain: previous_step_id refers to nothing.
  void begin_plain_forward(const char* what);
  /// Throws std::logic_error when kMaxSubmitted steps are already uncollected.
  void check_room() const;
  /// After a submitted step's kernels (launched on `turn` with m rows): enqueues its sampling
  /// unless `greedy` (its graph ended with the checked argmax into the turn's landing buffer),
  /// records its completion and queues it for collect(). `chained`: it has previous_step_id
  /// tokens.
  void push_submitted(int m, int turn, bool greedy, bool chained, const SamplingInput& in, float* logits,
                      int32_t* ids);
  /// Waits for the oldest submitted step and returns its ids (see Model::collect_ids); runs
  /// `prof.collect()` once none is left.
  void collect(std::vector<int32_t>& ids);

 private:
  cudaStream_t stream_;
  int n_vocab_;
  int n_sm_;
  OpProfiler& prof_;
  GraphCache& graphs_;
  DeviceBuffer<unsigned> argmax_counters_;  // argmax_rows' per-row counters (kept zero)
  DeviceBuffer<unsigned char> argmax_partials_;
  // forward_sample's rows + penalty tokens, staged; per turn
  PinnedBuffer<unsigned char> sampling_host_[2];
  DeviceBuffer<unsigned char> sampling_dev_[2];
  // Per turn: where a pipelined greedy step's graph writes its ids (mapped page-locked).
  PinnedBuffer<int32_t> landing_[2];
  int32_t* landing_dev_[2] = {nullptr, nullptr};
  // Pipelined steps (submit_sample): per uncollected step, its ids' page-locked landing
  // place and the event after their copy, in a ring of kMaxSubmitted.
  struct SubmittedStep {
    PinnedBuffer<int32_t> ids;  // written by the sampling kernel through its device mapping
    int32_t* ids_dev = nullptr;
    const int32_t* ids_at = nullptr;  // where collect reads them: `ids` or a landing buffer
    cudaEvent_t copied = nullptr;
    int rows = 0;
    bool chained = false;  // has previous_step_id tokens
  };
  static constexpr size_t kMaxSubmitted = Model::kMaxSubmitted;
  SubmittedStep submitted_[kMaxSubmitted];
  size_t pending_first_ = 0, pending_count_ = 0;
  long chain_rows_ = -1;       // rows of the last submit_sample step's ids in ids; -1: none
  bool chain_failed_ = false;  // a collected step had a failed row: the next chained step fails too
};

}  // namespace fdl::cuda
