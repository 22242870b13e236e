// Fast deterministic random tensor contents for the model maker: xoshiro256** per 64Ki-element
// chunk, seeded by SplitMix64 from (seed, stream, chunk), converted to the target type.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "tools/make_model_internal.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace fdl::tools {
namespace {

// fp32 -> fp16 is the bottleneck of F16 models (the portable conversion runs at ~60 M/s).
// x86 F16C converts 8 values per instruction with the same round-to-nearest-even result, so
// files are byte-identical whichever path runs.
#if defined(__x86_64__)
__attribute__((target("avx,f16c"))) void to_fp16_f16c(const float* src, uint8_t* dst, uint64_t n) {
  uint64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}
// F16C from CPUID leaf 1: clang before 15 does not know __builtin_cpu_supports("f16c").
bool cpu_has_f16c() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __builtin_cpu_supports("avx") && __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return ok;
}
#endif

void to_fp16(const float* src, uint8_t* dst, uint64_t n) {
#if defined(__x86_64__)
  if (cpu_has_f16c()) return to_fp16_f16c(src, dst, n);
#endif
  for (uint64_t i = 0; i < n; ++i) {
    const uint16_t h = fp32_to_fp16(src[i]);
    std::memcpy(dst + 2 * i, &h, 2);
  }
}

// Elements per chunk: a multiple of every block size used (Q8_0: 32, K-quants: 256), large enough to
// amortize thread scheduling, small enough to stay in L2.
constexpr uint64_t kChunkElems = 1 << 16;

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna): small state, fast, good statistical quality.
class Xoshiro256 {
 public:
  explicit Xoshiro256(uint64_t seed) {
    for (auto& w : s_) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

uint64_t chunk_seed(uint64_t seed, uint64_t stream, uint64_t chunk) {
  uint64_t x = seed;
  uint64_t h = splitmix64(x);
  x = h ^ (stream * 0xd1b54a32d192ed03ull);
  h = splitmix64(x);
  x = h ^ (chunk * 0x8cb92ba72f3d8dd7ull);
  return splitmix64(x);
}

/// Uniform values on [mean - a, mean + a) with a = std * sqrt(3) (so the std is `std`).
void uniform_values(float* dst, uint64_t n, float mean, float std, Xoshiro256& rng) {
  const float scale = std * std::sqrt(3.f) / 2147483648.f;  // int32 -> [-a, a)
  uint64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const uint64_t r = rng.next();
    dst[i] = mean + scale * static_cast<float>(static_cast<int32_t>(r >> 32));
    dst[i + 1] = mean + scale * static_cast<float>(static_cast<int32_t>(r & 0xffffffffu));
  }
  if (i < n) dst[i] = mean + scale * static_cast<float>(static_cast<int32_t>(rng.next() >> 32));
}

struct Scratch {
  std::vector<float> values = std::vector<float>(kChunkElems);
};

void fill_chunk(uint8_t* out, GgmlType type, uint64_t n, float mean, float std, Xoshiro256& rng,
                Scratch& scratch) {
  float* values = scratch.values.data();
  uniform_values(values, n, mean, std, rng);
  switch (type) {
    case GgmlType::F32:
      std::memcpy(out, values, n * sizeof(float));
      return;
    case GgmlType::F16:
      to_fp16(values, out, n);
      return;
    case GgmlType::BF16:
      for (uint64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(values[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    default:
      if (!has_quantizer(type))
        throw std::invalid_argument("fill_random: unsupported type " + ggml_type_name(static_cast<uint32_t>(type)));
      quantize_row(type, values, out, n);  // byte-wise: `out` needs no alignment
      return;
  }
}

}  // namespace

void fill_random(std::span<uint8_t> out, GgmlType type, uint64_t n_elements, float mean,
                 float std, uint64_t seed, uint64_t stream, unsigned threads) {
  const auto traits = ggml_type_traits(static_cast<uint32_t>(type));
  if (!traits || !is_supported_weight_type(type))
    throw std::invalid_argument("fill_random: unsupported type " +
                                ggml_type_name(static_cast<uint32_t>(type)));
  if (n_elements % traits->block_size != 0 ||
      out.size() != n_elements / traits->block_size * traits->type_size)
    throw std::invalid_argument("fill_random: buffer of " + std::to_string(out.size()) +
                                " bytes does not hold " + std::to_string(n_elements) + " " +
                                std::string(traits->name) + " values");
  const uint64_t n_chunks = (n_elements + kChunkElems - 1) / kChunkElems;
  const uint64_t chunk_bytes = kChunkElems / traits->block_size * traits->type_size;
  std::atomic<uint64_t> next{0};
  auto worker = [&] {
    Scratch scratch;
    for (uint64_t c = next++; c < n_chunks; c = next++) {
      Xoshiro256 rng(chunk_seed(seed, stream, c));
      const uint64_t n = std::min(kChunkElems, n_elements - c * kChunkElems);
      fill_chunk(out.data() + c * chunk_bytes, type, n, mean, std, rng, scratch);
    }
  };
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  const unsigned n_threads = static_cast<unsigned>(std::min<uint64_t>(threads, n_chunks));
  if (n_threads <= 1) {
    worker();
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(n_threads - 1);
  for (unsigned i = 1; i < n_threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

}  // namespace fdl::tools
