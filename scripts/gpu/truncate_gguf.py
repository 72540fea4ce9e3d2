"""Writes a copy of a llama GGUF keeping only its first N transformer blocks (metadata, tokenizer,
chat template and the kept tensors copied byte for byte, still quantized): a small real-weights
quantized model for GPU tests that fits the device tool's carry limit.

    python3 scripts/gpu/truncate_gguf.py SRC.gguf DST.gguf N     (needs `pip install gguf numpy`)
"""

import sys

import gguf
from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

src, dst, keep = sys.argv[1], sys.argv[2], int(sys.argv[3])
reader = gguf.GGUFReader(src)
arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()


def kept(name):
    if not name.startswith("blk."):
        return True
    return int(name.split(".")[1]) < keep


reader.tensors = [t for t in reader.tensors if kept(t.name)]
writer = gguf.GGUFWriter(dst, arch=arch, endianess=reader.endianess)
block_count = gguf.Keys.LLM.BLOCK_COUNT.format(arch=arch)
copy_with_new_metadata(reader, writer, {block_count: MetadataDetails(gguf.GGUFValueType.UINT32, keep)}, [])
print(f"{dst}: {keep} blocks, {len(reader.tensors)} tensors")
