// libFuzzer target for the safetensors reader: parse arbitrary bytes with
// SafetensorsFile::from_bytes, then read every byte of every tensor view and every metadata
// string, so that ASan reports any view that escapes the buffer. A SafetensorsError is an
// expected rejection; a crash, sanitizer report, leak or hang is a bug.
#include <cstdint>
#include <vector>

#include "hf/safetensors.h"

namespace {

volatile uint64_t g_sink;  // keeps the reads of the views from being optimized away

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const fdl::hf::SafetensorsFile f =
        fdl::hf::SafetensorsFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz");
    uint64_t sum = 0;
    uint64_t covered = 0;
    for (const fdl::hf::SafetensorsTensor& t : f.tensors()) {
      if (f.find(t.name) != &t) __builtin_trap();
      if (t.shape.size() > 8 || t.name.empty()) __builtin_trap();
      for (uint64_t i = 0; i < t.n_bytes; ++i) sum += t.data[i];
      sum += t.n_elements() + t.dtype.size();
      covered += t.n_bytes;
    }
    // The reader promises a buffer fully covered without overlaps: the tensors' bytes add up
    // to exactly what follows the header (accepted files hold at least the 8-byte prefix).
    uint64_t header_size = 0;
    for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | data[i];
    if (covered != size - 8 - header_size) __builtin_trap();
    for (const auto& [key, value] : f.metadata()) sum += key.size() + value.size();
    g_sink = g_sink + sum;
  } catch (const fdl::hf::SafetensorsError&) {
    // expected for malformed input
  }
  return 0;
}
