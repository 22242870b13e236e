// Tests for src/metrics/prometheus.h: primitives, registry rules, and the text exposition
// format parsed back line by line.
#include "metrics/prometheus.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace fdl::metrics;

namespace {

// One parsed sample line: name{labels} value.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  std::string value;
};

// A strict little parser of the exposition format (enough for what render() emits): it
// unescapes label values and fails the test on anything malformed.
struct Parsed {
  std::map<std::string, std::string> help, type;
  std::vector<std::string> family_order;
  std::vector<Sample> samples;
};

Parsed parse_exposition(const std::string& text) {
  Parsed p;
  EXPECT_TRUE(text.empty() || text.back() == '\n') << "exposition must end with a newline";
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    EXPECT_FALSE(line.empty()) << "empty line in exposition";
    if (line.rfind("# HELP ", 0) == 0) {
      std::string rest = line.substr(7);
      size_t sp = rest.find(' ');
      std::string name = rest.substr(0, sp);
      EXPECT_EQ(p.help.count(name), 0u) << "HELP twice for " << name;
      p.help[name] = sp == std::string::npos ? "" : rest.substr(sp + 1);
      p.family_order.push_back(name);
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      std::string rest = line.substr(7);
      size_t sp = rest.find(' ');
      std::string name = rest.substr(0, sp);
      EXPECT_EQ(p.type.count(name), 0u) << "TYPE twice for " << name;
      p.type[name] = rest.substr(sp + 1);
      continue;
    }
    Sample s;
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') s.name += line[i++];
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        std::string key;
        while (i < line.size() && line[i] != '=') key += line[i++];
        EXPECT_EQ(line.substr(i, 2), "=\"") << line;
        i += 2;
        std::string val;
        while (i < line.size() && line[i] != '"') {
          if (line[i] == '\\') {
            ++i;
            char c = line[i];
            EXPECT_TRUE(c == '\\' || c == '"' || c == 'n') << "bad escape in " << line;
            val += c == 'n' ? '\n' : c;
          } else {
            val += line[i];
          }
          ++i;
        }
        ++i;  // closing quote
        EXPECT_EQ(s.labels.count(key), 0u) << "label twice: " << key;
        s.labels[key] = val;
        if (i < line.size() && line[i] == ',') ++i;
      }
      EXPECT_LT(i, line.size()) << "unterminated label block: " << line;
      ++i;  // '}'
    }
    EXPECT_EQ(line[i], ' ') << line;
    s.value = line.substr(i + 1);
    EXPECT_FALSE(s.value.empty()) << line;
    EXPECT_EQ(s.value.find(' '), std::string::npos) << "no timestamps expected: " << line;
    p.samples.push_back(std::move(s));
  }
  return p;
}

const Sample* find(const Parsed& p, const std::string& name,
                   const std::map<std::string, std::string>& labels) {
  for (const auto& s : p.samples)
    if (s.name == name && s.labels == labels) return &s;
  return nullptr;
}

}  // namespace

TEST(Metrics, CounterIncrementsAndRejectsBadValues) {
  Counter c;
  EXPECT_EQ(c.value(), 0.0);
  c.inc();
  c.inc(2.5);
  EXPECT_DOUBLE_EQ(c.value(), 3.5);
  c.inc(0.0);
  EXPECT_DOUBLE_EQ(c.value(), 3.5);
  EXPECT_THROW(c.inc(-1), std::invalid_argument);
  EXPECT_THROW(c.inc(std::nan("")), std::invalid_argument);
  EXPECT_THROW(c.inc(std::numeric_limits<double>::infinity()), std::invalid_argument);
  EXPECT_DOUBLE_EQ(c.value(), 3.5) << "a rejected increment must not change the value";
}

TEST(Metrics, GaugeSetAndAdd) {
  Gauge g;
  g.set(10);
  g.add(-3);
  g.add(0.5);
  EXPECT_DOUBLE_EQ(g.value(), 7.5);
  g.set(-2);
  EXPECT_DOUBLE_EQ(g.value(), -2.0);
}

TEST(Metrics, HistogramRejectsBadBounds) {
  EXPECT_THROW(Histogram({1, 1}), std::invalid_argument);
  EXPECT_THROW(Histogram({2, 1}), std::invalid_argument);
  EXPECT_THROW(Histogram({1, std::numeric_limits<double>::infinity()}), std::invalid_argument);
  EXPECT_THROW(Histogram({std::nan(""), 1}), std::invalid_argument);
  EXPECT_THROW(Histogram({-std::numeric_limits<double>::infinity()}), std::invalid_argument);
  EXPECT_NO_THROW(Histogram(std::vector<double>{}));
  EXPECT_NO_THROW(Histogram({-5, 0, 5}));
}

TEST(Metrics, HistogramBucketsAreInclusiveAndCumulative) {
  Histogram h({1, 2, 5});
  for (double v : {0.5, 1.0, 1.5, 2.0, 3.0, 7.0, 100.0}) h.observe(v);
  h.observe(std::nan(""));  // ignored
  auto s = h.snapshot();
  ASSERT_EQ(s.cumulative.size(), 4u);
  EXPECT_EQ(s.cumulative[0], 2u);  // 0.5, 1.0 (le is inclusive)
  EXPECT_EQ(s.cumulative[1], 4u);  // + 1.5, 2.0
  EXPECT_EQ(s.cumulative[2], 5u);  // + 3.0
  EXPECT_EQ(s.cumulative[3], 7u);  // + 7, 100
  EXPECT_EQ(s.count, 7u);
  EXPECT_DOUBLE_EQ(s.sum, 0.5 + 1 + 1.5 + 2 + 3 + 7 + 100);
}

TEST(Metrics, QuantileInterpolatesInsideBuckets) {
  Histogram h({10, 20, 30, 40});
  // 10 values per bucket for the first 4 buckets: uniform-ish on 0..40.
  for (int b = 0; b < 4; ++b)
    for (int i = 0; i < 10; ++i) h.observe(b * 10 + 5);
  auto s = h.snapshot();
  EXPECT_DOUBLE_EQ(s.quantile(0.5), 20.0);   // rank 20 = end of bucket 2
  EXPECT_DOUBLE_EQ(s.quantile(0.25), 10.0);  // rank 10 = end of bucket 1
  EXPECT_DOUBLE_EQ(s.quantile(0.125), 5.0);  // rank 5, half-way through [0, 10]
  EXPECT_DOUBLE_EQ(s.quantile(0.95), 38.0);  // rank 38 in [30, 40]: 30 + 10 * 8/10
  EXPECT_DOUBLE_EQ(s.quantile(1.0), 40.0);
  EXPECT_DOUBLE_EQ(s.quantile(0.0), 0.0);
  EXPECT_THROW(s.quantile(-0.1), std::invalid_argument);
  EXPECT_THROW(s.quantile(1.5), std::invalid_argument);
  EXPECT_THROW(s.quantile(std::nan("")), std::invalid_argument);

  h.observe(1000);  // lands in +Inf: the quantile caps at the highest finite bound
  h.observe(1000);
  h.observe(1000);
  h.observe(1000);
  h.observe(1000);
  EXPECT_DOUBLE_EQ(h.snapshot().quantile(0.99), 40.0);

  Histogram empty({1, 2});
  EXPECT_TRUE(std::isnan(empty.snapshot().quantile(0.5)));
}

TEST(Metrics, QuantileOfLatencyBucketsIsClose) {
  // Uniform latencies 1..1000 ms: estimated p50/p95 within a bucket width of the truth.
  Histogram h(latency_buckets_ms());
  for (int i = 1; i <= 1000; ++i) h.observe(i);
  auto s = h.snapshot();
  EXPECT_NEAR(s.quantile(0.5), 500.0, 1.0);
  EXPECT_NEAR(s.quantile(0.95), 950.0, 15.0);
}

TEST(Metrics, LatencyBucketsAreValid) {
  auto b = latency_buckets_ms();
  ASSERT_GE(b.size(), 10u);
  EXPECT_LE(b.front(), 1.0);
  EXPECT_GE(b.back(), 60000.0);
  EXPECT_NO_THROW(Histogram{b});
}

TEST(Metrics, RegistryReturnsSameObjectForSameNameAndLabels) {
  Registry r;
  Counter& a = r.counter("req_total", "Requests", {{"code", "200"}, {"path", "/v1"}});
  Counter& b = r.counter("req_total", "ignored", {{"path", "/v1"}, {"code", "200"}});
  Counter& c = r.counter("req_total", "Requests", {{"code", "500"}, {"path", "/v1"}});
  EXPECT_EQ(&a, &b) << "label order must not matter";
  EXPECT_NE(&a, &c);
  // References stay valid while many more children are created (node-based storage).
  for (int i = 0; i < 1000; ++i) r.counter("req_total", "Requests", {{"code", std::to_string(i)}});
  a.inc(3);
  EXPECT_EQ(&a, &r.counter("req_total", "Requests", {{"code", "200"}, {"path", "/v1"}}));
  EXPECT_DOUBLE_EQ(b.value(), 3.0);

  Histogram& h1 = r.histogram("lat_ms", "Latency", {1, 2}, {{"class", "short"}});
  Histogram& h2 = r.histogram("lat_ms", "Latency", {1, 2}, {{"class", "short"}});
  EXPECT_EQ(&h1, &h2);
  Gauge& g1 = r.gauge("running", "Running");
  EXPECT_EQ(&g1, &r.gauge("running", "Running"));
}

TEST(Metrics, RegistryRejectsTypeConflicts) {
  Registry r;
  r.counter("x_total", "x");
  EXPECT_THROW(r.gauge("x_total", "x"), std::invalid_argument);
  EXPECT_THROW(r.histogram("x_total", "x", {1}), std::invalid_argument);
  r.histogram("h", "h", {1, 2});
  EXPECT_THROW(r.histogram("h", "h", {1, 3}), std::invalid_argument);
  EXPECT_NO_THROW(r.histogram("h", "h", {1, 2}, {{"a", "b"}}));  // same buckets, new child
  EXPECT_THROW(r.histogram("h", "h", {1}, {{"a", "c"}}), std::invalid_argument);
  EXPECT_THROW(r.counter("h", "h"), std::invalid_argument);
  // Histogram suffixes must not collide with other families, in either order.
  EXPECT_THROW(r.gauge("h_count", "c"), std::invalid_argument);
  EXPECT_THROW(r.counter("h_bucket", "c"), std::invalid_argument);
  EXPECT_THROW(r.gauge("h_sum", "c"), std::invalid_argument);
  r.gauge("g_sum", "g");
  EXPECT_THROW(r.histogram("g", "g", {1}), std::invalid_argument);
  // Invalid bounds registering a new family are rejected and leave nothing behind.
  EXPECT_THROW(r.histogram("bad", "b", {2, 1}), std::invalid_argument);
  EXPECT_NO_THROW(r.counter("bad", "now a counter"));
  // The message names the problem.
  try {
    r.gauge("x_total", "x");
    FAIL() << "expected a throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("counter"), std::string::npos) << e.what();
  }
}

TEST(Metrics, RegistryRejectsInvalidNames) {
  Registry r;
  for (const char* bad : {"", "1abc", "a-b", "a b", "a.b", "é", "a{b}", "a\"b"})
    EXPECT_THROW(r.counter(bad, "h"), std::invalid_argument) << "'" << bad << "'";
  for (const char* good : {"a", "_a", ":a", "a:b_c9", "ABC"})
    EXPECT_NO_THROW(r.counter(good, "h")) << good;
  for (const char* bad : {"", "1a", "a-b", "a:b", "__reserved", "a b"})
    EXPECT_THROW(r.gauge("g", "h", {{bad, "v"}}), std::invalid_argument) << "'" << bad << "'";
  EXPECT_THROW(r.gauge("g", "h", {{"a", "1"}, {"a", "2"}}), std::invalid_argument);
  EXPECT_THROW(r.histogram("hh", "h", {1}, {{"le", "1"}}), std::invalid_argument);
  EXPECT_NO_THROW(r.gauge("g2", "h", {{"le", "1"}})) << "le is only reserved on histograms";
}

TEST(Metrics, RenderParsesBack) {
  Registry r;
  r.counter("fdl_requests_total", "Finished requests.", {{"status", "ok"}}).inc(5);
  r.counter("fdl_requests_total", "Finished requests.", {{"status", "error"}}).inc(2);
  r.gauge("fdl_running", "Running requests.").set(3);
  r.gauge("fdl_weird", "Help with \\ backslash\nand newline",
          {{"v", "quote\" back\\slash\nnewline"}})
      .set(-1.25);
  Histogram& h = r.histogram("fdl_ttft_ms", "Time to first token.", {1, 10, 100}, {{"class", "short"}});
  for (double v : {0.5, 5.0, 5.0, 50.0, 500.0, 5000.0}) h.observe(v);
  r.histogram("fdl_ttft_ms", "Time to first token.", {1, 10, 100}, {{"class", "long"}});

  const std::string text = r.render();
  Parsed p = parse_exposition(text);

  EXPECT_EQ(p.type["fdl_requests_total"], "counter");
  EXPECT_EQ(p.type["fdl_running"], "gauge");
  EXPECT_EQ(p.type["fdl_ttft_ms"], "histogram");
  EXPECT_EQ(p.help["fdl_ttft_ms"], "Time to first token.");
  EXPECT_EQ(p.help["fdl_weird"], "Help with \\\\ backslash\\nand newline");
  EXPECT_EQ(p.family_order.size(), 4u) << "one HELP per family:\n" << text;

  const Sample* s = find(p, "fdl_requests_total", {{"status", "ok"}});
  ASSERT_NE(s, nullptr) << text;
  EXPECT_EQ(s->value, "5");
  s = find(p, "fdl_requests_total", {{"status", "error"}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->value, "2");
  s = find(p, "fdl_running", {});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->value, "3");
  s = find(p, "fdl_weird", {{"v", "quote\" back\\slash\nnewline"}});
  ASSERT_NE(s, nullptr) << "label value must round-trip through escaping:\n" << text;
  EXPECT_EQ(s->value, "-1.25");

  // Histogram: cumulative buckets, +Inf == count, sum.
  const std::vector<std::pair<std::string, std::string>> expect = {
      {"1", "1"}, {"10", "3"}, {"100", "4"}, {"+Inf", "6"}};
  for (const auto& [le, count] : expect) {
    s = find(p, "fdl_ttft_ms_bucket", {{"class", "short"}, {"le", le}});
    ASSERT_NE(s, nullptr) << "le=" << le << "\n" << text;
    EXPECT_EQ(s->value, count) << "le=" << le;
  }
  s = find(p, "fdl_ttft_ms_count", {{"class", "short"}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->value, "6");
  s = find(p, "fdl_ttft_ms_sum", {{"class", "short"}});
  ASSERT_NE(s, nullptr);
  EXPECT_DOUBLE_EQ(std::stod(s->value), 5560.5);
  s = find(p, "fdl_ttft_ms_bucket", {{"class", "long"}, {"le", "+Inf"}});
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->value, "0");

  // le is the last label and buckets come in increasing order (the format requires it).
  std::vector<std::string> order;
  for (const auto& smp : p.samples)
    if (smp.name == "fdl_ttft_ms_bucket" && smp.labels.at("class") == "short")
      order.push_back(smp.labels.at("le"));
  EXPECT_EQ(order, (std::vector<std::string>{"1", "10", "100", "+Inf"}));
  EXPECT_NE(text.find("fdl_ttft_ms_bucket{class=\"short\",le=\"1\"} 1\n"), std::string::npos)
      << text;

  // Every sample belongs to a declared family, and its lines follow that family's TYPE line.
  for (const auto& smp : p.samples) {
    std::string fam = smp.name;
    for (const char* suf : {"_bucket", "_sum", "_count"}) {
      const std::string sf = suf;
      if (fam.size() > sf.size() && fam.compare(fam.size() - sf.size(), sf.size(), sf) == 0 &&
          p.type.count(fam.substr(0, fam.size() - sf.size())) != 0)
        fam = fam.substr(0, fam.size() - sf.size());
    }
    EXPECT_EQ(p.type.count(fam), 1u) << smp.name;
  }
}

TEST(Metrics, RenderEmptyRegistryAndFamilyWithoutChildren) {
  Registry r;
  EXPECT_EQ(r.render(), "");
  r.counter("a_total", "A");
  EXPECT_EQ(r.render(), "# HELP a_total A\n# TYPE a_total counter\na_total 0\n");
}

TEST(Metrics, FormatValue) {
  EXPECT_EQ(format_value(0), "0");
  EXPECT_EQ(format_value(42), "42");
  EXPECT_EQ(format_value(-7), "-7");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(1e300), "1e+300");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::nan("")), "NaN");
}

TEST(Metrics, ConcurrentUpdatesAreExact) {
  Registry r;
  constexpr int kThreads = 8, kIters = 20000;
  Histogram& h = r.histogram("c_ms", "c", {1, 10});
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&r, &h, t] {
      for (int i = 0; i < kIters; ++i) {
        // Look up through the registry every time as well, to exercise its lock.
        r.counter("c_total", "c").inc();
        r.gauge("c_gauge", "c", {{"t", std::to_string(t % 2)}}).add(1);
        h.observe(i % 3 == 0 ? 0.5 : 5.0);
        if (i % 1000 == 0) (void)r.render();  // rendering concurrently must be safe
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(r.counter("c_total", "c").value(), double(kThreads) * kIters);
  EXPECT_EQ(r.gauge("c_gauge", "c", {{"t", "0"}}).value() + r.gauge("c_gauge", "c", {{"t", "1"}}).value(),
            double(kThreads) * kIters);
  auto s = h.snapshot();
  EXPECT_EQ(s.count, uint64_t(kThreads) * kIters);
  EXPECT_EQ(s.cumulative.back(), s.count);
  const uint64_t small = uint64_t(kThreads) * ((kIters + 2) / 3);
  EXPECT_EQ(s.cumulative[0], small);
  EXPECT_DOUBLE_EQ(s.sum, 0.5 * small + 5.0 * (s.count - small));
}
