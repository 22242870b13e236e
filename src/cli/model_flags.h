// model_flags.h — flags shared by the commands that load a model for inference (generate,
// bench, serve): how the weights are held in memory and which device runs the forward.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "engine/resolved_options.h"
#include "flashdllm/model.h"

namespace fdl::cli {

namespace detail {
/// Value of `--device` for this process. add_mmap_flag registers the flag on every command
/// that loads a model, so each such command gets `--device` without a flag of its own; one
/// command runs per process, so one variable is enough.
inline std::string& device_flag() {
  static std::string device = "cpu";
  return device;
}
/// Value of `--kv-cache-dtype` (same registration as --device).
inline std::string& kv_dtype_flag() {
  static std::string dtype = "auto";
  return dtype;
}
/// Value of `--batch-invariant` (same registration as --device).
inline std::string& batch_invariant_flag() {
  static std::string on = "on";
  return on;
}
}  // namespace detail

/// Adds `--mmap` (zero-copy weights instead of the default huge-page copy),
/// `--device cpu|cuda`, `--kv-cache-dtype auto|f32|f16|bf16` (vLLM's flag) and
/// `--batch-invariant on|off` to `cmd`.
inline void add_mmap_flag(CLI::App* cmd, bool& mmap) {
  cmd->add_flag("--mmap", mmap,
                "Map the weights zero-copy instead of loading them into huge pages (slower decode, lazy load)");
  cmd->add_option("--device", detail::device_flag(),
                  "Where the forward runs: cpu, or cuda (an NVIDIA GPU; needs a CUDA build)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", detail::kv_dtype_flag(),
                  "KV cache element type: auto (cpu: f32; cuda: the weights' 16-bit type, f16 for F16 and block-quantized "
                  "models, bf16 for BF16 ones, where head_dim is a multiple of 8, else f32), f32, f16 or bf16 (cuda only, "
                  "and only the weights' own 16-bit type); aliases fp32, float32, fp16, float16, half, bfloat16")
      ->check(CLI::IsMember({"auto", "f32", "fp32", "float32", "f16", "fp16", "float16", "half", "bf16", "bfloat16"}))
      ->capture_default_str();
  cmd->add_option("--batch-invariant", detail::batch_invariant_flag(),
                  "on: a token's output does not depend on the batch, the prompt's chunking or the prefix cache "
                  "(cuda: tensor-core kernels of one arithmetic for every step size); off: the fastest kernels per "
                  "step size (cuda only; the cpu is always invariant)")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

/// ModelOptions::n_ctx for a command whose Generator/Engine context is `ctx_size` (--ctx-size;
/// 0 = the engine's default, min(trained context, kDefaultContextCap)). Known before the model
/// is: the cap itself stands for the default, as the model clamps it to its trained context
/// just as the engine does.
inline int model_context(int ctx_size) { return ctx_size > 0 ? ctx_size : engine::kDefaultContextCap; }

/// ModelOptions for `-t THREADS`, `--mmap`, `--device`, `--kv-cache-dtype`, `--batch-invariant`, and the longest
/// sequence the command runs (`n_ctx`: ModelOptions::n_ctx, 0 = the model's trained context).
inline ModelOptions model_options(int threads, bool mmap, int n_ctx = 0) {
  return ModelOptions{.n_threads = threads,
                      .weights = mmap ? GgufBacking::Mmap : GgufBacking::HugePageCopy,
                      .device = detail::device_flag() == "cuda" ? Device::Cuda : Device::Cpu,
                      .kv_dtype = parse_kv_dtype(detail::kv_dtype_flag()),
                      .n_ctx = n_ctx,
                      .batch_invariant = detail::batch_invariant_flag() == "on"};
}

}  // namespace fdl::cli
