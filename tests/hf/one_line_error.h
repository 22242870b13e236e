// The error a call must throw, checked to be one line (the hf tests' bad-input contract).
#pragma once

#include <gtest/gtest.h>

#include <exception>
#include <string>

namespace fdl::test {

/// What `call()` throws (its what()), expected on one line; fails the test and returns ""
/// when it throws nothing.
template <class Call>
std::string one_line_error(Call&& call) {
  try {
    call();
  } catch (const std::exception& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no error";
  return {};
}

}  // namespace fdl::test
