// families.h — the Family constants, one per file in this directory (the list families.cpp
// searches). Internal to the arch module.
#pragma once

#include "arch/family.h"

namespace fdl::arch {

extern const Family kLlama;
extern const Family kQwen2;
extern const Family kQwen3;
extern const Family kPhi3;
extern const Family kGemma2;
extern const Family kGemma3;

}  // namespace fdl::arch
