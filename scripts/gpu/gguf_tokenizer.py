#!/usr/bin/env python3
"""Writes the byte-level BPE tokenizer of a GGUF (the `gpt2` tokenizer model: SmolLM2's, 49,152
tokens) as a tokenizer.json, so the dummy-weight shapes of the GPU benchmarks can carry a real
vocabulary (constrained decoding's masks cost what they cost on a real model only over a real
vocabulary). Needs gguf-py: `pip install --target /tmp/ggufpy gguf==0.17.1` and
PYTHONPATH=/tmp/ggufpy.

usage: gguf_tokenizer.py MODEL.gguf OUT/tokenizer.json
"""
import json
import sys

from gguf import GGUFReader


def strings(reader, key):
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def main(src, dst):
    reader = GGUFReader(src)
    tokens = strings(reader, "tokenizer.ggml.tokens")
    merges = strings(reader, "tokenizer.ggml.merges")
    types = [int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
             for i in reader.fields["tokenizer.ggml.token_type"].data]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3}
             for i, t in enumerate(tokens) if types[i] in (3, 4)]
    spec = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": {t: i for i, t in enumerate(tokens)},
                  "merges": merges},
    }
    with open(dst, "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    print(f"{len(tokens)} tokens, {len(merges)} merges -> {dst}")


if __name__ == "__main__":
    main(*sys.argv[1:])
