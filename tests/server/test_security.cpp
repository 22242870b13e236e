// Secure defaults: which API key a request presents (and its prefix-cache scope), key files,
// the warning for a non-loopback address without a key, 500s that name a request id instead
// of the failure, and the --max-queue bound.
#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "flashdllm/engine.h"
#include "server/api_keys.h"
#include "server/openai_error.h"
#include "server/queue_limit.h"
#include "server/server_metrics.h"

namespace fdl::server {
namespace {

TEST(ApiKeys, MatchesTheBearerKeyAndNamesItsIndex) {
  const ApiKeys keys({"alpha", "beta"});
  EXPECT_EQ(keys.match("Bearer alpha"), 0u);
  EXPECT_EQ(keys.match("Bearer beta"), 1u);
  for (const char* bad : {"", "alpha", "Bearer ", "Bearer alph", "Bearer alphaa", "Bearer  alpha", "bearer alpha",
                          "Basic alpha"})
    EXPECT_FALSE(keys.match(bad)) << bad;
  EXPECT_TRUE(ApiKeys().empty());
  EXPECT_FALSE(ApiKeys().match("Bearer alpha"));
}

TEST(ApiKeys, CacheScopeIsTheKeyIdNeverTheKey) {
  const ApiKeys keys({"alpha", "beta"});
  EXPECT_EQ(keys.cache_scope("Bearer alpha"), "key-0");
  EXPECT_EQ(keys.cache_scope("Bearer beta"), "key-1");
  // Without keys every request shares one scope, whatever token it sends.
  EXPECT_EQ(ApiKeys().cache_scope("Bearer alpha"), "");
  EXPECT_EQ(ApiKeys().cache_scope("Bearer beta"), "");
}

TEST(ApiKeys, RefusesKeysThatCannotBeSent) {
  EXPECT_THROW(ApiKeys({""}), std::invalid_argument);
  EXPECT_THROW(ApiKeys({"a b"}), std::invalid_argument);
  EXPECT_THROW(ApiKeys({"ok", "tab\there"}), std::invalid_argument);
}

TEST(ApiKeys, KeyFileLinesAreTrimmedAndBlankLinesSkipped) {
  EXPECT_EQ(parse_key_lines("s3cret\n"), std::vector<std::string>{"s3cret"});
  EXPECT_EQ(parse_key_lines("s3cret"), std::vector<std::string>{"s3cret"});
  EXPECT_EQ(parse_key_lines("one \r\n\n  two\t\n"), (std::vector<std::string>{"one", "two"}));
  EXPECT_THROW(parse_key_lines(""), std::invalid_argument);
  EXPECT_THROW(parse_key_lines(" \n\r\n\t"), std::invalid_argument);
}

TEST(BindAddress, LoopbackIsOnlyThisHost) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "localhost", "::1", "[::1]", "::ffff:127.0.0.1"})
    EXPECT_TRUE(is_loopback_host(host)) << host;
  for (const char* host : {"0.0.0.0", "::", "10.0.0.1", "128.0.0.1", "192.168.1.5", "example.com", "localhost.evil",
                           "::2", "::ffff:10.0.0.1", ""})
    EXPECT_FALSE(is_loopback_host(host)) << host;
}

TEST(BindAddress, WarnsOnlyForAnExposedAddressWithoutAKey) {
  EXPECT_EQ(exposure_warning("127.0.0.1", false), "");
  EXPECT_EQ(exposure_warning("0.0.0.0", true), "");
  const std::string w = exposure_warning("0.0.0.0", false);
  EXPECT_NE(w.find("0.0.0.0"), std::string::npos) << w;
  EXPECT_NE(w.find("without an API key"), std::string::npos) << w;
}

TEST(InternalError, ClientGetsARequestIdAndTheLogGetsTheDetail) {
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(8);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("test", sink));
  const ApiError e = internal_error("open /secret/path/model.gguf: Permission denied");
  spdlog::set_default_logger(previous);

  EXPECT_EQ(e.status(), 500);
  EXPECT_EQ(e.type(), "server_error");
  const std::string message = e.what();
  EXPECT_EQ(message.find("secret"), std::string::npos) << message;
  ASSERT_EQ(e.headers().size(), 1u);
  EXPECT_EQ(e.headers()[0].first, "X-Request-Id");
  const std::string id = e.headers()[0].second;
  EXPECT_GE(id.size(), 16u);
  EXPECT_EQ(message, "internal error (request id " + id + ")");
  EXPECT_EQ(error_body(e)["error"]["message"], message);

  const std::vector<std::string> logged = sink->last_formatted();
  ASSERT_EQ(logged.size(), 1u);
  EXPECT_NE(logged[0].find(id), std::string::npos) << logged[0];
  EXPECT_NE(logged[0].find("/secret/path/model.gguf: Permission denied"), std::string::npos) << logged[0];
  // Each failure its own id.
  EXPECT_NE(internal_error("x").headers()[0].second, id);
}

TEST(QueueLimit, UnboundedAdmitsWithoutAskingTheEngine) {
  QueueLimit q(0);
  for (int i = 0; i < 100; ++i)
    EXPECT_TRUE(q.admit(1, []() -> int64_t { throw std::logic_error("not called"); }));
}

TEST(QueueLimit, RefusesOnceMaxAreWaiting) {
  QueueLimit q(2);
  int64_t waiting = 0;
  auto engine = [&] { return waiting; };
  EXPECT_TRUE(q.admit(1, engine));
  waiting = 1;
  EXPECT_TRUE(q.admit(1, engine));
  waiting = 2;
  EXPECT_FALSE(q.admit(1, engine));
  waiting = 1;  // one was admitted: room again
  EXPECT_TRUE(q.admit(1, engine));
}

TEST(QueueLimit, CountsRequestsBetweenTheirCheckAndTheirSubmission) {
  QueueLimit q(2);
  auto none = [] { return int64_t(0); };
  auto first = q.admit(1, none);  // admitted, not yet submitted: the engine does not see it
  ASSERT_TRUE(first);
  auto second = q.admit(1, none);
  ASSERT_TRUE(second);
  EXPECT_FALSE(q.admit(1, none));
  second.reset();  // given up (or submitted, and then in the engine's count)
  EXPECT_TRUE(q.admit(1, none));
  EXPECT_FALSE(q.admit(2, [] { return int64_t(1); }));  // n choices count as n: 1 + 1 pending
}

TEST(QueueLimit, RejectionsAreCountedInMetrics) {
  ServerMetrics m;
  const std::string series = "flashdllm_requests_rejected_total{reason=\"queue_full\"}";
  EXPECT_NE(m.render(EngineMetrics{}, {}).find(series + " 0\n"), std::string::npos);
  m.count_rejected("queue_full");
  EXPECT_NE(m.render(EngineMetrics{}, {}).find(series + " 1\n"), std::string::npos);
}

}  // namespace
}  // namespace fdl::server
