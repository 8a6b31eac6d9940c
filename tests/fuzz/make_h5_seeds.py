#!/usr/bin/env python3
"""Writes the seed corpora of the HDF5 fuzz targets, tests/fuzz/corpus/weights/
and tests/fuzz/corpus/ckpt_shard/: byte strings in the description language
their harnesses decode (fuzz_weights.cpp, fuzz_ckpt_shard.cpp), each a file a
reader meets: valid ones, and one per kind of hostile or damaged file. Those
named regression_* failed the targets before the readers were fixed.

    python3 tests/fuzz/make_h5_seeds.py
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


# ---- weights (fuzz_weights.cpp): a flags byte (bit 0: track creation order),
# then ops: 0 attribute, 1 float32 dataset, 2 dataset of another type, 3 link.
NAMES = ["format", "version", "wte", "wpe", "h.0.attn.c_attn.weight", "ln_f.bias", "n_layer", "n_embd",
         "model", "x"]
TEXTS = ["blutrain-weights", '{"arch": "gpt2"}', "", "pytorch-state-dict", "blutrain-weights "]
ATTR_KIND = {"i64": 0, "i32be": 1, "i8": 2, "u64": 3, "u32": 4, "f64": 5, "vlen": 6, "fixed": 7,
             "array": 8, "null": 9, "strings": 10, "enum": 11}
LAYOUT = {"contiguous": 0, "early": 1, "compact": 2, "chunked": 3, "fletcher32": 4, "deflate": 5}
LINK_KIND = {"group": 0, "datatype": 1, "hard": 2, "soft": 3, "dangling": 4, "external_link": 5,
             "external_storage": 6, "virtual": 7}


def name(n):
    return bytes([NAMES.index(n)])


def value(v):
    return bytes([v]) if 0 <= v < 0x80 else b"\x80" + u64(v)


def attr(n, kind, v=0, text=0):
    return b"\x00" + name(n) + bytes([ATTR_KIND[kind]]) + value(v) + bytes([text])


def f32(n, dims, layout="contiguous", write=True, seed=1, big_endian=False, null=False):
    rank = 5 if null else len(dims)
    lb = LAYOUT[layout] | (0x40 if write else 0) | (0x80 if big_endian else 0)
    out = b"\x01" + name(n) + bytes([rank, lb, seed])
    for d in dims:
        out += bytes([d]) if d < 9 else b"\xf0" + u64(d)  # 0xf0: the next 8 bytes, shifted by 0
    return out


def other(n, kind):
    return b"\x02" + name(n) + bytes([kind])


def link(n, kind, target=0):
    return b"\x03" + name(n) + bytes([LINK_KIND[kind], target])


HEADER = attr("format", "vlen", text=0) + attr("version", "i64", 1)
VALID = (b"\x01" + HEADER + attr("n_layer", "i64", 2) + attr("model", "vlen", text=1)
         + f32("wte", [3, 4], seed=5) + f32("wpe", [8], "chunked", seed=4) + f32("ln_f.bias", [])
         + f32("x", [2, 2, 2], "deflate", seed=8, big_endian=True))

WEIGHTS = {
    "valid_tracked.bin": VALID,
    "valid_name_order_fixed_strings.bin": (b"\x00" + attr("format", "fixed", 1, text=0)
                                           + attr("version", "i32be", 1) + attr("n_embd", "u32", 8)
                                           + f32("wpe", [2, 3], "compact", seed=3)
                                           + f32("wte", [4], "fletcher32") + f32("x", [0, 5])
                                           + f32("h.0.attn.c_attn.weight", [1], "early", write=False)),
    "regression_huge_shape_unstored.bin": b"\x01" + HEADER + f32("wte", [1 << 40, 1 << 40], "chunked", write=False),
    "regression_overflowing_shape.bin": b"\x01" + HEADER + f32("wte", [1 << 62, 4, 0], write=False),
    "regression_unwritten_dataset.bin": b"\x01" + HEADER + f32("wte", [4, 4], write=False),
    "regression_u64_attribute_clamped.bin": b"\x01" + HEADER + attr("n_embd", "u64", 0xFFFFFFFFFFFFFFF0),
    "wrong_attributes.bin": (b"\x01" + HEADER + attr("n_layer", "f64", 3) + attr("n_embd", "array", 2)
                             + attr("model", "strings", text=1)),
    "wrong_format_version.bin": b"\x01" + attr("format", "vlen", text=4) + attr("version", "i8", 2),
    "other_types.bin": b"\x01" + HEADER + other("wte", 0) + other("wpe", 4) + f32("x", [2], null=True),
    "links.bin": (b"\x01" + HEADER + f32("wte", [2]) + link("wpe", "hard", 0) + link("x", "soft", 0)
                  + link("model", "dangling") + link("n_embd", "group")),
    "regression_external_link.bin": b"\x01" + HEADER + link("wte", "external_link"),
    "regression_external_storage.bin": b"\x01" + HEADER + link("wte", "external_storage"),
    "regression_virtual_dataset.bin": b"\x01" + HEADER + link("wte", "virtual"),
}


# ---- ckpt_shard (fuzz_ckpt_shard.cpp): a flags byte (bit 0: format 1;
# bits 1-4: crc32 block - 1; bit 5: two rank files; bit 6: one read call per
# range), a damage byte, the piece count - 1, the pieces, then the ranges.
KIND = {"sound": 0, "missing": 0x80, "other_length": 0x81, "other_rank": 0x82, "other_type": 0x83,
        "unallocated": 0x84, "other_layout": 0x85, "compact": 0x86, "outside": 0x87}
DAMAGE = {"none": 0, "truncated": 0xC0, "gone": 0xC1, "link_out": 0xC2, "link_in": 0xC3}


def flags(legacy=False, block=4, two_files=False, one_call_each=False):
    return bytes([(1 if legacy else 0) | ((block - 1) << 1) | (0x20 if two_files else 0)
                  | (0x40 if one_call_each else 0)])


def piece(tensor, begin, n, seed=1, kind="sound", flip=None):
    """flip: (element, byte) of the one bit flipped (bit seed % 8)."""
    fb = 0 if flip is None else (flip[0] << 2) | flip[1]
    assert flip is None or (fb != 0 and flip[0] < 64)
    return bytes([tensor, begin, n - 1, seed, KIND[kind], fb])


def shard(fl, damage, pieces, ranges=(), truncate_to=128):
    out = fl + bytes([DAMAGE[damage], len(pieces) - 1]) + b"".join(pieces)
    if damage == "truncated":
        out += bytes([truncate_to])
    out += bytes([len(ranges)])
    for k, lo, hi in ranges:  # lo, hi: relative to the piece's begin
        out += bytes([k, lo, hi - lo - 1])
    return out


THREE = [piece(0, 0, 10, 3), piece(1, 10, 7, 5), piece(2, 0, 33, 9)]
PARTS = [(0, 2, 9), (2, 5, 6), (2, 0, 33), (1, 3, 7)]
SHARD = {
    "valid_whole.bin": shard(flags(block=4), "none", THREE),
    "valid_partial_two_files.bin": shard(flags(block=3, two_files=True, one_call_each=True), "none", THREE, PARTS),
    "v1_valid_partial.bin": shard(flags(legacy=True), "none", THREE, PARTS),
    "flipped_block.bin": shard(flags(block=4), "none", [piece(0, 0, 20, 2, flip=(5, 1))], [(0, 0, 4), (0, 6, 9)]),
    "v1_flipped_chunk.bin": shard(flags(legacy=True), "none", [piece(0, 0, 20, 2, flip=(5, 1))],
                                  [(0, 0, 4), (0, 9, 20)]),
    "v1_contiguous_flipped_partial_elsewhere.bin": shard(flags(legacy=True), "none",
                                               [piece(0, 0, 20, 2, "other_layout", flip=(12, 0))], [(0, 0, 4)]),
    "regression_v1_partial_read_unchecked_chunks.bin": shard(flags(legacy=True), "none",
                                             [piece(0, 0, 20, 2, "other_layout", flip=(12, 0))], [(0, 10, 14)]),
    "regression_v1_partial_read_of_another_dataset.bin": shard(flags(legacy=True), "none", [piece(0, 0, 8, 1), piece(0, 0, 8, 2)],
                                    [(1, 1, 3)]),
    "truncated.bin": shard(flags(), "truncated", THREE, truncate_to=200),
    "file_gone.bin": shard(flags(), "gone", THREE),
    "link_out_of_folder.bin": shard(flags(), "link_out", THREE),
    "link_within_folder.bin": shard(flags(), "link_in", THREE),
}
for k in ["missing", "other_length", "other_rank", "other_type", "unallocated", "other_layout", "compact"]:
    SHARD["kind_" + k + ".bin"] = shard(flags(), "none", [piece(3, 4, 6, 4, k), piece(0, 0, 5)])
for seed, how in enumerate(["external_link", "external_storage", "virtual"]):
    for fl, fmt in ((flags(), ""), (flags(legacy=True), "regression_v1_")):  # format 1 read them
        SHARD[fmt + how + ".bin"] = shard(fl, "none", [piece(0, 0, 2, seed, "outside")])


def write(target, seeds):
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    for file, data in seeds.items():
        with open(os.path.join(folder, file), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    write("weights", WEIGHTS)
    write("ckpt_shard", SHARD)
