// work_meter.h — the bound on one rendering's work with values.
// A template is untrusted input. Lists and namespaces are shared, not copied, so a few `set`
// statements build a value whose printing, serialization or comparison takes time exponential in
// the template's size (a list holding itself twice, thirty times over); and one loop can run a
// filter over a million-element list at each of its iterations. The rendering installs a meter
// (render.cpp); those walks charge it, and the rendering fails with TemplateError once the
// budget is spent instead of running for hours.
// Units: one per byte handled one at a time (quoted, filtered), one per 16 bytes copied whole
// (concatenation), kElement per element visited or compared. Sanitized builds make the first and
// the last far dearer than copying, and the budget keeps them to a few seconds there.
// Thread-safety: the installed meter is per thread, as a rendering runs on one thread.
#pragma once

#include <cstdint>

namespace fdl::jinja {

class WorkMeter {
 public:
  /// What visiting or comparing one element costs, in bytes handled.
  static constexpr int64_t kElement = 16;
  /// Bytes copied whole per unit.
  static constexpr int64_t kCopiedBytesPerUnit = 16;
  /// A rendering's budget: 32 MiB handled byte by byte, 512 MiB copied, or 2M elements visited
  /// (a fraction of a second natively, a few seconds under ASan and fuzzing instrumentation).
  static constexpr int64_t kRenderBudget = int64_t(1) << 25;

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

 private:
  int64_t left_;
  WorkMeter* outer_;
};

}  // namespace fdl::jinja
