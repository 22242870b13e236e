#include "server/response_json.h"

#include <cmath>
#include <random>

namespace fdl::server {
namespace {

using nlohmann::json;

json logprob_value(float lp) {
  if (std::isnan(lp)) return nullptr;
  if (std::isinf(lp)) return lp < 0 ? -9999.0 : 0.0;
  return lp;
}

json bytes_of(const std::string& s) {
  json arr = json::array();
  for (const unsigned char c : s) arr.push_back(int(c));
  return arr;
}

// Generated tokens continue the prompt, so a SentencePiece "▁" is a real space here.
std::string piece(const Tokenizer& tok, int32_t id) { return tok.token_to_piece(id, false); }

json finish_value(const std::string& reason) {
  return reason.empty() ? json(nullptr) : json(reason);
}

}  // namespace

std::string new_response_id(const char* prefix) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += kHex[rng() & 15];
  return id;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json completion_logprobs(const Tokenizer& tok, const std::vector<SampledToken>& tokens,
                         size_t text_offset) {
  json texts = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t offset = text_offset;
  for (const SampledToken& t : tokens) {
    const std::string p = piece(tok, t.id);
    texts.push_back(p);
    lps.push_back(logprob_value(t.logprob));
    json top = json::object();
    for (const TokenLogprob& alt : t.top) {
      const std::string key = piece(tok, alt.id);
      if (!top.contains(key)) top[key] = logprob_value(alt.logprob);  // keep the likeliest
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += p.size();
  }
  return {{"tokens", std::move(texts)},
          {"token_logprobs", std::move(lps)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

json chat_logprobs(const Tokenizer& tok, const std::vector<SampledToken>& tokens) {
  json content = json::array();
  for (const SampledToken& t : tokens) {
    const std::string p = piece(tok, t.id);
    json top = json::array();
    for (const TokenLogprob& alt : t.top) {
      const std::string ap = piece(tok, alt.id);
      top.push_back({{"token", ap}, {"logprob", logprob_value(alt.logprob)}, {"bytes", bytes_of(ap)}});
    }
    content.push_back({{"token", p},
                       {"logprob", logprob_value(t.logprob)},
                       {"bytes", bytes_of(p)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}, {"refusal", nullptr}};
}

json completion_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                         const Usage& usage, const Tokenizer& tok, bool with_logprobs) {
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    out_choices.push_back(
        {{"index", i},
         {"text", c.text},
         {"logprobs", with_logprobs ? completion_logprobs(tok, c.tokens) : json(nullptr)},
         {"finish_reason", finish_value(c.finish_reason)}});
  }
  return {{"id", meta.id},         {"object", "text_completion"}, {"created", meta.created},
          {"model", meta.model},   {"system_fingerprint", nullptr},
          {"choices", std::move(out_choices)}, {"usage", usage_json(usage)}};
}

json chat_response(const ResponseMeta& meta, const std::vector<ChoiceResult>& choices,
                   const Usage& usage, const Tokenizer& tok, bool with_logprobs) {
  json out_choices = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const ChoiceResult& c = choices[i];
    json message = {{"role", "assistant"},
                    {"content", c.text.empty() && !c.tool_calls.empty() ? json(nullptr) : json(c.text)},
                    {"refusal", nullptr}};
    if (!c.tool_calls.empty()) message["tool_calls"] = tool_calls_json(c.tool_calls);
    out_choices.push_back(
        {{"index", i},
         {"message", std::move(message)},
         {"logprobs", with_logprobs ? chat_logprobs(tok, c.tokens) : json(nullptr)},
         {"finish_reason", finish_value(c.finish_reason)}});
  }
  return {{"id", meta.id},       {"object", "chat.completion"}, {"created", meta.created},
          {"model", meta.model}, {"system_fingerprint", nullptr},
          {"choices", std::move(out_choices)}, {"usage", usage_json(usage)}};
}

json completion_chunk(const ResponseMeta& meta, size_t index, const std::string& text,
                      json logprobs, const std::string& finish_reason, bool include_usage) {
  json chunk = {{"id", meta.id},
                {"object", "text_completion"},
                {"created", meta.created},
                {"model", meta.model},
                {"system_fingerprint", nullptr},
                {"choices", json::array({{{"index", index},
                                          {"text", text},
                                          {"logprobs", std::move(logprobs)},
                                          {"finish_reason", finish_value(finish_reason)}}})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json tool_calls_json(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls)
    out.push_back({{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  return out;
}

json tool_call_delta(const ToolCallEvent& e) {
  switch (e.kind) {
    case ToolCallEvent::Kind::CallBegin:
      return {{"tool_calls", json::array({{{"index", e.index},
                                           {"id", e.id},
                                           {"type", "function"},
                                           {"function", {{"name", e.name}, {"arguments", ""}}}}})}};
    case ToolCallEvent::Kind::CallArguments:
      return {{"tool_calls", json::array({{{"index", e.index}, {"function", {{"arguments", e.text}}}}})}};
    case ToolCallEvent::Kind::Content:
    case ToolCallEvent::Kind::CallFailed:
      break;
  }
  return {{"content", e.text}};
}

json chat_chunk(const ResponseMeta& meta, size_t index, json delta, json logprobs,
                const std::string& finish_reason, bool include_usage) {
  json chunk = {{"id", meta.id},
                {"object", "chat.completion.chunk"},
                {"created", meta.created},
                {"model", meta.model},
                {"system_fingerprint", nullptr},
                {"choices", json::array({{{"index", index},
                                          {"delta", std::move(delta)},
                                          {"logprobs", std::move(logprobs)},
                                          {"finish_reason", finish_value(finish_reason)}}})}};
  if (include_usage) chunk["usage"] = nullptr;
  return chunk;
}

json usage_chunk(const ResponseMeta& meta, const char* object, const Usage& usage) {
  return {{"id", meta.id},       {"object", object},          {"created", meta.created},
          {"model", meta.model}, {"system_fingerprint", nullptr},
          {"choices", json::array()}, {"usage", usage_json(usage)}};
}

}  // namespace fdl::server
