#include "server/generation_handler.h"

#include <chrono>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "server/generation_request.h"
#include "server/openai_error.h"
#include "server/request_stream.h"
#include "server/response_json.h"
#include "server/sse.h"
#include "server/tool_call_parser.h"

namespace fdl::server {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// How long a stream may stay silent before a keep-alive comment probes the client. Short,
// because a write is the only way to learn that a client left while its request waits or
// prefills (the first write after the peer closed succeeds, the next one fails), and an
// abandoned request should give its KV blocks back within a second.
constexpr auto kKeepAliveAfter = std::chrono::milliseconds(250);
// How long the HTTP thread waits for engine output before re-checking the client.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct Submitted {
  std::shared_ptr<RequestStream> stream;
  std::vector<RequestId> ids;
};

void abort_all(Engine& engine, const std::vector<RequestId>& ids) {
  for (const RequestId id : ids) engine.abort(id);
}

Submitted submit_all(ServerContext& ctx, const PreparedRequest& p, Clock::time_point arrived) {
  std::vector<GenerationRequest> requests =
      make_engine_requests(p.params, p.prompt_ids, p.extra_stops, std::random_device{}());
  Submitted s{std::make_shared<RequestStream>(requests.size()), {}};
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].cache_scope = p.cache_scope;
    auto sink = [stream = s.stream, metrics = ctx.metrics, i, arrived](const RequestOutput& out) {
      stream->push(i, out);
      if (out.finished) {
        metrics->observe_finished(
            out, std::chrono::duration<double, std::milli>(Clock::now() - arrived).count());
      }
    };
    try {
      s.ids.push_back(ctx.engine.submit(std::move(requests[i]), std::move(sink)));
    } catch (const std::invalid_argument& e) {
      abort_all(ctx.engine, s.ids);
      throw ApiError(400, e.what());
    } catch (const std::exception& e) {
      abort_all(ctx.engine, s.ids);
      throw ApiError(503, std::string("the server is shutting down: ") + e.what(), "",
                     "server_error");
    }
  }
  return s;
}

// How long a client refused for a full queue is asked to wait. The queue drains as fast as
// requests finish, which the server cannot foresee; a second lets it shrink without clients
// hammering it (the openai client backs off further on its own).
constexpr int kRetryAfterSeconds = 1;

// 429 for --max-queue: OpenAI's shape and code for a rate limit, with Retry-After.
ApiError queue_full(int64_t max_waiting) {
  ApiError e(429,
             "the server is busy: " + std::to_string(max_waiting) +
                 " requests are already waiting (--max-queue); retry after " +
                 std::to_string(kRetryAfterSeconds) + " s",
             "", "rate_limit_error", "rate_limit_exceeded");
  e.with_header("Retry-After", std::to_string(kRetryAfterSeconds));
  return e;
}

// submit_all, or 429 when --max-queue requests are already waiting. The reservation ends on
// return: from then on the engine's waiting count holds these requests.
Submitted submit_within_queue(ServerContext& ctx, const PreparedRequest& p, Clock::time_point arrived) {
  const std::optional<QueueLimit::Reservation> admitted =
      ctx.queue.admit(p.params.n, [&ctx] { return ctx.engine.metrics().waiting; });
  if (!admitted) {
    ctx.metrics->count_rejected("queue_full");
    throw queue_full(ctx.queue.max_waiting());
  }
  return submit_all(ctx, p, arrived);
}

// The error a choice that ended without "stop"/"length" turns into.
ApiError choice_failure(const RequestOutput& out) {
  if (out.finish_reason == "error") {
    // A grammar (schema, GBNF, tool call) that cannot be followed is the request's fault.
    if (out.grammar_error)
      return ApiError(400, "the output's grammar could not be followed: " + out.error, "", "invalid_request_error",
                      "grammar_not_followable");
    return internal_error("generation failed: " + out.error);
  }
  return ApiError(503, "the request was aborted (the server is shutting down)", "", "server_error");
}

// ---- whole responses --------------------------------------------------------------------

void respond_whole(ServerContext& ctx, const PreparedRequest& p, Submitted s, httplib::Response& res) {
  const size_t n = s.ids.size();
  std::vector<ChoiceResult> choices(n);
  for (ChoiceResult& c : choices) c.text = p.echo;
  Usage usage;
  size_t finished = 0;
  std::optional<ApiError> failure;
  while (finished < n) {
    for (RequestStream::Event& ev : s.stream->pop(std::chrono::milliseconds(500))) {
      ChoiceResult& c = choices[ev.choice];
      c.text += ev.output.text;
      for (SampledToken& t : ev.output.tokens) c.tokens.push_back(std::move(t));
      if (!ev.output.finished) continue;
      ++finished;
      c.finish_reason = ev.output.finish_reason;
      if (c.finish_reason != "stop" && c.finish_reason != "length" && !failure) {
        failure = choice_failure(ev.output);
      }
      if (ev.choice == 0) {
        usage.prompt_tokens = ev.output.prompt_tokens;
        usage.cached_tokens = ev.output.cached_prompt_tokens;
      }
      usage.completion_tokens += ev.output.completion_tokens;
    }
  }
  if (failure) throw *failure;
  if (p.tools.format.syntax != ToolCallSyntax::None)
    for (ChoiceResult& c : choices) {
      ParsedReply reply = parse_tool_calls(p.tools.format, c.text, p.tools.names, {}, p.tools.max_calls);
      c.text = std::move(reply.content);
      c.tool_calls = std::move(reply.calls);
      if (c.finish_reason == "stop" && !c.tool_calls.empty()) c.finish_reason = "tool_calls";
    }
  const ResponseMeta m{new_response_id(p.endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-"),
                       unix_now(), ctx.options.served_model_name};
  const bool lp = p.params.logprobs >= 0;
  const Tokenizer& tok = ctx.engine.tokenizer();
  const json body = p.endpoint == Endpoint::Chat ? chat_response(m, choices, usage, tok, lp)
                                                 : completion_response(m, choices, usage, tok, lp);
  res.status = 200;
  res.set_content(dump_json(body), "application/json");
}

// ---- streams ----------------------------------------------------------------------------

struct StreamState {
  StreamState(ServerContext& c, PreparedRequest pr, Submitted s)
      : ctx(c), p(std::move(pr)), sub(std::move(s)), guard(c.active),
        offsets(sub.ids.size(), 0), live_calls(sub.ids.size(), 0) {
    meta = ResponseMeta{new_response_id(p.endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-"),
                        unix_now(), ctx.options.served_model_name};
    if (p.tools.format.syntax != ToolCallSyntax::None)
      for (size_t i = 0; i < sub.ids.size(); ++i)
        parsers.emplace_back(p.tools.format, p.tools.names, std::function<std::string()>(), p.tools.max_calls);
  }
  ~StreamState() { abort_all(ctx.engine, sub.ids); }  // no-op for finished requests

  ServerContext& ctx;
  PreparedRequest p;
  Submitted sub;
  ActiveGuard guard;
  ResponseMeta meta;
  std::vector<size_t> offsets;  // bytes of text sent per choice (completions text_offset)
  std::vector<ToolCallParser> parsers;  // per choice, for chat replies read for tool calls
  std::vector<size_t> live_calls;       // per choice: calls begun and not failed
  size_t n_done = 0;            // choices whose final output was rendered
  Usage usage;
  bool started = false;
  bool failed = false;
  Clock::time_point last_write = Clock::now();
};

bool is_chat(const StreamState& st) { return st.p.endpoint == Endpoint::Chat; }

json text_chunk(const StreamState& st, size_t i, const std::string& text,
                const std::vector<SampledToken>& tokens) {
  const Tokenizer& tok = st.ctx.engine.tokenizer();
  const bool lp = st.p.params.logprobs >= 0;
  if (is_chat(st)) {
    return chat_chunk(st.meta, i, {{"content", text}}, lp ? chat_logprobs(tok, tokens) : json(nullptr),
                      "", st.p.params.include_usage);
  }
  return completion_chunk(st.meta, i, text,
                          lp ? completion_logprobs(tok, tokens, st.offsets[i]) : json(nullptr), "",
                          st.p.params.include_usage);
}

json finish_chunk(const StreamState& st, size_t i, const std::string& reason) {
  if (is_chat(st)) {
    return chat_chunk(st.meta, i, json::object(), nullptr, reason, st.p.params.include_usage);
  }
  return completion_chunk(st.meta, i, "", nullptr, reason, st.p.params.include_usage);
}

// SSE text for one delivery of a reply read for tool calls: a chunk per parser event, the
// delivery's logprobs on the first (or on an empty content delta when the parser holds the
// text back).
std::string tool_call_chunks(StreamState& st, size_t i, const RequestOutput& o) {
  ToolCallParser& parser = st.parsers[i];
  std::vector<ToolCallEvent> events = parser.feed(o.text);
  if (o.finished) {
    std::vector<ToolCallEvent> rest = parser.finish();
    events.insert(events.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  }
  json logprobs = st.p.params.logprobs >= 0 && !o.tokens.empty()
                      ? chat_logprobs(st.ctx.engine.tokenizer(), o.tokens)
                      : json(nullptr);
  std::string out;
  for (const ToolCallEvent& e : events) {
    if (e.kind == ToolCallEvent::Kind::CallBegin) ++st.live_calls[i];
    if (e.kind == ToolCallEvent::Kind::CallFailed) --st.live_calls[i];
    out += sse_event(chat_chunk(st.meta, i, tool_call_delta(e), std::exchange(logprobs, nullptr), "",
                                st.p.params.include_usage));
  }
  if (!logprobs.is_null())
    out += sse_event(chat_chunk(st.meta, i, {{"content", ""}}, std::move(logprobs), "", st.p.params.include_usage));
  return out;
}

// SSE text for one engine delivery.
std::string render_event(StreamState& st, const RequestStream::Event& ev) {
  std::string out;
  const size_t i = ev.choice;
  const RequestOutput& o = ev.output;
  const bool lp = st.p.params.logprobs >= 0;
  if (!st.parsers.empty()) {
    out += tool_call_chunks(st, i, o);
  } else if (!o.text.empty() || (lp && !o.tokens.empty())) {
    out += sse_event(text_chunk(st, i, o.text, o.tokens));
    st.offsets[i] += o.text.size();
  }
  if (!o.finished) return out;
  ++st.n_done;
  if (i == 0) {
    st.usage.prompt_tokens = o.prompt_tokens;
    st.usage.cached_tokens = o.cached_prompt_tokens;
  }
  st.usage.completion_tokens += o.completion_tokens;
  if (o.finish_reason == "stop" || o.finish_reason == "length") {
    const bool called = o.finish_reason == "stop" && !st.parsers.empty() && st.live_calls[i] > 0;
    out += sse_event(finish_chunk(st, i, called ? "tool_calls" : o.finish_reason));
  } else {
    st.failed = true;
    out += sse_event(error_body(choice_failure(o)));
  }
  return out;
}

// One call of httplib's chunked content provider: waits briefly for engine output and writes
// it. Returning false ends the response (client gone); the StreamState destructor then
// aborts the engine requests.
bool provide(StreamState& st, httplib::DataSink& sink) {
  std::string out;
  if (!st.started) {
    st.started = true;
    if (!st.p.echo.empty())  // completions with `echo`: each choice opens with the prompt
      for (size_t i = 0; i < st.sub.ids.size(); ++i) {
        out += sse_event(text_chunk(st, i, st.p.echo, {}));
        st.offsets[i] += st.p.echo.size();
      }
    if (is_chat(st)) {  // OpenAI opens every chat choice with the role
      for (size_t i = 0; i < st.sub.ids.size(); ++i) {
        out += sse_event(chat_chunk(st.meta, i, {{"role", "assistant"}, {"content", ""}}, nullptr,
                                    "", st.p.params.include_usage));
      }
    }
  }
  for (const RequestStream::Event& ev : st.sub.stream->pop(kPollInterval)) out += render_event(st, ev);
  const bool all_done = st.n_done == st.sub.ids.size();
  if (all_done) {
    if (st.p.params.include_usage && !st.failed) {
      out += sse_event(usage_chunk(st.meta, is_chat(st) ? "chat.completion.chunk" : "text_completion",
                                   st.usage));
    }
    out += sse_done();
  }
  if (out.empty() && Clock::now() - st.last_write >= kKeepAliveAfter) out = sse_comment();
  if (!out.empty()) {
    if (!sink.write(out.data(), out.size())) return false;
    st.last_write = Clock::now();
  }
  if (all_done) sink.done();
  return true;
}

void respond_stream(ServerContext& ctx, PreparedRequest p, Submitted s, httplib::Response& res) {
  auto st = std::make_shared<StreamState>(ctx, std::move(p), std::move(s));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st](size_t /*offset*/, httplib::DataSink& sink) { return provide(*st, sink); },
      [st](bool success) {
        if (!success) abort_all(st->ctx.engine, st->sub.ids);  // client gone: free the KV now
      });
}

}  // namespace

void handle_generation(ServerContext& ctx, const json& body, Endpoint endpoint, const std::string& cache_scope,
                       httplib::Response& res, const nlohmann::ordered_json* ordered) {
  const auto arrived = Clock::now();
  if (ctx.draining) {
    throw ApiError(503, "the server is shutting down", "", "server_error");
  }
  PreparedRequest p = prepare_generation(
      RequestEnv{ctx.engine.tokenizer(), ctx.options, ctx.grammars, ctx.engine.options().generator.n_ctx}, body,
      endpoint, ordered);
  p.cache_scope = cache_scope;
  if (p.params.stream) {
    Submitted s = submit_within_queue(ctx, p, arrived);
    respond_stream(ctx, std::move(p), std::move(s), res);
    return;
  }
  ActiveGuard guard(ctx.active);
  Submitted s = submit_within_queue(ctx, p, arrived);
  respond_whole(ctx, p, std::move(s), res);
}

}  // namespace fdl::server
