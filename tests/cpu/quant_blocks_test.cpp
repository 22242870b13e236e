// The block-quantized formats (src/core/quant_blocks.cpp) against llama.cpp's own Python
// reader: tests/data/quant_blocks.json holds random blocks of each type and the values gguf-py
// dequantizes them to (scripts/make_quant_block_fixture.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernels.h"
#include "cpu_test_util.h"
#include "flashdllm/dtype.h"
#include "test_support.h"

namespace fdl {
namespace {

std::vector<unsigned char> from_hex(const std::string& hex) {
  std::vector<unsigned char> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return out;
}

std::optional<GgmlType> type_named(const std::string& name) {
  for (uint32_t id = 0; id < 64; ++id)
    if (auto t = ggml_type_traits(id); t && t->name == name) return static_cast<GgmlType>(id);
  return std::nullopt;
}

TEST(QuantBlocks, ValuesEqualLlamaCppsDequantization) {
  std::ifstream in(test::test_data_dir() / "quant_blocks.json");
  ASSERT_TRUE(in) << "missing tests/data/quant_blocks.json";
  const auto doc = nlohmann::json::parse(in);
  int types = 0;
  for (const auto& c : doc.at("cases")) {
    const std::string name = c.at("type");
    const auto type = type_named(name);
    ASSERT_TRUE(type.has_value()) << name;
    const GgmlTypeTraits tr = *ggml_type_traits(static_cast<uint32_t>(*type));
    const auto blocks = from_hex(c.at("hex"));
    const auto want_bytes = from_hex(c.at("values_f32_hex"));
    const size_t n = size_t(c.at("blocks")) * tr.block_size;
    ASSERT_EQ(blocks.size(), size_t(c.at("blocks")) * tr.type_size) << name;
    ASSERT_EQ(want_bytes.size(), n * 4) << name;
    std::vector<float> want(n), got(n);
    std::memcpy(want.data(), want_bytes.data(), want_bytes.size());
    ASSERT_NE(block_dequantizer(*type), nullptr) << name;
    dequantize_row(*type, blocks.data(), got.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << name << " element " << i;
    ++types;
  }
  EXPECT_EQ(types, 10);
}

TEST(QuantBlocks, EveryComputedTypeIsSupportedAndOthersAreNot) {
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                     GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K})
    EXPECT_TRUE(is_supported_weight_type(t)) << ggml_type_name(static_cast<uint32_t>(t));
  for (GgmlType t : {GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::IQ2_XXS, GgmlType::IQ4_NL, GgmlType::TQ1_0}) {
    EXPECT_FALSE(is_supported_weight_type(t)) << ggml_type_name(static_cast<uint32_t>(t));
    float out[256];
    const unsigned char zeros[512] = {};
    EXPECT_THROW(dequantize_row(t, zeros, out, 256), std::invalid_argument);
  }
}

// The AVX2 build of the formats (the CPU kernels' dequantizer) gives the portable build's
// bits, on random blocks of every type.
TEST(QuantBlocks, Avx2BuildGivesThePortableBits) {
  if (!cpu::use_avx2_kernels()) GTEST_SKIP() << "AVX2 kernels unavailable here";
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q2_K,
                     GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K}) {
    const GgmlTypeTraits tr = *ggml_type_traits(static_cast<uint32_t>(t));
    constexpr int kBlocks = 64;
    std::vector<unsigned char> blocks(kBlocks * tr.type_size);
    cpu::test::random_blocks(t, blocks.data(), blocks.size(), 17u + static_cast<uint32_t>(t));
    const DequantizeBlockFn portable = block_dequantizer(t), avx2 = cpu::detail::block_dequantizer_avx2(t);
    ASSERT_NE(avx2, nullptr) << tr.name;
    std::vector<float> a(tr.block_size), b(tr.block_size);
    for (int i = 0; i < kBlocks; ++i) {
      portable(blocks.data() + i * tr.type_size, a.data());
      avx2(blocks.data() + i * tr.type_size, b.data());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << tr.name << " block " << i;
    }
  }
}

TEST(QuantBlocks, RowsThatAreNotWholeBlocksAreRefused) {
  const unsigned char zeros[1024] = {};
  std::vector<float> out(512);
  EXPECT_THROW(dequantize_row(GgmlType::Q4_K, zeros, out.data(), 300), std::invalid_argument);
  EXPECT_THROW(dequantize_row(GgmlType::Q5_0, zeros, out.data(), 40), std::invalid_argument);
  EXPECT_NO_THROW(dequantize_row(GgmlType::Q6_K, zeros, out.data(), 256));
}

// quantize_row is each format's inverse: random values (several blocks, with an all-zero
// block and a block of one repeated value) come back within the format's rounding error, so a
// wrong bit position or scale packing shows as a large error.
TEST(QuantBlocks, QuantizeRowRoundTripsWithinEachFormatsError) {
  // Relative RMS error bounds for uniform values: about half a level of each format's grid
  // (plus the rounded scales), looser for fewer bits.
  const std::vector<std::pair<GgmlType, double>> cases = {
      {GgmlType::Q8_0, 0.01}, {GgmlType::Q6_K, 0.03}, {GgmlType::Q5_0, 0.05}, {GgmlType::Q5_1, 0.05},
      {GgmlType::Q5_K, 0.05}, {GgmlType::Q4_0, 0.1},  {GgmlType::Q4_1, 0.1},  {GgmlType::Q4_K, 0.1},
      {GgmlType::Q3_K, 0.2},  {GgmlType::Q2_K, 0.4}};
  uint64_t state = 12345;
  auto uniform = [&] {  // [-1, 1)
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>(static_cast<int32_t>(state >> 32)) / 2147483648.f;
  };
  for (const auto& [type, bound] : cases) {
    const GgmlTypeTraits tr = *ggml_type_traits(static_cast<uint32_t>(type));
    SCOPED_TRACE(tr.name);
    ASSERT_TRUE(has_quantizer(type));
    const size_t bs = tr.block_size, n = 8 * bs;
    std::vector<float> x(n);
    for (size_t i = 0; i < n; ++i) x[i] = 0.3f * uniform() + (i / bs == 3 ? 0.2f : 0.f);  // one block off-centre
    std::fill(x.begin() + 5 * bs, x.begin() + 6 * bs, 0.f);
    std::fill(x.begin() + 6 * bs, x.begin() + 7 * bs, 0.125f);
    std::vector<unsigned char> q(n / bs * tr.type_size);
    quantize_row(type, x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row(type, q.data(), y.data(), n);
    double err = 0, norm = 0;
    for (size_t i = 0; i < n; ++i) err += (double(y[i]) - x[i]) * (double(y[i]) - x[i]), norm += double(x[i]) * x[i];
    EXPECT_LT(std::sqrt(err / norm), bound);
    for (size_t i = 5 * bs; i < 6 * bs; ++i) ASSERT_EQ(y[i], 0.f) << "a zero block must stay zero, element " << i;
    for (size_t i = 6 * bs; i < 7 * bs; ++i) ASSERT_NEAR(y[i], 0.125f, 0.125f * bound) << i;
  }
}

TEST(QuantBlocks, QuantizeRowRefusesBadInput) {
  std::vector<float> x(512, 0.5f);
  std::vector<unsigned char> q(4096);
  EXPECT_THROW(quantize_row(GgmlType::Q4_K, x.data(), q.data(), 100), std::invalid_argument);  // not whole blocks
  EXPECT_THROW(quantize_row(GgmlType::IQ4_NL, x.data(), q.data(), 32), std::invalid_argument);  // no quantizer
  EXPECT_THROW(quantize_row(GgmlType::F16, x.data(), q.data(), 32), std::invalid_argument);
  EXPECT_FALSE(has_quantizer(GgmlType::F32));
}

}  // namespace
}  // namespace fdl
