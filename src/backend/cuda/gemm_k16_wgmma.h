// gemm_k16_wgmma.h — the batch-invariant GEMM (gemm_k16.h) on Hopper's warpgroup MMA: 64- or
// 128-token x 128- or 192-feature tiles of wgmma m64nNk16 steps, operands by TMA, persistent blocks;
// the same chains and fold as every other gemm_k16 kernel, so the same bits (gemm_k16_wgmma.cu
// says why).
//
// Shapes and types as gemm_k16: W F16 or BF16 [rows][cols] with cols % 8 == 0, X n >= 1 rows
// of cols elements of W's type, Y fp32 [n][rows]; W and X 16-byte aligned (gemm_k16 checks).
// Errors: CudaError where gemm_k16_wgmma_available() is false, where the driver cannot encode
// the tensor maps, or for a failed launch.
// Thread-safety: enqueues on `stream`; allocates nothing (graph-capturable).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

/// Whether this build holds the sm_90a code (CMAKE_CUDA_ARCHITECTURES with 90a) and the
/// device current at the first call is compute capability 9.0 (decided once per process).
bool gemm_k16_wgmma_available();

/// Tiles of `token_rows` tokens (64 or 128) x `features` (128; 192 with 128 tokens, unsplit).
/// With `split` (128 features), each K segment of a tile is a work item of its own that writes
/// its chain to Y + s * n * W.rows instead (Y: the caller's workspace of segments x n x W.rows
/// floats; the caller adds the segments in order).
void gemm_k16_wgmma(const DeviceMatrix& W, const uint16_t* X, int n, float* Y, cudaStream_t stream, int token_rows,
                    int features, bool split);

/// Whether 128-token tiles of 192 features should finish n tokens of a rows-row matrix sooner
/// than tiles of 128 (by the rounds of tiles the SMs run; speed only).
bool gemm_k16_wgmma_prefers_wide(int64_t rows, int n);

}  // namespace fdl::cuda
