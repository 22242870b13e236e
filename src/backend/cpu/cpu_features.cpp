// Runtime CPU feature detection and the process-wide kernel-set switch.
#include "backend/cpu/cpu_features.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace fdl::cpu {
namespace {

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
// CPUID leaf 1 rather than __builtin_cpu_supports("f16c"), which clang before 15 does not know.
bool cpuid_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}
#endif

CpuFeatures detect() {
  CpuFeatures f;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = cpuid_f16c();
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
#endif
  return f;
}

bool env_set(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

// Whether AVX2 kernels could be used at all (hardware + environment), decided once.
bool avx2_allowed() {
  static const bool allowed = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx2 && f.fma && f.f16c && !env_set("FLASHDLLM_NO_AVX2");
  }();
  return allowed;
}

bool avx512_allowed() {
  static const bool allowed = [] {
    const CpuFeatures& f = cpu_features();
    return f.avx512f && f.avx512vl && !env_set("FLASHDLLM_NO_AVX512");
  }();
  return allowed;
}

std::atomic<bool> g_force_portable{false};
std::atomic<bool> g_force_avx2_tiles{false};

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool use_avx2_kernels() {
  return avx2_allowed() && !g_force_portable.load(std::memory_order_relaxed);
}

void force_portable_kernels(bool force) { g_force_portable.store(force, std::memory_order_relaxed); }

bool use_avx512_tiles() {
  return use_avx2_kernels() && avx512_allowed() && !g_force_avx2_tiles.load(std::memory_order_relaxed);
}

bool use_avx512_vnni() {
  const CpuFeatures& f = cpu_features();
  return use_avx512_tiles() && f.avx512bw && f.avx512vnni;
}

void force_avx2_tiles(bool force) { g_force_avx2_tiles.store(force, std::memory_order_relaxed); }

const char* kernel_set_name() { return use_avx2_kernels() ? "avx2" : "portable"; }

}  // namespace fdl::cpu
