// Model::load: the one place that knows every backend and every model source. It reads a GGUF
// file or a Hugging Face directory (src/hf) into a GgufFile, and picks the CPU model
// (src/model) or the CUDA backend (src/backend/cuda) by ModelOptions::device, so none of those
// modules depends on another.
#include <memory>
#include <string>

#include "backend/cuda/cuda_model_factory.h"
#include "flashdllm/model.h"
#include "hf/hf_checkpoint.h"
#include "hf/hf_config.h"
#include "hf/safetensors.h"
#include "model/llama_model.h"

namespace fdl {

GgufFile Model::open_file(const std::filesystem::path& path, GgufBacking backing) {
  if (path.extension() == ".safetensors" || path.filename() == "config.json")
    throw ModelError(path.string() + ": pass the Hugging Face model directory that holds it, not the file");
  if (!hf::is_hf_directory(path)) return GgufFile::open(path, {}, backing);
  try {
    return hf::open_hf_directory(path);
  } catch (const hf::HfError& e) {
    throw ModelError(e.what());
  } catch (const hf::SafetensorsError& e) {
    throw ModelError(e.what());
  }
}

std::unique_ptr<Model> Model::load(const std::filesystem::path& path, const ModelOptions& opt) {
  if (opt.n_threads < 0)
    throw ModelError("Model::load: n_threads must be >= 0 (0 = all cores), got " +
                     std::to_string(opt.n_threads));
  if (opt.n_ctx < 0)
    throw ModelError("Model::load: n_ctx must be >= 0 (0 = the model's trained context), got " +
                     std::to_string(opt.n_ctx));
  const auto open = [&](GgufBacking backing) { return open_file(path, backing); };
  if (opt.device == Device::Cuda) {
#ifdef FLASHDLLM_HAVE_CUDA
    std::string why;
    if (!cuda::device_available(&why)) throw ModelError("--device cuda: " + why);
    // The weights are copied to the GPU once, so the zero-copy mapping is the cheapest source.
    return cuda::make_cuda_model(open(GgufBacking::Mmap), opt);
#else
    throw ModelError("--device cuda: this build has no CUDA backend (configure with nvcc on the PATH "
                     "and -DFLASHDLLM_CUDA=ON)");
#endif
  }
  if (opt.kv_dtype && *opt.kv_dtype != KvDtype::F32)
    throw ModelError(std::string("--kv-cache-dtype ") + kv_dtype_name(*opt.kv_dtype) +
                     ": the CPU backend keeps an f32 KV cache (16-bit caches are --device cuda only; use "
                     "--kv-cache-dtype auto or f32)");
  return std::make_unique<LlamaModel>(open(opt.weights), opt);
}

}  // namespace fdl
