// GBNF compilation and matching (flashdllm/grammar.h).
#include <gtest/gtest.h>

#include <string>

#include "flashdllm/grammar.h"

namespace fdl {
namespace {

bool matches(const std::string& gbnf, const std::string& text) {
  GrammarMatcher m(Grammar::compile(gbnf));
  return m.accept_bytes(text) && m.can_end();
}

std::string error_of(const std::string& gbnf) {
  try {
    Grammar::compile(gbnf);
  } catch (const GrammarError& e) {
    return e.what();
  }
  return "";
}

TEST(Gbnf, LiteralsAlternativesAndGroups) {
  const std::string g = R"(root ::= "ab" ("c" | "de")  # comment
  )";
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "abde"));
  EXPECT_FALSE(matches(g, "abd"));
  EXPECT_FALSE(matches(g, "abcx"));
  EXPECT_FALSE(matches(g, ""));
}

TEST(Gbnf, RulesSpanLinesUntilTheNextDefinition) {
  const std::string g = "root ::= a\n  b\na ::= \"x\"\nb ::=\n \"y\" | \"z\"\n";
  EXPECT_TRUE(matches(g, "xy"));
  EXPECT_TRUE(matches(g, "xz"));
  EXPECT_FALSE(matches(g, "x"));
}

TEST(Gbnf, Quantifiers) {
  EXPECT_TRUE(matches(R"(root ::= "a"*)", ""));
  EXPECT_TRUE(matches(R"(root ::= "a"*)", "aaaa"));
  EXPECT_FALSE(matches(R"(root ::= "a"+)", ""));
  EXPECT_TRUE(matches(R"(root ::= "ab"+)", "ababab"));
  EXPECT_FALSE(matches(R"(root ::= "ab"+)", "aba"));
  EXPECT_TRUE(matches(R"(root ::= "a"? "b")", "b"));
  EXPECT_TRUE(matches(R"(root ::= "a"? "b")", "ab"));
  for (int n = 0; n <= 7; ++n) {
    const std::string s(size_t(n), 'a');
    EXPECT_EQ(matches(R"(root ::= "a"{2,5})", s), n >= 2 && n <= 5) << n;
    EXPECT_EQ(matches(R"(root ::= "a"{3})", s), n == 3) << n;
    EXPECT_EQ(matches(R"(root ::= "a"{2,})", s), n >= 2) << n;
    EXPECT_EQ(matches(R"(root ::= ("a" "a"?){0,2})", s), n <= 4) << n;
  }
}

TEST(Gbnf, ClassesMatchUtf8Characters) {
  const std::string g = R"(root ::= [a-c\u00e9\u4e00-\u4e02]+)";
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "a\xC3\xA9"));       // é
  EXPECT_TRUE(matches(g, "\xE4\xB8\x81"));    // U+4E01
  EXPECT_FALSE(matches(g, "\xE4\xB8\x83"));   // U+4E03
  EXPECT_FALSE(matches(g, "d"));
  const std::string neg = R"(root ::= [^"\\]*)";
  EXPECT_TRUE(matches(neg, "x y \xF0\x9F\x98\x80 \xC3\xA9"));
  EXPECT_FALSE(matches(neg, "a\"b"));
  EXPECT_FALSE(matches(neg, "\xC3"));         // half a character cannot end
  EXPECT_FALSE(matches(neg, "\xED\xA0\x80"));  // a surrogate is not UTF-8
  EXPECT_TRUE(matches("root ::= . .", "\xC3\xA9z"));
}

TEST(Gbnf, EscapesInLiterals) {
  EXPECT_TRUE(matches(R"(root ::= "a\"b\\c\n\x41\u00e9")", "a\"b\\c\nA\xC3\xA9"));
}

TEST(Gbnf, NextBytesAndCanEnd) {
  GrammarMatcher m(Grammar::compile(R"(root ::= "a" [bc] | "a")"));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_byte('a'));
  EXPECT_TRUE(m.can_end());
  const auto next = m.next_bytes();
  EXPECT_EQ(next.count(), 2u);
  EXPECT_TRUE(next.test('b'));
  EXPECT_FALSE(m.accept_byte('d'));
  EXPECT_TRUE(m.accept_byte('c'));
  EXPECT_TRUE(m.next_bytes().none());
}

TEST(Gbnf, AcceptBytesIsAllOrNothing) {
  GrammarMatcher m(Grammar::compile(R"(root ::= "abc")"));
  EXPECT_FALSE(m.accept_bytes("abx"));
  EXPECT_TRUE(m.accept_bytes("abc"));
  EXPECT_TRUE(m.can_end());
}

TEST(Gbnf, RecursionThroughRules) {
  const std::string g = R"(
root ::= value
value ::= "[" (value ("," value)*)? "]" | [0-9]
)";
  EXPECT_TRUE(matches(g, "[[1,2],[],[[3]]]"));
  EXPECT_FALSE(matches(g, "[[1,2]"));
  EXPECT_FALSE(matches(g, "[1,]"));
}

TEST(Gbnf, ErrorsNameLineAndColumn) {
  EXPECT_EQ(error_of("root ::= \"a\"\nfoo ::= bar"), "line 2, column 9: rule 'bar' is used but never defined");
  EXPECT_NE(error_of("root ::= \"abc").find("line 1, column 10: unterminated string literal"), std::string::npos);
  EXPECT_NE(error_of("root ::= [a-").find("unterminated character class"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"").find("expected ')'"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{3,2}").find("n < m"), std::string::npos);
  EXPECT_NE(error_of("root = \"a\"").find("expected '::='"), std::string::npos);
  EXPECT_NE(error_of("a ::= \"x\"").find("no rule 'root'"), std::string::npos);
  EXPECT_NE(error_of("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= (\"a\"?)*").find("left-recursive"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"\nroot ::= \"b\"").find("defined twice"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\q\"").find("unknown escape"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{20000}").find("10000"), std::string::npos);
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"\\uD800\"").find("scalar"), std::string::npos);
  EXPECT_NE(error_of("root ::= @").find("unexpected character \"@\""), std::string::npos);
  EXPECT_EQ(error_of("root ::= \xC3\xA9"), "line 1, column 10: unexpected character \"\xC3\xA9\"");  // é whole
  EXPECT_EQ(error_of("root ::= \xC3"), "line 1, column 10: unexpected character byte 0xC3");
  EXPECT_EQ(error_of("root ::= \x01"), "line 1, column 10: unexpected character \"\\x01\"");  // a control character, escaped
  EXPECT_EQ(error_of("root ::= \"\\\xC3\xA9\""), "line 1, column 11: unknown escape: \\ followed by \"\xC3\xA9\"");
  EXPECT_EQ(error_of("root ::= \"\\\n\""), "line 1, column 11: unknown escape: \\ followed by \"\\n\"");
  EXPECT_EQ(error_of("root ::= \"\xC3\xA9\" @"), "line 1, column 14: unexpected character \"@\"");  // characters, not bytes
  // A byte order mark is skipped, and columns count from after it.
  EXPECT_TRUE(matches("\xEF\xBB\xBFroot ::= \"a\"", "a"));
  EXPECT_EQ(error_of("\xEF\xBB\xBFroot ::= @"), "line 1, column 10: unexpected character \"@\"");
}

TEST(Gbnf, DeepNestingIsBoundedNotACrash) {
  const auto g = Grammar::compile(R"g(root ::= "(" root ")" | "x")g");
  GrammarMatcher m(g);
  std::string deep(5000, '(');
  // Beyond the stack-depth bound the matcher refuses instead of growing without limit.
  EXPECT_FALSE(m.accept_bytes(deep + "x" + std::string(5000, ')')));
  GrammarMatcher ok(g);
  EXPECT_TRUE(ok.accept_bytes(std::string(100, '(') + "x" + std::string(100, ')')));
  EXPECT_TRUE(ok.can_end());
}

}  // namespace
}  // namespace fdl

namespace fdl {
namespace {

TEST(GbnfBounds, HostileGrammarsAreRefusedQuickly) {
  EXPECT_NE(error_of("root ::= " + std::string(40000, '(') + "\"a\"" + std::string(40000, ')')).find("256 deep"),
            std::string::npos);
  std::string reps = "root ::= ";
  for (int i = 0; i < 200; ++i) reps += "\"a\"{10000} ";
  EXPECT_NE(error_of(reps).find("2^20"), std::string::npos);
  // Rules that match only empty text, each used twice: 2^40 paths to the first byte.
  std::string chain = "root ::= r1 \"x\"\n";
  for (int i = 1; i < 40; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " r" + std::to_string(i + 1) + "\n";
  chain += "r40 ::= \"\"\n";
  EXPECT_NE(error_of(chain).find("too ambiguous"), std::string::npos);
}

TEST(GbnfBounds, LiteralsMustBeWellFormedUtf8) {
  EXPECT_NE(error_of("root ::= \"\xED\xA0\x80\"").find("invalid UTF-8"), std::string::npos);  // a surrogate
  EXPECT_NE(error_of("root ::= \"\xC0\x80\"").find("invalid UTF-8"), std::string::npos);      // overlong
  EXPECT_NE(error_of("root ::= \"\xF5\x80\x80\x80\"").find("invalid UTF-8"), std::string::npos);
  EXPECT_EQ(error_of("root ::= \"\xF0\x9F\x98\x80\""), "");
}

}  // namespace
}  // namespace fdl
