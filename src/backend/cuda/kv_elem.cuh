// kv_elem.cuh — element access to the paged KV arena (KvLayerView, kernels.h), whose elements
// are fp32, fp16 or bf16 (KvDtype, flashdllm/kv_dtype.h): loads widen four elements to a
// float4 exactly, stores round an fp32 value to nearest even (IEEE 754 roundTiesToEven, the
// __float2half_rn / __float2bfloat16_rn conversions).
//
// Kernels whose inner loop reads K/V are templated on the element type (KvT = float, __half
// or __nv_bfloat16), so the fp32 kernels compile to what they were; the few stores of a step
// (one token's K and V per layer) branch on kv.dtype at run time instead.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace fdl::cuda {

template <typename KvT>
struct KvElem;

// Raw: four elements as loaded (float4, or the 8 bytes of four 16-bit elements: half the
// registers, so loops that keep several positions' K/V in flight widen them at use).
template <>
struct KvElem<float> {
  using Raw = float4;
  __device__ static Raw zero() { return make_float4(0.f, 0.f, 0.f, 0.f); }
  __device__ static float4 widen(Raw r) { return r; }
  /// Through L2 only (data other blocks of the running kernel wrote).
  __device__ static Raw load_raw_cg(const float* p) { return __ldcg(reinterpret_cast<const float4*>(p)); }
  __device__ static float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
  /// p[0], p[1] = x0, x1 (p 8-byte aligned).
  __device__ static void store2(float* p, float x0, float x1) { *reinterpret_cast<float2*>(p) = make_float2(x0, x1); }
};

// What fp16 and bf16 share: four elements are one 8-byte load; `Self` widens them.
template <typename T, typename Self>
struct Kv16Elem {
  using Raw = uint2;
  __device__ static Raw zero() { return make_uint2(0u, 0u); }
  __device__ static Raw load_raw_cg(const T* p) { return __ldcg(reinterpret_cast<const uint2*>(p)); }
  __device__ static float4 load4(const T* p) { return Self::widen(*reinterpret_cast<const uint2*>(p)); }
};

template <>
struct KvElem<__half> : Kv16Elem<__half, KvElem<__half>> {
  __device__ static float4 widen(uint2 u) {
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
  }
  __device__ static void store2(__half* p, float x0, float x1) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(x0, x1);
  }
};

template <>
struct KvElem<__nv_bfloat16> : Kv16Elem<__nv_bfloat16, KvElem<__nv_bfloat16>> {
  __device__ static float4 widen(uint2 u) {
    // bf16 is the high half of an fp32: widening is a shift.
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
  }
  __device__ static void store2(__nv_bfloat16* p, float x0, float x1) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(x0, x1);
  }
};

/// Element `e` of block `block`'s slot `slot` (0 .. 2 * block_size - 1: K slots, then V) in
/// this layer: the arena's layout, in elements.
__device__ __forceinline__ int64_t kv_index(const KvLayerView& kv, int32_t block, int slot, int64_t e) {
  return int64_t(block) * kv.block_stride + kv.layer_offset + int64_t(slot) * kv.n_head_kv * kv.head_dim + e;
}

/// That element's address, for a cache whose elements are KvT.
template <typename KvT>
__device__ __forceinline__ KvT* kv_ptr(const KvLayerView& kv, int32_t block, int slot, int64_t e) {
  return static_cast<KvT*>(kv.base) + kv_index(kv, block, slot, e);
}

/// Stores two consecutive elements (i even) rounded to kv.dtype.
__device__ __forceinline__ void kv_store2(const KvLayerView& kv, int64_t i, float x0, float x1) {
  switch (kv.dtype) {
    case KvDtype::F32: KvElem<float>::store2(static_cast<float*>(kv.base) + i, x0, x1); break;
    case KvDtype::F16: KvElem<__half>::store2(static_cast<__half*>(kv.base) + i, x0, x1); break;
    case KvDtype::BF16: KvElem<__nv_bfloat16>::store2(static_cast<__nv_bfloat16*>(kv.base) + i, x0, x1); break;
  }
}

/// Stores one element rounded to kv.dtype.
__device__ __forceinline__ void kv_store1(const KvLayerView& kv, int64_t i, float x) {
  switch (kv.dtype) {
    case KvDtype::F32: static_cast<float*>(kv.base)[i] = x; break;
    case KvDtype::F16: static_cast<__half*>(kv.base)[i] = __float2half_rn(x); break;
    case KvDtype::BF16: static_cast<__nv_bfloat16*>(kv.base)[i] = __float2bfloat16_rn(x); break;
  }
}

}  // namespace fdl::cuda
