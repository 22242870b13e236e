// Response, chunk and usage JSON shapes, logprobs formatting, SSE framing and error bodies.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "flashdllm/generator.h"
#include "server/openai_error.h"
#include "server/response_json.h"
#include "server/sse.h"
#include "test_support.h"

namespace fdl::server {
namespace {

using nlohmann::json;

const LoadedModel& stories() {
  static const LoadedModel m = load_model(test::model_path("stories260K.gguf"), ModelOptions{.n_threads = 1});
  return m;
}

TEST(ErrorBody, OpenAIShape) {
  const json body = error_body(invalid_param("max_tokens", "bad"));
  EXPECT_EQ(body, json::parse(R"({"error":{"message":"bad","type":"invalid_request_error",
                                           "param":"max_tokens","code":null}})"));
  const json other = error_body(ApiError(400, "long", "prompt", "invalid_request_error", "context_length_exceeded"));
  EXPECT_EQ(other["error"]["code"], "context_length_exceeded");
  EXPECT_TRUE(error_body("x", "server_error")["error"]["param"].is_null());
}

TEST(DumpJson, InvalidUtf8IsReplacedNotThrown) {
  const std::string bad = "a\xE2\x82";  // a truncated 3-byte sequence
  std::string out;
  ASSERT_NO_THROW(out = dump_json(json{{"t", bad}}));
  EXPECT_EQ(json::parse(out)["t"], "a\xEF\xBF\xBD");
}

TEST(Sse, Framing) {
  EXPECT_EQ(sse_event(json{{"a", "x\ny"}}), "data: {\"a\":\"x\\ny\"}\n\n");
  EXPECT_EQ(sse_done(), "data: [DONE]\n\n");
  EXPECT_EQ(sse_comment().front(), ':');
  EXPECT_EQ(sse_comment().substr(sse_comment().size() - 2), "\n\n");
}

TEST(ResponseJson, IdsAreUniqueWithPrefix) {
  const std::string a = new_response_id("cmpl-"), b = new_response_id("cmpl-");
  EXPECT_EQ(a.rfind("cmpl-", 0), 0u);
  EXPECT_EQ(a.size(), 5u + 24u);
  EXPECT_NE(a, b);
}

TEST(ResponseJson, CompletionShapeAndUsage) {
  const Tokenizer& tok = *stories().tokenizer;
  const ResponseMeta meta{"cmpl-1", 1700000000, "stories"};
  const std::vector<ChoiceResult> choices = {{"Once", {}, "length"}, {"Hi", {}, "stop"}};
  const json r = completion_response(meta, choices, Usage{5, 3, 2}, tok, false);
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["id"], "cmpl-1");
  EXPECT_EQ(r["model"], "stories");
  EXPECT_EQ(r["created"], 1700000000);
  ASSERT_EQ(r["choices"].size(), 2u);
  EXPECT_EQ(r["choices"][1]["index"], 1);
  EXPECT_EQ(r["choices"][1]["text"], "Hi");
  EXPECT_EQ(r["choices"][1]["finish_reason"], "stop");
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(r["usage"], json::parse(R"({"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,
                                        "prompt_tokens_details":{"cached_tokens":2}})"));
}

TEST(ResponseJson, ChatShape) {
  const Tokenizer& tok = *stories().tokenizer;
  const json r = chat_response({"chatcmpl-1", 1, "m"}, {{"Hello", {}, "stop"}}, Usage{1, 1, 0}, tok, false);
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(r["choices"][0]["message"].contains("tool_calls"));
}

// A reply of only calls has content null; text beside calls stays.
TEST(ResponseJson, ChatToolCalls) {
  const Tokenizer& tok = *stories().tokenizer;
  const std::vector<ToolCall> calls = {{"call_a", "get_time", "{}", 0}, {"call_b", "f", "{\"x\": 1}", 1}};
  json r = chat_response({"chatcmpl-1", 1, "m"}, {{"", {}, "tool_calls", calls}}, Usage{1, 1, 0}, tok, false);
  const json& m = r["choices"][0]["message"];
  EXPECT_TRUE(m["content"].is_null());
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  ASSERT_EQ(m["tool_calls"].size(), 2u);
  EXPECT_EQ(m["tool_calls"][1], json::parse(R"({"id": "call_b", "type": "function",
                                                "function": {"name": "f", "arguments": "{\"x\": 1}"}})"));
  r = chat_response({"chatcmpl-1", 1, "m"}, {{"Let me look.", {}, "tool_calls", calls}}, Usage{1, 1, 0}, tok, false);
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Let me look.");
}

TEST(ResponseJson, Chunks) {
  const ResponseMeta meta{"cmpl-2", 1, "m"};
  json c = completion_chunk(meta, 1, "piece", nullptr, "", false);
  EXPECT_EQ(c["object"], "text_completion");
  EXPECT_EQ(c["choices"][0]["index"], 1);
  EXPECT_EQ(c["choices"][0]["text"], "piece");
  EXPECT_TRUE(c["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(c.contains("usage"));
  c = completion_chunk(meta, 0, "", nullptr, "length", true);
  EXPECT_EQ(c["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(c.contains("usage") && c["usage"].is_null());
  const json d = chat_chunk(meta, 0, {{"content", "x"}}, nullptr, "", false);
  EXPECT_EQ(d["object"], "chat.completion.chunk");
  EXPECT_EQ(d["choices"][0]["delta"]["content"], "x");
  const json u = usage_chunk(meta, "chat.completion.chunk", Usage{4, 6, 0});
  EXPECT_TRUE(u["choices"].empty());
  EXPECT_EQ(u["usage"]["total_tokens"], 10);
}

TEST(ResponseJson, LogprobsUseTokenPieces) {
  const Tokenizer& tok = *stories().tokenizer;
  const auto ids = tok.encode("Once upon", false);  // SPM adds the space prefix
  ASSERT_GE(ids.size(), 2u);
  std::vector<SampledToken> tokens;
  for (const int32_t id : ids) {
    SampledToken t;
    t.id = id;
    t.logprob = -0.5f;
    t.top = {{id, -0.5f}, {ids[0] == id ? ids[1] : ids[0], -std::numeric_limits<float>::infinity()}};
    tokens.push_back(t);
  }
  const json lp = completion_logprobs(tok, tokens, 10);
  ASSERT_EQ(lp["tokens"].size(), ids.size());
  std::string joined;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(lp["tokens"][i], tok.token_to_piece(ids[i]));
    EXPECT_EQ(lp["text_offset"][i], 10 + joined.size());
    joined += lp["tokens"][i].get<std::string>();
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), -0.5f);
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u);
  }
  EXPECT_EQ(joined, " Once upon");
  // -inf cannot travel in JSON: OpenAI's -9999 stands for it.
  EXPECT_EQ(lp["top_logprobs"][0][tok.token_to_piece(ids[1])], -9999.0);

  const json chat = chat_logprobs(tok, tokens);
  ASSERT_EQ(chat["content"].size(), ids.size());
  const json& first = chat["content"][0];
  EXPECT_EQ(first["token"], tok.token_to_piece(ids[0]));
  std::string bytes;
  for (const auto& b : first["bytes"]) bytes += char(b.get<int>());
  EXPECT_EQ(bytes, tok.token_to_piece(ids[0]));
  EXPECT_EQ(first["top_logprobs"].size(), 2u);
  EXPECT_EQ(first["top_logprobs"][1]["logprob"], -9999.0);
}

}  // namespace
}  // namespace fdl::server
