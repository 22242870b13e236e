// Internal: exact GBNF for decimal numbers in a range. A range of integers N in [lo, hi] is
// split, per number of digits, into blocks of digit strings whose positions vary
// independently (e.g. 1[5-9] | [2-8][0-9] | 9[0-3] for 15..93); written with a decimal
// point k digits from the right, the same blocks give the numbers N / 10^k.
#pragma once

#include <string>

namespace fdl::grammar {

__extension__ typedef __int128 Int128;

/// 10^n (n <= 38).
Int128 pow10_128(int n);
/// Decimal text of v.
std::string to_string_128(Int128 v);

/// GBNF for the JSON texts of the values N / 10^k, N in [lo, hi] (lo <= hi, |lo|, |hi| < 10^36):
/// "-" for negatives, no leading zeros, and for k > 0 a fraction of up to k digits — trailing
/// fraction digits may be left out (with the point, when all are) wherever the value they
/// leave is still in the range, so 0.5 and 3 are written as such rather than 0.500000, 3.000000.
/// Zero is written "0" (never "-0").
std::string decimal_range_gbnf(Int128 lo, Int128 hi, int k);

}  // namespace fdl::grammar
