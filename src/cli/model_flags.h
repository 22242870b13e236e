// model_flags.h — flags shared by the commands that load a model for inference (generate,
// bench): how the weights are held in memory.
#pragma once

#include <CLI/CLI.hpp>

#include "flashdllm/model.h"

namespace fdl::cli {

/// Adds `--mmap` (zero-copy weights instead of the default huge-page copy) to `cmd`.
inline void add_mmap_flag(CLI::App* cmd, bool& mmap) {
  cmd->add_flag("--mmap", mmap,
                "Map the weights zero-copy instead of loading them into huge pages (slower decode, lazy load)");
}

/// ModelOptions for `-t THREADS` and `--mmap`.
inline ModelOptions model_options(int threads, bool mmap) {
  return ModelOptions{.n_threads = threads,
                      .weights = mmap ? GgufBacking::Mmap : GgufBacking::HugePageCopy};
}

}  // namespace fdl::cli
