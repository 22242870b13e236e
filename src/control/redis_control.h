// redis_control.h — a background subscriber that receives control commands from a Redis
// Pub/Sub channel and hands each parsed command to a handler (the server applies it to the
// engine's breakers).
//
// Why Pub/Sub: operators flip a breaker fleet-wide with one `PUBLISH` and no extra service;
// a missed message while disconnected is acceptable (commands are idempotent trip/reset and
// operators re-send), so no persistence or acknowledgement is needed.
//
// Robustness: the subscriber never throws for connection problems and never stops the server.
// Redis down or gone → one spdlog warning per outage, reconnect with exponential backoff
// (initial_backoff_s doubling to max_backoff_s), an info log when connected again. A message
// that does not parse, or whose handler throws, is logged and counted as rejected; later
// messages still apply.
//
// Threading: one background thread owned by the object; the handler runs on that thread, one
// command at a time (it must be thread-safe with respect to the rest of the program, not to
// itself). status() is thread-safe. The destructor sets a stop flag and joins; every wait
// (connect, SUBSCRIBE reply, messages) polls the socket in 100 ms slices, so it returns within
// about a second even while Redis hangs or is down. Host name resolution (getaddrinfo) is the
// one blocking step: give an IP address where a slow DNS must not delay shutdown.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "control/control_command.h"

namespace fdl::control {

class RedisControl {
 public:
  /// May throw std::exception: the command then counts as rejected, logged with the message.
  using Handler = std::function<void(const ControlCommand&)>;

  struct Options {
    double initial_backoff_s = 0.1;  ///< seconds before the first reconnect attempt
    double max_backoff_s = 5.0;      ///< seconds; cap of the doubling backoff
    double connect_timeout_s = 1.0;  ///< seconds; TCP connect timeout per attempt
    /// Sent as `AUTH [user] password` after every connect when the password is non-empty;
    /// a refused AUTH is a connection error (logged, retried with the backoff).
    std::string user;
    std::string password;
  };

  /// Starts the background thread (connect, SUBSCRIBE url.channel, dispatch). Throws
  /// std::invalid_argument only for invalid arguments (empty handler, empty channel or host,
  /// port outside 1..65535, non-positive or non-finite timeouts, max < initial backoff);
  /// never for connection problems.
  RedisControl(RedisUrl url, Handler handler, Options options);
  RedisControl(RedisUrl url, Handler handler) : RedisControl(std::move(url), std::move(handler), Options{}) {}
  ~RedisControl();
  RedisControl(const RedisControl&) = delete;
  RedisControl& operator=(const RedisControl&) = delete;

  struct Status {
    bool connected = false;  ///< subscribed right now
    int64_t applied = 0;     ///< commands parsed and handled without exception
    int64_t rejected = 0;    ///< messages that failed to parse or whose handler threw
    int64_t reconnects = 0;  ///< successful subscriptions after the first one
    std::string last_error;  ///< latest connection or command error; empty if none yet
  };
  Status status() const;  ///< thread-safe

  const RedisUrl& url() const { return url_; }

 private:
  struct Session;  // one connection's hiredis context (defined in the .cpp)

  void run();
  // Connects and subscribes; on failure returns nullptr and sets `error`.
  std::unique_ptr<Session> connect_and_subscribe(std::string& error);
  // Dispatches messages until stop (returns "") or a connection error (returns its text).
  std::string listen(Session& session);
  void dispatch(const std::string& payload);
  void reject(const std::string& why);
  void set_error(const std::string& e);
  bool stopping() const;
  bool sleep_for(double seconds);  // false if stop was requested while sleeping

  RedisUrl url_;
  Handler handler_;
  Options options_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  Status status_;
  std::thread thread_;
};

}  // namespace fdl::control
