// Block-quantized weights on the GPU (kernels.h: QType, gemv_quant, dequantize_to_f16, and
// embed_rows' quantized tables).
//  - Activations are rounded to 8 bits per 32 values (Q8Activations), as llama.cpp's MMVQ
//    kernels do (its Q8_1 rounds half away from zero and keeps the float sum of each 32; here
//    ties go to even and the integer sum of each 16 is kept), so the weights are multiplied in
//    integers (dp4a, 16 values an instruction) and scaled in fp32 once per 32-value group:
//    well under one instruction per weight, which keeps a 4-bit row HBM-bound (a float path
//    needs a conversion and an FMA per weight, more than the H200's ~4.7 instructions per
//    Q4_K weight at full bandwidth leave once loads are counted).
//  - Steps of up to kStagedMaxTokens tokens run gemv_quant_staged.cu's kernel where its
//    shared memory holds the activations; longer ones (and longer rows) round them in a kernel
//    of their own into `xq`, then the kernel here reads them from global memory.
//  - Here one warp takes a row, warps striding over the rows; each lane takes pairs lane,
//    lane + 32, ... (quant_pairs.cuh: 64 weights, two whole activation groups) and issues
//    UNROLL pairs' loads before using any, adds them in pair order, then the warp reduces: the
//    staged kernel's order, so a token's result is the same whatever the number of tokens in
//    the call and whichever kernel ran it.
//  - dequantize_to_f16 writes each value as the CPU computes it, rounded to F16: the GEMM
//    path of longer steps sees exactly what F16 weights widened at load would give.
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/embed_id.cuh"
#include "backend/cuda/gemv_quant_staged.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/q8_dot.cuh"
#include "backend/cuda/quant_pairs.cuh"
#include "backend/cuda/quant_units.cuh"

namespace fdl::cuda {
namespace {

using quant::Unit;

constexpr int kRowsPerBlock = 8;

// One warp per 32-value group: lane i rounds value i (q8_dot.cuh: round_group).
__global__ void __launch_bounds__(256) quantize_q8_kernel(const float* __restrict__ X, int n, int cols, int8_t* q,
                                                          float* d, int32_t* s) {
  launch_dependents();
  grid_dependency_wait();
  const int lane = threadIdx.x & 31, groups = cols / 32;
  const int g = blockIdx.x * 8 + threadIdx.x / 32;
  if (g >= n * groups) return;
  // Row t, group gi is group g = t groups + gi of the whole buffer.
  quant::store_group(quant::round_group(X[int64_t(g) * 32 + lane]), g, lane, q, d, s);
}

// Row r's run type and first byte (runs are few; no dynamic indexing, which would copy the
// runs to local memory).
__device__ __forceinline__ const uint8_t* row_of(const QuantRuns& runs, int64_t r, int cols, QType& type) {
  const QuantRun* run = &runs.run[0];
  if (runs.n > 1 && r >= runs.run[0].rows) {
    r -= runs.run[0].rows;
    run = &runs.run[1];
    if (runs.n > 2 && r >= runs.run[1].rows) {
      r -= runs.run[1].rows;
      run = &runs.run[2];
    }
  }
  type = run->type;
  return static_cast<const uint8_t*>(run->data) + r * quant_row_bytes(type, cols);
}

// Row r (of Y's leading dimension ldy) = W's row at `row` times each token's activations: one
// warp, UNROLL pairs per lane (quant_pairs.cuh) loaded before any is used, summed per lane in
// pair order, then reduced over the warp. The first row's loads go out before the PDL wait
// (`waited`).
template <typename F, int NT, int UNROLL>
__device__ __forceinline__ void row_dot(const uint8_t* row, int cols, const Q8Activations& x, int n, float* Y,
                                        int64_t ldy, int64_t r, bool& waited) {
  const int lane = threadIdx.x & 31, pairs = quant::pairs_of(cols);
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  for (int base = 0; base < pairs; base += 32 * UNROLL) {
    typename F::Raw raw[UNROLL];
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
      const int P = base + lane + 32 * i;
      if (P < pairs) F::load(row, P, cols, raw[i]);
    }
    if (!waited) {  // the activations come from the previous kernel; the weights do not
      grid_dependency_wait();
      waited = true;
    }
#pragma unroll
    for (int i = 0; i < UNROLL; ++i) {
      const int P = base + lane + 32 * i;
      if (P >= pairs) break;
#pragma unroll
      for (int t = 0; t < NT; ++t)
        if (t < n)
          F::dot(raw[i], P, cols,
                 quant::Q8Row{x.q + int64_t(t) * cols, x.d + int64_t(t) * (cols / 32), x.s + int64_t(t) * (cols / 16)},
                 acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    float v = acc[t];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0 && t < n) Y[int64_t(t) * ldy + r] = v;
  }
}

// One run of rows of format F, which are rows [y0, y0 + run_rows) of Y (leading dimension
// ldy). The grid is sized to what is resident, not to the rows: warp w takes rows w, w + warps,
// ... (a software pipeline across a warp's rows measured slower: its registers cost a block
// per SM, docs/GPU.md).
template <typename F, int NT, int UNROLL>
__global__ void __launch_bounds__(256, NT <= 2 ? 4 : 2)
    gemv_quant_kernel(const uint8_t* __restrict__ data, int cols, Q8Activations x, float* __restrict__ Y,
                      int64_t run_rows, int64_t y0, int64_t ldy, int n) {
  launch_dependents();
  bool waited = false;
  const int64_t warps = int64_t(gridDim.x) * kRowsPerBlock, row_bytes = quant_row_bytes(F::kType, cols);
  for (int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; r < run_rows; r += warps)
    row_dot<F, NT, UNROLL>(data + r * row_bytes, cols, x, n, Y, ldy, y0 + r, waited);
}

// One thread per unit of rows [row0, row0 + n_rows).
// The unit's 32 values (as the CPU computes them) and where its halves start in the row.
template <typename F>
__device__ __forceinline__ void unit_values(const uint8_t* row, int cols, int u, float* a, float* b, int& pa, int& pb) {
  typename F::Raw raw;
  F::load(row, u, cols, raw);
  Unit w;
  F::unit(raw, u, w);
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    a[i] = quant::value_at(w.qa, i, w.da, w.ma, w.bias, w.is_signed);
    b[i] = quant::value_at(w.qb, i, w.db, w.mb, w.bias, w.is_signed);
  }
  pa = 32 * w.ga + w.oa;
  pb = 32 * w.gb + w.ob;
}

__device__ __forceinline__ void row_unit_values(QType type, const uint8_t* row, int cols, int u, float* a, float* b,
                                                int& pa, int& pb) {
  switch (type) {
    case QType::Q4_K: return unit_values<quant::Q4K>(row, cols, u, a, b, pa, pb);
    case QType::Q5_K: return unit_values<quant::Q5K>(row, cols, u, a, b, pa, pb);
    case QType::Q6_K: return unit_values<quant::Q6K>(row, cols, u, a, b, pa, pb);
    case QType::Q8_0: return unit_values<quant::Q80>(row, cols, u, a, b, pa, pb);
    default: pa = pb = -1; return;
  }
}

__global__ void __launch_bounds__(256) dequantize_f16_kernel(QuantRuns runs, int cols, int64_t row0, int64_t n_rows,
                                                             __half* __restrict__ out) {
  launch_dependents();
  grid_dependency_wait();
  const int units = cols / 32;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_rows * units) return;
  const int64_t r = i / units;
  const int u = int(i % units);
  QType type;
  const uint8_t* row = row_of(runs, row0 + r, cols, type);
  float a[16], b[16];
  int pa, pb;
  row_unit_values(type, row, cols, u, a, b, pa, pb);
  if (pa < 0) return;
  __half* dst = out + r * cols;
  auto store16 = [&](const float* v, int at) {
    __align__(16) __half h[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) h[k] = __float2half_rn(v[k]);
    uint4* p = reinterpret_cast<uint4*>(dst + at);
    p[0] = *reinterpret_cast<const uint4*>(h);
    p[1] = *reinterpret_cast<const uint4*>(h + 8);
  };
  store16(a, pa);
  store16(b, pb);
}

// embed_rows of a quantized table: one block per token, a thread per unit.
__global__ void embed_quant_kernel(QuantRuns runs, int64_t rows, int cols, const int32_t* ids, const int32_t* prev_ids,
                                   float* out, float scale) {
  launch_dependents();
  grid_dependency_wait();
  const int t = blockIdx.x;
  const int64_t id = embed_row_id(ids, prev_ids, t, rows);
  QType type;
  const uint8_t* row = row_of(runs, id, cols, type);
  float* dst = out + int64_t(t) * cols;
  for (int u = threadIdx.x; u < cols / 32; u += blockDim.x) {
    float a[16], b[16];
    int pa, pb;
    row_unit_values(type, row, cols, u, a, b, pa, pb);
    if (pa < 0) return;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      dst[pa + k] = scale == 1.f ? a[k] : a[k] * scale;
      dst[pb + k] = scale == 1.f ? b[k] : b[k] * scale;
    }
  }
}

int block_values(QType t) { return t == QType::Q8_0 ? 32 : 256; }

void check_quantized(const DeviceMatrix& W, const char* what) {
  if (!W.quantized()) throw CudaError(std::string(what) + ": the matrix is not block-quantized");
  for (int k = 0; k < W.quant.n; ++k)
    if (W.cols % block_values(W.quant.run[k].type) != 0)
      throw CudaError(std::string(what) + ": " + std::to_string(W.cols) + " columns are not whole " +
                      qtype_name(W.quant.run[k].type) + " blocks");
  if (W.cols > INT32_MAX) throw CudaError(std::string(what) + ": rows too long");
}

/// Tuning knob: FLASHDLLM_GEMV_QUANT="2", pairs in flight per lane (1 default; 2), read once.
/// Both sum every row in the same order: the results are bit-identical.
int quant_unroll() {
  static const int v = [] {
    const char* e = std::getenv("FLASHDLLM_GEMV_QUANT");
    return e != nullptr && std::string(e) == "2" ? 2 : 1;
  }();
  return v;
}

template <typename F, int NT>
void launch_run(const QuantRun& run, int cols, const Q8Activations& xq, int n, float* Y, int64_t y0, int64_t ldy,
                cudaStream_t stream) {
  if (run.rows <= 0) return;
  // As many blocks as the launch bounds keep resident, fewer for short runs.
  const int64_t sms = device_attribute_once(cudaDevAttrMultiProcessorCount);
  const int64_t resident = sms * (NT <= 2 ? 4 : 2);
  const dim3 grid(unsigned(std::min<int64_t>((run.rows + kRowsPerBlock - 1) / kRowsPerBlock, resident)));
  auto* kernel = quant_unroll() == 2 ? gemv_quant_kernel<F, NT, 2> : gemv_quant_kernel<F, NT, 1>;
  launch_pdl(kernel, grid, dim3(256), 0, stream, static_cast<const uint8_t*>(run.data), cols, xq, Y, run.rows, y0, ldy,
             n);
}

template <int NT>
void launch_gemv(const DeviceMatrix& W, const Q8Activations& xq, int n, float* Y, cudaStream_t stream) {
  int64_t y0 = 0;
  for (int k = 0; k < W.quant.n; ++k) {
    const QuantRun& run = W.quant.run[k];
    const int cols = int(W.cols);
    switch (run.type) {
      case QType::Q4_K: launch_run<quant::Q4KPair, NT>(run, cols, xq, n, Y, y0, W.rows, stream); break;
      case QType::Q5_K: launch_run<quant::Q5KPair, NT>(run, cols, xq, n, Y, y0, W.rows, stream); break;
      case QType::Q6_K: launch_run<quant::Q6KPair, NT>(run, cols, xq, n, Y, y0, W.rows, stream); break;
      case QType::Q8_0: launch_run<quant::Q80Pair, NT>(run, cols, xq, n, Y, y0, W.rows, stream); break;
      default: throw CudaError("gemv_quant: a run of no type");
    }
    y0 += run.rows;
  }
}

}  // namespace

const char* qtype_name(QType t) {
  switch (t) {
    case QType::Q8_0: return "Q8_0";
    case QType::Q4_K: return "Q4_K";
    case QType::Q5_K: return "Q5_K";
    case QType::Q6_K: return "Q6_K";
    default: return "none";
  }
}

void gemv_quant(const DeviceMatrix& W, const float* X, int n, float* Y, const Q8Activations& xq, cudaStream_t stream) {
  if (n <= 0 || W.rows == 0) return;
  check_quantized(W, "gemv_quant");
  if (n > kGemvMaxTokens)
    throw CudaError("gemv_quant: " + std::to_string(n) + " tokens > " + std::to_string(kGemvMaxTokens));
  if (size_t(n) * size_t(W.cols) > xq.capacity)
    throw CudaError("gemv_quant: the activation buffers hold " + std::to_string(xq.capacity) + " values, " +
                    std::to_string(size_t(n) * size_t(W.cols)) + " needed");
  if (gemv_quant_staged_fits(W, n)) return gemv_quant_staged(W, X, n, Y, stream);
  const int groups = n * int(W.cols / 32);
  launch_pdl(quantize_q8_kernel, dim3(unsigned((groups + 7) / 8)), dim3(256), 0, stream, X, n, int(W.cols), xq.q, xq.d,
             xq.s);
  if (n == 1) return launch_gemv<1>(W, xq, n, Y, stream);
  if (n == 2) return launch_gemv<2>(W, xq, n, Y, stream);
  if (n <= 4) return launch_gemv<4>(W, xq, n, Y, stream);
  if (n <= 8) return launch_gemv<8>(W, xq, n, Y, stream);
  return launch_gemv<16>(W, xq, n, Y, stream);
}

void dequantize_to_f16(const DeviceMatrix& W, int64_t row0, int64_t n_rows, void* out, cudaStream_t stream) {
  if (n_rows <= 0) return;
  check_quantized(W, "dequantize_to_f16");
  if (row0 < 0 || row0 + n_rows > W.rows) throw CudaError("dequantize_to_f16: rows out of range");
  const int64_t units = n_rows * (W.cols / 32);
  launch_pdl(dequantize_f16_kernel, dim3(unsigned((units + 255) / 256)), dim3(256), 0, stream, W.quant, int(W.cols),
             row0, n_rows, static_cast<__half*>(out));
}

void embed_quant_rows(const DeviceMatrix& E, const int32_t* ids, const int32_t* prev_ids, int n, float* out,
                      cudaStream_t stream, float scale) {
  check_quantized(E, "embed_rows");
  launch_pdl(embed_quant_kernel, dim3(unsigned(n)), dim3(128), 0, stream, E.quant, E.rows, int(E.cols), ids, prev_ids,
             out, scale);
}

}  // namespace fdl::cuda
