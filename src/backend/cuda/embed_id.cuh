// embed_id.cuh — the table row an embedding kernel gathers for step token t (kernels.h:
// embed_rows): ids[t], or for a negative id the id the previous step drew on the device
// (prev_ids[-1 - ids[t]]). A drawn id outside [0, rows) (a failed row's -1) reads row 0; the
// host fails that step (CudaModel::collect_ids). Device code only; include from .cu files.
#pragma once

#include <cstdint>

namespace fdl::cuda {

__device__ __forceinline__ int64_t embed_row_id(const int32_t* ids, const int32_t* prev_ids, int t, int64_t rows) {
  int64_t row = ids[t];
  if (row < 0) {
    row = prev_ids[-1 - row];
    if (row < 0 || row >= rows) row = 0;
  }
  return row;
}

}  // namespace fdl::cuda
