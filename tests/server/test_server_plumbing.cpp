// The pieces between the engine and HTTP: RequestStream hand-off across threads, the
// Prometheus rendering of ServerMetrics, and an in-process HttpServer driving the real
// engine (bind to port 0, serve, drain with 503, stop).
#include <gtest/gtest.h>
#include <httplib.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <thread>

#include "flashdllm/engine.h"
#include "server/http_server.h"
#include "server/request_stream.h"
#include "server/server_metrics.h"
#include "test_support.h"

namespace fdl::server {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

TEST(RequestStream, DeliversInOrderAcrossThreadsAndCountsFinishes) {
  RequestStream rs(2);
  EXPECT_TRUE(rs.pop(1ms).empty());
  std::thread producer([&] {
    for (int i = 0; i < 100; ++i) {
      RequestOutput o;
      o.text = std::to_string(i);
      o.finished = i == 99;
      rs.push(size_t(i % 2 == 0 ? 0 : 1), o);
    }
  });
  std::vector<RequestStream::Event> got;
  while (got.size() < 100) {
    for (auto& e : rs.pop(100ms)) got.push_back(std::move(e));
  }
  producer.join();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[size_t(i)].output.text, std::to_string(i));
  EXPECT_FALSE(rs.all_finished());  // only choice 1 finished
  RequestOutput last;
  last.finished = true;
  rs.push(0, last);
  EXPECT_TRUE(rs.all_finished());
}

TEST(ServerMetrics, RendersRequestAndEngineSeries) {
  ServerMetrics m;
  RequestOutput out;
  out.finished = true;
  out.finish_reason = "length";
  out.queue_ms = 2;
  out.timings.gen_tokens = 3;
  out.timings.ttft_ms = 5;
  out.timings.token_latencies_ms = {1.0, 2.0};
  m.observe_finished(out, 12.0);
  m.count_response(200);
  EngineMetrics e;
  e.running = 1;
  e.kv_blocks_total = 10;
  e.kv_blocks_free = 6;
  e.kv_blocks_cached = 1;
  e.kv_block_bytes = 100;
  e.kv_dtype = KvDtype::BF16;
  e.kv_block_size = 16;
  e.prefix_cache_queries = 8;
  e.prefix_cache_hits = 2;
  e.generation_tokens = 7;
  e.spec.drafted = 4;
  e.spec.accepted = 1;
  e.spec.tree_steps = 3;
  e.spec.tree_alt_accepted = 2;
  const std::string text = m.render(e, {{"speculation", true, 1, "x"}, {"disk_offload", false, 0, ""}});
  for (const char* line : {"flashdllm_requests_running 1\n", "flashdllm_kv_blocks_used 3\n",
                           "flashdllm_kv_bytes_used 300\n", "flashdllm_prefix_cache_hit_rate 0.25\n",
                           "flashdllm_spec_acceptance_rate 0.25\n", "flashdllm_generation_tokens_total 7\n",
                           "flashdllm_spec_tree_steps_total 3\n", "flashdllm_spec_tree_alt_accepted_tokens_total 2\n",
                           "flashdllm_breaker_open{name=\"speculation\"} 1\n",
                           "flashdllm_kv_cache_info{block_size=\"16\",dtype=\"bf16\"} 1\n",
                           "flashdllm_breaker_open{name=\"disk_offload\"} 0\n",
                           "flashdllm_requests_finished_total{finish_reason=\"length\"} 1\n",
                           "flashdllm_http_responses_total{code=\"200\"} 1\n",
                           "flashdllm_inter_token_latency_ms_count 2\n",
                           "flashdllm_time_to_first_token_ms_count 1\n", "flashdllm_queue_time_ms_sum 2\n",
                           "flashdllm_e2e_request_latency_ms_sum 12\n"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line;
  }
  // Mirrored engine totals only grow by the difference.
  e.generation_tokens = 10;
  EXPECT_NE(m.render(e, {}).find("flashdllm_generation_tokens_total 10\n"), std::string::npos);
}

TEST(HttpServer, ServesDrainsAndStopsInProcess) {
  const LoadedModel model = load_model(test::model_path("stories260K.gguf"), ModelOptions{.n_threads = 1});
  EngineOptions eo;
  eo.generator.n_ctx = 128;
  eo.generator.max_sequences = 2;
  Engine engine(*model.model, *model.tokenizer, eo);
  ServerOptions so;
  so.port = 0;
  so.served_model_name = "stories";
  HttpServer server(engine, so);
  const int port = server.bind();
  ASSERT_GT(port, 0);
  std::thread runner([&] { server.run(); });

  httplib::Client client("127.0.0.1", port);
  auto res = client.Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":5,"temperature":0})",
                         "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  const json body = json::parse(res->body);
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["model"], "stories");

  res = client.Post("/v1/completions", R"({"prompt":"x","max_tokens":0})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["param"], "max_tokens");

  server.begin_drain();
  res = client.Post("/v1/completions", R"({"prompt":"Once","max_tokens":5})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "server_error");
  res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(server.active_requests(), 0u);
  server.stop();
  runner.join();
}

}  // namespace
}  // namespace fdl::server
