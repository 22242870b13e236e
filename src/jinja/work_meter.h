// work_meter.h — the bound on one rendering's work with values.
// A template is untrusted input, and so is the conversation it renders. Lists and namespaces
// are shared, not copied, so a few `set` statements build a value whose printing,
// serialization or comparison takes time exponential in the template's size (a list holding
// itself twice, thirty times over); and one loop can run a filter over a million-element list
// at each of its iterations. The rendering installs a meter (render.cpp); the walks over values
// charge it, and the rendering fails with TemplateError once the budget is spent instead of
// running for hours. Operations that take constant time (a list's length, a type test, a
// lookup) are not charged.
// Units: one per byte handled one at a time (quoted, filtered), one per 16 bytes copied whole
// (concatenation, comparison), kElement per element visited. The budget grows with the
// rendering's input, so that long conversations through templates that do quadratic work on
// them (a prompt built by concatenation, a scan of all messages at each message) still render.
// Thread-safety: the installed meter is per thread, as a rendering runs on one thread; a
// rendering inside another has its own meter, and its work is not charged to the outer one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace fdl::jinja {

class WorkMeter {
 public:
  /// What visiting one element costs, in bytes handled.
  static constexpr int64_t kElement = 16;
  /// Bytes copied whole per unit.
  static constexpr int64_t kCopiedBytesPerUnit = 16;
  /// A rendering's budget before its input counts: 32 MiB handled byte by byte, 512 MiB
  /// copied, or 2M elements visited (a fraction of a second natively, a few seconds under ASan
  /// and fuzzing instrumentation).
  static constexpr int64_t kBaseBudget = int64_t(1) << 25;
  /// Units added per byte of input (the strings and elements of the rendering's variables).
  static constexpr int64_t kBudgetPerInputByte = 256;
  /// The longest string a rendering makes (one value or the whole output).
  static constexpr size_t kMaxText = size_t(64) << 20;

  /// kBaseBudget + kBudgetPerInputByte * input_bytes.
  static int64_t budget_for(int64_t input_bytes);

  /// Installs a meter of `budget` units as this thread's until it is destroyed (the meter it
  /// replaced, if any, is installed again then).
  explicit WorkMeter(int64_t budget);
  ~WorkMeter();
  WorkMeter(const WorkMeter&) = delete;
  WorkMeter& operator=(const WorkMeter&) = delete;

  /// Charges `units` to this thread's meter: TemplateError once its budget is spent. Without an
  /// installed meter (a value used outside a rendering) nothing is bounded.
  static void charge(int64_t units);
  /// charge(n * kElement).
  static void charge_elements(int64_t n) { charge(n * kElement); }
  /// Charges `bytes` copied whole.
  static void charge_copy(int64_t bytes) { charge(bytes / kCopiedBytesPerUnit); }
  /// A string of `bytes` is about to be made: TemplateError past kMaxText, else charged as
  /// copied.
  static void make_text(size_t bytes);
  /// out += piece, refused past kMaxText and charged for the piece: for strings that grow
  /// piece by piece (format, join, replace), checked before each piece is added.
  static void append_text(std::string& out, std::string_view piece);
  /// Where `needle` is in `hay` at or after `from` (npos if nowhere), in time linear in their
  /// sizes (std::string::find is quadratic on repetitive text); charged for the bytes scanned.
  static size_t find_text(std::string_view hay, std::string_view needle, size_t from = 0);

 private:
  int64_t budget_;
  int64_t left_;
  WorkMeter* outer_;
};

}  // namespace fdl::jinja
