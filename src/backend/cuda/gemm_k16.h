// gemm_k16.h — the batch-invariant projection of the CUDA backend.
//
// Y[t][r] = S_0 + S_1 + ... (fp32, left to right; Y = S_0 for one segment), where S_s is the
// chain over the k16 blocks b of K segment s (kGemmK16Segment elements: [1024 s, 1024 s + 1024)
// of W.cols), in order, of the tensor-core step acc = mma.m16n8k16(X[t][16b .. 16b+15],
// W[r][16b .. 16b+15], acc), acc starting at +0 (fp32 accumulation of 16-bit products; the
// last block zero-padded when W.cols is not a multiple of 16). The fixed segments give a
// one-token step 4 independent chains per row of a 4096-wide projection (14 for a 14336-wide
// down projection), so the weight stream has enough in flight. Every variant computes exactly this, so a row's bits depend on its own
// activations and the weights only: not on n, on the row's place in the batch, or on the
// variant (gemm_k16.cu says why the chain fixes the bits on sm_90).
//
// Shapes and types: W is F16 or BF16, [W.rows][W.cols] row-major in device memory; X holds n
// rows of W.cols elements of W's type (activations rounded to it once by their producer);
// Y is fp32 [n][W.rows]. Y must not alias X or W.
// Errors: CudaError for other weight types, sizes beyond 32-bit indices, or a failed launch.
// Thread-safety: enqueues on `stream`; nothing is allocated (graph-capturable): the split
// tilings write their segments to a workspace the caller owns.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

/// Elements of K per independent chain (part of the arithmetic: every kernel splits here).
constexpr int kGemmK16Segment = 1024;
/// The register-streaming kernel (tiling 1) takes rows of up to this many segments.
constexpr int kGemmK16StreamMaxSegments = 32;

/// Whether gemm_k16 takes these weights (F16 or BF16).
bool gemm_k16_supported(const DeviceMatrix& W);

/// The kernels that compute it: entry 0 is the reference (any K and alignment, slow), entry 1
/// the register-streaming kernel for few tokens (16 per launch), the others tilings of the
/// tensor-core GEMM (entries >= 1 need W.cols % 8 == 0 and 16-byte-aligned W and X), the last
/// three on warpgroup MMA (only where gemm_k16_tiling_available). They exist side by side for
/// gemm_k16_bench and the invariance tests, which compare their bits.
int gemm_k16_tilings();
/// A tiling's name ("" outside [0, gemm_k16_tilings())).
const char* gemm_k16_tiling_name(int tiling);
/// Whether the tiling runs here: the wgmma tiling needs sm_90a code on an sm_90 GPU.
bool gemm_k16_tiling_available(int tiling);

/// Floats of workspace gemm_k16 needs for n tokens of W with `tiling` (-1: the one it picks
/// when given a workspace): n x W.rows per K segment for the tilings that give each segment
/// its own block (few tokens, long rows: more blocks than features alone would give), else 0.
size_t gemm_k16_workspace_floats(const DeviceMatrix& W, int n, int tiling = -1);

/// `tiling` -1 picks one by the token count (speed only), and the reference where the tiled
/// kernels do not apply; without a `workspace` (device memory of gemm_k16_workspace_floats
/// floats, not aliasing X, Y or W) it picks no split tiling. CudaError for another tiling that
/// does not apply or does not exist, or a split tiling without a workspace.
void gemm_k16(const DeviceMatrix& W, const void* X, int n, float* Y, cudaStream_t stream, int tiling = -1,
              float* workspace = nullptr);

}  // namespace fdl::cuda
