// One JSON value's syntax, checked a byte at a time (json_scanner.h).
#include "server/json_scanner.h"

namespace fdl::server {
namespace {

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

JsonScanner::Step JsonScanner::value_done() {
  if (stack_.empty()) {
    state_ = State::End;
    return Step::Done;
  }
  state_ = State::AfterValue;
  return Step::More;
}

// A byte that cannot extend the number in progress: the number ends before it when it is
// complete, and the byte is then read in the state after the number.
JsonScanner::Step JsonScanner::number_ended(char c) {
  if (stack_.empty()) {
    state_ = State::End;
    return Step::DoneBefore;
  }
  state_ = State::AfterValue;
  return feed(c);
}

JsonScanner::Step JsonScanner::feed(char c) {
  switch (state_) {
    case State::Value:
    case State::ArrayFirst:
      if (is_ws(c)) return Step::More;
      started_ = true;
      if (state_ == State::ArrayFirst && c == ']') {
        stack_.pop_back();
        return value_done();
      }
      switch (c) {
        case '{':
          stack_.push_back('{');
          state_ = State::ObjectFirst;
          return Step::More;
        case '[':
          stack_.push_back('[');
          state_ = State::ArrayFirst;
          return Step::More;
        case '"':
          string_role_ = StringRole::Value;
          state_ = State::String;
          return Step::More;
        case '-':
          state_ = State::NumSign;
          return Step::More;
        case '0':
          state_ = State::NumZero;
          return Step::More;
        case 't':
          literal_ = "rue";
          state_ = State::Literal;
          return Step::More;
        case 'f':
          literal_ = "alse";
          state_ = State::Literal;
          return Step::More;
        case 'n':
          literal_ = "ull";
          state_ = State::Literal;
          return Step::More;
        default:
          if (c >= '1' && c <= '9') {
            state_ = State::NumInt;
            return Step::More;
          }
          return fail();
      }
    case State::ObjectFirst:
    case State::Key:
      if (is_ws(c)) return Step::More;
      if (c == '"') {
        string_role_ = StringRole::Key;
        state_ = State::String;
        return Step::More;
      }
      if (c == '}' && state_ == State::ObjectFirst) {
        stack_.pop_back();
        return value_done();
      }
      return fail();
    case State::Colon:
      if (is_ws(c)) return Step::More;
      if (c != ':') return fail();
      state_ = State::Value;
      return Step::More;
    case State::AfterValue:
      if (is_ws(c)) return Step::More;
      if (c == ',') {
        state_ = stack_.back() == '{' ? State::Key : State::Value;
        return Step::More;
      }
      if ((c == '}' && stack_.back() == '{') || (c == ']' && stack_.back() == '[')) {
        stack_.pop_back();
        return value_done();
      }
      return fail();
    case State::String:
      if (c == '"') {
        if (string_role_ == StringRole::Key) {
          state_ = State::Colon;
          return Step::More;
        }
        return value_done();
      }
      if (c == '\\') {
        state_ = State::Escape;
        return Step::More;
      }
      if (static_cast<unsigned char>(c) < 0x20) return fail();
      return Step::More;
    case State::Escape:
      if (c == 'u') {
        hex_left_ = 4;
        state_ = State::Unicode;
        return Step::More;
      }
      if (c != '"' && c != '\\' && c != '/' && c != 'b' && c != 'f' && c != 'n' && c != 'r' && c != 't')
        return fail();
      state_ = State::String;
      return Step::More;
    case State::Unicode:
      if (!is_hex(c)) return fail();
      if (--hex_left_ == 0) state_ = State::String;
      return Step::More;
    case State::Literal:
      if (c != *literal_) return fail();
      if (*++literal_ == '\0') return value_done();
      return Step::More;
    case State::NumSign:
      if (c == '0') {
        state_ = State::NumZero;
        return Step::More;
      }
      if (c >= '1' && c <= '9') {
        state_ = State::NumInt;
        return Step::More;
      }
      return fail();
    case State::NumZero:
    case State::NumInt:
      if (is_digit(c) && state_ == State::NumInt) return Step::More;
      if (c == '.') {
        state_ = State::NumDot;
        return Step::More;
      }
      if (c == 'e' || c == 'E') {
        state_ = State::NumExp;
        return Step::More;
      }
      return number_ended(c);
    case State::NumDot:
      if (!is_digit(c)) return fail();
      state_ = State::NumFrac;
      return Step::More;
    case State::NumFrac:
      if (is_digit(c)) return Step::More;
      if (c == 'e' || c == 'E') {
        state_ = State::NumExp;
        return Step::More;
      }
      return number_ended(c);
    case State::NumExp:
      if (c == '+' || c == '-') {
        state_ = State::NumExpSign;
        return Step::More;
      }
      [[fallthrough]];
    case State::NumExpSign:
      if (!is_digit(c)) return fail();
      state_ = State::NumExpInt;
      return Step::More;
    case State::NumExpInt:
      if (is_digit(c)) return Step::More;
      return number_ended(c);
    case State::End:
    case State::Failed:
      return fail();
  }
  return fail();
}

bool JsonScanner::complete_at_end() const {
  if (state_ == State::End) return true;
  const bool number_complete = state_ == State::NumZero || state_ == State::NumInt || state_ == State::NumFrac ||
                               state_ == State::NumExpInt;
  return number_complete && stack_.empty();
}

}  // namespace fdl::server
