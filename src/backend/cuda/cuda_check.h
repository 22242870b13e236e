// cuda_check.h — turn CUDA runtime and cuBLAS status codes into exceptions that name the call
// site, so no error code is silently dropped (METHOD.md: exit code 0 proves nothing).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace fdl::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  throw CudaError(std::string("CUDA error in ") + what + " (" + file + ":" + std::to_string(line) +
                  "): " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}
[[noreturn]] inline void throw_cublas(cublasStatus_t s, const char* what, const char* file, int line) {
  throw CudaError(std::string("cuBLAS error in ") + what + " (" + file + ":" + std::to_string(line) +
                  "): status " + std::to_string(int(s)));
}

}  // namespace fdl::cuda

#define FDL_CUDA_CHECK(call)                                                      \
  do {                                                                            \
    const cudaError_t fdl_e_ = (call);                                            \
    if (fdl_e_ != cudaSuccess) ::fdl::cuda::throw_cuda(fdl_e_, #call, __FILE__, __LINE__); \
  } while (0)

/// After a kernel launch: launch-configuration errors surface here.
#define FDL_CUDA_CHECK_LAUNCH() FDL_CUDA_CHECK(cudaGetLastError())

#define FDL_CUBLAS_CHECK(call)                                                        \
  do {                                                                                \
    const cublasStatus_t fdl_s_ = (call);                                             \
    if (fdl_s_ != CUBLAS_STATUS_SUCCESS) ::fdl::cuda::throw_cublas(fdl_s_, #call, __FILE__, __LINE__); \
  } while (0)
