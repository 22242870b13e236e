// codelm-16m's quantized files on the CPU against llama.cpp's greedy text
// (quant_reference_check.h).
#include <set>
#include <string>

#include "engine/quant_reference_check.h"

namespace fdl {
namespace {

TEST(QuantizedReference, CodeLmFollowsLlamaCppUpToNearTies) {
  std::set<std::string> files;
  for (const auto& c : test::read_reference("codelm_quant_greedy.json")) files.insert(c["model"].get<std::string>());
  ASSERT_EQ(files, std::set<std::string>(test::quantized_codelm_files().begin(), test::quantized_codelm_files().end()));
  for (const std::string& file : test::quantized_codelm_files())
    test::expect_quantized_codelm_follows_llama_cpp(file, test::kTestModelOptions);
}

}  // namespace
}  // namespace fdl
