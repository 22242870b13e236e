// json_scanner.h — internal: checks the syntax of one JSON value as its text arrives, one
// byte at a time, so a tool call's arguments can be streamed while they are written and a
// broken call is noticed at the byte that breaks it.
//
// It is a recognizer, not a parser: it builds nothing and keeps only the nesting (a stack of
// object/array) and its place inside the current token. Accepted syntax is RFC 8259's: any
// value, whitespace around tokens, strings with the standard escapes (\uXXXX checked for four
// hex digits, pairing of surrogates not checked), no control bytes below 0x20 inside strings,
// numbers as -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?. Bytes of 0x80 and above are taken
// as they come inside strings (UTF-8 is not validated here) and refused elsewhere.
//
// Errors: none thrown; feed() answers Error at the first byte that cannot continue a value,
// and the scanner stays in that state.
// Thread-safety: one scanner is one value's state; not thread-safe, cheap to copy.
#pragma once

#include <cstdint>
#include <vector>

namespace fdl::server {

class JsonScanner {
 public:
  enum class Step {
    More,        ///< the byte belongs to the value, which is not complete yet
    Done,        ///< the byte completed the value (a closing brace, bracket, quote or literal)
    DoneBefore,  ///< the value (a number) was already complete: the byte is not part of it
    Error,       ///< the byte cannot continue a value
  };

  /// Feeds the next byte. Leading whitespace before the value is skipped (More). After Done,
  /// DoneBefore or Error, further bytes answer Error.
  Step feed(char c);
  /// Whether the text so far is a complete value, were it to end here (only numbers, whose
  /// end is seen at the next byte, can be complete while feed() still said More).
  bool complete_at_end() const;
  /// Whether any byte of the value itself (not leading whitespace) has been seen.
  bool started() const { return started_; }

 private:
  enum class State : uint8_t {
    Value,        // expecting a value (leading whitespace allowed)
    ArrayFirst,   // after '[': a value or ']'
    ObjectFirst,  // after '{': a key or '}'
    Key,          // after ',' in an object: a key
    Colon,        // after a key: ':'
    AfterValue,   // inside a container after a member value: ',' or the closer
    String,       // inside a string
    Escape,       // after a backslash inside a string
    Unicode,      // inside \uXXXX (hex_left_ digits to go)
    NumSign,      // after '-'
    NumZero,      // after a leading 0
    NumInt,       // inside the integer digits
    NumDot,       // after '.'
    NumFrac,      // inside the fraction digits
    NumExp,       // after 'e' / 'E'
    NumExpSign,   // after the exponent's sign
    NumExpInt,    // inside the exponent digits
    Literal,      // inside true / false / null
    End,          // the value is complete
    Failed,
  };
  // What a completed string was: a key (':' follows) or a value.
  enum class StringRole : uint8_t { Key, Value };

  Step value_done();  // a scalar or container just completed
  Step number_ended(char c);
  Step fail() {
    state_ = State::Failed;
    return Step::Error;
  }

  State state_ = State::Value;
  StringRole string_role_ = StringRole::Value;
  std::vector<char> stack_;  // '{' or '[' per open container
  const char* literal_ = nullptr;  // the rest of true/false/null still to match
  int hex_left_ = 0;
  bool started_ = false;
};

}  // namespace fdl::server
