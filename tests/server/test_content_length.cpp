// The Content-Length check the server runs before the body is read (server/content_length.h):
// decimal digits only, 400 naming the header otherwise, 413 over the limit; never another
// exception, never a saturated or partly parsed value.
#include <gtest/gtest.h>

#include <string>

#include "server/content_length.h"
#include "server/openai_error.h"

namespace fdl::server {
namespace {

int status_of(const std::string& value, size_t max_bytes) {
  try {
    check_content_length(value, max_bytes);
  } catch (const ApiError& e) {
    EXPECT_EQ(e.param(), e.status() == 400 ? "Content-Length" : "") << value;
    EXPECT_FALSE(std::string(e.what()).empty());
    return e.status();
  }
  return 200;
}

TEST(ContentLength, DecimalDigitsUpToTheLimitAreAccepted) {
  EXPECT_EQ(status_of("0", 100), 200);
  EXPECT_EQ(status_of("100", 100), 200);
  EXPECT_EQ(status_of("0007", 100), 200);  // leading zeros are still digits
  EXPECT_EQ(status_of("1099511627776", size_t(1) << 40), 200);
}

TEST(ContentLength, AnythingButDigitsIsABadRequest) {
  for (const char* v : {"", "-1", "+5", "1e3", "12abc", "0x10", " 31", "31 ", "3 1", "1.0", "abc", "\t7"})
    EXPECT_EQ(status_of(v, 100), 400) << "'" << v << "'";
  // Past 19 digits a value could not fit in 64 bits: refused, not saturated.
  EXPECT_EQ(status_of("99999999999999999999999", ~size_t(0)), 400);
  EXPECT_EQ(status_of(std::string(200, '9'), ~size_t(0)), 400);
}

TEST(ContentLength, OverTheLimitIsTooLarge) {
  EXPECT_EQ(status_of("101", 100), 413);
  EXPECT_EQ(status_of("9999999999999999999", 65536), 413);  // 19 digits: parsed exactly
}

TEST(ContentLength, TheMessageQuotesALongValueShortened) {
  try {
    check_content_length(std::string(1000, 'x'), 10);
    FAIL() << "accepted";
  } catch (const ApiError& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);
  }
}

}  // namespace
}  // namespace fdl::server
