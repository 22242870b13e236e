// OpProfiler: events between the ops of a forward, summed per op class (op_profiler.h).
#include "backend/cuda/op_profiler.h"

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {

namespace {
constexpr const char* kProfNames[kProfKinds] = {"embed",   "norm",      "qkv",  "rope",   "attention", "wo",
                                                "attn_block", "route", "gate_up", "silu", "down", "ffn_block", "output",
                                                "sample", "upload"};
}  // namespace

OpProfiler::OpProfiler(cudaStream_t stream, bool enabled) : stream_(stream), enabled_(enabled) {
  if (enabled_) ms_.assign(kProfKinds, 0.0);
}

OpProfiler::~OpProfiler() {
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

void OpProfiler::mark(int kind) {
  if (!enabled_) return;
  if (used_ == events_.size()) {
    cudaEvent_t e;
    FDL_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
    kinds_.push_back(0);
  }
  FDL_CUDA_CHECK(cudaEventRecord(events_[used_], stream_));
  kinds_[used_++] = kind;
}

void OpProfiler::collect() {
  if (!enabled_) return;
  for (size_t i = 1; i < used_; ++i) {
    float ms = 0;
    FDL_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[i - 1], events_[i]));
    ms_[size_t(kinds_[i])] += ms;
  }
  used_ = 0;
}

std::vector<std::pair<std::string, double>> OpProfiler::totals() const {
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < ms_.size(); ++k) out.emplace_back(kProfNames[k], ms_[k]);
  return out;
}

void OpProfiler::reset() { ms_.assign(ms_.size(), 0.0); }

}  // namespace fdl::cuda
