// Sampling on the GPU: one block per logits row turns it into a token id (contract in
// kernels.h, semantics in flashdllm/sampling.h). Only the ids cross PCIe.
//
// A block of 1024 threads has one SM's bandwidth for a row of up to ~150k logits, so the
// design counts passes over the row and keeps each one streaming (16-byte loads, several in
// flight per thread):
//  1. maximum, argmax, NaN / +Inf check (greedy rows stop here);
//  temperature only (nothing is cut):
//  2. the tempered weights' sum per warp range, then the warp whose range holds the target
//     walks it 32 ids at a time: the draw in id order;
//  with top-k / top-p / min-p:
//  2. a histogram of (max - logit) in 1/64-nat bins (count and untempered mass), which bounds
//     every cut from below: survivors lie in the bins above the first one where the count
//     reaches k, the mass reaches p, or the distance passes -ln(min_p);
//  3. those candidates (at most kListCap) are copied, in id order, into shared memory, and
//     the exact cuts run there. A row whose bound holds more candidates runs the same exact
//     cuts over the row in global memory instead.
// The exact cuts never sort: a float's bits, flipped into an unsigned key, order like the
// float, so the k-th best logit is a radix select over the keys (four 8-bit passes of
// 256-bin histograms) and the top-p cut the same select weighted by probability mass (exact
// 64-bit fixed point, so the result does not depend on the order of atomics). Ties
// at a cut keep the lowest ids (the host's order). The draw walks the survivors in id order.
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.h"
#include "backend/cuda/row_loads.cuh"
#include "decode/draw_arithmetic.h"

namespace fdl::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 256;        // radix digits
constexpr int kDistBins = 2048;   // distance histogram: 1/64 nat per bin, 32 nats, then one open bin
constexpr float kDistScale = 64.0f;
constexpr int kListCap = 4096;    // candidates kept in shared memory
constexpr unsigned kFull = 0xffffffffu;

__device__ __forceinline__ int lane_id() { return int(threadIdx.x) & 31; }
__device__ __forceinline__ int warp_id() { return int(threadIdx.x) >> 5; }

// Order-preserving key: a > b (as finite floats) iff key(a) > key(b). -0 ranks as +0, since
// the two compare equal on the host.
__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Weights, masses, the draw's and top-p's targets and min-p's test: decode/draw_arithmetic.h,
// the host Sampler's own arithmetic (so a draw gives the host's token for the same u).
using draw::Mass;
using draw::tempered;
// Probability mass (untempered, top-p's): exp(v - top) as an exact integer. Sums of up to
// 2^20 - 1 of them (Sampler's vocabulary limit) fit 64 bits and do not depend on the order
// of the atomics or the grouping of a pass, so every pass of a selection sees the same masses.
__device__ __forceinline__ Mass fixed_mass(float v, float top) { return draw::to_mass(tempered(v, top, 1.0f)); }

__device__ __forceinline__ int dist_bin(float v, float top) {
  const float d = (top - v) * kDistScale;
  return d < float(kDistBins - 1) ? int(d) : kDistBins - 1;
}

// The entries a pass looks at: a row in global memory (ids = positions) or the candidate list
// in shared memory (ids[] in increasing order, so positions keep the id order).
struct View {
  const float* v;
  const int32_t* ids;  // null: the position is the id
  int n;
  __device__ int id(int i) const { return ids ? ids[i] : i; }
};

// A contiguous range of positions [begin, end).
struct Range {
  int begin, end;
};

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T v) {
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(kFull, v, o);
    if (lane_id() >= o) v += up;
  }
  return v;
}

struct Shared {
  union {
    unsigned count[kWarps][kBins];  // per-warp radix histograms
    Mass mass[kWarps][kBins];
    struct {
      unsigned count[kDistBins];
      Mass mass[kDistBins];
    } dist;
  } hist;
  Mass bin_amount[kBins];  // a radix pass's counts or masses, summed over the warps
  Mass warp_m[kWarps];
  int warp_i[kWarps];
  int warp_j[kWarps];
  float warp_f[kWarps];
  float list_v[kListCap];
  int32_t list_id[kListCap];
  // broadcast by one thread
  int digit;
  Mass digit_above;
  int found;
};

// Which entries a cut keeps: key above `key`, or equal to it at a position <= `pos`
// (pos < 0: the cut is inactive).
struct Cut {
  uint32_t key = 0;
  int pos = -1;
  __device__ bool keeps(uint32_t k, int i) const { return pos < 0 || k > key || (k == key && i <= pos); }
};

// Warp w's share [begin, end) of the positions [lo, hi): contiguous, a multiple of 32 long.
__device__ __forceinline__ Range warp_share(int lo, int hi, int w) {
  const int per = ((hi - lo + kWarps - 1) / kWarps + 31) / 32 * 32;
  const int b = min(hi, lo + w * per);
  return {b, min(hi, b + per)};
}

// The position of the entry where the running amount, over the positions in order, first
// reaches need = need_of(total amount) (count: running >= need; mass: need < running, the
// host's draw). Two levels narrow it down: the warps sum their shares of the positions, the
// share holding the target is split among the warps again, and one warp walks the share
// found last (<= 128 positions of a 150k row) 32 at a time. Every thread picks the same
// share from the same sums (exact integers); should the target lie past every sum (it does
// not for the callers' targets), the last share and position with an amount win. -1 when
// nothing has any amount.
template <typename T, bool kStrict, typename NeedOf, typename Amount>
__device__ int find_running(const View& view, NeedOf need_of, Amount amount, Shared& s) {
  T* sums;
  if constexpr (std::is_same_v<T, Mass>)
    sums = s.warp_m;
  else
    sums = s.warp_i;
  auto reaches = [](T need, T running) { return kStrict ? need < running : need <= running; };
  int lo = 0, hi = view.n;
  T base = 0, need = 0;
  for (int level = 0; level < 2; ++level) {
    const Range r = warp_share(lo, hi, warp_id());
    T mine = 0;
    int i = r.begin + lane_id();
    for (; i + 96 < r.end; i += 128) {  // four loads in flight per lane
      const T a0 = amount(i), a1 = amount(i + 32), a2 = amount(i + 64), a3 = amount(i + 96);
      mine += (a0 + a1) + (a2 + a3);
    }
    for (; i < r.end; i += 32) mine += amount(i);
    mine = warp_sum(mine);
    if (lane_id() == 0) sums[warp_id()] = mine;
    __syncthreads();
    if (level == 0) {
      T total = 0;
      for (int w = 0; w < kWarps; ++w) total += sums[w];
      need = need_of(total);
    }
    int pick = -1, last = -1;
    T before = base, pick_before = base, last_before = base;
    for (int w = 0; w < kWarps; ++w) {
      const T a = sums[w];
      if (a > T(0)) {
        if (pick < 0 && reaches(need, before + a)) pick = w, pick_before = before;
        last = w, last_before = before;
      }
      before += a;
    }
    __syncthreads();
    if (pick < 0) pick = last, pick_before = last_before;
    if (pick < 0) return -1;
    const Range pr = warp_share(lo, hi, pick);
    lo = pr.begin, hi = pr.end, base = pick_before;
  }
  if (warp_id() == 0) {
    T running = base;
    int found = -1, last_pos = -1;
    for (int b = lo; b < hi; b += 32) {
      const int i = b + lane_id();
      const T a = i < hi ? amount(i) : T(0);
      const T incl = running + warp_inclusive_scan(a);
      const unsigned hit = __ballot_sync(kFull, a > T(0) && reaches(need, incl));
      if (hit) {
        found = b + __ffs(hit) - 1;
        break;
      }
      const unsigned any = __ballot_sync(kFull, a > T(0));
      if (any) last_pos = b + 31 - __clz(any);
      running = __shfl_sync(kFull, incl, 31);
    }
    if (lane_id() == 0) s.found = found >= 0 ? found : last_pos;
  }
  __syncthreads();
  const int pos = s.found;
  __syncthreads();
  return pos;
}

// Digit search over the 256 bins of s.bin_amount, from the highest digit down: the first
// non-empty digit whose cumulative amount reaches `need`. Warp 0 only; writes s.digit (-1 when
// none does) and the amount of the digits above it.
__device__ void find_digit(Shared& s, Mass need) {
  if (warp_id() != 0) return;
  const int lane = lane_id();
  Mass own = 0;  // lane l owns digits 255 - 8l ... 248 - 8l
  for (int j = 0; j < 8; ++j) own += s.bin_amount[255 - 8 * lane - j];
  const Mass incl = warp_inclusive_scan(own);
  const unsigned ballot = __ballot_sync(kFull, incl >= need && own > 0);
  if (ballot == 0) {
    if (lane == 0) s.digit = -1;
    return;
  }
  if (lane == __ffs(ballot) - 1) {
    Mass c = incl - own;  // exact: integers
    int digit = -1;
    for (int j = 0; j < 8; ++j) {
      const int d = 255 - 8 * lane - j;
      const Mass a = s.bin_amount[d];
      if (a > 0 && c + a >= need) {
        digit = d;
        break;
      }
      c += a;
    }
    s.digit = digit;
    s.digit_above = c;
  }
}

// Radix select over the entries `earlier` keeps: the key of the entry where the running
// amount (count, or mass exp(v - top)) in rank order (key descending) reaches `need`.
// `above` gets the amount ranked strictly above that key. False when no key reaches it (the
// view holds less than `need`: min-p bounded a candidate list above the cut, which then
// keeps every candidate).
template <bool kMass>
__device__ bool radix_select(const View& view, Cut earlier, float top, Mass need, Shared& s, uint32_t& key_out,
                             Mass& above) {
  uint32_t prefix = 0, mask = 0;
  above = 0;
#pragma unroll 1
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = int(threadIdx.x); i < kWarps * kBins; i += kThreads) {
      if (kMass)
        (&s.hist.mass[0][0])[i] = 0;
      else
        (&s.hist.count[0][0])[i] = 0u;
    }
    __syncthreads();
    for (int i = int(threadIdx.x); i < view.n; i += kThreads) {
      const float v = view.v[i];
      if (!isfinite(v)) continue;
      const uint32_t k = order_key(v);
      if ((k & mask) != prefix || !earlier.keeps(k, i)) continue;
      const int d = int((k >> shift) & 0xffu);
      if (kMass)
        atomicAdd(&s.hist.mass[warp_id()][d], fixed_mass(v, top));
      else
        atomicAdd(&s.hist.count[warp_id()][d], 1u);
    }
    __syncthreads();
    if (threadIdx.x < kBins) {
      const int d = int(threadIdx.x);
      Mass a = 0;
      for (int w = 0; w < kWarps; ++w) a += kMass ? s.hist.mass[w][d] : Mass(s.hist.count[w][d]);
      s.bin_amount[d] = a;
    }
    __syncthreads();
    find_digit(s, need - above);
    __syncthreads();
    const int digit = s.digit;
    const Mass digit_above = s.digit_above;
    __syncthreads();  // s.digit is rewritten next pass
    if (digit < 0) return false;
    above += digit_above;
    prefix |= uint32_t(digit) << shift;
    mask |= 0xffu << shift;
  }
  key_out = prefix;
  return true;
}

// The position of the `nth` (1-based) entry, in position order, tied at `key` and kept by
// `earlier`; past the last one (not reached: nth comes from exact counts and masses) the
// cut keeps every tie.
__device__ int nth_tied(const View& view, Cut earlier, uint32_t key, int nth, Shared& s) {
  const int pos = find_running<int, false>(
      view, [nth](int) { return nth; },
      [&](int i) {
        const float v = view.v[i];
        return (isfinite(v) && order_key(v) == key && earlier.keeps(key, i)) ? 1 : 0;
      },
      s);
  return pos < 0 ? 0x7fffffff : pos;
}

// The exact stages 2-6 over `view` (the whole row, or candidates copied from it: a prefix of
// the row in rank order that holds every survivor, and the whole top-k set when top-k cuts):
// top-k, top-p over its survivors, min-p, the tempered draw in position order. `finite` is
// the view's finite entries; `topp_total` the mass (fixed_mass) top-p takes its fraction of
// (kNoTotal: summed over the view's top-k survivors). Returns the drawn id.
constexpr Mass kNoTotal = ~Mass(0);
// top-p's target as an integer: the host keeps the shortest prefix whose mass is >= p·total.
__device__ __forceinline__ Mass topp_target(float top_p, Mass total) { return draw::top_p_target(top_p, total); }
__device__ __noinline__ int32_t cut_and_draw(const View& view, const RowSamplingDev& p, float top, int finite, Mass topp_total,
                                Shared& s) {
  Cut topk;
  if (p.top_k > 0 && p.top_k < finite) {
    uint32_t key = 0;
    Mass above = 0;
    radix_select<false>(view, Cut{}, top, Mass(p.top_k), s, key, above);  // k <= finite: found
    topk.key = key;
    topk.pos = nth_tied(view, Cut{}, key, p.top_k - int(above), s);
  }
  Cut topp;
  if (p.top_p < 1.0f) {  // over the top-k survivors, by the untempered softmax (the host's order)
    Mass total = topp_total;
    if (total == kNoTotal) {
      Mass mine = 0;
      for (int i = int(threadIdx.x); i < view.n; i += kThreads) {
        const float v = view.v[i];
        if (isfinite(v) && topk.keeps(order_key(v), i)) mine += fixed_mass(v, top);
      }
      mine = warp_sum(mine);
      if (lane_id() == 0) s.warp_m[warp_id()] = mine;
      __syncthreads();
      total = 0;
      for (int w = 0; w < kWarps; ++w) total += s.warp_m[w];
      __syncthreads();
    }
    const Mass target = topp_target(p.top_p, total);
    uint32_t key = 0;
    Mass above = 0;
    // False only where the view holds less than the target: min-p bounded the candidates
    // below top-p's cut, and then top-p keeps every candidate (its cut lies further down).
    if (radix_select<true>(view, topk, top, target, s, key, above)) {
      // the ties at the cut all weigh w (> 0: a digit with mass was chosen): the fewest of
      // them that reach the target
      const Mass w = fixed_mass(key_value(key), top);
      const Mass nth = w > 0 ? (target - above + w - 1) / w : 1;
      topp.key = key;
      topp.pos = nth_tied(view, topk, key, nth < 1 ? 1 : int(min(nth, Mass(0x7fffffff))), s);
    }
  }
  const float t = p.temperature;
  auto weight = [&](int i) -> Mass {
    const float v = view.v[i];
    if (!isfinite(v)) return 0;
    const uint32_t k = order_key(v);
    if (!topk.keeps(k, i) || !topp.keeps(k, i) || !draw::min_p_keeps(v, top, p.min_p)) return 0;
    return draw::to_mass(tempered(v, top, t));
  };
  const double u = p.uniform;
  const int pos = find_running<Mass, true>(view, [u](Mass total) { return draw::draw_target(u, total); }, weight, s);
  return pos >= 0 ? view.id(pos) : -1;
}

// The row's id, into ids and (optionally) the caller's second place for it.
__device__ __forceinline__ void put_id(int32_t* ids, int32_t* ids_copy, int32_t id) {
  ids[blockIdx.x] = id;
  if (ids_copy) ids_copy[blockIdx.x] = id;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int n, const RowSamplingDev* params,
                                                          int32_t* ids, int32_t* ids_copy) {
  launch_dependents();
  grid_dependency_wait();
  extern __shared__ __align__(16) unsigned char smem_raw[];
  Shared& s = *reinterpret_cast<Shared*>(smem_raw);
  const float* row = logits + int64_t(blockIdx.x) * n;
  const RowSamplingDev p = params[blockIdx.x];

  // Pass 1: maximum (lowest id on ties), finite count, NaN / +Inf check.
  float best = -INFINITY;  // any finite value beats it, -FLT_MAX included
  int best_i = 0x7fffffff;
  int finite = 0, bad = 0;
  Mass mass = 0;  // over the finite entries: top-p's total when top-k does not cut first
  for_each_in_row<kThreads>(row, n, [&](int i, float v) {
    if (v != v || v > FLT_MAX) bad = 1;
    if (!isfinite(v)) return;
    ++finite;
    if (v > best || (v == best && i < best_i)) best = v, best_i = i;
  });
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, best, o);
    const int oi = __shfl_xor_sync(kFull, best_i, o);
    if (ov > best || (ov == best && oi < best_i)) best = ov, best_i = oi;
  }
  finite = warp_sum(finite);
  bad = warp_sum(bad);
  if (lane_id() == 0) s.warp_f[warp_id()] = best, s.warp_i[warp_id()] = best_i, s.warp_j[warp_id()] = finite;
  __syncthreads();
  int n_finite = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (s.warp_f[w] > best || (s.warp_f[w] == best && s.warp_i[w] < best_i)) best = s.warp_f[w], best_i = s.warp_i[w];
    n_finite += s.warp_j[w];
  }
  __syncthreads();
  if (lane_id() == 0) s.warp_j[warp_id()] = bad;
  __syncthreads();
  int n_bad = 0;
  for (int w = 0; w < kWarps; ++w) n_bad += s.warp_j[w];
  __syncthreads();
  if (n_bad > 0 || n_finite == 0) {
    if (threadIdx.x == 0) put_id(ids, ids_copy, -1);
    return;
  }
  if (p.temperature == 0.0f) {
    if (threadIdx.x == 0) put_id(ids, ids_copy, best_i);
    return;
  }
  const float top = best;
  const View whole{row, nullptr, n};
  const bool cuts = (p.top_k > 0 && p.top_k < n_finite) || p.top_p < 1.0f || p.min_p > 0.0f;
  int32_t id = -1;
  const bool topk_cuts = p.top_k > 0 && p.top_k < n_finite;
  if (!cuts) {
    id = cut_and_draw(whole, p, top, n_finite, kNoTotal, s);
  } else {
    // Pass 2: distances from the maximum, counted and weighed, bound every cut from below;
    // the row's untempered mass in a fixed order (top-p's total when top-k does not cut).
    for (int i = int(threadIdx.x); i < kDistBins; i += kThreads) s.hist.dist.count[i] = 0u, s.hist.dist.mass[i] = 0;
    __syncthreads();
    // The mass is needed only where top-p bounds the list (top-k does not cut): the count
    // alone costs one integer atomic per entry.
    const bool by_mass = !topk_cuts && p.top_p < 1.0f;
    for_each_in_row<kThreads>(row, n, [&](int, float v) {
      if (!isfinite(v)) return;
      const int b = dist_bin(v, top);
      atomicAdd(&s.hist.dist.count[b], 1u);
      if (by_mass) {
        const Mass w = fixed_mass(v, top);
        mass += w;
        atomicAdd(&s.hist.dist.mass[b], w);
      }
    });
    mass = warp_sum(mass);
    if (lane_id() == 0) s.warp_m[warp_id()] = mass;
    __syncthreads();
    Mass row_mass = 0;
    for (int w = 0; w < kWarps; ++w) row_mass += s.warp_m[w];
    __syncthreads();
    if (warp_id() == 0) {
      // Lane l holds bins [64l, 64l + 64): cumulative count and mass by lane, then the bin.
      Mass c = 0, m = 0;
      #pragma unroll 4
      for (int j = 0; j < kDistBins / 32; ++j) c += s.hist.dist.count[64 * lane_id() + j], m += s.hist.dist.mass[64 * lane_id() + j];
      const Mass c_incl = warp_inclusive_scan(c);
      const Mass m_incl = warp_inclusive_scan(m);
      // The last bin the candidates reach. With top-k cutting, the list must hold the whole
      // top-k set (top-p takes its fraction of that set's mass): its bound alone. Otherwise
      // the survivors of top-p and of min-p bound it, and top-p's total is the row's.
      int bound = kDistBins - 1;
      if (!topk_cuts && p.min_p > 0.0f) bound = min(bound, int(-log(double(p.min_p)) * kDistScale) + 1);
      // Count / mass bounds: the first bin where the cumulative amount reaches the cut's own
      // (exact integers: the same target cut_and_draw uses, so the list holds the cut).
      auto first_bin = [&](bool by_mass, Mass need) {
        const unsigned hit = __ballot_sync(kFull, (by_mass ? m_incl : c_incl) >= need);
        if (!hit) return kDistBins - 1;
        const int l = __ffs(hit) - 1;
        const Mass before = __shfl_sync(kFull, by_mass ? m_incl - m : c_incl - c, l);
        int b = 64 * l + 63;
        if (lane_id() == l) {
          Mass run = before;
          #pragma unroll 1
          for (int j = 0; j < 64; ++j) {
            run += by_mass ? s.hist.dist.mass[64 * l + j] : Mass(s.hist.dist.count[64 * l + j]);
            if (run >= need) {
              b = 64 * l + j;
              break;
            }
          }
        }
        return __shfl_sync(kFull, b, l);
      };
      if (topk_cuts) bound = min(bound, first_bin(false, Mass(p.top_k)));
      else if (p.top_p < 1.0f) bound = min(bound, first_bin(true, topp_target(p.top_p, row_mass)));
      bound = min(bound, kDistBins - 1);
      // candidates = every finite entry in bins <= bound
      unsigned cand = 0;
      #pragma unroll 4
      for (int j = 0; j < kDistBins / 32; ++j) cand += (64 * lane_id() + j <= bound) ? s.hist.dist.count[64 * lane_id() + j] : 0u;
      cand = warp_sum(cand);
      if (lane_id() == 0) s.warp_i[0] = bound < kDistBins - 1 && cand <= unsigned(kListCap) ? bound : -1;
    }
    __syncthreads();
    const int bound = s.warp_i[0];
    __syncthreads();
    if (bound < 0) {
      id = cut_and_draw(whole, p, top, n_finite, kNoTotal, s);  // too many candidates: the exact cuts over the row
    } else {
      // Pass 3: the candidates' positions in order — per-warp counts, then each warp writes
      // its range's candidates after those of the warps before it.
      const Range r = warp_share(0, n, warp_id());
      auto candidate = [&](float v) { return isfinite(v) && dist_bin(v, top) <= bound; };
      int mine = 0;
      int i = r.begin + lane_id();
      for (; i + 96 < r.end; i += 128) {  // four loads in flight per lane
        const float v0 = __ldg(row + i), v1 = __ldg(row + i + 32), v2 = __ldg(row + i + 64), v3 = __ldg(row + i + 96);
        mine += int(candidate(v0)) + int(candidate(v1)) + int(candidate(v2)) + int(candidate(v3));
      }
      for (; i < r.end; i += 32) mine += candidate(__ldg(row + i)) ? 1 : 0;
      mine = warp_sum(mine);
      if (lane_id() == 0) s.warp_i[warp_id()] = mine;
      __syncthreads();
      int out = 0, n_list = 0;
      for (int w = 0; w < kWarps; ++w) out += w < warp_id() ? s.warp_i[w] : 0, n_list += s.warp_i[w];
      for (int base = r.begin; base < r.end && n_list <= kListCap; base += 128) {
        float v[4];  // four loads in flight per lane, then the four ballots in order
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = base + 32 * k + lane_id();
          v[k] = i < r.end ? __ldg(row + i) : -INFINITY;
        }
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const int i = base + 32 * k + lane_id();
          const bool keep = i < r.end && candidate(v[k]);
          const unsigned ballot = __ballot_sync(kFull, keep);
          if (keep) {
            const int at = out + __popc(ballot & ((1u << lane_id()) - 1u));
            s.list_v[at] = v[k];
            s.list_id[at] = i;
          }
          out += __popc(ballot);
        }
      }
      __syncthreads();
      if (n_list <= kListCap)  // the histogram's count, so always; a guard for the writes above
        id = cut_and_draw(View{s.list_v, s.list_id, n_list}, p, top, n_list, topk_cuts ? kNoTotal : row_mass, s);
      else
        id = cut_and_draw(whole, p, top, n_finite, kNoTotal, s);
    }
  }
  if (threadIdx.x == 0) put_id(ids, ids_copy, id >= 0 ? id : best_i);
}

__global__ void penalty_kernel(float* logits, int n_cols, const PenaltyTokenDev* penalties, int n,
                               const RowSamplingDev* params) {
  launch_dependents();
  grid_dependency_wait();
  const int i = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (i >= n) return;
  const PenaltyTokenDev p = penalties[i];
  const RowSamplingDev& r = params[p.row];
  float& logit = logits[int64_t(p.row) * n_cols + p.token];
  // penalize_logit (flashdllm/sampling.h) with every operation rounded on its own
  // (saturating at +-FLT_MAX like the host; non-finite logits unchanged)
  const auto sat = [](float x) { return fminf(fmaxf(x, -FLT_MAX), FLT_MAX); };
  float l = logit;
  if (!isfinite(l)) return;
  if (r.repeat_penalty != 1.0f) l = sat(l <= 0.0f ? __fmul_rn(l, r.repeat_penalty) : __fdiv_rn(l, r.repeat_penalty));
  const float by_count = sat(__fmul_rn(float(p.count), r.frequency_penalty));
  logit = sat(__fsub_rn(l, sat(__fadd_rn(by_count, p.count > 0 ? r.presence_penalty : 0.0f))));
}

}  // namespace

// One thread per 32-bit word of a mask: its 32 logits of the row, -inf where the bit is clear.
__global__ void token_mask_kernel(float* logits, int n_cols, const int32_t* rows, const int32_t* which,
                                  const uint32_t* words, int words_per_mask) {
  launch_dependents();
  grid_dependency_wait();
  const int i = int(blockIdx.y);
  const int w = int(blockIdx.x) * int(blockDim.x) + int(threadIdx.x);
  if (w * 32 >= n_cols) return;
  const uint32_t bits = words[int64_t(which[i]) * words_per_mask + w];
  if (bits == 0xffffffffu) return;
  float* row = logits + int64_t(rows[i]) * n_cols + int64_t(w) * 32;
  const int n = min(32, n_cols - w * 32);
  for (int b = 0; b < n; ++b)
    if (!((bits >> b) & 1u)) row[b] = -INFINITY;
}

void apply_token_masks(float* logits, int n_cols, const int32_t* rows, const int32_t* which, const uint32_t* words,
                       int n_masked, cudaStream_t stream) {
  if (n_masked <= 0) return;
  const int words_per_mask = 2 * int((int64_t(n_cols) + 63) / 64);  // 64-bit words, read as pairs of 32
  const int used = (n_cols + 31) / 32;
  launch_pdl(token_mask_kernel, dim3(unsigned((used + 255) / 256), unsigned(n_masked)), dim3(256), 0, stream, logits,
             n_cols, rows, which, words, words_per_mask);
}

void apply_penalties(float* logits, int n_cols, const PenaltyTokenDev* penalties, int n,
                     const RowSamplingDev* params, cudaStream_t stream) {
  if (n <= 0) return;
  launch_pdl(penalty_kernel, dim3(unsigned((n + 255) / 256)), dim3(256), 0, stream, logits, n_cols, penalties, n,
             params);
}

void sample_rows(const float* logits, int n_rows, int n_cols, const RowSamplingDev* params, int32_t* ids,
                 cudaStream_t stream, int32_t* ids_copy) {
  if (n_rows <= 0) return;
  static const bool configured = [] {
    FDL_CUDA_CHECK(cudaFuncSetAttribute(sample_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(sizeof(Shared))));
    return true;
  }();
  (void)configured;
  launch_pdl(sample_kernel, dim3(unsigned(n_rows)), dim3(kThreads), sizeof(Shared), stream, logits, n_cols, params,
             ids, ids_copy);
}

}  // namespace fdl::cuda
