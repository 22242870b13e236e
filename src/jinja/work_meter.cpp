#include "jinja/work_meter.h"

#include "jinja/value.h"

namespace fdl::jinja {
namespace {

thread_local WorkMeter* installed = nullptr;

}  // namespace

WorkMeter::WorkMeter(int64_t budget) : left_(budget), outer_(installed) { installed = this; }

WorkMeter::~WorkMeter() { installed = outer_; }

void WorkMeter::charge(int64_t units) {
  WorkMeter* m = installed;
  if (m == nullptr) return;
  m->left_ -= units;
  if (m->left_ < 0)
    throw TemplateError("the template does too much work with its values (a value printed, serialized, compared "
                        "or filtered past the rendering's budget: 32 MiB handled, 512 MiB copied or 2M elements)");
}

}  // namespace fdl::jinja
