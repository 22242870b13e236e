// DeviceSampling: sampling kernels' inputs and scratch, and the submitted-step ring
// (device_sampling.h).
#include "backend/cuda/device_sampling.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {

void throw_failed_row(const std::vector<int32_t>& ids, const char* what) {
  for (size_t r = 0; r < ids.size(); ++r)
    if (ids[r] < 0)
      throw std::invalid_argument(std::string(what) + ": logits row " + std::to_string(r) +
                                  " holds NaN or +Inf, or only -Inf: nothing to sample");
}

DeviceSampling::DeviceSampling(cudaStream_t stream, int n_vocab, int n_sm, OpProfiler& prof, GraphCache& graphs)
    : stream_(stream), n_vocab_(n_vocab), n_sm_(n_sm), prof_(prof), graphs_(graphs) {}

DeviceSampling::~DeviceSampling() {
  for (SubmittedStep& s : submitted_)
    if (s.copied) cudaEventDestroy(s.copied);
}

namespace {

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

// Where each part of a SamplingInput lies in its upload (DeviceSampling::input_bytes).
struct InputLayout {
  size_t penalties, mask_rows, mask_which, mask_words, total;
};
InputLayout layout_of(const SamplingInput& in) {
  InputLayout l;
  l.penalties = in.rows.size_bytes();
  if (in.masks.empty()) {
    l.mask_rows = l.mask_which = l.mask_words = l.total = l.penalties + in.penalties.size_bytes();
    return l;
  }
  l.mask_rows = align16(l.penalties + in.penalties.size_bytes());
  l.mask_which = align16(l.mask_rows + in.masks.rows.size_bytes());
  l.mask_words = align16(l.mask_which + in.masks.which.size_bytes());
  l.total = l.mask_words + in.masks.words.size_bytes();
  return l;
}

}  // namespace

size_t DeviceSampling::input_bytes(const SamplingInput* in) { return in ? layout_of(*in).total : 0; }

void DeviceSampling::upload_input(int turn, const SamplingInput& in, cudaStream_t upload) {
  const InputLayout l = layout_of(in);
  PinnedBuffer<unsigned char>& host = sampling_host_[turn];
  host.grow(l.total);
  unsigned char* h = host.get();
  std::memcpy(h, in.rows.data(), in.rows.size_bytes());
  if (!in.penalties.empty()) std::memcpy(h + l.penalties, in.penalties.data(), in.penalties.size_bytes());
  if (!in.masks.empty()) {
    std::memcpy(h + l.mask_rows, in.masks.rows.data(), in.masks.rows.size_bytes());
    std::memcpy(h + l.mask_which, in.masks.which.data(), in.masks.which.size_bytes());
    std::memcpy(h + l.mask_words, in.masks.words.data(), in.masks.words.size_bytes());
  }
  FDL_CUDA_CHECK(cudaMemcpyAsync(sampling_dev_[turn].get(), h, l.total, cudaMemcpyHostToDevice, upload));
}

ArgmaxScratch DeviceSampling::argmax_scratch(int m) {
  const size_t partials = argmax_partial_bytes(m, n_vocab_, n_sm_);
  if (partials == 0) return {};
  if (argmax_counters_.size() < size_t(m) || argmax_partials_.size() < partials) {
    if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));  // submitted steps use them
    if (argmax_counters_.grow(size_t(m))) {
      FDL_CUDA_CHECK(cudaMemsetAsync(argmax_counters_.get(), 0, argmax_counters_.bytes(), stream_));
      graphs_.invalidate();  // graphs with an argmax tail hold the old pointers
    }
    if (argmax_partials_.grow(partials)) graphs_.invalidate();
  }
  return ArgmaxScratch{argmax_counters_.get(), argmax_partials_.get(), n_sm_};
}

void DeviceSampling::ensure_landing(int turn, int m) {
  if (landing_[turn].size() >= size_t(m)) return;
  if (pending_count_ > 0) FDL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  landing_[turn].grow(size_t(std::max(m, 64)));
  FDL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&landing_dev_[turn]), landing_[turn].get(), 0));
  graphs_.invalidate();
}

void DeviceSampling::enqueue(int m, int turn, const SamplingInput& in, float* logits, int32_t* ids,
                             int32_t* ids_copy) {
  const unsigned char* dev = sampling_dev_[turn].get();
  const auto* d_rows = reinterpret_cast<const RowSamplingDev*>(dev);
  const InputLayout l = layout_of(in);
  apply_token_masks(logits, n_vocab_, reinterpret_cast<const int32_t*>(dev + l.mask_rows),
                    reinterpret_cast<const int32_t*>(dev + l.mask_which),
                    reinterpret_cast<const uint32_t*>(dev + l.mask_words), int(in.masks.rows.size()), stream_);
  apply_penalties(logits, n_vocab_, reinterpret_cast<const PenaltyTokenDev*>(dev + l.penalties),
                  int(in.penalties.size()), d_rows, stream_);
  // Greedy rows need only pass 1 of sample_rows (maximum and the NaN / +Inf check): the
  // argmax kernel does that with the row split over several SMs at small batches, and without
  // sample_rows' shared-memory footprint.
  const bool all_greedy =
      std::all_of(in.rows.begin(), in.rows.end(), [](const RowSampling& r) { return r.temperature == 0.0f; });
  if (all_greedy)
    argmax_rows(logits, m, n_vocab_, ids, stream_, true, argmax_scratch(m), ids_copy);
  else
    sample_rows(logits, m, n_vocab_, d_rows, ids, stream_, ids_copy);
  prof_.mark(kSample);  // penalties and the draw (or the checked argmax)
}

void DeviceSampling::begin_plain_forward(const char* what) {
  if (pending_count_ > 0)
    throw std::logic_error(std::string(what) + ": " + std::to_string(pending_count_) +
                           " submitted step(s) not collected yet (collect_ids first)");
  chain_rows_ = -1;  // the ids will hold this forward's ids (or nothing): no chain to continue
}

void DeviceSampling::check_room() const {
  if (pending_count_ >= kMaxSubmitted)
    throw std::logic_error("submit_sample: " + std::to_string(pending_count_) +
                           " steps already submitted and not collected (at most " + std::to_string(kMaxSubmitted) + ")");
}

void DeviceSampling::push_submitted(int m, int turn, bool greedy, bool chained, const SamplingInput& in,
                                    float* logits, int32_t* ids) {
  SubmittedStep& st = submitted_[(pending_first_ + pending_count_) % kMaxSubmitted];
  if (st.ids.grow(size_t(std::max(m, 1))))  // the kernel writes the ids straight into it
    FDL_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&st.ids_dev), st.ids.get(), 0));
  if (st.copied == nullptr) FDL_CUDA_CHECK(cudaEventCreateWithFlags(&st.copied, cudaEventDisableTiming));
  st.ids_at = greedy && m > 0 ? landing_[turn].get() : st.ids.get();
  if (m > 0 && !greedy) enqueue(m, turn, in, logits, ids, st.ids_dev);
  FDL_CUDA_CHECK(cudaEventRecord(st.copied, stream_));
  st.rows = m;
  st.chained = chained;
  ++pending_count_;
  chain_rows_ = m;
}

void DeviceSampling::collect(std::vector<int32_t>& ids) {
  if (pending_count_ == 0) throw std::logic_error("collect_ids: no submitted step to collect");
  SubmittedStep& st = submitted_[pending_first_];
  // Off the queue first: a step whose wait fails (a device fault) is gone either way, so a
  // drain after the error ends.
  pending_first_ = (pending_first_ + 1) % kMaxSubmitted;
  --pending_count_;
  FDL_CUDA_CHECK(cudaEventSynchronize(st.copied));
  ids.assign(st.ids_at, st.ids_at + st.rows);
  if (pending_count_ == 0) prof_.collect();
  const bool inherited = st.chained && chain_failed_;
  chain_failed_ = std::any_of(ids.begin(), ids.end(), [](int32_t t) { return t < 0; });
  if (inherited) {
    chain_failed_ = true;  // and so on down the chain
    throw std::invalid_argument(
        "collect_ids: this step's previous_step_id tokens came from a step whose sampling failed");
  }
  throw_failed_row(ids, "collect_ids");
}

}  // namespace fdl::cuda
