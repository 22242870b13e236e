#include "jinja/work_meter.h"

#include <string.h>  // memmem

#include <string>

#include "jinja/value.h"

namespace fdl::jinja {
namespace {

thread_local WorkMeter* installed = nullptr;

}  // namespace

int64_t WorkMeter::budget_for(int64_t input_bytes) { return kBaseBudget + kBudgetPerInputByte * input_bytes; }

WorkMeter::WorkMeter(int64_t budget) : budget_(budget), left_(budget), outer_(installed) { installed = this; }

WorkMeter::~WorkMeter() { installed = outer_; }

void WorkMeter::charge(int64_t units) {
  WorkMeter* m = installed;
  if (m == nullptr) return;
  m->left_ -= units;
  if (m->left_ < 0)
    throw TemplateError("the template does too much work with its values: printing, serializing, comparing, "
                        "copying or filtering them took over " + std::to_string(m->budget_) +
                        " units (a unit: a byte handled, 16 bytes copied; an element visited: 16)");
}

void WorkMeter::make_text(size_t bytes) {
  if (bytes > kMaxText) throw TemplateError("a string longer than 64 MiB");
  charge_copy(int64_t(bytes));
}

void WorkMeter::append_text(std::string& out, std::string_view piece) {
  if (out.size() + piece.size() > kMaxText) throw TemplateError("a string longer than 64 MiB");
  charge_copy(int64_t(piece.size()));
  out += piece;
}

size_t WorkMeter::find_text(std::string_view hay, std::string_view needle, size_t from) {
  if (from > hay.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  // glibc's memmem is the two-way algorithm: linear in both sizes.
  const void* at = ::memmem(hay.data() + from, hay.size() - from, needle.data(), needle.size());
  const size_t pos = at == nullptr ? std::string_view::npos : size_t(static_cast<const char*>(at) - hay.data());
  charge(int64_t((pos == std::string_view::npos ? hay.size() : pos + needle.size()) - from));
  return pos;
}

}  // namespace fdl::jinja
