"""The functions against the float64 oracle, over random shapes: every activation and cache
dtype, strided caches (vLLM's interleaved pages, padded ones), fused-QKV views, out= given,
block sizes 1, 16, 17, 128 and odd, head sizes 32..256 and awkward ones, GQA 7:1, MQA, ALiBi,
sliding windows, soft-caps, sinks, decodes, chunks, whole prompts and empty batches; the same
over tiled caches (layout="tiled": block sizes 16, 32, 128, head sizes 16..256), whose bytes
after a write are checked against helpers.tile (include/pagedattn.h's formula written out) and
spot-checked at hand-computed positions; copies and swaps of tiled blocks."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from conftest import cases
from helpers import (
    ACTIVATIONS,
    CACHE_KINDS,
    LAYOUTS,
    activations,
    cache_storage,
    expected_cache_after_write,
    make_cache,
    random_batch,
    random_lengths,
    same_bytes,
    slots,
    tile,
    untile,
)
from oracle import assert_close, assert_lse, attend, cache_f64, gather, to_f64

import pagedattn

HEAD_SIZES = [32, 64, 80, 128, 256, 1, 7, 20, 96]
BLOCK_SIZES = [1, 16, 17, 128, 3, 5]
GROUPS = [(1, 1), (2, 1), (4, 2), (7, 1), (8, 2), (3, 3)]  # (query heads, KV heads)
# A tiled cache needs multiples of 16: 64, 80 and 128 twice as often as the others.
TILED_HEAD_SIZES = [64, 80, 128, 64, 80, 128, 16, 32, 96, 256]
TILED_BLOCK_SIZES = [16, 32, 128]


def random_features(rng: random.Random, heads: int, d: int):
    f = {"scale": rng.choice([None, 0.5 / math.sqrt(d)])}
    if rng.random() < 0.25:
        f["alibi_slopes"] = [rng.uniform(0.01, 0.5) for _ in range(heads)]
    if rng.random() < 0.25:
        f["sliding_window"] = rng.randint(1, 24)
    if rng.random() < 0.25:
        f["logits_soft_cap"] = rng.uniform(0.5, 5.0)
    if rng.random() < 0.25:
        f["sinks"] = torch.tensor([rng.uniform(-2, 2) for _ in range(heads)], dtype=torch.float32)
    return f


def oracle_features(f):
    sinks = f.get("sinks")
    return {
        "window": f.get("sliding_window") or 0,
        "soft_cap": f.get("logits_soft_cap") or 0.0,
        "alibi": f.get("alibi_slopes"),
        "sinks": None if sinks is None else sinks.tolist(),
    }


def run_paged_case(
    rng: random.Random, label: str, attn_type: str = "decoder", kv_layout: str = "rows"
) -> None:
    tiled = kv_layout == "tiled"
    act = rng.choice(ACTIVATIONS)
    heads, kv_heads = rng.choice(GROUPS)
    d = rng.choice(TILED_HEAD_SIZES if tiled else HEAD_SIZES)
    block_size = rng.choice(TILED_BLOCK_SIZES if tiled else BLOCK_SIZES)
    kind = rng.choice(CACHE_KINDS)
    storage, kv_cache_dtype, fp8 = cache_storage(kind, act, rng)
    layout = rng.choice(LAYOUTS)
    num_seqs = rng.choice([0, 1, 1, 2, 3, 5])
    query_lens, seq_lens = random_lengths(rng, num_seqs, rng.choice([8, 40, 150]), attn_type)
    batch = random_batch(rng, query_lens, seq_lens, block_size)
    k_scale, v_scale = (rng.uniform(0.02, 0.2), rng.uniform(0.02, 0.2)) if fp8 else (1.0, 1.0)
    cache = make_cache(
        batch.num_blocks,
        kv_heads,
        block_size,
        d,
        storage,
        kv_cache_dtype,
        fp8,
        layout,
        rng,
        k_scale,
        v_scale,
    )
    label += (
        f" act={act} cache={kind}/{storage}/{kv_cache_dtype} layout={layout}/{kv_layout} H={heads}"
        f" KVH={kv_heads} d={d} bs={block_size} q={query_lens} k={seq_lens}"
    )

    # Every key of every sequence through write_kv, with padding rows between them.
    total = sum(seq_lens)
    keys = activations(rng, total, kv_heads, d, act)
    values = activations(rng, total, kv_heads, d, act)
    token_slots = slots(batch, lambda s: 0, lambda s: seq_lens[s])
    garbage = torch.full((kv_heads, d), 1e4).to(act)
    key_rows, value_rows, slot_list = [], [], []
    for t, slot in enumerate(token_slots):
        if rng.random() < 0.1:  # a padding row: what it holds must not reach the cache
            key_rows.append(garbage)
            value_rows.append(-garbage)
            slot_list.append(-1)
        key_rows.append(keys[t])
        value_rows.append(values[t])
        slot_list.append(slot)
    padded_keys = torch.stack(key_rows) if key_rows else keys
    padded_values = torch.stack(value_rows) if value_rows else values
    slot_mapping = torch.tensor(slot_list, dtype=torch.int64)
    with_padding = slot_list
    # want_k / want_v: the cache's tiles in row order, whatever the layout.
    want_k, want_v = expected_cache_after_write(
        cache, padded_keys, padded_values, with_padding, kv_layout
    )
    base_before = cache.base.clone()
    pagedattn.write_kv(
        padded_keys,
        padded_values,
        cache.key,
        cache.value,
        slot_mapping,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=k_scale,
        v_scale=v_scale,
        layout=kv_layout,
    )
    if tiled:
        assert same_bytes(cache.key, tile(want_k, 0)), f"{label}: tiled key cache after write_kv"
        assert same_bytes(cache.value, tile(want_v, 1)), f"{label}: tiled value cache after write"
    else:
        assert same_bytes(cache.key, want_k), f"{label}: key cache after write_kv"
        assert same_bytes(cache.value, want_v), f"{label}: value cache after write_kv"
    if layout == "padded":  # the padding between tiles is never written
        mask = torch.ones(cache.base.shape, dtype=torch.bool)
        mask[: batch.num_blocks, :kv_heads, :, :block_size] = False
        assert same_bytes(cache.base[mask], base_before[mask]), f"{label}: padding written"

    # Queries: a view into a fused QKV row half of the time.
    num_tokens = batch.num_tokens
    query = activations(
        rng, num_tokens, heads, d, act, fused_with=2 * kv_heads if rng.random() < 0.5 else 0
    )
    features = random_features(rng, heads, d)
    give_out = rng.random() < 0.5
    out = None
    if give_out:
        buffer = torch.full((num_tokens, heads * d + 8), float("nan"), dtype=act)
        out = buffer[:, : heads * d].view(num_tokens, heads, d)
    tables = batch.block_tables_t
    if rng.random() < 0.3:  # the first columns of a wider table, whose rest is not block ids
        wide = torch.full((tables.shape[0], tables.shape[1] + 3), -7, dtype=torch.int32)
        wide[:, : tables.shape[1]] = tables
        tables = wide[:, : tables.shape[1]]
    result, lse = pagedattn.paged_attention(
        query, cache.key, cache.value, batch.query_start_loc, batch.seq_lens_t,
        tables, attn_type=attn_type, kv_cache_dtype=kv_cache_dtype,
        k_scale=k_scale, v_scale=v_scale, out=out, return_lse=True, layout=kv_layout,
        **features,
    )  # fmt: skip
    if give_out:
        assert result is out
        assert torch.isnan(buffer[:, heads * d :]).all(), f"{label}: wrote past the rows"
    assert result.shape == query.shape and result.dtype == act

    # The oracle reads the keys and values the write was seen to store, in row order.
    key_f64 = cache_f64(want_k, kv_cache_dtype, k_scale)
    value_f64 = cache_f64(want_v, kv_cache_dtype, v_scale)
    scale = features["scale"] or 1 / math.sqrt(d)
    q64 = to_f64(query)
    for s in range(num_seqs):
        lo, hi = int(batch.query_start_loc[s]), int(batch.query_start_loc[s + 1])
        if lo == hi:
            continue
        k, v = gather(key_f64, value_f64, batch.block_tables[s], seq_lens[s], block_size)
        want, want_lse = attend(
            q64[lo:hi], k, v, scale=scale, attn_type=attn_type, **oracle_features(features)
        )
        vmax = float(np.abs(v).max()) if v.size else 0.0
        assert_close(result[lo:hi], want, vmax, act, f"{label} seq {s}")
        assert_lse(lse[lo:hi], want_lse, f"{label} seq {s}")


@pytest.mark.parametrize("attn_type", ["decoder", "encoder_decoder"])
def test_paged_attention_random(seed, attn_type):
    rng = random.Random(seed)
    for i in range(cases(40 if attn_type == "decoder" else 15)):
        run_paged_case(rng, f"case {i} (seed {seed})", attn_type)


@pytest.mark.parametrize("attn_type", ["decoder", "encoder_decoder"])
def test_paged_attention_tiled_random(seed, attn_type):
    """write_kv and paged_attention over tiled caches: every activation and cache dtype, block
    sizes 16, 32, 128, head sizes 64, 80, 128 (and 16..256), GQA 7:1, vLLM's pages and padded
    tiles, mixed prefills, chunks and decodes; the bytes written against helpers.tile."""
    rng = random.Random(seed)
    for i in range(cases(40 if attn_type == "decoder" else 12)):
        run_paged_case(rng, f"tiled case {i} (seed {seed})", attn_type, "tiled")


def test_tiled_write_at_hand_computed_positions():
    """Token 17's element 5 of a 32 x 64 tile: the key group of tokens 16..31 starts at 16 * 64,
    element pair 2 at 2 * 32 in it, token 1 of the group at 1 * 2, element 1 of the pair at 1:
    1024 + 64 + 2 + 1 = 1091. Its value: element group 0 (elements 0..15) at 0, token pair 8 at
    8 * 32, element 5 at 5 * 2, token 1 of the pair at 1: 256 + 10 + 1 = 267. And element 37 of
    token 2: keys 0 + 18 * 32 + 2 * 2 + 1 = 581, values 2 * 16 * 32 + 1 * 32 + 5 * 2 + 0 = 1066.
    """
    bs, d = 32, 64
    key_cache = torch.zeros((3, 1, bs, d))
    value_cache = torch.zeros((3, 1, bs, d))
    key = torch.zeros((2, 1, d))
    value = torch.zeros((2, 1, d))
    key[0, 0, 5], value[0, 0, 5] = 1.5, -2.5  # token 17 of block 2 (slot 2 * 32 + 17)
    key[1, 0, 37], value[1, 0, 37] = 3.0, 4.0  # token 2 of block 1 (slot 32 + 2)
    pagedattn.write_kv(key, value, key_cache, value_cache, torch.tensor([81, 34]), layout="tiled")
    flat_k, flat_v = key_cache.reshape(3, -1), value_cache.reshape(3, -1)
    assert flat_k[2, 1091] == 1.5 and flat_v[2, 267] == -2.5
    assert flat_k[1, 581] == 3.0 and flat_v[1, 1066] == 4.0
    assert int((key_cache != 0).sum()) == 2 and int((value_cache != 0).sum()) == 2
    # Read back in rows, the same bytes are other tokens: the layouts are not interchangeable.
    query = torch.ones((1, 1, d))
    qsl, lens = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([18], dtype=torch.int32)
    args = (key_cache, value_cache, qsl, lens, torch.tensor([[2]], dtype=torch.int32))
    tiled_out = pagedattn.paged_attention(query, *args, layout="tiled")
    assert tiled_out[0, 0, 5] < 0  # token 17's value, seen through its key
    rows_out = pagedattn.paged_attention(query, *args)
    assert not torch.equal(tiled_out, rows_out)
    assert untile(key_cache[2:3], 0)[0, 0, 17, 5] == 1.5


def test_varlen_attention_random(seed):
    rng = random.Random(seed)
    for i in range(cases(30)):
        act = rng.choice(ACTIVATIONS)
        heads, kv_heads = rng.choice(GROUPS)
        d = rng.choice(HEAD_SIZES)
        attn_type = rng.choice(["encoder_only", "encoder", "decoder", "encoder_decoder"])
        num_seqs = rng.choice([0, 1, 2, 4])
        q_lens, k_lens = [], []
        for _ in range(num_seqs):
            k_len = rng.randint(1, 60)
            q_len = k_len if attn_type in ("encoder_only", "encoder") else rng.randint(0, k_len)
            q_lens.append(q_len)
            k_lens.append(k_len)
        cu_q = torch.tensor(np.concatenate(([0], np.cumsum(q_lens))), dtype=torch.int32)
        cu_k = torch.tensor(np.concatenate(([0], np.cumsum(k_lens))), dtype=torch.int32)
        fused = rng.random() < 0.5
        query = activations(
            rng, int(cu_q[-1]), heads, d, act, fused_with=2 * kv_heads if fused else 0
        )
        key = activations(rng, int(cu_k[-1]), kv_heads, d, act, fused_with=kv_heads if fused else 0)
        value = activations(rng, int(cu_k[-1]), kv_heads, d, act)
        features = random_features(rng, heads, d)
        out, lse = pagedattn.varlen_attention(
            query, key, value, cu_q, cu_k, attn_type=attn_type, return_lse=True, **features
        )
        label = (
            f"case {i} (seed {seed}) {attn_type} act={act} H={heads}/{kv_heads} d={d} "
            f"q={q_lens} k={k_lens}"
        )
        q64, k64, v64 = to_f64(query), to_f64(key), to_f64(value)
        scale = features["scale"] or 1 / math.sqrt(d)
        for s in range(num_seqs):
            ql, qh, kl, kh = int(cu_q[s]), int(cu_q[s + 1]), int(cu_k[s]), int(cu_k[s + 1])
            if ql == qh:
                continue
            want, want_lse = attend(
                q64[ql:qh],
                k64[kl:kh],
                v64[kl:kh],
                scale=scale,
                attn_type=attn_type,
                **oracle_features(features),
            )
            vmax = float(np.abs(v64[kl:kh]).max())
            assert_close(out[ql:qh], want, vmax, act, f"{label} seq {s}")
            assert_lse(lse[ql:qh], want_lse, f"{label} seq {s}")


def test_numpy_arrays():
    """float32 / float16 numpy arrays and uint8 FP8 caches work as torch tensors do."""
    rng = np.random.default_rng(1)
    for act, cache_dtype, kv_cache_dtype in [
        (np.float32, np.float32, "auto"),
        (np.float16, np.float16, "auto"),
        (np.float32, np.uint8, "fp8_e5m2"),
    ]:
        heads, kv_heads, d, bs, n = 4, 2, 16, 8, 20
        key_cache = np.zeros((4, kv_heads, bs, d), dtype=cache_dtype)
        value_cache = np.zeros_like(key_cache)
        keys = rng.uniform(-1, 1, (n, kv_heads, d)).astype(act)
        values = rng.uniform(-1, 1, (n, kv_heads, d)).astype(act)
        table = np.array([[2, 0, 3]], dtype=np.int32)
        slot_mapping = np.array([table[0, p // bs] * bs + p % bs for p in range(n)], dtype=np.int64)
        pagedattn.write_kv(
            keys,
            values,
            key_cache,
            value_cache,
            slot_mapping,
            kv_cache_dtype=kv_cache_dtype,
            k_scale=0.5,
            v_scale=0.25,
        )
        query = rng.uniform(-1, 1, (3, heads, d)).astype(act)
        qsl = np.array([0, 3], dtype=np.int32)
        lens = np.array([n], dtype=np.int32)
        out = pagedattn.paged_attention(
            query,
            key_cache,
            value_cache,
            qsl,
            lens,
            table,
            kv_cache_dtype=kv_cache_dtype,
            k_scale=0.5,
            v_scale=0.25,
        )
        assert isinstance(out, np.ndarray) and out.dtype == act and out.shape == query.shape
        kc = cache_f64(torch.from_numpy(key_cache), kv_cache_dtype, 0.5)
        vc = cache_f64(torch.from_numpy(value_cache), kv_cache_dtype, 0.25)
        k, v = gather(kc, vc, table[0], n, bs)
        want, _ = attend(query.astype(np.float64), k, v, scale=d**-0.5)
        dtype = torch.float32 if act == np.float32 else torch.float16
        assert_close(torch.from_numpy(out), want, float(np.abs(v).max()), dtype, str(act))


def test_merge_states_random(seed):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for i in range(cases(20)):
        act = rng.choice(ACTIVATIONS)
        rows, heads, d = rng.choice([0, 1, 5, 33]), rng.randint(1, 6), rng.choice([1, 7, 64, 128])
        out_a = (torch.rand((rows, heads, d), generator=g) * 2 - 1).to(act)
        out_b = (torch.rand((rows, heads, d), generator=g) * 2 - 1).to(act)
        lse_a = torch.rand((rows, heads), generator=g) * 20 - 10
        lse_b = torch.rand((rows, heads), generator=g) * 20 - 10
        for r in range(rows):  # rows and heads that saw no key on one side or both
            for h in range(heads):
                pick = rng.random()
                if pick < 0.1:
                    lse_a[r, h] = -math.inf
                elif pick < 0.2:
                    lse_b[r, h] = -math.inf
                elif pick < 0.25:
                    lse_a[r, h] = lse_b[r, h] = -math.inf
        la, lb = lse_a.double().numpy(), lse_b.double().numpy()
        top = np.maximum(la, lb)
        safe = np.where(np.isinf(top), 0.0, top)
        wa, wb = np.exp(la - safe), np.exp(lb - safe)
        total = wa + wb
        want = np.where(
            total[..., None] > 0,
            (wa[..., None] * to_f64(out_a) + wb[..., None] * to_f64(out_b))
            / np.where(total > 0, total, 1)[..., None],
            0.0,
        )
        want_lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1)), -math.inf)
        alias = rng.choice(["none", "a", "b"])
        out_arg = {"none": None, "a": out_a, "b": out_b}[alias]
        lse_arg = {"none": None, "a": lse_a, "b": lse_b}[rng.choice(["none", "a", "b"])]
        out, lse = pagedattn.merge_states(
            out_a.clone() if out_arg is None else out_a,
            lse_a.clone() if lse_arg is None else lse_a,
            out_b,
            lse_b,
            out=out_arg,
            lse=lse_arg,
        )
        label = (
            f"merge case {i} (seed {seed}) act={act} rows={rows} heads={heads} d={d} alias={alias}"
        )
        assert_close(out, want, 1.0, act, label)
        assert_lse(lse, want_lse, label)


def test_copy_and_swap_blocks(seed):
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for i in range(cases(12)):
        dtype = rng.choice([torch.float32, torch.bfloat16, torch.uint8, torch.float8_e4m3fn])
        nb, kvh, bs, d = (
            rng.randint(2, 9),
            rng.randint(1, 3),
            rng.choice([1, 4, 17]),
            rng.choice([8, 20]),
        )
        shape = (2, nb, bs * kvh * d)
        layers = [
            torch.randint(0, 120, shape, generator=g, dtype=torch.uint8).view(torch.uint8).to(dtype)
            if dtype != torch.float8_e4m3fn
            else torch.randint(0, 120, shape, generator=g, dtype=torch.uint8).view(dtype)
            for _ in range(rng.randint(1, 3))
        ]
        pairs = [(rng.randrange(nb), rng.randrange(nb)) for _ in range(rng.randint(0, 6))]
        want = [layer.clone() for layer in layers]
        for w in want:
            for src, dst in pairs:  # in order: chains and repeats mean what they mean sequentially
                w[:, dst] = w[:, src].clone()
        form = rng.choice(["tensor", "dict", "list", "0-d"])
        mapping = (
            torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2)
            if form == "tensor"
            else pairs
            if form == "list"
            else None
        )
        if form == "0-d":  # ids as 0-d tensors (keys unequal as objects) and arrays
            values = (torch.tensor, np.array)
            mapping = {torch.tensor(src): rng.choice(values)(dst) for src, dst in pairs}
        if form == "dict":
            mapping = {}
            for src, dst in pairs:
                mapping.setdefault(src, []).append(dst)
            want = [layer.clone() for layer in layers]
            for w in want:
                for src, dsts in mapping.items():
                    for dst in dsts:
                        w[:, dst] = w[:, src].clone()
        pagedattn.copy_blocks(layers, mapping)
        for layer, w in zip(layers, want, strict=True):
            assert same_bytes(layer, w), f"copy case {i} (seed {seed}) {form} {pairs}"

        # Swap between two pools of different sizes, and with (key, value) pairs of views.
        src = layers[0]
        dst = torch.zeros((2, nb + 2, shape[2]), dtype=dtype)
        pairs = [(rng.randrange(nb), rng.randrange(nb + 2)) for _ in range(rng.randint(0, 5))]
        want_dst = dst.clone()
        for s_, d_ in pairs:
            want_dst[:, d_] = src[:, s_]
        pagedattn.swap_blocks(src, dst, torch.tensor(pairs, dtype=torch.int64).reshape(-1, 2))
        assert same_bytes(dst, want_dst), f"swap case {i} (seed {seed}) {pairs}"
        src_pair = (src[0].view(nb, kvh, bs, d), src[1].view(nb, kvh, bs, d))
        page = torch.zeros((nb + 2, kvh, 2, bs, d), dtype=dtype)  # vLLM-style interleaved pages
        dst_pair = (page[:, :, 0], page[:, :, 1])
        want_page = page.clone()
        for s_, d_ in pairs:
            want_page[d_, :, 0], want_page[d_, :, 1] = src_pair[0][s_], src_pair[1][s_]
        pagedattn.swap_blocks(src_pair, dst_pair, pairs)
        assert same_bytes(page, want_page), f"swap pair case {i} (seed {seed}) {pairs}"


def test_empty_batch_and_padded_query():
    cache = torch.zeros((2, 3, 2, 4, 8))
    qsl, lens, table = (
        torch.zeros(1, dtype=torch.int32),
        torch.zeros(0, dtype=torch.int32),
        torch.zeros((0, 2), dtype=torch.int32),
    )
    out = pagedattn.paged_attention(torch.ones((0, 4, 8)), cache[0], cache[1], qsl, lens, table)
    assert out.shape == (0, 4, 8)
    # Query rows past query_start_loc[-1] (an engine's padding) come back as zeros / -inf.
    query = torch.ones((5, 4, 8))
    out, lse = pagedattn.paged_attention(
        query, cache[0], cache[1], torch.tensor([0, 2], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32), torch.tensor([[1, 0]], dtype=torch.int32),
        return_lse=True,
    )  # fmt: skip
    assert torch.equal(out[2:], torch.zeros((3, 4, 8)))
    assert torch.isinf(lse[2:]).all() and (lse[2:] < 0).all()
    assert torch.isfinite(lse[:2]).all()


def test_one_block_interleaved_cache():
    """A one-block cache in vLLM's page layout: its block stride is never stepped."""
    base = torch.randn(1, 2, 2, 4, 8)  # [block, kv head, K|V, token, d]
    key_cache, value_cache = base[:, :, 0], base[:, :, 1]
    query = torch.randn(1, 4, 8)
    out = pagedattn.paged_attention(
        query, key_cache, value_cache, torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([3], dtype=torch.int32), torch.tensor([[0]], dtype=torch.int32),
    )  # fmt: skip
    k, v = gather(to_f64(key_cache), to_f64(value_cache), [0], 3, 4)
    want, _ = attend(to_f64(query), k, v, scale=8**-0.5)
    assert_close(out, want, float(np.abs(v).max()), torch.float32, "one block")


def test_copy_and_swap_blocks_tiled(seed):
    """Copies and swaps of tiled caches move whole tiles: the bytes are the sequential copies',
    and attention over a destination block, read tiled, is attention over its source block."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    for i in range(cases(8)):
        act = rng.choice(ACTIVATIONS)
        storage, kv_cache_dtype = rng.choice(
            [(act, "auto"), (torch.float32, "auto"), (torch.uint8, "fp8_e4m3")]
        )
        nb, kvh, bs, d = rng.randint(3, 6), rng.choice([1, 2]), rng.choice([16, 32]), 64
        heads = kvh * rng.choice([1, 7])
        label = f"tiled copy case {i} (seed {seed}) act={act} cache={storage} KVH={kvh} bs={bs}"
        combined = torch.zeros((2, nb, bs * kvh * d), dtype=storage)
        key_cache, value_cache = (combined[s].view(nb, kvh, bs, d) for s in (0, 1))
        n = nb * bs
        keys = activations(rng, n, kvh, d, act)
        values = activations(rng, n, kvh, d, act)
        opts = {"kv_cache_dtype": kv_cache_dtype, "k_scale": 0.05, "v_scale": 0.04}
        pagedattn.write_kv(
            keys, values, key_cache, value_cache, torch.arange(n), layout="tiled", **opts
        )
        query = (torch.rand((1, heads, d), generator=g) * 2 - 1).to(act)

        def attend_block(k_cache, v_cache, block, query=query, opts=opts, bs=bs):
            return pagedattn.paged_attention(
                query, k_cache, v_cache, torch.tensor([0, 1], dtype=torch.int32),
                torch.tensor([bs], dtype=torch.int32), torch.tensor([[block]], dtype=torch.int32),
                layout="tiled", **opts,
            )  # fmt: skip

        before = [attend_block(key_cache, value_cache, b) for b in range(nb)]
        pairs = [(rng.randrange(nb), rng.randrange(nb)) for _ in range(rng.randint(1, 4))]
        want = combined.clone()
        source = list(range(nb))  # which original block each block now holds
        for src, dst in pairs:
            want[:, dst] = want[:, src].clone()
            source[dst] = source[src]
        form = rng.choice(["combined", "pair"])
        kv = combined if form == "combined" else (key_cache, value_cache)
        pagedattn.copy_blocks([kv], pairs, layout="tiled")
        assert same_bytes(combined, want), f"{label}: copy_blocks ({form}) {pairs}"
        for b in range(nb):
            got = attend_block(key_cache, value_cache, b)
            assert same_bytes(got, before[source[b]]), f"{label}: block {b} after copy {pairs}"

        # Swap into vLLM-style pages of a larger pool (pairs of views), and into a larger
        # combined pool (combined tensors), both tiled.
        page = torch.zeros((nb + 2, kvh, 2, bs, d), dtype=storage)
        dst_pair = (page[:, :, 0], page[:, :, 1])
        pool = torch.zeros((2, nb + 2, bs * kvh * d), dtype=storage)
        pool_pair = tuple(pool[s].view(nb + 2, kvh, bs, d) for s in (0, 1))
        swaps = [(rng.randrange(nb), rng.randrange(nb + 2)) for _ in range(rng.randint(1, 4))]
        pagedattn.swap_blocks((key_cache, value_cache), dst_pair, swaps, layout="tiled")
        pagedattn.swap_blocks(combined, pool, swaps, layout="tiled", dst_layout="tiled")
        final = {dst: src for src, dst in swaps}  # the last pair to a destination wins
        for dst, src in final.items():
            for side in (0, 1):
                assert same_bytes(page[dst, :, side], (key_cache, value_cache)[side][src]), (
                    f"{label}: swap {swaps} side {side}"
                )
                assert same_bytes(pool[side, dst], combined[side, src]), f"{label}: {swaps}"
            for k_cache, v_cache in (dst_pair, pool_pair):
                got = attend_block(k_cache, v_cache, dst)
                assert same_bytes(got, before[source[src]]), f"{label}: swapped block {dst}"
