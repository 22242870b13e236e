// The CPU model's block-quantized matrices rearranged into panels at load (weight_panels.h).
#include "model/weight_panels.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/q8k_panels.h"

namespace fdl {
namespace {

// The bytes one tensor (or one reordered copy) holds, and the matrix views into it.
struct Region {
  const uint8_t* begin;
  const uint8_t* end;
  bool in_file;
  std::vector<cpu::WeightMatrix*> views;
};

bool disabled_by_env() {
  const char* v = std::getenv("FLASHDLLM_NO_WEIGHT_PANELS");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}

const uint8_t* begin_of(const cpu::WeightMatrix& m) { return static_cast<const uint8_t*>(m.data); }
const uint8_t* end_of(const cpu::WeightMatrix& m) {
  return begin_of(m) + cpu::weight_row_bytes(m.type, m.cols) * size_t(m.rows);
}

// Whether the views tile the region whole, in panels of one type and width.
bool tiles_in_panels(const Region& r) {
  const cpu::WeightMatrix& first = *r.views.front();
  const size_t panel_bytes = cpu::weight_row_bytes(first.type, first.cols) * size_t(cpu::detail::kPanelRows);
  size_t covered = 0;
  for (const cpu::WeightMatrix* v : r.views) {
    if (!cpu::detail::panels_fit(*v) || v->type != first.type || v->cols != first.cols) return false;
    if (size_t(begin_of(*v) - r.begin) % panel_bytes != 0) return false;
    covered += size_t(end_of(*v) - begin_of(*v));
  }
  return covered == size_t(r.end - r.begin);  // views do not overlap: one per row range
}

// Rewrites the region's panels in place, split across the pool.
void rearrange(const Region& r, uint8_t* writable, cpu::ThreadPool& pool) {
  const cpu::WeightMatrix& m = *r.views.front();
  const size_t panel_bytes = cpu::weight_row_bytes(m.type, m.cols) * size_t(cpu::detail::kPanelRows);
  const auto panels = int64_t(size_t(r.end - r.begin) / panel_bytes);
  pool.parallel_for(
      panels,
      [&](int64_t p0, int64_t p1, int) {
        cpu::detail::to_panels(m.type, writable + size_t(p0) * panel_bytes, (p1 - p0) * cpu::detail::kPanelRows, m.cols);
      },
      4);
}

}  // namespace

int prepare_weight_panels(LlamaWeights& w, GgufFile& file, cpu::ThreadPool& pool) {
  if (!cpu::use_avx512_vnni() || disabled_by_env()) return 0;
  std::vector<cpu::WeightMatrix*> views;
  for (LlamaLayerWeights& L : w.layers)
    for (cpu::WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
      if (m->data != nullptr && m->rows > 0 && cpu::detail::panel_type(m->type)) views.push_back(m);
  if (w.output.data != nullptr && w.output.data != w.token_embd.data && cpu::detail::panel_type(w.output.type))
    views.push_back(&w.output);

  // Each view's region: the file tensor that holds it, or the reordered copy it points into.
  std::vector<Region> regions;
  const uint8_t* embd_begin = begin_of(w.token_embd);
  for (cpu::WeightMatrix* v : views) {
    const uint8_t* b = begin_of(*v);
    auto found = std::find_if(regions.begin(), regions.end(), [&](const Region& r) { return b >= r.begin && b < r.end; });
    if (found != regions.end()) {
      found->views.push_back(v);
      continue;
    }
    Region r{nullptr, nullptr, false, {v}};
    for (const GgufTensorInfo& t : file.tensors()) {
      const auto* tb = static_cast<const uint8_t*>(t.data);
      if (b >= tb && b < tb + t.n_bytes) r = Region{tb, tb + t.n_bytes, true, {v}};
    }
    if (!r.in_file)
      for (const std::vector<uint8_t>& buf : w.owned_rows)
        if (b >= buf.data() && b < buf.data() + buf.size()) r = Region{b, end_of(*v), false, {v}};
    if (r.begin == nullptr) continue;  // neither: leave it in rows
    regions.push_back(std::move(r));
  }
  for (Region& r : regions)  // a copy's extent is its views' (the buffer has alignment slack)
    if (!r.in_file)
      for (const cpu::WeightMatrix* v : r.views) r.begin = std::min(r.begin, begin_of(*v)), r.end = std::max(r.end, end_of(*v));

  std::vector<const Region*> in_file;
  int marked = 0;
  for (const Region& r : regions) {
    if (!tiles_in_panels(r) || (embd_begin >= r.begin && embd_begin < r.end)) continue;
    if (r.in_file) {
      in_file.push_back(&r);
      continue;
    }
    rearrange(r, const_cast<uint8_t*>(r.begin), pool);  // the model's own copy (LlamaWeights::owned_rows)
    for (cpu::WeightMatrix* v : r.views) v->panels = true, ++marked;
  }
  if (in_file.empty()) return marked;
  const uint8_t* lo = in_file.front()->begin;
  const uint8_t* hi = in_file.front()->end;
  for (const Region* r : in_file) lo = std::min(lo, r->begin), hi = std::max(hi, r->end);
  const bool edited = file.edit_in_place(lo, size_t(hi - lo), [&](uint8_t* writable) {
    for (const Region* r : in_file) rearrange(*r, writable + (r->begin - lo), pool);
  });
  if (!edited) return marked;  // a zero-copy mapping: the file's rows stay
  for (const Region* r : in_file)
    for (cpu::WeightMatrix* v : r->views) v->panels = true, ++marked;
  return marked;
}

}  // namespace fdl
