// The known families and their lookup by GGUF or Hugging Face name (family.h).
#include <array>

#include "arch/families.h"

namespace fdl::arch {
namespace {

const std::array<const Family*, 6>& all() {
  static const std::array<const Family*, 6> families{&kLlama, &kQwen2, &kQwen3, &kPhi3, &kGemma2, &kGemma3};
  return families;
}

}  // namespace

const Family* find_family(std::string_view name) {
  for (const Family* f : all())
    if (f->name == name) return f;
  return nullptr;
}

const Family* find_hf_family(std::string_view model_type) {
  for (const Family* f : all())
    for (std::string_view t : f->hf_model_types)
      if (!t.empty() && t == model_type) return f;
  return nullptr;
}

std::string family_names() {
  std::string s;
  for (const Family* f : all()) s += (s.empty() ? "" : ", ") + std::string(f->name);
  return s;
}

std::string hf_model_type_names() {
  std::string s;
  for (const Family* f : all())
    for (std::string_view t : f->hf_model_types)
      if (!t.empty()) s += (s.empty() ? "" : ", ") + std::string(t);
  return s;
}

}  // namespace fdl::arch
