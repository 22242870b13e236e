// Tests for the control message and Redis URL parsers: good inputs, and bad inputs each
// with the part of the error message that tells the operator what is wrong.
#include "control/control_command.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

using fdl::control::ControlCommand;
using fdl::control::parse_control_command;
using fdl::control::parse_redis_url;
using fdl::control::RedisUrl;

namespace {

struct BadCase {
  std::string input;
  std::string message_part;
};

template <class Fn>
void expect_all_rejected(const std::vector<BadCase>& cases, Fn parse) {
  for (const auto& c : cases) {
    try {
      parse(c.input);
      ADD_FAILURE() << "accepted bad input: " << c.input;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos)
          << "input: " << c.input << "\nmessage: " << e.what() << "\nexpected to contain: "
          << c.message_part;
    }
  }
}

}  // namespace

TEST(ControlCommand, ParsesValidCommands) {
  ControlCommand c =
      parse_control_command(R"({"breaker":"disk_offload","action":"trip","reason":"disk alarm"})");
  EXPECT_EQ(c.breaker, "disk_offload");
  EXPECT_EQ(c.action, "trip");
  EXPECT_EQ(c.reason, "disk alarm");

  c = parse_control_command(" {\n \"action\" : \"reset\", \"breaker\":\"spec\" } ");
  EXPECT_EQ(c.breaker, "spec");
  EXPECT_EQ(c.action, "reset");
  EXPECT_EQ(c.reason, "") << "reason is optional";

  c = parse_control_command(R"({"breaker":"b\u00e9","action":"trip","reason":""})");
  EXPECT_EQ(c.breaker, "b\xc3\xa9");

  c = parse_control_command(R"({"breaker":"spec","action":"trip","reason":null})");
  EXPECT_EQ(c.reason, "") << "null reason = absent";
  const std::string longest(fdl::control::kMaxReasonBytes, 'r');
  c = parse_control_command(R"({"breaker":"spec","action":"trip","reason":")" + longest + "\"}");
  EXPECT_EQ(c.reason, longest);
}

TEST(ControlCommand, RejectsBadMessagesWithClearErrors) {
  const std::string big(70 * 1024, ' ');
  expect_all_rejected(
      {
          {"", "invalid JSON"},
          {"{", "invalid JSON"},
          {"not json", "invalid JSON"},
          {R"({"breaker":"a","action":"trip",})", "invalid JSON"},
          {R"({"breaker":"a","action":"trip"} trailing)", "invalid JSON"},
          {"[]", "expected a JSON object, got array"},
          {"\"trip\"", "expected a JSON object, got string"},
          {"42", "expected a JSON object, got number"},
          {"null", "expected a JSON object, got null"},
          {R"({"action":"trip"})", "missing field \"breaker\""},
          {R"({"breaker":"a"})", "missing field \"action\""},
          {R"({})", "missing field \"breaker\""},
          {R"({"breaker":1,"action":"trip"})", "field \"breaker\" must be a string, got number"},
          {R"({"breaker":"a","action":true})", "field \"action\" must be a string, got boolean"},
          {R"({"breaker":"a","action":null})", "field \"action\" must be a string, got null"},
          {R"({"breaker":"","action":"trip"})", "field \"breaker\" is empty"},
          {R"({"breaker":"a","action":"explode"})", "unknown action \"explode\""},
          {R"({"breaker":"a","action":"TRIP"})", "unknown action \"TRIP\""},
          {R"({"breaker":"a","action":"trip","reason":5})", "field \"reason\" must be a string"},
          {R"({"breaker":"a","action":"trip","reason":")" + std::string(fdl::control::kMaxReasonBytes + 1, 'r') + "\"}",
           "field \"reason\" has 513 bytes (limit is 512)"},
          {R"({"breaker":"a","action":"trip","force":true})", "unknown field \"force\""},
          {R"({"breaker":"a","action":"trip","action":"reset"})", "duplicate field \"action\""},
          {R"({"breaker":["a"],"action":"trip"})", "must be a string, got array"},
          {"{" + big + "}", "limit is 65536"},
      },
      [](const std::string& s) { return parse_control_command(s); });
}

TEST(ControlCommand, MessagesArePrefixed) {
  try {
    parse_control_command("[]");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_EQ(std::string(e.what()).rfind("control command: ", 0), 0u) << e.what();
  }
}

TEST(RedisUrlParse, ParsesValidUrls) {
  RedisUrl u = parse_redis_url("redis://127.0.0.1:6379/flashdllm-control");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 6379);
  EXPECT_EQ(u.channel, "flashdllm-control");

  u = parse_redis_url("redis://localhost/ops");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, 6379) << "default port";
  EXPECT_EQ(u.channel, "ops");

  u = parse_redis_url("redis://[::1]:7000/a/b:c");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 7000);
  EXPECT_EQ(u.channel, "a/b:c") << "everything after the first '/' is the channel";

  u = parse_redis_url("redis://redis-1.internal_x:65535/c");
  EXPECT_EQ(u.host, "redis-1.internal_x");
  EXPECT_EQ(u.port, 65535);
  EXPECT_EQ(parse_redis_url("redis://h:1/c").port, 1);
}

TEST(RedisUrlParse, RejectsBadUrlsWithClearErrors) {
  expect_all_rejected(
      {
          {"", "empty"},
          {"127.0.0.1:6379/c", "must start with redis://"},
          {"http://127.0.0.1/c", "must start with redis://"},
          {"rediss://127.0.0.1/c", "TLS (rediss://) is not supported"},
          {"REDIS://127.0.0.1/c", "must start with redis://"},
          {"redis://", "missing host"},
          {"redis:///chan", "missing host"},
          {"redis://:6379/chan", "missing host"},
          {"redis://127.0.0.1:6379", "missing /CHANNEL"},
          {"redis://127.0.0.1", "missing /CHANNEL"},
          {"redis://127.0.0.1:6379/", "empty channel name"},
          {"redis://127.0.0.1:/c", "empty port"},
          {"redis://127.0.0.1:abc/c", "port 'abc' is not a number"},
          {"redis://127.0.0.1:63a/c", "port '63a' is not a number"},
          {"redis://127.0.0.1:0/c", "outside 1..65535"},
          {"redis://127.0.0.1:65536/c", "outside 1..65535"},
          {"redis://127.0.0.1:-1/c", "outside 1..65535"},
          {"redis://127.0.0.1:99999999999/c", "outside 1..65535"},
          {"redis://user:pw@127.0.0.1/c", "user/password"},
          {"redis://127.0.0.1/c?db=1", "query strings"},
          {"redis://127.0.0.1/c#x", "fragments"},
          {"redis://127.0.0.1/my channel", "whitespace"},
          {"redis://127.0.0.1/c\n", "whitespace"},
          {"redis://[::1/c", "unterminated '['"},
          {"redis://[]:1/c", "empty IPv6 host"},
          {"redis://[::1]x/c", "after ']'"},
          {"redis://::1/c", "more than one ':'"},
          {"redis://ho$t/c", "invalid character '$' in host"},
      },
      [](const std::string& s) { return parse_redis_url(s); });
}

TEST(RedisUrlParse, MessageQuotesUrlAndSyntax) {
  try {
    parse_redis_url("redis://h:0/c");
    FAIL();
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("'redis://h:0/c'"), std::string::npos) << m;
    EXPECT_NE(m.find("redis://HOST[:PORT]/CHANNEL"), std::string::npos) << m;
  }
}
