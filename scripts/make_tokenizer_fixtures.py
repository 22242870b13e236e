#!/usr/bin/env python3
"""Make the tokenizer.json fixtures under tests/data/tokenizers/.

Each fixture is a small Hugging Face tokenizer in the layout the engine reads from a model
directory, with what Hugging Face `tokenizers` and llama.cpp make of a set of tricky texts:

  <name>/tokenizer.json         written by the `tokenizers` library;
  <name>/tokenizer_config.json  BOS/EOS names and add_bos_token, as transformers writes them;
  <name>/vocab.gguf             the tokenizer.ggml.* metadata llama.cpp's converter would write
                                for it (vocabulary only), built here independently of the
                                engine: src/hf must produce the same metadata;
  <name>/expected.json          for every text: `hf` (ids from `tokenizers`, no special tokens
                                added), `hf_with_special` (with them), `llama_cpp` and
                                `llama_cpp_parse_special` (llama.cpp's ids on vocab.gguf with
                                parse_special off / on, no BOS).

Fixtures:
  spm-legacy     SentencePiece-style BPE (byte fallback) over stories260K's 512-token Llama 2 style
                 vocabulary, merges derived from the piece scores the way transformers' converter
                 derives them, normalizer Prepend("▁") + Replace(" ", "▁") (Llama 2 / Mistral 7B /
                 TinyLlama "legacy" form), plus added tokens (control, look-special and
                 user-defined ones);
  spm-metaspace  the same vocabulary with transformers 5's form: no normalizer, pre-tokenizer
                 Metaspace(prepend_scheme "first", split false), Metaspace decoder;
  spm-gemma      the same vocabulary as Gemma writes it: normalizer Replace(" ", "▁") only (no
                 prefix space), pre-tokenizer Split(" ", merged_with_previous);
  tekken         a byte-level BPE trained here with the Mistral Nemo ("tekken") Split pattern and
                 ignore_merges, special tokens first as in Nemo.

Where `tokenizers` and llama.cpp disagree (see src/hf/hf_spm_pipeline.h and
src/tokenizer/pre_tokenizer.cpp), the engine follows llama.cpp; `hf_equal` says for each text
whether they agree.

Rerun from the repository root with a virtual environment holding tokenizers, transformers and
gguf (pip install tokenizers transformers gguf), ../shared (stories260K.gguf) and llama.cpp's
libllama built as tests/data/families/README.md says, plus the helper

    g++ -O2 -std=c++17 scripts/llama_cpp_tokenize.cpp -I$LLAMA/include -I$LLAMA/ggml/include \\
        -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o build-tools/llama_cpp_tokenize
    .venv/bin/python scripts/make_tokenizer_fixtures.py --llama-cpp build-tools/llama_cpp_tokenize

Everything is deterministic (the tekken tokenizer is trained on the fixed text below).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors, trainers
from tokenizers.models import BPE
from transformers.tokenization_utils_base import generate_merges

ROOT = Path(__file__).resolve().parents[1]
OUT_DIR = ROOT / "tests" / "data" / "tokenizers"
SHARED = Path(os.environ.get("FLASHDLLM_SHARED") or ROOT.parent / "shared")

SPACE = "\u2581"
# The Split pattern of Mistral Nemo's tokenizer.json (llama.cpp: pre-tokenizer "tekken").
TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# llama.cpp's token types.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SPM_TEXTS = [
    "", " ", "  ", "\n", "Hello world", " Hello world", "Hello world ", "  leading and trailing  ",
    "two  spaces   three    four", "a\nb\n\nc\n", "\ttab\tin text", "line\r\nbreak",
    "Once upon a time, there was a little girl named Lily.", "She said: \"Don't!\" (really?)",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "\u65e5\u672c\u8a9e", "emoji \U0001F999 and \U0001F600!",
    "\u0001 control \u007f", SPACE + "already marked", "x" + SPACE + "y", "1234567890 3.14",
    "<s>", "</s>", "<s>Hello</s> world", "x<s> y", "<unk>", "Hi <|im_start|>user\nyo<|end|> ok",
    "say hello world now", "ZZZ", "\u00a0nbsp\u00a0", "end.",
]
TEKKEN_TEXTS = [
    "", " ", "Hello world", " Hello  world ", "HelloWorld iPhone ABCdef", "\u00c9COLE \u00e9cole \u00c9cole",
    "\u00c9T\u00c9 \u00d6L\u00dc",
    "na\u00efve caf\u00e9", "e\u0301 combining e\u0301cole", "don't I'm WE'LL", "12345 3.14 1/2", "a/b/c\n\nnext",
    "path/to/file.txt", "  \n  x", "tabs\t\there", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440", "emoji \U0001F999!", "[INST]hi[/INST] there",
    "<s>text</s>", "x\u00a0y", "CamelCaseWord snake_case_word", "\u03a3\u03af\u03c3\u03c5\u03c6\u03bf\u03c2",
]
TEKKEN_TRAINING_TEXT = """\
Hello world! The quick brown fox jumps over the lazy dog. Hello, World. HELLO WORLD.
Once upon a time, there was a little girl named Lily. She loved to play outside in the sun.
iPhone, MacBook, CamelCaseWord, snake_case_word, ABCdef, XMLHttpRequest, getElementById.
path/to/file.txt, a/b/c, https://example.com/index.html, 1/2, 3/4, 12345, 3.14159, 2024-07-18.
don't, I'm, we'll, they've, she's, WE'LL, DON'T. "Quoted" (parenthesised) [bracketed] {braced}.
École, école, ÉCOLE, naïve, café, résumé, Ñandú, Straße, ΣΊΣΥΦΟΣ, Σίσυφος, Привет мир, ПРИВЕТ.
日本語のテキスト, 中文文本, 한국어 텍스트. Tabs\tand\tnewlines\n\n  indented line\r\nwindows line.
"""
# Repeated so that merges join non-ASCII capitals with what follows and letters with combining
# marks: the two places where llama.cpp's tekken split differs from the pattern's.
TEKKEN_CASE_TEXT = "\u00c9COLE \u00c9T\u00c9 \u00c0\u00c9\u00c8 e\u0301cole e\u0301te\u0301 \u00d6L\u00dc\n" * 12


def shared(path: str) -> Path:
    p = SHARED / path
    if not p.exists():
        sys.exit(f"missing {p} (set FLASHDLLM_SHARED)")
    return p


# --- SentencePiece-style BPE ---------------------------------------------------------------

def stories_vocab():
    """stories260K's pieces: (text, score, llama.cpp type) by id."""
    r = gguf.GGUFReader(shared("models/stories260K.gguf"))
    texts = r.fields["tokenizer.ggml.tokens"].contents()
    scores = r.fields["tokenizer.ggml.scores"].contents()
    types = r.fields["tokenizer.ggml.token_type"].contents()
    return list(zip(texts, scores, types))


# Added beyond the 512 pieces: a special token, one that is not marked special but looks special
# to llama.cpp's converter, and a user-defined one holding a "▁" (llama.cpp writes it as a space).
SPM_EXTRA_TOKENS = [("<|im_start|>", True), ("<|end|>", False), (f"hello{SPACE}world", False)]


def spm_tokenizer(form: str) -> Tokenizer:
    pieces = stories_vocab()
    vocab = {text: i for i, (text, _, _) in enumerate(pieces)}
    # transformers' LlamaConverter scores <unk>, <s>, </s> 0 and orders merges by piece score.
    merges = generate_merges(vocab, [(t, 0.0 if i < 3 else s) for i, (t, s, _) in enumerate(pieces)])
    tok = Tokenizer(BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True, dropout=None))
    if form == "legacy":
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    elif form == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme="first", split=False)
    elif form == "gemma":
        tok.normalizer = normalizers.Replace(" ", SPACE)
        tok.pre_tokenizer = pre_tokenizers.Split(" ", "merged_with_previous")
        tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    else:
        raise ValueError(form)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in ("<unk>", "<s>", "</s>")])
    if form == "legacy":
        for text, special in SPM_EXTRA_TOKENS:
            if special:
                tok.add_special_tokens([AddedToken(text, normalized=False, special=True)])
            else:
                tok.add_tokens([AddedToken(text, normalized=True, special=False)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    return tok


def looks_special(text: str) -> bool:
    """llama.cpp's converter's rule for added tokens it makes control tokens."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def spm_metadata(tj: dict, add_space_prefix: bool, n_vocab: int) -> dict:
    """tokenizer.ggml.* for a SentencePiece-style tokenizer.json: tokens and types as llama.cpp's
    converter makes them, scores from the merge ranks (the first merge making a token sets it)."""
    model = tj["model"]
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [UNUSED] * n_vocab
    for text, i in model["vocab"].items():
        tokens[i] = text
        is_byte = len(text) == 6 and text.startswith("<0x") and text.endswith(">")
        types[i] = UNKNOWN if text == model["unk_token"] else BYTE if is_byte else NORMAL
    for a in tj["added_tokens"]:
        special = a["special"] or looks_special(a["content"])
        tokens[a["id"]] = a["content"] if special else a["content"].replace(SPACE, " ")
        types[a["id"]] = CONTROL if special else USER_DEFINED
    merges = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
    scores = [-float(len(merges))] * n_vocab
    made = set()
    for rank, (left, right) in enumerate(merges):
        i = model["vocab"][left + right]
        if i not in made:
            scores[i] = -float(rank)
            made.add(i)
    return {"model": "llama", "pre": "default", "tokens": tokens, "scores": scores, "types": types,
            "add_space_prefix": add_space_prefix, "unk": model["vocab"][model["unk_token"]]}


# --- tekken (byte-level BPE) ---------------------------------------------------------------

TEKKEN_SPECIALS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"]


def tekken_tokenizer() -> Tokenizer:
    tok = Tokenizer(BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(TEKKEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=TEKKEN_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((TEKKEN_TRAINING_TEXT * 3 + TEKKEN_CASE_TEXT).splitlines(keepends=True), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tok


def bpe_metadata(tj: dict, pre: str, n_vocab: int) -> dict:
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [UNUSED] * n_vocab
    for text, i in tj["model"]["vocab"].items():
        tokens[i], types[i] = text, NORMAL
    for a in tj["added_tokens"]:
        tokens[a["id"]], types[a["id"]] = a["content"], CONTROL if a["special"] else USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    return {"model": "gpt2", "pre": pre, "tokens": tokens, "types": types, "merges": merges}


# --- output --------------------------------------------------------------------------------

def write_gguf(path: Path, name: str, meta: dict, bos: int, eos: int, add_bos: bool) -> None:
    w = gguf.GGUFWriter(str(path), "llama")
    # Just enough hyperparameters for llama.cpp to load the vocabulary (vocab_only).
    w.add_name(name)
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(64)
    w.add_head_count(1)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(meta["tokens"]))
    w.add_tokenizer_model(meta["model"])
    w.add_tokenizer_pre(meta["pre"])
    w.add_token_list(meta["tokens"])
    if "scores" in meta:
        w.add_token_scores(meta["scores"])
    w.add_token_types(meta["types"])
    if "merges" in meta:
        w.add_token_merges(meta["merges"])
    if "add_space_prefix" in meta:
        w.add_add_space_prefix(meta["add_space_prefix"])
    if "unk" in meta:
        w.add_unk_token_id(meta["unk"])
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def llama_cpp_ids(helper: Path, gguf_path: Path, texts: list[str]) -> list[tuple[list[int], list[int]]]:
    stdin = "".join(t.encode("utf-8").hex() + "\n" for t in texts)
    out = subprocess.run([str(helper), str(gguf_path)], input=stdin, capture_output=True, text=True, check=True).stdout
    ids = []
    for line in out.splitlines():
        plain, special = line.split("|")
        ids.append(([int(v) for v in plain.split()], [int(v) for v in special.split()]))
    if len(ids) != len(texts):
        sys.exit(f"llama_cpp_tokenize gave {len(ids)} results for {len(texts)} texts")
    return ids


def write_fixture(name: str, tok: Tokenizer, meta: dict, texts: list[str], helper: Path, note: str) -> None:
    out = OUT_DIR / name
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": False,
              "model_max_length": 4096}
    if meta["model"] == "llama":
        config["unk_token"] = "<unk>"
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    write_gguf(out / "vocab.gguf", name, meta, bos, eos, True)
    cases = []
    for text, (plain, special) in zip(texts, llama_cpp_ids(helper, out / "vocab.gguf", texts)):
        hf = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "hf": hf, "hf_with_special": tok.encode(text).ids, "llama_cpp": plain,
                      "llama_cpp_parse_special": special, "hf_equal": hf == special})
    expected = {"note": note, "n_vocab": len(meta["tokens"]),
                "versions": {p: importlib.metadata.version(p) for p in ("tokenizers", "transformers", "gguf")},
                "cases": cases}
    (out / "expected.json").write_text(json.dumps(expected, indent=1, ensure_ascii=True) + "\n")
    differ = [c["text"] for c in cases if not c["hf_equal"]]
    print(f"{name}: {len(cases)} texts, HF and llama.cpp differ on {len(differ)}: {differ!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llama-cpp", type=Path, default=ROOT / "build-tools" / "llama_cpp_tokenize",
                    help="the llama_cpp_tokenize helper (scripts/llama_cpp_tokenize.cpp)")
    args = ap.parse_args()
    if not args.llama_cpp.exists():
        sys.exit(f"missing {args.llama_cpp}: build scripts/llama_cpp_tokenize.cpp (see this script's docstring)")

    notes = {
        "legacy": "Prepend+Replace normalizer: HF and llama.cpp agree except around added tokens that are not "
                  "special: HF normalizes their text too (so looks for a prefixed one) and adds no prefix after "
                  "them; llama.cpp matches them in the raw text (<|end|> as a control token) and puts a prefix "
                  "after every token it splits out.",
        "metaspace": "Metaspace pre-tokenizer (prepend_scheme first): HF adds no prefix to a text that starts with "
                     "a space nor after a special token; llama.cpp does both.",
        "gemma": "No prefix space anywhere: HF and llama.cpp agree.",
    }
    for form in ("legacy", "metaspace", "gemma"):
        tok = spm_tokenizer(form)
        tj = json.loads(tok.to_str())
        meta = spm_metadata(tj, add_space_prefix=form != "gemma", n_vocab=tok.get_vocab_size(with_added_tokens=True))
        write_fixture(f"spm-{form}", tok, meta, SPM_TEXTS, args.llama_cpp, notes[form])

    tok = tekken_tokenizer()
    tj = json.loads(tok.to_str())
    meta = bpe_metadata(tj, "tekken", tok.get_vocab_size(with_added_tokens=True))
    write_fixture("tekken", tok, meta, TEKKEN_TEXTS, args.llama_cpp,
                  "llama.cpp's tekken split knows letter case for ASCII letters only and does not count combining "
                  "marks as letters; HF's pattern uses Unicode case classes.")


if __name__ == "__main__":
    main()
