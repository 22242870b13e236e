// Model::load: the one place that knows every backend. It picks the CPU model (src/model) or
// the CUDA backend (src/backend/cuda) by ModelOptions::device, so neither of those modules
// depends on the other.
#include <memory>
#include <string>

#include "backend/cuda/cuda_model_factory.h"
#include "flashdllm/model.h"
#include "model/llama_model.h"

namespace fdl {

std::unique_ptr<Model> Model::load(const std::filesystem::path& path, const ModelOptions& opt) {
  if (opt.n_threads < 0)
    throw ModelError("Model::load: n_threads must be >= 0 (0 = all cores), got " +
                     std::to_string(opt.n_threads));
  if (opt.device == Device::Cuda) {
#ifdef FLASHDLLM_HAVE_CUDA
    return cuda::make_cuda_model(path, opt);
#else
    throw ModelError("--device cuda: this build has no CUDA backend (configure with nvcc on the PATH "
                     "and -DFLASHDLLM_CUDA=ON)");
#endif
  }
  if (opt.kv_dtype && *opt.kv_dtype != KvDtype::F32)
    throw ModelError(std::string("--kv-cache-dtype ") + kv_dtype_name(*opt.kv_dtype) +
                     ": the CPU backend keeps an f32 KV cache (16-bit caches are --device cuda only; use "
                     "--kv-cache-dtype auto or f32)");
  return std::make_unique<LlamaModel>(GgufFile::open(path, {}, opt.weights), opt);
}

}  // namespace fdl
