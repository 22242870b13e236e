// redis_control.cpp — the Pub/Sub subscriber thread.
//
// Why a non-blocking hiredis context driven by poll(): a blocking context with a socket read
// timeout marks itself failed on every timeout (hiredis sets REDIS_ERR_IO on EAGAIN in
// blocking mode), so the idle-wait needed to notice the stop flag would look like a broken
// connection. With poll() in short slices the thread wakes every kPollSliceMs to check the
// stop flag, and every wait (connect, subscribe reply, messages) is interruptible the same way.
#include "control/redis_control.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <spdlog/fmt/fmt.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace fdl::control {

namespace {

constexpr int kPollSliceMs = 100;  // how often a waiting thread checks the stop flag

using Clock = std::chrono::steady_clock;

struct ReplyDeleter {
  void operator()(redisReply* r) const { if (r != nullptr) freeReplyObject(r); }
};
using ReplyPtr = std::unique_ptr<redisReply, ReplyDeleter>;

std::string endpoint(const RedisUrl& u) {
  const bool v6 = u.host.find(':') != std::string::npos;
  return "redis://" + (v6 ? "[" + u.host + "]" : u.host) + ":" + std::to_string(u.port) + "/" +
         u.channel;
}

}  // namespace

struct RedisControl::Session {
  redisContext* ctx = nullptr;
  ~Session() { if (ctx != nullptr) redisFree(ctx); }
};

RedisControl::RedisControl(RedisUrl url, Handler handler, Options options)
    : url_(std::move(url)), handler_(std::move(handler)), options_(options) {
  if (!handler_) throw std::invalid_argument("RedisControl: handler is empty");
  if (url_.host.empty()) throw std::invalid_argument("RedisControl: host is empty");
  if (url_.channel.empty()) throw std::invalid_argument("RedisControl: channel is empty");
  if (url_.port < 1 || url_.port > 65535)
    throw std::invalid_argument("RedisControl: port " + std::to_string(url_.port) +
                                " is outside 1..65535");
  auto positive = [](double v) { return std::isfinite(v) && v > 0; };
  if (!positive(options_.initial_backoff_s) || !positive(options_.max_backoff_s) ||
      !positive(options_.connect_timeout_s))
    throw std::invalid_argument("RedisControl: backoff and timeout options must be finite and > 0");
  if (options_.max_backoff_s < options_.initial_backoff_s)
    throw std::invalid_argument("RedisControl: max_backoff_s must be >= initial_backoff_s");
  thread_ = std::thread([this] { run(); });
}

RedisControl::~RedisControl() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

RedisControl::Status RedisControl::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

bool RedisControl::stopping() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

bool RedisControl::sleep_for(double seconds) {
  std::unique_lock<std::mutex> lock(mu_);
  return !cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stop_; });
}

void RedisControl::set_error(const std::string& e) {
  std::lock_guard<std::mutex> lock(mu_);
  status_.last_error = e;
}

void RedisControl::run() {
  double backoff = options_.initial_backoff_s;
  bool ever_connected = false;
  bool in_outage = false;  // a warning was logged for the current outage
  while (!stopping()) {
    std::string error;
    if (auto session = connect_and_subscribe(error)) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        status_.connected = true;
        if (ever_connected) ++status_.reconnects;
      }
      if (in_outage && ever_connected)
        spdlog::info("control: reconnected to {}", endpoint(url_));
      else if (in_outage)
        spdlog::info("control: subscribed to {} (it was unavailable at start)", endpoint(url_));
      else
        spdlog::info("control: subscribed to {}", endpoint(url_));
      ever_connected = true;
      in_outage = false;
      backoff = options_.initial_backoff_s;
      error = listen(*session);
      {
        std::lock_guard<std::mutex> lock(mu_);
        status_.connected = false;
      }
      if (error.empty()) break;  // stop requested
    }
    if (stopping()) break;
    set_error(error);
    if (!in_outage) {
      spdlog::warn("control: Redis {} unavailable: {}; retrying every {}..{} s until it is back",
                   endpoint(url_), error, options_.initial_backoff_s, options_.max_backoff_s);
      in_outage = true;
    } else {
      spdlog::debug("control: Redis {} still unavailable: {}", endpoint(url_), error);
    }
    if (!sleep_for(backoff)) break;
    backoff = std::min(backoff * 2, options_.max_backoff_s);
  }
}

namespace {

// Waits until fd is ready for `events`, in kPollSliceMs slices so `stop` is honoured.
// Returns 1 ready, 0 deadline passed, -1 stopped, -2 poll error (errno text in err).
template <class StopFn>
int wait_fd(int fd, short events, Clock::time_point deadline, StopFn stop, std::string& err) {
  for (;;) {
    if (stop()) return -1;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), kPollSliceMs)));
    if (rc < 0) {
      if (errno == EINTR) continue;
      err = std::string("poll: ") + std::strerror(errno);
      return -2;
    }
    if (rc > 0) return 1;  // POLLERR/POLLHUP also count: the next read/write reports them
  }
}

// Reads one reply from a non-blocking context, waiting up to `deadline`.
template <class StopFn>
int read_reply(redisContext* c, Clock::time_point deadline, StopFn stop, ReplyPtr& out,
               std::string& err) {
  for (;;) {
    void* r = nullptr;
    // Non-blocking context: redisGetReply only parses what is already buffered.
    if (redisGetReply(c, &r) != REDIS_OK) {
      err = c->errstr[0] != '\0' ? c->errstr : "protocol error";
      return -2;
    }
    if (r != nullptr) {
      out.reset(static_cast<redisReply*>(r));
      return 1;
    }
    const int w = wait_fd(c->fd, POLLIN, deadline, stop, err);
    if (w != 1) return w;
    if (redisBufferRead(c) != REDIS_OK) {  // EOF → "Server closed the connection"
      err = c->errstr[0] != '\0' ? c->errstr : "read failed";
      return -2;
    }
  }
}

}  // namespace

std::unique_ptr<RedisControl::Session> RedisControl::connect_and_subscribe(std::string& error) {
  auto stop = [this] { return stopping(); };
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options_.connect_timeout_s));
  auto s = std::make_unique<Session>();
  s->ctx = redisConnectNonBlock(url_.host.c_str(), url_.port);
  if (s->ctx == nullptr) {
    error = "cannot allocate a Redis context";
    return nullptr;
  }
  if (s->ctx->err != 0) {
    error = std::string("connect: ") + s->ctx->errstr;
    return nullptr;
  }
  // Non-blocking connect: wait for writability, then read the socket's connect result.
  int w = wait_fd(s->ctx->fd, POLLOUT, deadline, stop, error);
  if (w == 0) error = fmt::format("connect timed out after {} s", options_.connect_timeout_s);
  if (w != 1) return nullptr;
  int so_error = 0;
  socklen_t len = sizeof so_error;
  if (::getsockopt(s->ctx->fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
  if (so_error != 0) {
    error = std::string("connect: ") + std::strerror(so_error);
    return nullptr;
  }
  // Keepalive detects a peer that vanished without closing (network partition, host crash).
  redisEnableKeepAlive(s->ctx);

  // AUTH (when configured) and SUBSCRIBE go out together; their replies come back in order.
  const bool auth = !options_.password.empty();
  const std::string& user = options_.user;
  const std::string& password = options_.password;
  const int auth_rc = !auth ? REDIS_OK
                      : user.empty()
                          ? redisAppendCommand(s->ctx, "AUTH %b", password.data(), password.size())
                          : redisAppendCommand(s->ctx, "AUTH %b %b", user.data(), user.size(), password.data(),
                                               password.size());
  if (auth_rc != REDIS_OK ||
      redisAppendCommand(s->ctx, "SUBSCRIBE %b", url_.channel.data(), url_.channel.size()) != REDIS_OK) {
    error = std::string("SUBSCRIBE: ") + s->ctx->errstr;
    return nullptr;
  }
  for (int done = 0; !done;) {
    if (redisBufferWrite(s->ctx, &done) != REDIS_OK) {
      error = std::string("SUBSCRIBE write: ") + s->ctx->errstr;
      return nullptr;
    }
    if (!done) {
      w = wait_fd(s->ctx->fd, POLLOUT, deadline, stop, error);
      if (w == 0) error = "SUBSCRIBE write timed out";
      if (w != 1) return nullptr;
    }
  }
  ReplyPtr reply;
  if (auth) {
    w = read_reply(s->ctx, deadline, stop, reply, error);
    if (w == 0) error = fmt::format("no reply to AUTH within {} s", options_.connect_timeout_s);
    if (w != 1) return nullptr;
    if (reply->type == REDIS_REPLY_ERROR) {  // WRONGPASS, or AUTH without requirepass
      error = "AUTH" + (user.empty() ? std::string() : " as user '" + user + "'") +
              " refused: " + std::string(reply->str, reply->len);
      return nullptr;
    }
  }
  w = read_reply(s->ctx, deadline, stop, reply, error);
  if (w == 0) error = fmt::format("no reply to SUBSCRIBE within {} s", options_.connect_timeout_s);
  if (w != 1) return nullptr;
  if (reply->type == REDIS_REPLY_ERROR) {
    const std::string what(reply->str, reply->len);
    error = "SUBSCRIBE refused: " + what;
    if (what.starts_with("NOAUTH"))
      error += " (the server wants a password: --redis-password-file or FLASHDLLM_REDIS_PASSWORD)";
    return nullptr;
  }
  if (reply->type != REDIS_REPLY_ARRAY || reply->elements < 1 ||
      reply->element[0]->type != REDIS_REPLY_STRING ||
      std::string(reply->element[0]->str, reply->element[0]->len) != "subscribe") {
    error = "unexpected reply to SUBSCRIBE (is this a Redis server?)";
    return nullptr;
  }
  return s;
}

std::string RedisControl::listen(Session& session) {
  auto stop = [this] { return stopping(); };
  for (;;) {
    ReplyPtr reply;
    std::string error;
    const int w = read_reply(session.ctx, Clock::time_point::max(), stop, reply, error);
    if (w == -1) return {};
    if (w != 1) return error.empty() ? "connection lost" : error;
    if (reply->type == REDIS_REPLY_ERROR) return "server error: " + std::string(reply->str, reply->len);
    // A Pub/Sub delivery is ["message", channel, payload]; confirmations are ignored.
    if (reply->type == REDIS_REPLY_ARRAY && reply->elements == 3 &&
        reply->element[0]->type == REDIS_REPLY_STRING &&
        std::string(reply->element[0]->str, reply->element[0]->len) == "message") {
      const redisReply* payload = reply->element[2];
      if (payload->type == REDIS_REPLY_STRING)
        dispatch(std::string(payload->str, payload->len));
      else
        reject("message payload is not a string");
    }
  }
}

void RedisControl::reject(const std::string& why) {
  spdlog::warn("control: rejected command from {}: {}", endpoint(url_), why);
  std::lock_guard<std::mutex> lock(mu_);
  ++status_.rejected;
  status_.last_error = why;
}

void RedisControl::dispatch(const std::string& payload) {
  ControlCommand cmd;
  try {
    cmd = parse_control_command(payload);
  } catch (const std::exception& e) {
    reject(e.what());
    return;
  }
  try {
    handler_(cmd);
  } catch (const std::exception& e) {
    reject("breaker \"" + cmd.breaker + "\" " + cmd.action + ": " + e.what());
    return;
  } catch (...) {
    reject("breaker \"" + cmd.breaker + "\" " + cmd.action + ": unknown exception");
    return;
  }
  spdlog::info("control: applied {} of breaker \"{}\"{}{}", cmd.action, cmd.breaker,
               cmd.reason.empty() ? "" : ", reason: ", cmd.reason);
  std::lock_guard<std::mutex> lock(mu_);
  ++status_.applied;
}

}  // namespace fdl::control
