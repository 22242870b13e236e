// StopMatcher: stop strings across piece boundaries, hold-back, OpenAI truncation.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "decode/stop_matcher.h"

namespace fdl {
namespace {

/// Feeds `pieces` and returns every emitted chunk, flushing at the end unless stopped.
std::vector<std::string> run(StopMatcher& m, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const auto& p : pieces) {
    out.push_back(m.push(p));
    if (m.stopped()) return out;
  }
  out.push_back(m.flush());
  return out;
}

std::string joined(const std::vector<std::string>& chunks) {
  std::string s;
  for (const auto& c : chunks) s += c;
  return s;
}

TEST(StopMatcher, NoStopsIsPassThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, StopInsideOnePieceTruncates) {
  StopMatcher m({"END"});
  EXPECT_EQ(m.push("hello END world"), "hello ");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched_index(), 0);
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, StopSpanningPiecesIsHeldThenDropped) {
  StopMatcher m({"The end"});
  EXPECT_EQ(m.push("story. Th"), "story. ");  // "Th" could start the stop string
  EXPECT_EQ(m.push("e e"), "");
  EXPECT_EQ(m.push("nd!"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, HeldTextIsReleasedWhenItDiverges) {
  StopMatcher m({"The end"});
  EXPECT_EQ(m.push("Th"), "");
  EXPECT_EQ(m.push("e e"), "");
  EXPECT_EQ(m.push("lephant"), "The elephant");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, FlushReleasesAPartialMatchAtEndOfStream) {
  StopMatcher m({"###"});
  const auto chunks = run(m, {"a#", "#"});
  EXPECT_EQ(joined(chunks), "a##");
  EXPECT_EQ(chunks.back(), "##");
}

TEST(StopMatcher, EarliestOfSeveralStopsWins) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.push("hello world"), "hel");
  EXPECT_EQ(m.matched_index(), 1);
}

TEST(StopMatcher, OverlappingPrefixIsFoundAfterAFalseStart) {
  // "aab": the held "aa" is not a prefix of the stop, but its tail "a" is.
  StopMatcher m({"ab"});
  EXPECT_EQ(m.push("a"), "");
  EXPECT_EQ(m.push("a"), "a");
  EXPECT_EQ(m.push("b"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, EarlierStartingStopWinsOverEarlierCompletingOne) {
  // " " completes first, but "b c" may start one byte before it: wait and see.
  StopMatcher m({"b c", " "});
  EXPECT_EQ(m.push("ab "), "a");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("c"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched_index(), 0);

  StopMatcher n({"b c", " "});
  EXPECT_EQ(n.push("ab "), "a");
  EXPECT_EQ(n.push("x"), "b");  // "b c" ruled out: the " " match stands
  EXPECT_TRUE(n.stopped());
  EXPECT_EQ(n.matched_index(), 1);

  StopMatcher o({"b c", " "});
  EXPECT_EQ(o.push("ab "), "a");
  EXPECT_EQ(o.flush(), "b");  // end of stream decides too
  EXPECT_TRUE(o.stopped());
}

TEST(StopMatcher, StopAtStartEmitsNothing) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(joined(run(m, {"\n", "\nrest"})), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, MultiByteUtf8StopNeverSplitsCharacters) {
  StopMatcher m({"é!"});
  EXPECT_EQ(m.push("caf"), "caf");
  EXPECT_EQ(m.push("é"), "");      // held: whole character, could be the stop
  EXPECT_EQ(m.push("s"), "és");    // diverged: released whole
  EXPECT_EQ(m.push("é!"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, StreamEqualsInputWhenNoStopMatches) {
  const std::vector<std::string> pieces{"Once", " upon", " a", " ti", "me", ",", " the", "re"};
  StopMatcher m({"time,\n", "upon the", "zzz"});
  std::string in;
  for (const auto& p : pieces) in += p;
  EXPECT_EQ(joined(run(m, pieces)), in);
}

TEST(StopMatcher, RandomSplitsAgreeWithWholeTextSearch) {
  // Small alphabet so that partial matches and overlaps are frequent.
  std::mt19937 rng(3);
  const std::string alphabet = "ab c";
  auto random_string = [&](size_t len) {
    std::string s;
    for (size_t i = 0; i < len; ++i) s += alphabet[rng() % alphabet.size()];
    return s;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops;
    for (size_t i = 0, n = 1 + rng() % 3; i < n; ++i) stops.push_back(random_string(1 + rng() % 4));
    const std::string text = random_string(rng() % 40);
    // Expected: everything before the earliest occurrence of any stop string.
    size_t cut = std::string::npos;
    for (const auto& st : stops) cut = std::min(cut, text.find(st));
    const std::string want = text.substr(0, cut);

    std::vector<std::string> pieces;
    for (size_t at = 0; at < text.size();) {
      const size_t len = 1 + rng() % 5;
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    StopMatcher m(stops);
    std::string got;
    for (const auto& piece : pieces) {
      got += m.push(piece);
      ASSERT_EQ(want.compare(0, got.size(), got), 0)
          << "emitted text that is not in the answer: got '" << got << "' want '" << want
          << "' text '" << text << "' stops '" << stops[0] << "' '" << stops.back() << "' pieces " << pieces.size() << " first piece '" << pieces[0] << "'";
      if (m.stopped()) break;
    }
    got += m.flush();
    ASSERT_EQ(got, want) << "text '" << text << "'";
    EXPECT_EQ(m.stopped(), cut != std::string::npos);
  }
}

TEST(StopMatcher, RejectsEmptyStopString) {
  EXPECT_THROW(StopMatcher({"ok", ""}), std::invalid_argument);
}

}  // namespace
}  // namespace fdl
