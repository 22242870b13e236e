// Helpers for the Engine tests: a thread-safe collector of streamed outputs.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "flashdllm/engine.h"

namespace fdl::test {

/// Everything one request streamed, put together.
struct Collected {
  std::vector<int32_t> ids;
  std::vector<SampledToken> tokens;
  std::string text;
  size_t deliveries = 0;
  bool finished = false;
  RequestOutput last;  ///< the final delivery
};

/// Sinks for any number of requests; wait() blocks until the given count has finished.
class Collector {
 public:
  OutputSink sink(size_t key) {
    return [this, key](const RequestOutput& out) {
      std::lock_guard lk(mu_);
      Collected& c = got_[key];
      ++c.deliveries;
      for (const auto& t : out.tokens) {
        c.ids.push_back(t.id);
        c.tokens.push_back(t);
      }
      c.text += out.text;
      if (out.finished) {
        c.finished = true;
        c.last = out;
        ++n_finished_;
        cv_.notify_all();
      }
    };
  }
  /// False on timeout.
  bool wait(size_t n, std::chrono::seconds timeout = std::chrono::seconds(120)) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return n_finished_ >= n; });
  }
  Collected get(size_t key) {
    std::lock_guard lk(mu_);
    return got_[key];
  }
  size_t n_finished() {
    std::lock_guard lk(mu_);
    return n_finished_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<size_t, Collected> got_;
  size_t n_finished_ = 0;
};

}  // namespace fdl::test
