// Parsing and validation of /v1/completions and /v1/chat/completions bodies: every field's
// accepted values map to the right engine parameters, and every bad value is an ApiError 400
// naming the field (never another exception type, never a crash).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/chat_request.h"
#include "server/completion_request.h"
#include "server/generation_params.h"
#include "server/openai_error.h"

namespace fdl::server {
namespace {

using nlohmann::json;

constexpr int32_t kVocab = 512;

json with(json body, const json& extra) {
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  return body;
}

const json kCompletion = {{"model", "m"}, {"prompt", "Once upon a time"}};
const json kChat = {{"model", "m"}, {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})}};

// The ApiError a completions body raises (fails the test if it parses).
ApiError completion_error(const json& body) {
  try {
    parse_completion_request(body, kVocab);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return ApiError(0, "");
}

ApiError chat_error(const json& body) {
  try {
    parse_chat_request(body);
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "accepted: " << body.dump();
  return ApiError(0, "");
}

TEST(CompletionRequest, Defaults) {
  const CompletionRequest r = parse_completion_request(kCompletion, kVocab);
  ASSERT_TRUE(r.prompt_text.has_value());
  EXPECT_EQ(*r.prompt_text, "Once upon a time");
  EXPECT_TRUE(r.prompt_ids.empty());
  EXPECT_EQ(r.params.max_new_tokens, kCompletionsDefaultMaxTokens);
  EXPECT_FLOAT_EQ(r.params.sampling.temperature, 1.0f);
  EXPECT_FLOAT_EQ(r.params.sampling.top_p, 1.0f);
  EXPECT_EQ(r.params.sampling.top_k, 0);
  EXPECT_FALSE(r.params.seed_given);
  EXPECT_EQ(r.params.n, 1);
  EXPECT_FALSE(r.params.stream);
  EXPECT_EQ(r.params.logprobs, -1);
  EXPECT_TRUE(r.params.stop.empty());
  EXPECT_EQ(r.params.model, "m");
}

// The model's recommended sampling (ServerOptions::sampling_defaults) fills the fields a request
// leaves out; a field the request sets wins, on both endpoints.
TEST(CompletionRequest, ModelSamplingDefaultsFillOnlyWhatIsLeftOut) {
  const SamplingParams model{.temperature = 0.7f, .top_k = 20, .top_p = 0.8f, .min_p = 0.05f, .repeat_penalty = 1.05f};
  const SamplingParams got = parse_completion_request(kCompletion, kVocab, model).params.sampling;
  EXPECT_FLOAT_EQ(got.temperature, 0.7f);
  EXPECT_EQ(got.top_k, 20);
  EXPECT_FLOAT_EQ(got.top_p, 0.8f);
  EXPECT_FLOAT_EQ(got.min_p, 0.05f);
  EXPECT_FLOAT_EQ(got.repeat_penalty, 1.05f);
  const SamplingParams set =
      parse_chat_request(with(kChat, {{"temperature", 0}, {"top_k", 3}, {"top_p", 0.5}, {"min_p", 0},
                                      {"repetition_penalty", 1}}),
                         model)
          .params.sampling;
  EXPECT_FLOAT_EQ(set.temperature, 0.f);
  EXPECT_EQ(set.top_k, 3);
  EXPECT_FLOAT_EQ(set.top_p, 0.5f);
  EXPECT_FLOAT_EQ(set.min_p, 0.f);
  EXPECT_FLOAT_EQ(set.repeat_penalty, 1.f);
}

TEST(CompletionRequest, PromptForms) {
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"prompt", {1, 2, 3}}}), kVocab).prompt_ids,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*parse_completion_request(with(kCompletion, {{"prompt", {"abc"}}}), kVocab).prompt_text, "abc");
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"prompt", json::array({json::array({5, 511})})}}), kVocab)
                .prompt_ids,
            (std::vector<int32_t>{5, 511}));
  // A model name and no prompt: missing prompt is refused.
  EXPECT_EQ(completion_error({{"model", "m"}}).param(), "prompt");
}

TEST(CompletionRequest, BadPrompts) {
  for (const json& prompt : {json(""), json::array(), json::array({""}), json::array({json::array()}),
                             json(42), json(true), json::object(), json::array({"a", "b"}),
                             json::array({1, "a"}), json::array({-1}), json::array({kVocab}),
                             json::array({1.5}), json::array({json::array({1}), json::array({2})})}) {
    const ApiError e = completion_error(with(kCompletion, {{"prompt", prompt}}));
    EXPECT_EQ(e.status(), 400) << prompt.dump();
    EXPECT_EQ(e.param(), "prompt") << prompt.dump();
  }
}

TEST(CompletionRequest, MaxTokens) {
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"max_tokens", 7}}), kVocab).params.max_new_tokens, 7);
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"max_tokens", 7.0}}), kVocab).params.max_new_tokens, 7);
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"max_tokens", nullptr}}), kVocab).params.max_new_tokens,
            kCompletionsDefaultMaxTokens);
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"max_tokens", 2147483647}}), kVocab).params.max_new_tokens,
            2147483647);
  for (const json& v : {json(0), json(-1), json("ten"), json(1.5), json(true), json(2147483648LL),
                        json(1e300), json::array({1})}) {
    const ApiError e = completion_error(with(kCompletion, {{"max_tokens", v}}));
    EXPECT_EQ(e.status(), 400) << v.dump();
    EXPECT_EQ(e.param(), "max_tokens") << v.dump();
  }
  // Still refused when other unsupported/limited fields ride along.
  EXPECT_EQ(completion_error(with(kCompletion, {{"max_tokens", "ten"}, {"echo", true}})).param(), "max_tokens");
  EXPECT_EQ(completion_error(with(kCompletion, {{"max_tokens", -1}, {"logprobs", 2}})).param(), "max_tokens");
}

TEST(CompletionRequest, SamplingRanges) {
  const auto params = [](const json& extra) {
    return parse_completion_request(with(kCompletion, extra), kVocab).params;
  };
  EXPECT_FLOAT_EQ(params({{"temperature", 0}}).sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(params({{"temperature", 1e-4}}).sampling.temperature, 1e-4f);
  EXPECT_FLOAT_EQ(params({{"temperature", 2}}).sampling.temperature, 2.0f);
  EXPECT_FLOAT_EQ(params({{"top_p", 0.5}}).sampling.top_p, 0.5f);
  // top_p 0 keeps only the most likely token: expressed as top_k 1.
  EXPECT_EQ(params({{"top_p", 0}}).sampling.top_k, 1);
  EXPECT_FLOAT_EQ(params({{"top_p", 0}}).sampling.top_p, 1.0f);
  EXPECT_EQ(params({{"top_k", 1000000}}).sampling.top_k, 1000000);
  EXPECT_FLOAT_EQ(params({{"min_p", 0.1}}).sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(params({{"presence_penalty", -2}}).sampling.presence_penalty, -2.0f);
  EXPECT_FLOAT_EQ(params({{"frequency_penalty", 2}}).sampling.frequency_penalty, 2.0f);
  EXPECT_FLOAT_EQ(params({{"repetition_penalty", 1.3}}).sampling.repeat_penalty, 1.3f);
  EXPECT_EQ(params({{"repeat_last_n", -1}}).sampling.repeat_last_n, -1);
  for (const auto& [field, value] :
       std::vector<std::pair<std::string, json>>{{"temperature", -1},      {"temperature", 1e9},
                                                 {"temperature", "hot"},   {"temperature", 2.0001},
                                                 {"top_p", 1.5},           {"top_p", -0.1},
                                                 {"top_k", -1},            {"top_k", 0.5},
                                                 {"min_p", 1.1},           {"presence_penalty", 3},
                                                 {"frequency_penalty", -2.5},
                                                 {"repetition_penalty", 0}, {"repetition_penalty", -1},
                                                 {"repeat_last_n", -2},    {"seed", "x"},
                                                 {"seed", 1.5},            {"n", 0},
                                                 {"n", 17},                {"stream", "yes"},
                                                 {"stream", 1},            {"user", 5},
                                                 {"logit_bias", {{"x", 5}}}, {"logit_bias", {{"1", 101}}},
                                                 {"logit_bias", {{"-1", 1}}}, {"logit_bias", {{"1", "a"}}},
                                                 {"logit_bias", {{"05", 1}}}, {"logit_bias", {{"+5", 1}}},
                                                 {"logit_bias", {{" 5", 1}}}, {"logit_bias", {{"5 ", 1}}},
                                                 {"logit_bias", {{"1234567890123456789", 1}}},
                                                 {"logit_bias", 3},        {"model", 3},
                                                 {"ignore_eos", "no"}}) {
    const ApiError e = completion_error(with(kCompletion, {{field, value}}));
    EXPECT_EQ(e.status(), 400) << field << "=" << value.dump();
    EXPECT_EQ(e.param(), field) << field << "=" << value.dump();
  }
}

TEST(CompletionRequest, LogitBias) {
  const auto r = parse_completion_request(with(kCompletion, {{"logit_bias", {{"5", -100}, {"7", 2.5}}}}), kVocab);
  const std::vector<std::pair<int32_t, float>> want = {{5, -100.0f}, {7, 2.5f}};
  EXPECT_EQ(r.params.sampling.logit_bias, want);
  EXPECT_TRUE(parse_completion_request(with(kCompletion, {{"logit_bias", nlohmann::json::object()}}), kVocab)
                  .params.sampling.logit_bias.empty());
}

TEST(CompletionRequest, Seed) {
  const auto p = parse_completion_request(with(kCompletion, {{"seed", 42}}), kVocab).params;
  EXPECT_TRUE(p.seed_given);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"seed", -1}}), kVocab).params.sampling.seed,
            UINT64_MAX);
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"seed", UINT64_MAX}}), kVocab).params.sampling.seed,
            UINT64_MAX);
}

TEST(CompletionRequest, Stop) {
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"stop", "\n"}}), kVocab).params.stop,
            (std::vector<std::string>{"\n"}));
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"stop", {"a", "b", "c", "d"}}}), kVocab).params.stop,
            (std::vector<std::string>{"a", "b", "c", "d"}));
  EXPECT_TRUE(parse_completion_request(with(kCompletion, {{"stop", nullptr}}), kVocab).params.stop.empty());
  for (const json& v : {json(""), json::array({"a", ""}), json::array({"a", "b", "c", "d", "e"}),
                        json(5), json::array({1})}) {
    EXPECT_EQ(completion_error(with(kCompletion, {{"stop", v}})).param(), "stop") << v.dump();
  }
}

TEST(CompletionRequest, StreamOptions) {
  auto p = parse_completion_request(
               with(kCompletion, {{"stream", true}, {"stream_options", {{"include_usage", true}}}}), kVocab)
               .params;
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(completion_error(with(kCompletion, {{"stream_options", {{"include_usage", true}}}})).param(),
            "stream_options");
  EXPECT_EQ(completion_error(with(kCompletion, {{"stream", true}, {"stream_options", 1}})).param(),
            "stream_options");
  EXPECT_EQ(completion_error(with(kCompletion, {{"stream", true}, {"stream_options", {{"include_usage", 1}}}}))
                .param(),
            "stream_options.include_usage");
}

TEST(CompletionRequest, LogprobsEchoSuffixBestOf) {
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"logprobs", 0}}), kVocab).params.logprobs, 0);
  EXPECT_EQ(parse_completion_request(with(kCompletion, {{"logprobs", 5}}), kVocab).params.logprobs, 5);
  EXPECT_EQ(completion_error(with(kCompletion, {{"logprobs", 6}})).param(), "logprobs");
  EXPECT_EQ(completion_error(with(kCompletion, {{"logprobs", true}})).param(), "logprobs");
  EXPECT_EQ(completion_error(with(kCompletion, {{"echo", true}, {"logprobs", 1}})).param(), "echo");
  EXPECT_TRUE(parse_completion_request(with(kCompletion, {{"echo", true}}), kVocab).echo);
  EXPECT_FALSE(parse_completion_request(with(kCompletion, {{"echo", false}}), kVocab).echo);
  EXPECT_EQ(completion_error(with(kCompletion, {{"suffix", "end"}})).param(), "suffix");
  EXPECT_NO_THROW(parse_completion_request(with(kCompletion, {{"suffix", nullptr}}), kVocab));
  EXPECT_EQ(completion_error(with(kCompletion, {{"best_of", 2}})).param(), "best_of");
}

TEST(CompletionRequest, UnknownFieldsIgnoredAndBodyMustBeObject) {
  EXPECT_NO_THROW(parse_completion_request(with(kCompletion, {{"frobnicate", {1, 2}}}), kVocab));
  for (const json& body : {json::array(), json(1), json("x"), json(nullptr)}) {
    EXPECT_EQ(completion_error(body).status(), 400) << body.dump();
  }
}

TEST(EngineRequests, NChoicesGetConsecutiveSeedsAndExtraStops) {
  GenerationParams p = parse_completion_request(
                           with(kCompletion, {{"n", 3}, {"seed", 10}, {"stop", "x"}, {"logprobs", 2}}), kVocab)
                           .params;
  const auto reqs = make_engine_requests(p, {1, 2}, {"<|im_end|>"}, 999);
  ASSERT_EQ(reqs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(reqs[i].sampling.seed, 10 + i);
    EXPECT_EQ(reqs[i].prompt_ids, (std::vector<int32_t>{1, 2}));
    EXPECT_EQ(reqs[i].stop, (std::vector<std::string>{"x", "<|im_end|>"}));
    EXPECT_EQ(reqs[i].logprobs, 2);
    EXPECT_EQ(reqs[i].max_new_tokens, kCompletionsDefaultMaxTokens);
  }
  p.seed_given = false;
  EXPECT_EQ(make_engine_requests(p, {1}, {}, 999)[1].sampling.seed, 1000u);
}

TEST(EngineRequests, PromptMustLeaveRoom) {
  EXPECT_NO_THROW(check_prompt_fits(255, 256, "prompt"));
  try {
    check_prompt_fits(256, 256, "prompt");
    FAIL() << "a prompt of exactly n_ctx accepted";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 400);
    EXPECT_EQ(e.code(), "context_length_exceeded");
    EXPECT_EQ(e.param(), "prompt");
  }
}

TEST(ChatRequest, MessagesAndDefaults) {
  const json body = with(kChat, {{"messages",
                                  {{{"role", "system"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}},
                                                                   {{"type", "text"}, {"text", "b"}}}}},
                                   {{"role", "assistant"}, {"content", "ok"}, {"name", "bot"}},
                                   {{"role", "developer"}, {"content", "dev"}}}}});
  const ChatRequest r = parse_chat_request(body);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "ab");
  EXPECT_EQ(r.messages[2].role, "assistant");
  EXPECT_EQ(r.messages[3].role, "system");
  EXPECT_EQ(r.params.max_new_tokens, -1);  // chat default: until end or context full
  EXPECT_EQ(r.params.logprobs, -1);
}

TEST(ChatRequest, MaxCompletionTokensWins) {
  EXPECT_EQ(parse_chat_request(with(kChat, {{"max_tokens", 5}})).params.max_new_tokens, 5);
  EXPECT_EQ(parse_chat_request(with(kChat, {{"max_tokens", 5}, {"max_completion_tokens", 9}})).params.max_new_tokens,
            9);
  EXPECT_EQ(chat_error(with(kChat, {{"max_completion_tokens", 0}})).param(), "max_completion_tokens");
  EXPECT_EQ(chat_error(with(kChat, {{"max_completion_tokens", 4}, {"max_tokens", "x"}})).param(), "max_tokens");
}

TEST(ChatRequest, Logprobs) {
  EXPECT_EQ(parse_chat_request(with(kChat, {{"logprobs", true}})).params.logprobs, 0);
  EXPECT_EQ(parse_chat_request(with(kChat, {{"logprobs", true}, {"top_logprobs", 20}})).params.logprobs, 20);
  EXPECT_EQ(parse_chat_request(with(kChat, {{"logprobs", false}})).params.logprobs, -1);
  EXPECT_EQ(chat_error(with(kChat, {{"top_logprobs", 3}})).param(), "top_logprobs");
  EXPECT_EQ(chat_error(with(kChat, {{"logprobs", true}, {"top_logprobs", 21}})).param(), "top_logprobs");
  EXPECT_EQ(chat_error(with(kChat, {{"logprobs", 3}})).param(), "logprobs");
}

TEST(ChatRequest, BadMessages) {
  const std::vector<std::pair<json, std::string>> cases = {
      {json::array(), "messages"},
      {json("hi"), "messages"},
      {json::array({"hi"}), "messages[0]"},
      {json::array({{{"content", "x"}}}), "messages[0].role"},
      {json::array({{{"role", "function"}, {"content", "x"}}}), "messages[0].role"},
      {json::array({{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array()}}}), "messages[0].tool_calls"},
      {json::array({{{"role", "assistant"}, {"tool_calls", {{{"function", {{"arguments", "{}"}}}}}}}}),
       "messages[0].tool_calls[0].function.name"},
      {json::array({{{"role", "tool"}, {"content", "x"}, {"tool_call_id", 5}}}), "messages[0].tool_call_id"},
      {json::array({{{"role", 1}, {"content", "x"}}}), "messages[0].role"},
      {json::array({{{"role", "user"}}}), "messages[0].content"},
      {json::array({{{"role", "user"}, {"content", nullptr}}}), "messages[0].content"},
      {json::array({{{"role", "user"}, {"content", 5}}}), "messages[0].content"},
      {json::array({{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", "x"}}}}}}),
       "messages[0].content[0].type"},
      {json::array({{{"role", "user"}, {"content", {{{"type", "text"}}}}}}), "messages[0].content[0].text"},
      {json::array({{{"role", "user"}, {"content", "a"}, {"name", 5}}}), "messages[0].name"},
  };
  for (const auto& [messages, param] : cases) {
    const ApiError e = chat_error(with(kChat, {{"messages", messages}}));
    EXPECT_EQ(e.status(), 400) << messages.dump();
    EXPECT_EQ(e.param(), param) << messages.dump();
  }
  EXPECT_EQ(chat_error({{"model", "m"}}).param(), "messages");
}

// Tools and tool turns reach the template: arguments strings become the objects they hold.
TEST(ChatRequest, ToolsAndToolTurns) {
  const json messages = json::array(
      {{{"role", "user"}, {"content", "Weather?"}},
       {{"role", "assistant"},
        {"content", nullptr},
        {"tool_calls", {{{"id", "c1"}, {"type", "function"}, {"function", {{"name", "w"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
       {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "-3"}}});
  const json tools = json::array({{{"type", "function"}, {"function", {{"name", "w"}}}}});
  const ChatRequest r = parse_chat_request(with(kChat, {{"messages", messages}, {"tools", tools}}));
  ASSERT_EQ(r.messages.size(), 3u);
  EXPECT_EQ(r.messages[1].content, "");
  EXPECT_EQ(r.messages[1].tool_calls[0]["function"]["arguments"].dump(), R"({"city":"Oslo"})");
  EXPECT_EQ(r.messages[2].tool_call_id, "c1");
  EXPECT_EQ(r.tools.dump(), tools.dump());
  EXPECT_EQ(parse_chat_request(with(kChat, {{"tools", tools}, {"tool_choice", "none"}})).tools.dump(), tools.dump());
}

TEST(ChatRequest, UnsupportedFeaturesAreRefused) {
  EXPECT_EQ(chat_error(with(kChat, {{"tools", {{{"type", "function"}}}}})).param(), "tools");
  EXPECT_EQ(chat_error(with(kChat, {{"tool_choice", "required"}})).param(), "tool_choice");
  EXPECT_EQ(chat_error(with(kChat, {{"functions", json::array({json::object()})}})).param(), "functions");
  EXPECT_NO_THROW(parse_chat_request(with(kChat, {{"response_format", {{"type", "text"}}}, {"tools", json::array()}})));
}

}  // namespace
}  // namespace fdl::server
