// Token masks over real vocabularies: the mask allows exactly the tokens whose bytes the
// matcher accepts (checked token by token), forced tokens spell the forced bytes.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>

#include "flashdllm/gguf.h"
#include "flashdllm/grammar.h"
#include "flashdllm/tokenizer.h"
#include "grammar/token_masker.h"
#include "test_support.h"

namespace fdl {
namespace {

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& file) {
  const GgufFile f = GgufFile::open(test::model_path(file));
  return Tokenizer::from_gguf(f);
}

const char* kJsonish = R"(
root ::= "{" ws "\"name\":" ws str "," ws "\"tags\":" ws "[" (str ("," ws str)*)? "]" ws "}"
str ::= "\"" [^"\\\x00-\x1F]{0,12} "\""
ws ::= " "?
)";

bool is_eog(const Tokenizer& tok, int32_t id) { return tok.is_eog(id); }

// Walks random paths through the grammar; at each state compares the mask with a
// token-by-token check of every vocabulary entry.
void check_masks_match_bruteforce(const std::string& model_file) {
  const auto tok = load_tokenizer(model_file);
  const auto g = Grammar::compile(kJsonish);
  auto trie = std::make_shared<const grammar::TokenTrie>(*tok, false);
  grammar::TokenMasker masker(g, trie);
  std::mt19937 rng(7);
  for (int walk = 0; walk < 6; ++walk) {
    GrammarMatcher m(g);
    for (int step = 0; step < 40; ++step) {
      const std::vector<uint64_t> bits = masker.mask(m);
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < tok->n_vocab(); ++id) {
        const bool in_mask = (bits[size_t(id) / 64] >> (id % 64)) & 1;
        bool expected;
        if (is_eog(*tok, id)) {
          expected = m.can_end();
        } else {
          const std::string piece = tok->token_to_piece(id, false);
          GrammarMatcher probe = m;
          expected = !piece.empty() && probe.accept_bytes(piece);
        }
        ASSERT_EQ(in_mask, expected) << model_file << " token " << id << " '" << tok->token_to_piece(id) << "'";
        if (expected) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      const int32_t pick = allowed[rng() % allowed.size()];
      if (is_eog(*tok, pick)) break;
      ASSERT_TRUE(masker.accept(m, pick));
    }
  }
  EXPECT_GT(masker.cached_masks(), 10u);
}

TEST(TokenMasker, MasksMatchTokenByTokenCheckSentencePiece) { check_masks_match_bruteforce("stories260K.gguf"); }
TEST(TokenMasker, MasksMatchTokenByTokenCheckCodeModel) { check_masks_match_bruteforce("codelm-16m-f16.gguf"); }

TEST(TokenMasker, ForcedTokensSpellTheForcedBytes) {
  const auto tok = load_tokenizer("codelm-16m-f16.gguf");
  const auto g = Grammar::compile(R"(root ::= "{\"description\": \"" [a-z]+ "\"}")");
  grammar::TokenMasker masker(g, std::make_shared<const grammar::TokenTrie>(*tok, false));
  GrammarMatcher m(g);
  std::vector<int32_t> forced;
  masker.forced_tokens(m, 16, forced);
  ASSERT_FALSE(forced.empty());
  std::string spelled;
  for (const int32_t t : forced) spelled += tok->token_to_piece(t);
  EXPECT_EQ(spelled, "{\"description\": \"");
  // Each forced token is allowed where it stands.
  for (const int32_t t : forced) ASSERT_TRUE(masker.accept(m, t));
  forced.clear();
  masker.forced_tokens(m, 16, forced);
  EXPECT_TRUE(forced.empty());  // [a-z]+ leaves a choice
  // At the end only "\"}" and then the end of generation remain.
  ASSERT_TRUE(m.accept_bytes("abc"));
  std::vector<int32_t> tail;
  masker.forced_tokens(m, 16, tail);
  EXPECT_TRUE(tail.empty());  // more letters or the quote: still a choice
  ASSERT_TRUE(m.accept_bytes("\""));
  masker.forced_tokens(m, 16, tail);
  ASSERT_EQ(tail.size(), 2u);
  EXPECT_EQ(tok->token_to_piece(tail[0]), "}");
  EXPECT_TRUE(tok->is_eog(tail[1]));
}

TEST(TokenMasker, ApplySetsDisallowedLogitsToMinusInfinity) {
  const auto tok = load_tokenizer("stories260K.gguf");
  const auto g = Grammar::compile(R"(root ::= [0-9]+)");
  grammar::TokenMasker masker(g, std::make_shared<const grammar::TokenTrie>(*tok, false));
  GrammarMatcher m(g);
  const std::vector<float> raw(size_t(tok->n_vocab()) + 3, 1.0f);  // with padding beyond the vocabulary
  std::vector<float> logits(raw.size());
  const size_t allowed = masker.apply(m, raw, logits);
  ASSERT_GT(allowed, 0u);
  size_t finite = 0;
  for (int32_t id = 0; id < tok->n_vocab(); ++id) {
    if (!std::isfinite(logits[size_t(id)])) continue;
    ++finite;
    const std::string piece = tok->token_to_piece(id);
    EXPECT_TRUE(!piece.empty() && piece.find_first_not_of("0123456789") == std::string::npos) << piece;
  }
  EXPECT_EQ(finite, allowed);
  for (size_t t = size_t(tok->n_vocab()); t < logits.size(); ++t) EXPECT_FALSE(std::isfinite(logits[t]));
  // A state that allows most tokens takes the other path through apply().
  const auto any = Grammar::compile(R"(root ::= [^\x00]{0,5})");
  grammar::TokenMasker wide(any, std::make_shared<const grammar::TokenTrie>(*tok, false));
  GrammarMatcher wm(any);
  const size_t wide_allowed = wide.apply(wm, raw, logits);
  size_t wide_finite = 0;
  for (int32_t id = 0; id < tok->n_vocab(); ++id) wide_finite += std::isfinite(logits[size_t(id)]) ? 1 : 0;
  EXPECT_EQ(wide_finite, wide_allowed);
  EXPECT_GT(2 * wide_allowed, size_t(tok->n_vocab()));
}

}  // namespace
}  // namespace fdl

namespace fdl {
namespace {

TEST(TokenMasker, MasksAgreeWithTheMatcherAtItsDepthBound) {
  const auto tok = load_tokenizer("stories260K.gguf");
  const auto g = Grammar::compile(R"g(root ::= "[" root "]" | "x")g");
  grammar::TokenMasker masker(g, std::make_shared<const grammar::TokenTrie>(*tok, false));
  GrammarMatcher m(g);
  size_t depth = 0;
  while (m.accept_byte('[')) ++depth;
  EXPECT_LT(depth, GrammarMatcher::kMaxStackDepth + 2);
  const std::vector<uint64_t> bits = masker.mask(m);
  for (int32_t id = 0; id < tok->n_vocab(); ++id) {
    if (!((bits[size_t(id) / 64] >> (id % 64)) & 1)) continue;
    GrammarMatcher probe = m;
    EXPECT_TRUE(masker.accept(probe, id)) << "token " << id << " '" << tok->token_to_piece(id) << "'";
  }
}

TEST(TokenMasker, AMaskOfAHostileGrammarIsBoundedInTime) {
  const auto tok = load_tokenizer("codelm-16m-f16.gguf");
  std::string gbnf = "root ::= ";
  for (int i = 0; i < 4000; ++i) gbnf += (i ? " | " : "") + std::string("[a-f]* \"xxxxx") + std::to_string(i) + "\"";
  const auto g = Grammar::compile(gbnf);
  grammar::TokenMasker masker(g, std::make_shared<const grammar::TokenTrie>(*tok, false));
  GrammarMatcher m(g);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    masker.mask(m);
  } catch (const GrammarError& e) {
    EXPECT_NE(std::string(e.what()).find("too much work"), std::string::npos);
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
}

}  // namespace
}  // namespace fdl
