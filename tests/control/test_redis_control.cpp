// Integration tests for RedisControl against a real redis-server started by the test on a
// free loopback port (Debian package redis-server). Skipped only when the binary is absent.
#include "control/redis_control.h"

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

using namespace std::chrono_literals;
using fdl::control::ControlCommand;
using fdl::control::RedisControl;
using fdl::control::RedisUrl;

namespace {

constexpr const char* kRedisServer = "/usr/bin/redis-server";

// Port the kernel just handed out for 127.0.0.1; free again once the probe socket closes.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    ::close(fd);
    throw std::runtime_error("bind/getsockname failed");
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

bool wait_until(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

// A redis-server child process on 127.0.0.1:port; killed in the destructor. With a
// `password` it runs with --requirepass, and this object's own clients send AUTH first.
class RedisServer {
 public:
  explicit RedisServer(int port, std::string password = {}) : port_(port), password_(std::move(password)) {}
  ~RedisServer() { stop(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  // Spawns the server and waits until it answers PING; returns false (with why) otherwise.
  bool start(std::string& why) {
    const std::string port = std::to_string(port_);
    std::vector<std::string> args = {kRedisServer, "--port", port, "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                                     "--loglevel", "warning"};
    if (!password_.empty()) args.insert(args.end(), {"--requirepass", password_});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    const int rc = posix_spawn(&pid_, kRedisServer, &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) {
      pid_ = -1;
      why = std::string("posix_spawn: ") + std::strerror(rc);
      return false;
    }
    const auto end = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < end) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        why = "redis-server exited early (port " + port + " taken?)";
        return false;
      }
      if (ping()) return true;
      std::this_thread::sleep_for(20ms);
    }
    why = "redis-server did not answer PING within 5 s";
    stop();
    return false;
  }

  // SIGKILL: the server vanishes like a crash (the kernel still closes its sockets).
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  bool ping() const {
    timeval tv{0, 200000};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    bool ok = false;
    if (c != nullptr && c->err == 0 && authenticate(c)) {
      auto* r = static_cast<redisReply*>(redisCommand(c, "PING"));
      ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
      if (r != nullptr) freeReplyObject(r);
    }
    if (c != nullptr) redisFree(c);
    return ok;
  }

  // PUBLISH through a separate client, as an operator would; returns the receiver count.
  long long publish(const std::string& channel, const std::string& payload) const {
    timeval tv{1, 0};
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port_, tv);
    if (c == nullptr || c->err != 0 || !authenticate(c)) {
      if (c != nullptr) redisFree(c);
      ADD_FAILURE() << "cannot connect to publish";
      return -1;
    }
    auto* r = static_cast<redisReply*>(redisCommand(c, "PUBLISH %b %b", channel.data(),
                                                    channel.size(), payload.data(), payload.size()));
    long long n = -1;
    if (r != nullptr && r->type == REDIS_REPLY_INTEGER) n = r->integer;
    if (r != nullptr) freeReplyObject(r);
    redisFree(c);
    return n;
  }

  int port() const { return port_; }

 private:
  bool authenticate(redisContext* c) const {
    if (password_.empty()) return true;
    auto* r = static_cast<redisReply*>(redisCommand(c, "AUTH %b", password_.data(), password_.size()));
    const bool ok = r != nullptr && r->type == REDIS_REPLY_STATUS;
    if (r != nullptr) freeReplyObject(r);
    return ok;
  }

  int port_;
  std::string password_;
  pid_t pid_ = -1;
};

// Collects what the handler receives; "bad" breakers are refused like an unknown name would be.
struct Recorder {
  std::mutex mu;
  std::vector<ControlCommand> got;
  RedisControl::Handler handler() {
    return [this](const ControlCommand& c) {
      if (c.breaker == "no_such_breaker") throw std::invalid_argument("unknown breaker");
      std::lock_guard<std::mutex> lock(mu);
      got.push_back(c);
    };
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return got.size();
  }
};

RedisUrl url_for(int port, std::string channel = "flashdllm-control-test") {
  RedisUrl u;
  u.host = "127.0.0.1";
  u.port = port;
  u.channel = std::move(channel);
  return u;
}

RedisControl::Options fast_options() {
  RedisControl::Options o;
  o.initial_backoff_s = 0.05;
  o.max_backoff_s = 0.2;
  o.connect_timeout_s = 1.0;
  return o;
}

class RedisControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::access(kRedisServer, X_OK), 0) << kRedisServer << " not installed (scripts/install-deps.sh installs redis-server)";
    server_ = std::make_unique<RedisServer>(free_port());
    std::string why;
    ASSERT_TRUE(server_->start(why)) << why;
  }
  std::unique_ptr<RedisServer> server_;
};

}  // namespace

TEST_F(RedisControlTest, AppliesPublishedCommands) {
  Recorder rec;
  RedisControl ctl(url_for(server_->port()), rec.handler(), fast_options());
  ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s)) << ctl.status().last_error;

  EXPECT_EQ(server_->publish("flashdllm-control-test",
                             R"({"breaker":"disk_offload","action":"trip","reason":"alarm"})"),
            1);
  server_->publish("other-channel", R"({"breaker":"x","action":"trip"})");  // not ours
  server_->publish("flashdllm-control-test", R"({"breaker":"disk_offload","action":"reset"})");
  ASSERT_TRUE(wait_until([&] { return rec.size() == 2; }, 5s)) << rec.size();
  std::this_thread::sleep_for(100ms);  // nothing else may arrive
  auto st = ctl.status();
  EXPECT_EQ(st.applied, 2);
  EXPECT_EQ(st.rejected, 0);
  EXPECT_EQ(st.reconnects, 0);
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.got.size(), 2u);
  EXPECT_EQ(rec.got[0].breaker, "disk_offload");
  EXPECT_EQ(rec.got[0].action, "trip");
  EXPECT_EQ(rec.got[0].reason, "alarm");
  EXPECT_EQ(rec.got[1].action, "reset");
}

TEST_F(RedisControlTest, MalformedMessagesAreRejectedAndLaterOnesApply) {
  Recorder rec;
  RedisControl ctl(url_for(server_->port()), rec.handler(), fast_options());
  ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s));

  const std::string ch = "flashdllm-control-test";
  server_->publish(ch, "this is not json");
  ASSERT_TRUE(wait_until([&] { return ctl.status().rejected == 1; }, 5s));
  EXPECT_NE(ctl.status().last_error.find("invalid JSON"), std::string::npos)
      << ctl.status().last_error;

  server_->publish(ch, R"({"breaker":"a","action":"explode"})");
  server_->publish(ch, std::string("\x00\xff\x01", 3));
  server_->publish(ch, R"({"breaker":"no_such_breaker","action":"trip"})");  // handler throws
  server_->publish(ch, R"({"breaker":"spec","action":"trip"})");
  ASSERT_TRUE(wait_until([&] { return ctl.status().applied == 1; }, 5s));
  auto st = ctl.status();
  EXPECT_EQ(st.rejected, 4);
  EXPECT_EQ(st.applied, 1);
  EXPECT_TRUE(st.connected) << "bad messages must not drop the connection";
  EXPECT_NE(st.last_error.find("unknown breaker"), std::string::npos) << st.last_error;
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.got.size(), 1u);
  EXPECT_EQ(rec.got[0].breaker, "spec");
}

TEST_F(RedisControlTest, SurvivesRedisRestartAndWarnsOncePerOutage) {
  // Capture log lines to check "one warning per outage".
  auto sink = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256);
  auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("control-test", sink));
  spdlog::set_level(spdlog::level::info);
  {
    Recorder rec;
    RedisControl ctl(url_for(server_->port()), rec.handler(), fast_options());
    ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s));

    server_->stop();
    ASSERT_TRUE(wait_until([&] { return !ctl.status().connected; }, 3s));
    std::this_thread::sleep_for(800ms);  // several reconnect attempts fail meanwhile
    auto down = ctl.status();
    EXPECT_FALSE(down.connected);
    EXPECT_FALSE(down.last_error.empty());

    std::string why;
    ASSERT_TRUE(server_->start(why)) << why;  // same port
    ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s)) << ctl.status().last_error;
    EXPECT_EQ(ctl.status().reconnects, 1);
    server_->publish("flashdllm-control-test", R"({"breaker":"disk_offload","action":"reset"})");
    ASSERT_TRUE(wait_until([&] { return ctl.status().applied == 1; }, 5s));
    EXPECT_EQ(rec.size(), 1u);
  }
  std::vector<std::string> lines = sink->last_formatted();
  spdlog::set_default_logger(previous);
  int unavailable = 0, reconnected = 0;
  for (const auto& l : lines) {
    if (l.find("unavailable") != std::string::npos) ++unavailable;
    if (l.find("reconnected") != std::string::npos) ++reconnected;
  }
  EXPECT_EQ(unavailable, 1) << "one warning per outage, not one per retry";
  EXPECT_EQ(reconnected, 1);
}

TEST(RedisControlAuth, PasswordIsSentAfterEveryConnectAndRefusalsAreClear) {
  ASSERT_EQ(::access(kRedisServer, X_OK), 0) << kRedisServer << " not installed (scripts/install-deps.sh installs redis-server)";
  RedisServer server(free_port(), "s3cret-pass");
  std::string why;
  ASSERT_TRUE(server.start(why)) << why;
  RedisControl::Options with = fast_options();
  with.password = "s3cret-pass";
  {
    Recorder rec;
    RedisControl ctl(url_for(server.port()), rec.handler(), with);
    ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s)) << ctl.status().last_error;
    server.publish("flashdllm-control-test", R"({"breaker":"disk_offload","action":"trip"})");
    ASSERT_TRUE(wait_until([&] { return ctl.status().applied == 1; }, 5s));
    // A restarted server needs AUTH again: the reconnect sends it.
    server.stop();
    ASSERT_TRUE(wait_until([&] { return !ctl.status().connected; }, 3s));
    ASSERT_TRUE(server.start(why)) << why;
    ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s)) << ctl.status().last_error;
    EXPECT_EQ(ctl.status().reconnects, 1);
    server.publish("flashdllm-control-test", R"({"breaker":"disk_offload","action":"reset"})");
    ASSERT_TRUE(wait_until([&] { return ctl.status().applied == 2; }, 5s));
  }
  // With a user (Redis 6 ACLs: "default" is the requirepass user).
  RedisControl::Options as_user = with;
  as_user.user = "default";
  {
    Recorder rec;
    RedisControl ctl(url_for(server.port()), rec.handler(), as_user);
    ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s)) << ctl.status().last_error;
  }
  // Without the password, or with a wrong one: never subscribed, and the error says why.
  RedisControl::Options wrong = fast_options();
  wrong.password = "nope";
  for (const auto& [options, expected] : {std::pair{fast_options(), std::string("NOAUTH")},
                                          std::pair{wrong, std::string("AUTH refused: WRONGPASS")}}) {
    Recorder rec;
    RedisControl ctl(url_for(server.port()), rec.handler(), options);
    ASSERT_TRUE(wait_until([&, &expected = expected] { return ctl.status().last_error.find(expected) != std::string::npos; }, 5s))
        << ctl.status().last_error;
    EXPECT_FALSE(ctl.status().connected);
    EXPECT_EQ(ctl.status().last_error.find('\n'), std::string::npos);  // one line
    EXPECT_EQ(ctl.status().last_error.find("nope"), std::string::npos);  // no password in it
    EXPECT_EQ(server.publish("flashdllm-control-test", R"({"breaker":"disk_offload","action":"trip"})"), 0);
  }
}

TEST_F(RedisControlTest, StartsWhileRedisIsDownAndConnectsLater) {
  const int port = server_->port();
  server_->stop();
  Recorder rec;
  RedisControl ctl(url_for(port), rec.handler(), fast_options());
  ASSERT_TRUE(wait_until([&] { return !ctl.status().last_error.empty(); }, 3s));
  EXPECT_FALSE(ctl.status().connected);
  EXPECT_NE(ctl.status().last_error.find("refused"), std::string::npos) << ctl.status().last_error;

  std::string why;
  ASSERT_TRUE(server_->start(why)) << why;
  ASSERT_TRUE(wait_until([&] { return ctl.status().connected; }, 5s));
  EXPECT_EQ(ctl.status().reconnects, 0) << "the first successful connection is not a reconnect";
  server_->publish("flashdllm-control-test", R"({"breaker":"x","action":"trip"})");
  EXPECT_TRUE(wait_until([&] { return ctl.status().applied == 1; }, 5s));
}

TEST_F(RedisControlTest, DestructorIsQuickWhileConnectedOrDown) {
  Recorder rec;
  RedisControl::Options slow_retry = fast_options();
  slow_retry.initial_backoff_s = 5;  // it will be sleeping in backoff when destroyed
  slow_retry.max_backoff_s = 5;
  {
    auto ctl = std::make_unique<RedisControl>(url_for(server_->port()), rec.handler(), slow_retry);
    ASSERT_TRUE(wait_until([&] { return ctl->status().connected; }, 5s));
    const auto t0 = std::chrono::steady_clock::now();
    ctl.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "while connected and idle";
  }
  {
    auto ctl = std::make_unique<RedisControl>(url_for(server_->port()), rec.handler(), slow_retry);
    ASSERT_TRUE(wait_until([&] { return ctl->status().connected; }, 5s));
    server_->stop();
    ASSERT_TRUE(wait_until([&] { return !ctl->status().connected; }, 3s));
    std::this_thread::sleep_for(100ms);
    const auto t0 = std::chrono::steady_clock::now();
    ctl.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s) << "while Redis is down";
  }
}

TEST(RedisControlHang, DestructorIsQuickWhileServerNeverAnswers) {
  // A listening socket that never accepts: TCP connects (kernel backlog) but SUBSCRIBE never
  // gets a reply, like a wedged server.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(fd, 8), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);

  Recorder rec;
  RedisControl::Options o = fast_options();
  o.connect_timeout_s = 0.3;
  {
    RedisControl ctl(url_for(port), rec.handler(), o);
    EXPECT_TRUE(wait_until(
        [&] { return ctl.status().last_error.find("no reply to SUBSCRIBE") != std::string::npos; },
        3s))
        << ctl.status().last_error;
    EXPECT_FALSE(ctl.status().connected);
  }
  o.connect_timeout_s = 30;  // destroyed mid-wait: must not wait out the 30 s
  {
    auto ctl = std::make_unique<RedisControl>(url_for(port), rec.handler(), o);
    std::this_thread::sleep_for(300ms);
    const auto t0 = std::chrono::steady_clock::now();
    ctl.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  }
  ::close(fd);
}

TEST(RedisControlArgs, InvalidArgumentsThrow) {
  auto h = [](const ControlCommand&) {};
  RedisControl::Options o;
  EXPECT_THROW(RedisControl(url_for(6379), nullptr, o), std::invalid_argument);
  EXPECT_THROW(RedisControl(url_for(0), h, o), std::invalid_argument);
  EXPECT_THROW(RedisControl(url_for(70000), h, o), std::invalid_argument);
  EXPECT_THROW(RedisControl(url_for(6379, ""), h, o), std::invalid_argument);
  RedisUrl no_host = url_for(6379);
  no_host.host.clear();
  EXPECT_THROW(RedisControl(no_host, h, o), std::invalid_argument);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity()}) {
    RedisControl::Options b;
    b.initial_backoff_s = bad;
    EXPECT_THROW(RedisControl(url_for(6379), h, b), std::invalid_argument);
    b = {};
    b.connect_timeout_s = bad;
    EXPECT_THROW(RedisControl(url_for(6379), h, b), std::invalid_argument);
  }
  RedisControl::Options b;
  b.initial_backoff_s = 2;
  b.max_backoff_s = 1;
  EXPECT_THROW(RedisControl(url_for(6379), h, b), std::invalid_argument);
}
