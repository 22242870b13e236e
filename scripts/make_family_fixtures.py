#!/usr/bin/env python3
"""Make the per-family tiny random-weight model fixtures under tests/data/families/.

For each model family (llama, qwen2, qwen3, mistral, gemma2, gemma3, phi3, mixtral, and the
variants qwen2-yarn and phi3-longrope) this writes tests/data/families/<family>/ with:

  hf/              a Hugging Face model directory (config.json, model.safetensors in float32,
                   tokenizer.json, tokenizer_config.json, generation_config.json), saved with
                   save_pretrained from a randomly initialised AutoModelForCausalLM;
  model.gguf       the same model converted by llama.cpp's own convert_hf_to_gguf.py
                   (--outtype f32);
  reference.json   reference outputs: for 8 fixed prompts (token ids), the float32 logits after
                   the last prompt token, 32 greedy tokens (no EOS stopping, no BOS added) and
                   the top-1 minus top-2 logit margin at each greedy step, from HF Transformers
                   with eager attention ("hf"), and, when a llama.cpp reference program is
                   given, the same from llama.cpp running model.gguf ("llama_cpp").
                   phi3-longrope's prompts are longer than its original context (64), so both
                   oracles rotate with the long factors there; its "short_context" section
                   holds HF's outputs for the 8 usual prompts kept within 64 tokens (short
                   factors; see LONGROPE_* below).

Everything is deterministic (fixed seeds; the tokenizer is trained on fixed text in this file).
All families share one tiny byte-level BPE tokenizer (256 byte symbols + merges + 3 special
tokens = 320 ids); the llama family's copy uses the Llama 3 split pattern, the others Qwen2's.

Rerun (from the repository root, with the virtual environment and llama.cpp source set up as
tests/data/families/README.md describes):

    .venv/bin/python scripts/make_family_fixtures.py
    .venv/bin/python scripts/make_family_fixtures.py --llama-cpp build-tools/llama_cpp_reference

The second form also runs the llama.cpp reference program (built from
scripts/llama_cpp_reference.cpp against llama.cpp's libllama) on each model.gguf and adds the
"llama_cpp" section. --families llama,qwen2 limits the run to some families.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "families"
LLAMA_CPP_DIR = ROOT / "build-tools" / "llama-cpp-python-0.3.36" / "vendor" / "llama.cpp"

# The pre-tokenizer Split patterns, exactly as Qwen2's and Llama 3's tokenizer.json spell them
# (and as src/hf/hf_tokenizer.cpp accepts them: kQwen2Split / kLlama3Split).
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

N_BPE = 317                      # 256 byte symbols + 61 merges
SPECIAL_TOKENS = ["<|endoftext|>", "<s>", "</s>"]   # ids 317, 318, 319
VOCAB = N_BPE + len(SPECIAL_TOKENS)
PAD_ID, BOS_ID, EOS_ID = N_BPE, N_BPE + 1, N_BPE + 2

PROMPT_LENGTHS = [3, 5, 9, 13, 17, 24, 31, 40]
N_GREEDY = 32
PROMPT_SEED = 1234

# "qwen2-yarn" is the qwen2 family with YaRN context extension (factor 4 over 64 positions);
# "phi3-longrope" is phi3 with LongRoPE (per-pair long / short frequency factors, original
# context 64 of 256).
FAMILIES = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "mixtral", "qwen2-yarn",
            "phi3-longrope"]

# LongRoPE picks its long factors for sequences beyond the original context (HF: per forward, by
# the sequence length; llama.cpp: by the context it is run with, padded to a multiple of 256, so
# always the long ones here). The main prompts are all longer than that context, so both oracles
# use the long factors throughout; the short-context section takes the usual prompts with their
# greedy runs cut so that prompt + generated tokens stay within it (HF only: short factors).
LONGROPE_ORIG_CTX = 64
LONGROPE_PROMPT_LENGTHS = [65, 68, 72, 77, 83, 88, 94, 100]
LONGROPE_PROMPT_SEED = 4321

# Text the tokenizer is trained on (written for these fixtures).
TRAINING_TEXT = """\
The lighthouse keeper climbed the stairs every evening at seven, counting each of the 117 steps.
She kept a notebook of ships: 3 trawlers on Monday, 12 on Tuesday, and none at all on Sunday.
When the fog rolled in, the lamp turned slowly and the horn sounded twice a minute.
Nobody in the village remembered who had painted the tower red and white, or when.

def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i * 2))

The market opened early. Bakers stacked bread on wooden shelves; fishermen sold the morning catch.
"How much for the apples?" asked the boy. "Two coins each, or five for eight," the seller said.
It's the sort of place where they'll tell you the weather before you've asked about it.
Rain was expected at 4:30 in the afternoon, with winds of 25 to 40 kilometres per hour.

In the workshop, the old engine was taken apart piece by piece: pistons, valves, springs, bolts.
Each part was cleaned, measured, and written down in the ledger with its weight in grams.
The apprentice learned that patience matters more than strength when working with small things.
By the end of the winter, the engine ran again, quieter than anyone had expected.

Numbers: 0 1 2 3 4 5 6 7 8 9 10 20 30 100 256 1024 2048 65536 3.14159 2.71828
Symbols: ( ) [ ] { } < > = + - * / % & | ^ ~ ! ? @ # $ : ; , . ' " `
The river ran north through the valley, then turned east at the mill and west again at the bridge.
Travellers crossed it on foot in summer, when the water was low and the stones were dry.
In spring the snow melted on the mountains and the river rose until it covered the road.
"""


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------

def build_tokenizer(split_pattern: str, ignore_merges: bool):
    """The fixtures' byte-level BPE tokenizer (a `tokenizers.Tokenizer`).

    Trained once with the Qwen2 split; the llama copy swaps in the Llama 3 split and sets
    ignore_merges (Llama 3's tokenizer.json sets it, and llama.cpp's llama-bpe pre-tokenizer
    implies it), keeping the same vocabulary and merges.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=N_BPE, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT.splitlines(keepends=True), trainer=trainer)
    if tok.get_vocab_size() != N_BPE:
        raise SystemExit(f"tokenizer training gave {tok.get_vocab_size()} tokens, wanted {N_BPE}: add training text")
    tok.add_special_tokens(SPECIAL_TOKENS)

    spec = json.loads(tok.to_str())
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": split_pattern}
    spec["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(spec))
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [PAD_ID, BOS_ID, EOS_ID]
    return tok


def save_tokenizer(tok, hf_dir: Path, family: str) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   pad_token="<|endoftext|>", unk_token=None)
    fast.save_pretrained(hf_dir)
    cfg_path = hf_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    # Prompts are fed as ids with no BOS; say so explicitly rather than rely on defaults.
    cfg["add_bos_token"] = False
    cfg["add_eos_token"] = False
    # convert_hf_to_gguf.py's Phi3 class reads a SentencePiece tokenizer.model unless
    # tokenizer_class is GPT2Tokenizer (the Phi-4 case), when it takes the byte-level BPE path.
    cfg["tokenizer_class"] = "GPT2Tokenizer" if family.startswith("phi3") else "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


# --------------------------------------------------------------------------------------------
# Model configurations
# --------------------------------------------------------------------------------------------

def make_config(family: str):
    import transformers as tf

    # intermediate_size 80 (not 128) and Mixtral's experts 32 keep all eight fixtures, each stored
    # twice in float32 (safetensors and GGUF), well under 8 MB; both differ from hidden_size (64),
    # so a swapped dimension cannot go unnoticed.
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)

    def rope(theta, **extra):
        return {"rope_type": "default", "rope_theta": float(theta)} | extra

    if family == "llama":
        return tf.LlamaConfig(**common, rope_parameters=rope(10000), tie_word_embeddings=False)
    if family == "qwen2":
        # Q/K/V biases are part of the architecture.
        return tf.Qwen2Config(**common, rope_parameters=rope(1e6), use_sliding_window=False,
                              tie_word_embeddings=False)
    if family == "qwen2-yarn":
        # YaRN: frequencies between the interpolated and the original per pair, and cos/sin
        # scaled by 0.1 ln(factor) + 1; a context of 64 stretched 4x.
        return tf.Qwen2Config(**common, rope_parameters=rope(1e6, rope_type="yarn", factor=4.0,
                                                             original_max_position_embeddings=64),
                              use_sliding_window=False, tie_word_embeddings=False)
    if family == "qwen3":
        # Per-head RMSNorm on q and k; head_dim given explicitly (16, not hidden/heads by accident).
        return tf.Qwen3Config(**common, rope_parameters=rope(1e6), tie_word_embeddings=True)
    if family == "mistral":
        return tf.MistralConfig(**common, rope_parameters=rope(10000), sliding_window=8, tie_word_embeddings=True)
    if family == "gemma2":
        # Layers alternate sliding (even) / global (odd), as in Gemma 2 and llama.cpp's default.
        c = dict(common, num_hidden_layers=4)
        return tf.Gemma2Config(**c, rope_parameters=rope(10000), sliding_window=8, attn_logit_softcapping=50.0,
                               final_logit_softcapping=30.0, query_pre_attn_scalar=16,
                               hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    if family == "gemma3":
        # 6 layers with Gemma 3's 5:1 pattern (layers 0-4 sliding, layer 5 global). The GGUF that
        # convert_hf_to_gguf.py writes for Gemma 3 carries no sliding_window_pattern key, and
        # llama.cpp then assumes 5:1; any other pattern would make model.gguf mean another model.
        c = dict(common, num_hidden_layers=6)
        layer_types = ["sliding_attention"] * 5 + ["full_attention"]
        return tf.Gemma3TextConfig(**c, sliding_window=8, layer_types=layer_types, query_pre_attn_scalar=16,
                                   rope_parameters={"sliding_attention": rope(10000),
                                                    "full_attention": rope(1e6)},
                                   hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)
    if family == "phi3":
        # Fused qkv_proj and gate_up_proj are part of the architecture; half of each head rotated.
        c = {k: v for k, v in common.items() if k != "head_dim"}
        return tf.Phi3Config(**c, rope_parameters=rope(10000, partial_rotary_factor=0.5),
                             original_max_position_embeddings=256, sliding_window=None,
                             tie_word_embeddings=True)
    if family == "phi3-longrope":
        # Phi-4-mini's partial rotation (0.75: 12 of 16 dims, 6 pairs). Short factors near 1, long
        # ones rising with the pair index as in the released Phi-3 configs; fixed seed.
        import numpy as np

        rng = np.random.RandomState(77)
        n_pairs = int(16 * 0.75) // 2
        short = [round(float(x), 4) for x in 1.0 + 0.5 * rng.rand(n_pairs)]
        long = [round(float(x), 4) for x in sorted(1.5 + 14.5 * rng.rand(n_pairs))]
        c = {k: v for k, v in common.items() if k != "head_dim"}
        return tf.Phi3Config(**c, rope_parameters=rope(10000, partial_rotary_factor=0.75, rope_type="longrope",
                                                       long_factor=long, short_factor=short,
                                                       original_max_position_embeddings=LONGROPE_ORIG_CTX),
                             original_max_position_embeddings=LONGROPE_ORIG_CTX, sliding_window=None,
                             tie_word_embeddings=True)
    if family == "mixtral":
        return tf.MixtralConfig(**dict(common, intermediate_size=32), rope_parameters=rope(1e6), num_local_experts=4, num_experts_per_tok=2,
                                router_jitter_noise=0.0, sliding_window=None, tie_word_embeddings=True)
    raise ValueError(family)


def reinit_weights(model, family: str, seed: int) -> None:
    """Larger-than-default random weights, so logits are spread out and near-ties are rare.

    Matrices: normal with std k/sqrt(fan_in), clamped to [0.1, 0.3], k = 2 (0.25 for fan_in 64,
    0.18 for 128); embeddings (also the tied output) and an untied lm_head std 0.4; the MoE router
    std 0.3; biases std 0.1; RMSNorm scales 1 +- 0.2.

    Gemma (stored norm weight w, scale 1 + w): k = 2.4, embeddings std 0.25, the post-attention and
    post-feed-forward norms scale 4 +- 0.2 and the final norm 1.5 +- 0.2. With Gemma's sqrt(hidden)
    embedding scaling and tied output, the plain settings leave the input token's embedding
    dominating the residual stream and every greedy run just repeats the last prompt token; larger
    sub-layer outputs give greedy runs that depend on the context.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    gemma = family.startswith("gemma")
    k = 2.4 if gemma else 2.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() == 1 and "norm" in name:
                scale = 1.0
                if gemma and ".post_" in name:
                    scale = 4.0
                elif gemma and name == "model.norm.weight":
                    scale = 1.5
                value = (scale - 1.0 if gemma else scale) + 0.2 * noise
            elif name.endswith("bias"):
                value = 0.1 * noise
            elif "embed_tokens" in name or name.startswith("lm_head"):
                value = (0.25 if gemma else 0.4) * noise
            elif name.endswith("mlp.gate.weight"):          # the MoE router
                value = 0.3 * noise
            else:
                value = min(0.3, max(0.1, k / p.shape[-1] ** 0.5)) * noise
            p.copy_(value)


# --------------------------------------------------------------------------------------------
# HF reference outputs
# --------------------------------------------------------------------------------------------

def round7(x: float) -> float:
    return float(f"{x:.7g}")


def make_prompts(lengths: list[int] = PROMPT_LENGTHS, seed: int = PROMPT_SEED) -> list[list[int]]:
    import numpy as np

    rng = np.random.RandomState(seed)
    return [[int(t) for t in rng.randint(0, N_BPE, size=n)] for n in lengths]


def hf_reference(hf_dir: Path, prompts: list[list[int]], max_len: int | None = None) -> tuple[dict, float]:
    """HF outputs for the prompts, and the largest |logit| difference between the cached greedy
    decode and one uncached forward pass over the same tokens (a self-check). With `max_len`,
    each greedy run stops where prompt + generated tokens would exceed it (fewer than 32 ids)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    # No EOS stopping: generate() fills unset values from the model's generation_config, so the
    # EOS id is removed there (in memory only) as well as left out of the config passed in.
    model.generation_config.eos_token_id = None
    gen_cfg = GenerationConfig(do_sample=False, max_new_tokens=N_GREEDY, min_new_tokens=0, eos_token_id=None,
                               pad_token_id=PAD_ID, return_dict_in_generate=True, output_logits=True)
    out = {"last_logits": [], "greedy": [], "greedy_margin": []}
    worst_recheck = 0.0
    with torch.no_grad():
        for ids in prompts:
            n_greedy = N_GREEDY if max_len is None else min(N_GREEDY, max_len - len(ids))
            gen_cfg.max_new_tokens = n_greedy
            x = torch.tensor([ids])
            logits = model(input_ids=x, use_cache=False).logits[0, -1].float()
            assert torch.isfinite(logits).all()
            out["last_logits"].append([round7(v) for v in logits.tolist()])

            g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gen_cfg)
            new = g.sequences[0, len(ids):].tolist()
            assert len(new) == n_greedy, (len(new), n_greedy)
            step_logits = torch.stack([l[0].float() for l in g.logits])          # [32, vocab], raw
            top2 = step_logits.topk(2, dim=-1).values
            assert step_logits.argmax(-1).tolist() == new
            out["greedy"].append(new)
            out["greedy_margin"].append([round7(v) for v in (top2[:, 0] - top2[:, 1]).tolist()])

            # Recheck the cached decode against one uncached forward over prompt + generated tokens.
            full = model(input_ids=g.sequences[:, :-1], use_cache=False).logits[0, len(ids) - 1:].float()
            assert full.argmax(-1).tolist() == new, "cached and uncached greedy disagree"
            worst_recheck = max(worst_recheck, (full - step_logits).abs().max().item())
    return out, round7(worst_recheck)


# --------------------------------------------------------------------------------------------
# GGUF conversion (runs in a child process of this script: see convert_main)
# --------------------------------------------------------------------------------------------

def convert_main(hf_dir: str, outfile: str, model_name: str) -> None:
    """Run llama.cpp's convert_hf_to_gguf.py in this process, with two overrides.

    convert_hf_to_gguf.py names the pre-tokenizer (tokenizer.ggml.pre) by hashing the token ids
    its tokenizer gives for a fixed test string and looking the hash up in a table of known
    released models; a new tokenizer such as these fixtures' is refused. These fixtures use
    exactly Qwen2's or Llama 3's pre-tokenizer (the Split pattern in tokenizer.json), so the
    override reads that pattern and answers "qwen2" or "llama-bpe", the names the hash table gives
    for Qwen2 and Llama 3 themselves. Any other pattern is still refused.

    Its Gemma 2 class only reads SentencePiece tokenizer.model files; the fixtures share the
    byte-level BPE tokenizer, so Gemma 2 takes the same GPT-2-style vocabulary path that its
    Gemma 3 class takes when there is no tokenizer.model.
    """
    sys.path.insert(0, str(LLAMA_CPP_DIR / "gguf-py"))
    sys.path.insert(0, str(LLAMA_CPP_DIR))
    import convert_hf_to_gguf
    from conversion import base as conv_base
    from conversion import gemma as conv_gemma

    def get_vocab_base_pre(self, tokenizer) -> str:
        spec = json.loads((Path(self.dir_model) / "tokenizer.json").read_text(encoding="utf-8"))
        pre = spec.get("pre_tokenizer") or {}
        pattern = None
        if pre.get("type") == "Sequence" and pre["pretokenizers"][0].get("type") == "Split":
            pattern = pre["pretokenizers"][0]["pattern"].get("Regex")
        if pattern == QWEN2_SPLIT:
            return "qwen2"
        if pattern == LLAMA3_SPLIT:
            return "llama-bpe"
        raise NotImplementedError(f"fixture tokenizer with an unknown pre-tokenizer: {pre!r}")

    conv_base.TextModel.get_vocab_base_pre = get_vocab_base_pre
    conv_gemma.Gemma2Model.set_vocab = lambda self: self._set_vocab_gpt2()

    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outtype", "f32", "--outfile", outfile,
                "--model-name", model_name]
    convert_hf_to_gguf.main()


def convert(hf_dir: Path, gguf_path: Path, family: str) -> None:
    env = dict(os.environ, NO_LOCAL_GGUF="1")   # the child puts llama.cpp's gguf-py first itself
    # general.name. Not "...phi3": llama.cpp's vocabulary loader matches "phi3" / "phi-3" in the
    # model name and then requires Phi-3's SentencePiece special tokens (<unk>), which these lack.
    name = {"phi3": "tiny-random-phi", "phi3-longrope": "tiny-random-phi-longrope"}.get(family, f"tiny-random-{family}")
    subprocess.run([sys.executable, __file__, "--convert", str(hf_dir), str(gguf_path), name],
                   check=True, env=env, cwd=ROOT)


# --------------------------------------------------------------------------------------------
# llama.cpp reference outputs
# --------------------------------------------------------------------------------------------

def llama_cpp_reference(binary: Path, gguf_path: Path, prompts: list[list[int]]) -> dict:
    """Run the llama.cpp reference program (scripts/llama_cpp_reference.cpp) on model.gguf."""
    request = "\n".join(" ".join(str(t) for t in p) for p in prompts) + "\n"
    res = subprocess.run([str(binary), str(gguf_path), str(N_GREEDY)], input=request, capture_output=True,
                         text=True, check=True)
    raw = json.loads(res.stdout)
    out = {"last_logits": [], "greedy": [], "greedy_margin": []}
    for r in raw:
        out["last_logits"].append([round7(v) for v in r["last_logits"]])
        out["greedy"].append(r["greedy"])
        out["greedy_margin"].append([round7(v) for v in r["greedy_margin"]])
    return out


# Where llama.cpp is not an exact second oracle for a fixture, and why.
_GELU_NOTE = ("llama.cpp's CPU GELU reads a float16 lookup table (GGML_GELU_FP16 in ggml-cpu/vec.h), so its "
              "logits differ from HF's float32 GELU by up to about 1e-2; greedy runs may part at a near-tie.")
LLAMA_CPP_NOTES = {
    "mistral": ("model.gguf says general.architecture llama with no sliding-window key (convert_hf_to_gguf.py "
                "converts Mistral as Llama and drops sliding_window), so llama.cpp attends to every position: "
                "it matches HF only while the sequence is at most 8 tokens long (prompts 0 and 1 and the first "
                "greedy steps); past that the HF reference is the one to follow."),
    "gemma2": _GELU_NOTE,
    "gemma3": _GELU_NOTE,
    "phi3-longrope": ("llama.cpp runs with n_ctx 256 (> the original context 64), so it rotates with the long "
                      "factors, as HF does for these prompts (all longer than 64 tokens). short_context has no "
                      "llama.cpp part: llama.cpp pads its context to a multiple of 256, so it never picks the "
                      "short factors of a model whose original context is 64."),
}


def versions() -> dict:
    import tokenizers
    import torch
    import transformers

    return {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "tokenizers": tokenizers.__version__, "llama.cpp": "vendored in llama-cpp-python 0.3.36"}


def compare(hf: dict, lc: dict) -> dict:
    import numpy as np

    diffs = [float(np.abs(np.array(a) - np.array(b)).max()) for a, b in zip(hf["last_logits"], lc["last_logits"])]
    same = [a == b for a, b in zip(hf["greedy"], lc["greedy"])]
    return {"last_logits_max_abs_diff_per_prompt": [round7(d) for d in diffs], "greedy_equal_per_prompt": same}


# --------------------------------------------------------------------------------------------

def make_family(family: str, prompts, llama_cpp_bin: Path | None, seed: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    fam_dir = OUT_DIR / family
    hf_dir = fam_dir / "hf"
    if fam_dir.exists():
        shutil.rmtree(fam_dir)
    hf_dir.mkdir(parents=True)

    if family == "llama":
        tok = build_tokenizer(LLAMA3_SPLIT, ignore_merges=True)
    else:
        tok = build_tokenizer(QWEN2_SPLIT, ignore_merges=False)
    save_tokenizer(tok, hf_dir, family)

    config = make_config(family)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    reinit_weights(model, family, seed)
    model.generation_config.bos_token_id = BOS_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.save_pretrained(hf_dir, safe_serialization=True)

    gguf_path = fam_dir / "model.gguf"
    convert(hf_dir, gguf_path, family)

    longrope = family == "phi3-longrope"
    if longrope:
        short_prompts, prompts = prompts, make_prompts(LONGROPE_PROMPT_LENGTHS, LONGROPE_PROMPT_SEED)
    ref = {"family": family, "prompts": prompts}
    ref["hf"], recheck = hf_reference(hf_dir, prompts)
    checks = {"hf_cached_vs_uncached_max_abs_diff": recheck}
    if longrope:
        ref["n_ctx"] = 256
        short = {"n_ctx": LONGROPE_ORIG_CTX, "prompts": short_prompts}
        short["hf"], short_recheck = hf_reference(hf_dir, short_prompts, max_len=LONGROPE_ORIG_CTX)
        ref["short_context"] = short
        checks["short_context_hf_cached_vs_uncached_max_abs_diff"] = short_recheck
    if llama_cpp_bin is not None:
        ref["llama_cpp"] = llama_cpp_reference(llama_cpp_bin, gguf_path, prompts)
        checks["llama_cpp_vs_hf"] = compare(ref["hf"], ref["llama_cpp"])
        if family in LLAMA_CPP_NOTES:
            checks["llama_cpp_note"] = LLAMA_CPP_NOTES[family]
    ref["checks"] = checks
    ref["versions"] = versions()
    (fam_dir / "reference.json").write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print(f"{family}: done", flush=True)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--convert":
        convert_main(sys.argv[2], sys.argv[3], sys.argv[4])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated subset of " + ",".join(FAMILIES))
    ap.add_argument("--llama-cpp", type=Path, default=None,
                    help="the llama.cpp reference program built from scripts/llama_cpp_reference.cpp")
    args = ap.parse_args()
    if not (LLAMA_CPP_DIR / "convert_hf_to_gguf.py").is_file():
        raise SystemExit(f"missing {LLAMA_CPP_DIR}/convert_hf_to_gguf.py (see tests/data/families/README.md)")

    import torch
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)

    prompts = make_prompts()
    for i, family in enumerate(FAMILIES):
        if family in args.families.split(","):
            make_family(family, prompts, args.llama_cpp, seed=1000 + i)


if __name__ == "__main__":
    main()
