// cpu_features.h — which SIMD kernels this machine can run, decided once at startup.
//
// The AVX2 kernels (files *_avx2.cpp) need AVX2 + FMA + F16C. They are used when the CPU has
// all three, unless the environment variable FLASHDLLM_NO_AVX2 is set to a non-empty value
// other than "0", or force_portable_kernels(true) was called (tests use this to cover the
// portable path on any machine).
//
// Within the AVX2 set, the matmul uses wider token tiles for batches of 4+ tokens when the
// CPU also has AVX-512F and AVX-512VL (32 vector registers; see matmul_driver_avx2.h). Those
// tiles run the same 256-bit arithmetic, so they are bit-identical to the AVX2 tiles:
// switching between them never changes a result, and every batch size uses the same kernel
// family (the same per-output operations). FLASHDLLM_NO_AVX512
// (non-empty, not "0") or force_avx2_tiles(true) keeps the AVX2 tiles.
//
// Thread-safety: all functions are thread-safe. Changing force_portable_kernels or
// force_avx2_tiles while a kernel runs on another thread is allowed; that call may use
// either path.
#pragma once

namespace fdl::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512vl = false;
  bool avx512bw = false;
  bool avx512vnni = false;
};

/// What the CPU supports (detected once, cached).
const CpuFeatures& cpu_features();

/// True if the AVX2/FMA/F16C kernels are in use: the CPU supports them, FLASHDLLM_NO_AVX2
/// is not set, and force_portable_kernels(true) is not in effect.
bool use_avx2_kernels();

/// True where the K-quants' integer kernels may use AVX-512 VNNI (q8k_vnni.cpp, the same sums
/// bit for bit): use_avx512_tiles() and the CPU has AVX-512BW and AVX-512 VNNI.
bool use_avx512_vnni();

/// Forces (true) or releases (false) the portable kernels process-wide. Releasing never
/// enables AVX2 on a CPU without it or when FLASHDLLM_NO_AVX2 is set.
void force_portable_kernels(bool force);

/// True if the matmul uses the AVX-512VL tiles: use_avx2_kernels(), the CPU has AVX-512F and
/// AVX-512VL, FLASHDLLM_NO_AVX512 is not set and force_avx2_tiles(true) is not in effect.
bool use_avx512_tiles();

/// Forces (true) or releases (false) the AVX2 tiles inside the AVX2 kernel set (tests compare
/// the two bit for bit).
void force_avx2_tiles(bool force);

/// Name of the kernel set in use, "avx2" or "portable", for logs and benchmark labels.
const char* kernel_set_name();

}  // namespace fdl::cpu
