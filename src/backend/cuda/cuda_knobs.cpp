// CudaKnobs::from_environment: the one place the CUDA model reads its knobs (cuda_knobs.h).
#include "backend/cuda/cuda_knobs.h"

#include <cstdlib>
#include <string>

namespace fdl::cuda {

namespace {
/// Whether variable `name` is set to exactly `value`.
bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}
}  // namespace

CudaKnobs CudaKnobs::from_environment() {
  CudaKnobs k;
  k.gemm_tune = !env_is("FLASHDLLM_GEMM_TUNE", "0");
  k.graphs = !env_is("FLASHDLLM_CUDA_GRAPHS", "0");
  k.attn_tiles = !env_is("FLASHDLLM_ATTN_TILES", "0");
  k.fuse = !env_is("FLASHDLLM_CUDA_FUSE", "0");
  if (const char* t = std::getenv("FLASHDLLM_ATTN_TC"); t) k.attn_tc = std::string(t) == "1";
  k.decode_tiles = !env_is("FLASHDLLM_DECODE_TILES", "0");
  k.attn_block = !env_is("FLASHDLLM_ATTN_BLOCK", "0");
  k.ffn_block = !env_is("FLASHDLLM_FFN_BLOCK", "0");
  k.output_block = !env_is("FLASHDLLM_OUTPUT_BLOCK", "0");
  k.quant = !env_is("FLASHDLLM_CUDA_QUANT", "0");
  k.gemm_quant = env_is("FLASHDLLM_GEMM_QUANT", "1");
  if (const char* t = std::getenv("FLASHDLLM_DEQUANT_TILE_MB"); t) {
    const int mb = std::atoi(t);
    if (mb >= 1 && mb <= 4096) k.dequant_tile_mb = mb;
  }
  k.decode_trace = env_is("FLASHDLLM_DECODE_TRACE", "1");
  k.profile = env_is("FLASHDLLM_CUDA_PROFILE", "1");
  return k;
}

}  // namespace fdl::cuda
