"""Random batches, caches in every layout the library reads, and the expected bytes of writes,
for the Python tests. Nothing here calls pagedattn."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np
import torch
from oracle import FP8, encode

ACTIVATIONS = [torch.float32, torch.float16, torch.bfloat16]
CACHE_KINDS = ["auto", "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2"]
PLAIN = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
LAYOUTS = ["dense", "vllm", "padded"]  # where the tiles lie (strides)
NAN_BYTE = 0x7F  # a NaN in both FP8 formats
GROUP = 16  # PA_KV_TILED's group: tokens of a key group, elements of a value group


def _positions(side: int, block_size: int, head_size: int) -> torch.Tensor:
    """[block_size * head_size]: the tiled position of row-order element t * head_size + e."""
    t = torch.arange(block_size).repeat_interleave(head_size)
    e = torch.arange(head_size).repeat(block_size)
    if side == 0:
        pos = (t // GROUP) * GROUP * head_size + (e // 2) * 32 + (t % GROUP) * 2 + e % 2
    else:
        pos = (e // GROUP) * GROUP * block_size + (t // 2) * 32 + (e % GROUP) * 2 + t % 2
    assert sorted(pos.tolist()) == list(range(block_size * head_size))  # a permutation
    return pos


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def tile(rows: torch.Tensor, side: int) -> torch.Tensor:
    """The tiled order of row-order tiles ``[..., block_size, head_size]`` (a new tensor of the
    same shape and dtype, bit for bit)."""
    *lead, bs, d = rows.shape
    pos = _positions(side, bs, d)
    src = _bits(rows.contiguous()).reshape(*lead, bs * d)
    out = torch.empty_like(src)
    out[..., pos] = src
    return out.view(rows.dtype).reshape(rows.shape)


def untile(tiled: torch.Tensor, side: int) -> torch.Tensor:
    """The row order of tiled tiles ``[..., block_size, head_size]`` (the inverse of tile)."""
    *lead, bs, d = tiled.shape
    pos = _positions(side, bs, d)
    src = _bits(tiled.contiguous()).reshape(*lead, bs * d)
    return src[..., pos].contiguous().view(tiled.dtype).reshape(tiled.shape)


@dataclass
class Cache:
    """A paged cache: key/value views [num_blocks, kv_heads, block_size, d] over `base`, which
    also holds the padding between tiles (NaN: a read of it shows)."""

    key: torch.Tensor
    value: torch.Tensor
    base: torch.Tensor
    kv_cache_dtype: str  # as passed to pagedattn
    storage: torch.dtype  # the tensors' dtype
    fp8: torch.dtype | None  # the FP8 format, if any
    k_scale: float = 1.0
    v_scale: float = 1.0

    @property
    def block_size(self) -> int:
        return self.key.shape[2]


def cache_storage(kind: str, act: torch.dtype, rng: random.Random):
    """(tensor dtype, kv_cache_dtype string, FP8 format) for a cache kind."""
    if kind == "auto":
        return act, "auto", None
    if kind in PLAIN:
        return PLAIN[kind], "auto", None
    fp8 = FP8[kind]
    if rng.random() < 0.5:
        return torch.uint8, rng.choice(["fp8", "fp8_e4m3"] if kind == "fp8_e4m3" else [kind]), fp8
    return fp8, rng.choice(["auto", kind]), fp8


def make_cache(
    num_blocks,
    kv_heads,
    block_size,
    d,
    storage,
    kv_cache_dtype,
    fp8,
    layout,
    rng,
    k_scale=1.0,
    v_scale=1.0,
) -> Cache:
    if layout == "dense":
        base = torch.empty((2, num_blocks, kv_heads, block_size, d), dtype=storage)
        key, value = base[0], base[1]
    elif layout == "vllm":  # K and V tiles of a (block, head) side by side in one page
        base = torch.empty((num_blocks, kv_heads, 2, block_size, d), dtype=storage)
        key, value = base[:, :, 0], base[:, :, 1]
    else:  # padding after every tile, after every head and after every block
        base = torch.empty((num_blocks + 1, kv_heads + 1, 2, block_size + 1, d), dtype=storage)
        key, value = (
            base[:num_blocks, :kv_heads, 0, :block_size],
            base[:num_blocks, :kv_heads, 1, :block_size],
        )
    fill_nan(base)
    cache = Cache(key, value, base, kv_cache_dtype, storage, fp8, k_scale, v_scale)
    for side, scale in ((key, k_scale), (value, v_scale)):  # stale, finite data in every tile
        side.copy_(encode(torch.empty(side.shape).uniform_(-1, 1) * scale, storage, fp8, scale))
    return cache


def fill_nan(t: torch.Tensor) -> None:
    if t.dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2):
        t.view(torch.uint8).fill_(NAN_BYTE)
    else:
        t.fill_(float("nan"))


@dataclass
class Batch:
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    num_blocks: int
    block_size: int
    query_start_loc: torch.Tensor = field(init=False)
    seq_lens_t: torch.Tensor = field(init=False)
    block_tables_t: torch.Tensor = field(init=False)

    def __post_init__(self):
        starts = np.concatenate(([0], np.cumsum(self.query_lens))).astype(np.int32)
        self.query_start_loc = torch.from_numpy(starts)
        self.seq_lens_t = torch.tensor(self.seq_lens, dtype=torch.int32)
        width = max((len(t) for t in self.block_tables), default=0)
        table = torch.zeros((len(self.block_tables), width), dtype=torch.int32)
        for s, row in enumerate(self.block_tables):
            table[s, : len(row)] = torch.tensor(row, dtype=torch.int32)
        self.block_tables_t = table

    @property
    def num_tokens(self) -> int:
        return int(sum(self.query_lens))


def random_lengths(rng: random.Random, num_seqs: int, max_len: int, attn_type: str):
    """(query_lens, seq_lens): decodes, whole prompts and chunks over a cached prefix."""
    query_lens, seq_lens = [], []
    for _ in range(num_seqs):
        seq_len = rng.randint(1, max_len)
        kind = rng.random()
        if attn_type == "encoder_decoder":
            q = rng.randint(1, 6)
        elif kind < 0.35:
            q = 1  # decode
        elif kind < 0.6:
            q = seq_len  # whole prompt
        elif kind < 0.65:
            q = 0  # a sequence with no new rows
        else:
            q = rng.randint(1, seq_len)  # a chunk over a cached prefix
        query_lens.append(q)
        seq_lens.append(seq_len)
    return query_lens, seq_lens


def random_batch(
    rng: random.Random, query_lens, seq_lens, block_size: int, spare: int = 3
) -> Batch:
    """Block tables over a shuffled pool; the blocks a sequence needs, sometimes one more."""
    needs = [(n + block_size - 1) // block_size + (rng.random() < 0.3) for n in seq_lens]
    num_blocks = sum(needs) + spare
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    tables, at = [], 0
    for n in needs:
        tables.append(pool[at : at + n])
        at += n
    return Batch(list(query_lens), list(seq_lens), tables, num_blocks, block_size)


def slots(batch: Batch, first, count) -> list[int]:
    """Slots of positions first(s) .. first(s) + count(s) - 1 of every sequence, in order."""
    out = []
    bs = batch.block_size
    for s, table in enumerate(batch.block_tables):
        out.extend(table[p // bs] * bs + p % bs for p in range(first(s), first(s) + count(s)))
    return out


def activations(
    rng: random.Random,
    rows: int,
    heads: int,
    d: int,
    dtype: torch.dtype,
    fused_with: int = 0,
    magnitude: float = 1.0,
):
    """[rows, heads, d] values in [-magnitude, magnitude); with fused_with > 0, a view into a
    wider row (the fused-QKV case: row stride (heads + fused_with) * d)."""
    g = torch.Generator().manual_seed(rng.randrange(1 << 62))
    width = (heads + fused_with) * d
    full = (torch.rand((rows, width), generator=g, dtype=torch.float64) * 2 - 1) * magnitude
    full = full.to(dtype)
    if fused_with:
        return full[:, : heads * d].view(rows, heads, d)
    return full.view(rows, heads, d)


def expected_cache_after_write(
    cache: Cache, key: torch.Tensor, value: torch.Tensor, slots, kv_layout: str = "rows"
):
    """Copies of the key and value views with the rows of non-negative slots encoded in, in
    row order (a tiled cache's tiles are read through untile)."""
    if kv_layout == "tiled":
        want_k, want_v = untile(cache.key, 0), untile(cache.value, 1)
    else:
        want_k, want_v = cache.key.clone(), cache.value.clone()
    bs = cache.block_size
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        b, o = slot // bs, slot % bs
        want_k[b, :, o] = encode(key[t].to(torch.float32), cache.storage, cache.fp8, cache.k_scale)
        want_v[b, :, o] = encode(
            value[t].to(torch.float32), cache.storage, cache.fp8, cache.v_scale
        )
    return want_k, want_v


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit equality of two tensors of one dtype (NaN == NaN)."""
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
