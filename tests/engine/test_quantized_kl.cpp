// codelm-16m's quantized files on the CPU: KL divergence from the F16 file within llama.cpp's
// (quant_kl_check.h).
#include "engine/quant_kl_check.h"
#include "engine/quant_reference_check.h"

namespace fdl {
namespace {

TEST(QuantizedKl, CodeLmFilesStayWithinLlamaCppsDivergence) {
  for (const std::string& file : test::quantized_codelm_files())
    test::expect_quantized_kl_within_llama_cpp(file, test::kTestModelOptions);
}

}  // namespace
}  // namespace fdl
