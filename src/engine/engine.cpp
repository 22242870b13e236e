// Engine: the scheduler on its own thread, fed through a locked inbox (flashdllm/engine.h).
//
// Three locks, taken in this order (state_mu, snap_mu, inbox_mu) by whoever needs several:
//  - inbox_mu guards what other threads hand over (new requests, aborts, the stop flag, the
//    in-flight count drain() waits on); it is held only for a swap, so submit() and abort()
//    never wait for a forward;
//  - state_mu guards the scheduler, the KV cache and the breakers; the engine thread holds it
//    for one step, so metrics() and the breaker calls wait at most one forward. A mutex is not
//    fair: the engine thread, re-locking right after each step, would win every time and
//    starve them for a whole generation (a /metrics request hung for the 45 s of a long
//    request). So they announce themselves (lock_state) and the engine thread lets them in
//    before its next step;
//  - snap_mu guards the metrics snapshot: metrics() during a step does not queue on state_mu
//    at all but takes a ticket, and the engine thread answers every ticket of the step with
//    one snapshot at its end (StepWindow).
// Sinks run on the engine thread with state_mu held: they must not call metrics().
#include "flashdllm/engine.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <spdlog/spdlog.h>

#include "engine/engine_core.h"
#include "engine/kv_offload.h"
#include "engine/request_validation.h"
#include "engine/resolved_options.h"
#include "engine/scheduler.h"
#include "engine/step_trace.h"

namespace fdl {
namespace {

constexpr const char* kSpeculation = "speculation";
constexpr const char* kDiskOffload = "disk_offload";

EngineOptions resolve(const Model& model, EngineOptions o) {
  o.generator = engine::resolve_options(model, o.generator);
  engine::validate_scheduler_options(o.scheduler, o.generator);
  o.kv_blocks = engine::resolve_pool_blocks(
      o.generator, o.kv_blocks != 0 ? o.kv_blocks : o.generator.kv_blocks, "Engine");
  o.generator.kv_blocks = o.kv_blocks;
  // Either switch turns async scheduling off (the generator's, for callers that set only it).
  o.scheduler.async_scheduling = o.scheduler.async_scheduling && o.generator.async_scheduling;
  return o;
}

}  // namespace

struct Engine::Impl {
  Impl(Model& m, const Tokenizer& t, const EngineOptions& o)
      : options(resolve(m, o)), core(m, t, options.generator, "Engine"),
        ctx(core.context(!options.generator.trace_file.empty())),
        scheduler(ctx, options.scheduler) {}

  void loop();
  void finished_one();

  EngineOptions options;
  // The tier manager inside outlives the scheduler (its prefix cache holds OffloadIds).
  engine::EngineCore core;
  engine::EngineContext ctx;
  engine::Scheduler scheduler;

  struct NewRequest {
    RequestId id;
    GenerationRequest request;
    OutputSink sink;
  };
  mutable std::mutex inbox_mu;
  std::condition_variable inbox_cv;
  std::condition_variable idle_cv;  ///< drain() waits for in_flight == 0
  std::vector<NewRequest> inbox;
  std::vector<RequestId> aborts;
  int64_t in_flight = 0;
  bool stopping = false;
  bool draining = false;
  std::atomic<RequestId> next_id{1};

  mutable std::mutex state_mu;
  // Callers other than the engine thread waiting for state_mu, and where they say they got it.
  mutable std::atomic<int> state_waiters{0};
  mutable std::mutex turn_mu;
  mutable std::condition_variable turn_cv;
  std::thread thread;

  /// state_mu for a caller other than the engine thread, taken ahead of the engine's next step.
  std::unique_lock<std::mutex> lock_state() const {
    state_waiters.fetch_add(1, std::memory_order_acq_rel);
    std::unique_lock st(state_mu);
    state_waiters.fetch_sub(1, std::memory_order_acq_rel);
    turn_cv.notify_all();
    return st;
  }
  // metrics() while a step runs: instead of queueing on state_mu (one lock hand-over per
  // caller, each making the engine thread wait: a /metrics flood slowed generation by
  // 11-17%), callers take a ticket and the engine thread collects one snapshot at the end of
  // the step for every ticket taken during it. All guarded by snap_mu.
  mutable std::mutex snap_mu;
  mutable std::condition_variable snap_cv;
  bool stepping = false;          // the engine thread holds state_mu for a step
  mutable uint64_t snap_asked = 0;   // last ticket handed out
  uint64_t snap_served = 0;          // tickets up to this one are answered by `snap`
  // metrics() and breakers() both: the server's /metrics reads the two, and a breakers() that
  // queued on state_mu would give the flood its per-caller lock hand-over back.
  struct Snapshot {
    EngineMetrics metrics;
    std::vector<BreakerState> breakers;
  };
  Snapshot snap;

  /// The metrics / the breakers; the caller holds state_mu.
  EngineMetrics collect_metrics() const;
  std::vector<BreakerState> collect_breakers() const;
  /// During a step: waits for the snapshot taken at its end and copies it to `out`. False
  /// (nothing copied) when no step runs or the step outlasts the wait: read under state_mu.
  bool step_snapshot(Snapshot& out) const {
    std::unique_lock lk(snap_mu);
    if (!stepping) return false;
    const uint64_t ticket = ++snap_asked;
    if (!snap_cv.wait_for(lk, std::chrono::seconds(2), [&] { return snap_served >= ticket; })) return false;
    out = snap;
    return true;
  }
  /// Engine thread: marks the span during which it holds state_mu for a step; at its end,
  /// answers the tickets taken during it with one snapshot.
  struct StepWindow {
    Impl& im;
    explicit StepWindow(Impl& i) : im(i) {
      std::lock_guard lk(im.snap_mu);
      im.stepping = true;
    }
    ~StepWindow() {
      std::lock_guard lk(im.snap_mu);
      if (im.snap_asked > im.snap_served) {
        try {
          im.snap = Snapshot{im.collect_metrics(), im.collect_breakers()};
          im.snap_served = im.snap_asked;
          im.snap_cv.notify_all();
        } catch (const std::exception& e) {  // waiters fall back to lock_state after their timeout
          spdlog::error("engine: metrics snapshot failed: {}", e.what());
        }
      }
      im.stepping = false;
    }
  };

  /// On the engine thread between steps: lets announced callers take state_mu first (a bounded
  /// wait: a notification missed between the check and the wait costs at most 1 ms).
  void give_turn() {
    if (state_waiters.load(std::memory_order_acquire) == 0) return;
    std::unique_lock lk(turn_mu);
    turn_cv.wait_for(lk, std::chrono::milliseconds(1),
                     [&] { return state_waiters.load(std::memory_order_acquire) == 0; });
  }
};

void Engine::Impl::finished_one() {
  std::lock_guard lk(inbox_mu);
  if (--in_flight == 0) idle_cv.notify_all();
}

void Engine::Impl::loop() {
  std::vector<NewRequest> adds;
  std::vector<RequestId> ends;
  bool busy = false;
  for (;;) {
    {
      std::unique_lock lk(inbox_mu);
      inbox_cv.wait(lk, [&] { return stopping || busy || !inbox.empty() || !aborts.empty(); });
    }
    give_turn();
    std::lock_guard st(state_mu);
    const StepWindow window(*this);  // ends before state_mu is released
    bool stop_now;
    {
      // Taken out of the inbox only under state_mu: a caller let in by give_turn must find a
      // submitted request in the inbox or in the scheduler, never in neither (metrics' waiting).
      // The stop flag is read with the same lock: read later, a request submitted in between
      // would stay in the inbox of a stopped engine and never get its final delivery.
      std::lock_guard lk(inbox_mu);
      adds.swap(inbox);
      ends.swap(aborts);
      stop_now = stopping;
    }
    for (auto& r : adds) scheduler.add(r.id, std::move(r.request), std::move(r.sink));
    adds.clear();
    for (RequestId id : ends) scheduler.abort(id);
    ends.clear();
    if (stop_now) {
      scheduler.fail_all("abort", "the engine is shutting down");  // sinks take inbox_mu
      return;
    }
    if (scheduler.has_work()) {
      try {
        scheduler.step();
      } catch (const std::exception& e) {
        // A failed forward ends what was running, not the engine: the next request gets a
        // clean KV cache.
        spdlog::error("engine step failed: {}", e.what());
        scheduler.fail_all("error", e.what());
      }
    }
    busy = scheduler.has_work();
  }
}

Engine::Engine(Model& model, const Tokenizer& tokenizer, const EngineOptions& options)
    : impl_(std::make_unique<Impl>(model, tokenizer, options)) {
  impl_->thread = std::thread([this] { impl_->loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lk(impl_->inbox_mu);
    impl_->stopping = true;
  }
  impl_->inbox_cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  const auto& file = impl_->options.generator.trace_file;
  if (!file.empty()) {
    try {
      impl_->core.trace.write(file);
    } catch (const std::exception& e) {
      spdlog::error("engine: {}", e.what());  // a destructor must not throw
    }
  }
}

RequestId Engine::submit(GenerationRequest request, OutputSink sink) {
  Impl& im = *impl_;
  engine::validate_request(request, 0, im.core.n_vocab, im.options.generator.n_ctx);
  if (request.logprobs < -1 || request.logprobs > 20)
    throw std::invalid_argument("logprobs = " + std::to_string(request.logprobs) +
                                " is invalid (-1 = none, 0..20 alternatives)");
  const RequestId id = im.next_id.fetch_add(1);
  // The engine's wrapper counts the request as done on its final delivery, whatever ends it.
  OutputSink wrapped = [&im, user = std::move(sink)](const RequestOutput& out) {
    struct Done {
      Impl& im;
      bool last;
      ~Done() { if (last) im.finished_one(); }
    } done{im, out.finished};
    if (user) user(out);
  };
  {
    std::lock_guard lk(im.inbox_mu);
    if (im.draining || im.stopping)
      throw std::runtime_error("the engine is draining and accepts no new requests");
    ++im.in_flight;
    im.inbox.push_back({id, std::move(request), std::move(wrapped)});
  }
  im.inbox_cv.notify_one();
  return id;
}

void Engine::abort(RequestId id) {
  {
    std::lock_guard lk(impl_->inbox_mu);
    impl_->aborts.push_back(id);
  }
  impl_->inbox_cv.notify_one();
}

void Engine::drain() {
  std::unique_lock lk(impl_->inbox_mu);
  impl_->draining = true;
  impl_->idle_cv.wait(lk, [&] { return impl_->in_flight == 0; });
}

EngineMetrics Engine::metrics() const {
  const Impl& im = *impl_;
  // During a step: the snapshot taken at its end (coalesced with every other caller during
  // it); idle, or a step longer than the wait: under the state lock.
  if (Impl::Snapshot s; im.step_snapshot(s)) return std::move(s.metrics);
  const auto st = im.lock_state();
  return im.collect_metrics();
}

EngineMetrics Engine::Impl::collect_metrics() const {
  const Impl& im = *this;
  EngineMetrics m;
  const auto& c = im.scheduler.counters();
  m.running = int64_t(im.scheduler.n_running());
  m.waiting = int64_t(im.scheduler.n_waiting());
  {
    // Submitted but not yet handed to the scheduler count as waiting too.
    std::lock_guard lk(im.inbox_mu);
    m.waiting += int64_t(im.inbox.size());
  }
  m.steps = c.steps;
  m.requests_submitted = c.submitted;
  m.requests_finished = c.finished;
  m.requests_aborted = c.aborted;
  m.requests_failed = c.failed;
  m.preemptions = c.preemptions;
  m.prompt_tokens = c.prompt_tokens;
  m.prefill_tokens_computed = c.prefill_computed;
  m.recomputed_tokens = c.recomputed;
  m.generation_tokens = c.generated;
  m.prefix_cache_queries = c.prefix_queries;
  m.prefix_cache_hits = c.prefix_hits;
  m.kv_blocks_total = im.core.pool.capacity();
  m.kv_blocks_free = im.core.pool.n_free();
  m.kv_blocks_cached = im.scheduler.prefix_cache().n_evictable();
  m.kv_block_bytes = im.core.pool.shape().block_bytes();
  m.kv_dtype = im.core.pool.shape().dtype;
  m.kv_block_size = im.core.pool.shape().block_size;
  m.kv_blocks_copied = im.core.kv.blocks_copied();
  m.spec = im.core.spec_metrics();
  m.forward_ms = im.core.stats.forward_ms;
  m.grammar_rows = im.core.stats.grammar_rows;
  m.grammar_ms = im.core.stats.grammar_ms;
  m.kv_tiers = im.core.tier_metrics();
  return m;
}

std::vector<BreakerState> Engine::breakers() const {
  const Impl& im = *impl_;
  if (Impl::Snapshot s; im.step_snapshot(s)) return std::move(s.breakers);
  const auto st = im.lock_state();
  return im.collect_breakers();
}

std::vector<BreakerState> Engine::Impl::collect_breakers() const {
  const Impl& im = *this;
  std::vector<BreakerState> out;
  out.push_back({kSpeculation, im.core.spec.breaker.open(), im.core.spec.breaker.trips(),
                 im.core.spec.breaker.reason()});
  const TierStats ts = im.core.tiers->stats();
  out.push_back({kDiskOffload, ts.breaker_open, int64_t(ts.breaker_trips), ts.breaker_reason});
  return out;
}

void Engine::trip_breaker(const std::string& name, const std::string& reason) {
  Impl& im = *impl_;
  const auto st = im.lock_state();
  // Every manual trip reads the same way on both breakers ("manual trip: " + why), so an
  // operator can tell it from an automatic one (audit, slowness, disk latency) in the metrics.
  const std::string why = "manual trip: " + (reason.empty() ? std::string("by an operator") : reason);
  if (name == kSpeculation)
    im.core.spec.breaker.trip(why);
  else if (name == kDiskOffload)
    im.core.tiers->trip_breaker(why);
  else
    throw std::invalid_argument("unknown breaker '" + name + "' (expected " + kSpeculation +
                                " or " + kDiskOffload + ")");
}

int Engine::inject_fault(const std::string& fault, int count) {
  if (count < 1 || count > 1000) throw std::invalid_argument("fault count must be in 1..1000");
  Impl& im = *impl_;
  const auto st = im.lock_state();
  TierManager* tiers = im.core.tiers.get();
  if (fault == "flip_bit") {
    if (tiers == nullptr) return 0;
    const std::vector<OffloadId> stored = tiers->stored_for_test();
    // Spread over the stored blocks (newest first: the likeliest to be read back soon), a
    // different byte each time.
    int flipped = 0;
    for (size_t i = 0; i < stored.size() && flipped < count; ++i, ++flipped)
      tiers->corrupt_for_test(stored[stored.size() - 1 - i], (i * 7) % 64, int(i % 8));
    return flipped;
  }
  const auto disk = [&](bool on_write, const char* kind) {
    if (tiers == nullptr || !tiers->tier_enabled(BlockTier::Disk))
      throw std::invalid_argument("fault '" + fault + "' needs an enabled disk tier (--kv-disk-path)");
    tiers->inject_disk_fault_for_test(on_write, kind, count);
    return count;
  };
  if (fault == "disk_read_eio") return disk(false, "eio");
  if (fault == "disk_write_eio") return disk(true, "eio");
  if (fault == "disk_write_enospc") return disk(true, "enospc");
  if (fault == "disk_read_short") return disk(false, "short");
  throw std::invalid_argument("unknown fault '" + fault +
                              "' (expected disk_read_eio, disk_write_eio, disk_write_enospc, disk_read_short or flip_bit)");
}

void Engine::reset_breaker(const std::string& name) {
  Impl& im = *impl_;
  const auto st = im.lock_state();
  if (name == kSpeculation)
    im.core.spec.breaker.reset();
  else if (name == kDiskOffload)
    im.core.tiers->reset_breaker();
  else
    throw std::invalid_argument("unknown breaker '" + name + "' (expected " + kSpeculation +
                                " or " + kDiskOffload + ")");
}

const EngineOptions& Engine::options() const { return impl_->options; }
const Tokenizer& Engine::tokenizer() const { return impl_->core.tokenizer; }
const ModelConfig& Engine::model_config() const { return impl_->core.model.config(); }

}  // namespace fdl
