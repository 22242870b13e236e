// Device discovery and the CUDA model factory (see cuda_model_factory.h).
#include "backend/cuda/cuda_model_factory.h"

#include <mutex>

#include "backend/cuda/cuda_model.h"

namespace fdl::cuda {

bool device_available(std::string* why) {
  static std::once_flag once;
  static bool ok = false;
  static std::string reason;
  std::call_once(once, [] {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      // Without an NVIDIA driver the runtime reports an "insufficient" driver.
      reason = std::string("no usable CUDA device (no NVIDIA GPU/driver, or a driver older than this "
                           "build's CUDA runtime: ") + cudaGetErrorString(e) + ")";
      cudaGetLastError();  // clear the sticky-free error so later calls start clean
      return;
    }
    if (count == 0) {
      reason = "no CUDA device found";
      return;
    }
    ok = true;
  });
  if (!ok && why) *why = reason;
  return ok;
}

std::unique_ptr<Model> make_cuda_model(GgufFile file, const ModelOptions& opt) {
  const std::string path = file.path();
  try {
    return std::make_unique<CudaModel>(std::move(file), opt);
  } catch (const CudaError& e) {
    throw ModelError(path + ": --device cuda: " + e.what());
  }
}

}  // namespace fdl::cuda
