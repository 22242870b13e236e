// launch.h — kernel launches with programmatic dependent launch (PDL, sm_90).
//
// Decode is a chain of ~10 short kernels per layer; between two of them the GPU would idle
// while the next grid is launched and its blocks ramp up. With PDL the next kernel is
// launched while the previous one drains: it runs its prologue (for the GEMV: issuing its
// first weight loads, which depend on nothing) and then waits in grid_dependency_wait() until
// the previous grid has finished and its writes are visible. Rule for every kernel launched
// this way: touch nothing a previous kernel writes or reads before grid_dependency_wait().
// FLASHDLLM_PDL=0 turns the attribute off (plain stream order), for A/B timing.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_check.h"

namespace fdl::cuda {

inline bool pdl_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("FLASHDLLM_PDL");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  FDL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}

/// An attribute of the device current at the first call, read once per process (per `attr`):
/// launchers size grids with it on every call, and a process runs its kernels on one device.
/// Throws CudaError.
inline int device_attribute_once(cudaDeviceAttr attr) {
  auto read = [](cudaDeviceAttr a) {
    int dev = 0, v = 0;
    FDL_CUDA_CHECK(cudaGetDevice(&dev));
    FDL_CUDA_CHECK(cudaDeviceGetAttribute(&v, a, dev));
    return v;
  };
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: {
      static const int sms = read(attr);
      return sms;
    }
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: {
      static const int optin = read(attr);
      return optin;
    }
    default: return read(attr);
  }
}

}  // namespace fdl::cuda

#ifdef __CUDACC__
/// Lets the next kernel in the stream launch now (its blocks start once ours are all
/// resident, and wait for our completion in grid_dependency_wait before touching our data).
__device__ __forceinline__ void launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
/// Waits until the grids this one depends on have completed (no-op without PDL).
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
#endif
