// cuda_model_factory.h — the entry points of the CUDA backend that the rest of the engine may
// call. Plain C++ (no CUDA headers), so src/loader can include it in every build; the
// definitions exist only when the project is built with FLASHDLLM_CUDA (Model::load in
// src/loader calls them under FLASHDLLM_HAVE_CUDA).
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "flashdllm/gguf.h"
#include "flashdllm/model.h"

namespace fdl::cuda {

/// True when a CUDA device can be used; otherwise false with a one-line reason in *why
/// (no device, driver too old, ...). Cheap after the first call. Thread-safe.
bool device_available(std::string* why = nullptr);

/// Loads a Llama-family model onto GPU 0 (see cuda_model.h) from `file` (a mapped GGUF, or a
/// Hugging Face directory read as one); check device_available() first. Throws ModelError with
/// a one-line message when the weights do not fit or the device fails.
std::unique_ptr<Model> make_cuda_model(GgufFile file, const ModelOptions& opt);

}  // namespace fdl::cuda
