// Secure defaults: which API key a request presents (and its prefix-cache scope), key files,
// the warning for a non-loopback address without a key, and 500s that name a request id
// instead of the failure.
#include <gtest/gtest.h>

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "server/api_keys.h"
#include "server/openai_error.h"

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

}  // namespace
}  // namespace fdl::server
