"""The backend classes as an engine drives them: several steps of a batch that mixes prompts,
chunked prefill and decodes, two layers sharing the step's metadata and plan, FP8 caches with
the layer's scales, cross-attention whose decode steps pass key=None, encoders, profiling runs
with an empty cache and the warm-up call; each over the cache layout the impl picks ("auto")
and over tiled caches (kv_cache_layout="tiled"), whose bytes are read back through
helpers.untile; block copies and swaps of tiled caches."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from conftest import cases
from helpers import activations, same_bytes, tile, untile
from oracle import FP8, assert_close, attend, cache_f64, encode, gather, to_f64

import pagedattn
from pagedattn import (
    AttentionType,
    PagedAttentionBackend,
    PagedAttentionImpl,
    PagedAttentionMetadata,
    PagedAttentionMetadataBuilder,
)


class ScaledLayer:
    """What an engine passes as `layer`: its FP8 scales as 0-d tensors (or as numpy float32
    scalars, or Python floats)."""

    def __init__(self, k_scale: float, v_scale: float, kind: str = "tensor"):
        make = {"tensor": torch.tensor, "numpy": np.float32, "float": float}[kind]
        self._k_scale = make(k_scale)
        self._v_scale = make(v_scale)


def test_backend_description():
    B = PagedAttentionBackend
    assert B.get_name() == "PAGEDATTN"
    assert B.get_supported_dtypes() == [torch.float16, torch.bfloat16, torch.float32]
    assert B.get_kv_cache_shape(10, 16, 4, 64) == (2, 10, 16 * 4 * 64)
    assert B.get_kv_cache_shape(10, 16, 4, 64, "fp8") == (2, 10, 16 * 4 * 64)
    for engine_name in ("bfloat16", "float16", "float32"):  # vLLM's cache_dtype strings
        assert B.get_kv_cache_shape(10, 16, 4, 64, engine_name) == (2, 10, 16 * 4 * 64)
    assert B.get_impl_cls() is PagedAttentionImpl
    assert B.get_metadata_cls() is PagedAttentionMetadata
    assert B.get_builder_cls() is PagedAttentionMetadataBuilder
    assert B.use_cascade_attention(1, 2, x=3) is False
    for ok in (1, 32, 80, 256, 1024):
        B.validate_head_size(ok)
    for bad in (0, -3, 1025):
        with pytest.raises(
            ValueError, match=rf"head_size = {bad} is outside the supported range 1\.\.1024"
        ):
            B.validate_head_size(bad)
    assert AttentionType.DECODER == "decoder" and AttentionType.ENCODER == "encoder"
    assert AttentionType.ENCODER_ONLY == "encoder_only"
    assert AttentionType.ENCODER_DECODER == "encoder_decoder"


def test_metadata_builder():
    b = PagedAttentionMetadataBuilder(4)
    md = b.build([1, 5, 3], [9, 5, 7], [[3, 1, 0], [2, 4], [5, 6]])
    assert md.query_start_loc.tolist() == [0, 1, 6, 9]
    assert md.seq_lens.dtype == torch.int32 and md.block_tables.dtype == torch.int32
    assert md.block_tables.tolist() == [[3, 1, 0], [2, 4, 0], [5, 6, 0]]
    # The new tokens' slots: position 8 of seq 0; 0..4 of seq 1; 4..6 of seq 2.
    assert md.slot_mapping.dtype == torch.int64
    assert md.slot_mapping.tolist() == [0 * 4 + 0, 8, 9, 10, 11, 16, 6 * 4 + 0, 25, 26]
    assert (md.num_seqs, md.num_prefills, md.num_prefill_tokens, md.num_decode_tokens) == (
        3,
        2,
        8,
        1,
    )
    assert (md.max_query_len, md.max_seq_len) == (5, 9)
    with pytest.raises(AttributeError):
        md.num_seqs = 4  # derived, read-only
    # A field assigned anew is seen by the derived values and the library's batch.
    batch = md.library_batch()
    md.seq_lens = torch.tensor([9, 6, 7], dtype=torch.int32)
    assert md.max_seq_len == 9 and md.library_batch() is not batch
    md.seq_lens = torch.tensor([9, 5, 7], dtype=torch.int32)
    with pytest.raises(pagedattn.Error, match=r"block_tables\[1\] has 1 entries; position 4"):
        b.build([1, 5], [1, 5], [[0], [2]])
    with pytest.raises(
        pagedattn.Error, match=r"query_lens\[0\] = 3 must be in \[0, seq_lens\[0\] = 2\]"
    ):
        b.build([3], [2], [[0]])
    cross = b.build([2], [2], [[0]], encoder_seq_lens=[6], cross_block_tables=[[7, 3]])
    assert cross.cross_slot_mapping.tolist() == [28, 29, 30, 31, 12, 13]
    assert cross.encoder_seq_lens.tolist() == [6]


def make_layer(heads, kv_heads, d, kv_cache_dtype, kv_cache_layout="auto", **features):
    """A decoder impl and the oracle's view of its features."""
    impl = PagedAttentionImpl(
        heads, d, 1 / math.sqrt(d), num_kv_heads=kv_heads, kv_cache_dtype=kv_cache_dtype,
        attn_type=AttentionType.DECODER, kv_cache_layout=kv_cache_layout, **features,
    )  # fmt: skip
    oracle = {
        "window": features.get("sliding_window") or 0,
        "soft_cap": features.get("logits_soft_cap") or 0.0,
        "alibi": features.get("alibi_slopes"),
        "sinks": features.get("sinks"),
    }
    return impl, oracle


def split_qkv(qkv, heads, kv_heads, d):
    return (
        qkv[:, : heads * d],
        qkv[:, heads * d : (heads + kv_heads) * d],
        qkv[:, (heads + kv_heads) * d :],
    )


def row_view(kv_cache, kv_heads, block_size, d, layout):
    """The backend cache as [2, num_blocks, kv_heads, block_size, d] in row order (a copy,
    untiled, for a tiled cache)."""
    view = kv_cache.view(2, kv_cache.shape[1], kv_heads, block_size, d)
    if layout == "tiled":
        return torch.stack([untile(view[0], 0), untile(view[1], 1)])
    return view


def check_cache_holds(
    kv_cache, history, tables, block_size, kv_heads, d, storage, fp8, scales, label, layout
):
    """Every token written so far is in its slot, encoded as the cache stores it."""
    view = row_view(kv_cache, kv_heads, block_size, d, layout)
    for s, (keys, values) in enumerate(history):
        for t in range(keys.shape[0]):
            b, o = tables[s][t // block_size], t % block_size
            for side, rows, scale in ((0, keys, scales[0]), (1, values, scales[1])):
                want = encode(rows[t].to(torch.float32), storage, fp8, scale)
                assert same_bytes(view[side, b, :, o], want), (
                    f"{label}: seq {s} token {t} side {side}"
                )


@pytest.mark.parametrize("kv_cache_layout", ["auto", "tiled"])
@pytest.mark.parametrize("kind", ["auto", "fp8", "fp8_e5m2", "f32-cache", "fp8-tensor"])
def test_forward_engine_steps(seed, kind, kv_cache_layout):
    """An engine's steps: prompts (one chunked over two steps), then decodes; two layers (one
    with a sliding window and sinks) share each step's metadata and plan. "fp8-tensor": a
    float8 cache under kv_cache_dtype "auto", whose format is the tensor's and whose scales
    are the layer's all the same. "auto": the layout kv_layout_preferred gives (bf16 over a
    bf16 or FP8 cache and f16 over FP8 may be tiled on the amx path); "tiled": block sizes
    16, 32, 128 and head sizes 64, 80, 128."""
    rng = random.Random(seed)
    tiled = kv_cache_layout == "tiled"
    for case in range(cases(6 if not tiled else 4)):
        act = rng.choice([torch.float32, torch.bfloat16, torch.float16])
        heads, kv_heads = rng.choice([(4, 2), (7, 1), (2, 2), (8, 1)])
        d = rng.choice([64, 80, 128] if tiled else [32, 64, 80, 128, 20])
        block_size = rng.choice([16, 32, 128] if tiled else [1, 16, 17, 5])
        kv_cache_dtype = "auto" if kind in ("auto", "f32-cache", "fp8-tensor") else kind
        fp8 = FP8.get(kv_cache_dtype)
        storage = torch.uint8 if fp8 else (torch.float32 if kind == "f32-cache" else act)
        if kind == "fp8-tensor":
            fp8 = storage = rng.choice([torch.float8_e4m3fn, torch.float8_e5m2])
        scales = (rng.uniform(0.02, 0.1), rng.uniform(0.02, 0.1)) if fp8 else (1.0, 1.0)
        scale_kind = rng.choice(["tensor", "tensor", "numpy", "float"])
        layer_obj = ScaledLayer(*scales, scale_kind) if fp8 else None
        prompt_lens = [rng.randint(1, 40) for _ in range(rng.randint(1, 4))]
        max_blocks = (max(prompt_lens) + 8 + block_size - 1) // block_size
        num_blocks = len(prompt_lens) * max_blocks + 2
        pool = list(range(num_blocks))
        rng.shuffle(pool)
        tables = [pool[s * max_blocks : (s + 1) * max_blocks] for s in range(len(prompt_lens))]
        shape = PagedAttentionBackend.get_kv_cache_shape(
            num_blocks, block_size, kv_heads, d, kv_cache_dtype
        )
        caches = [torch.zeros(shape, dtype=storage) for _ in range(2)]
        layers = [
            make_layer(heads, kv_heads, d, kv_cache_dtype, kv_cache_layout),
            make_layer(heads, kv_heads, d, kv_cache_dtype, kv_cache_layout,
                       sliding_window=rng.randint(1, 12),
                       sinks=[rng.uniform(-1, 1) for _ in range(heads)],
                       logits_soft_cap=rng.choice([None, 3.0]),
                       alibi_slopes=rng.choice([None, [0.1 * (h + 1) for h in range(heads)]])),
        ]  # fmt: skip
        history = [
            [(torch.zeros((0, kv_heads, d), dtype=act),) * 2 for _ in prompt_lens] for _ in layers
        ]
        done = [0] * len(prompt_lens)
        builder = PagedAttentionMetadataBuilder(block_size)
        for step in range(4):
            # Step 0 prefills half of the first prompt and all the others; step 1 the rest of
            # the first prompt (a chunk over its cached half) beside decodes; then decodes.
            q_lens = []
            for s, n in enumerate(prompt_lens):
                if step == 0:
                    q_lens.append(max(1, n // 2) if s == 0 else n)
                elif done[s] < n:
                    q_lens.append(n - done[s])
                else:
                    q_lens.append(1)
            seq_lens = [done[s] + q_lens[s] for s in range(len(prompt_lens))]
            md = builder.build(q_lens, seq_lens, [t for t in tables])
            tokens = sum(q_lens)
            for li, ((impl, features), kv_cache) in enumerate(zip(layers, caches, strict=True)):
                label = (
                    f"case {case} (seed {seed}) {kind} step {step} layer {li} act={act} "
                    f"H={heads}/{kv_heads} d={d} bs={block_size}"
                )
                qkv = activations(rng, tokens, heads + 2 * kv_heads, d, act).reshape(tokens, -1)
                query, key, value = split_qkv(qkv, heads, kv_heads, d)
                output = (
                    torch.full((tokens, heads * d), float("nan"), dtype=act)
                    if rng.random() < 0.7
                    else None
                )
                result = impl.forward(layer_obj, query, key, value, kv_cache, md, output=output)
                cache_dtype = kv_cache_dtype if kv_cache_dtype != "auto" else storage
                chosen = pagedattn.kv_layout_preferred(act, cache_dtype, block_size, d)
                layout = kv_cache_layout if tiled else chosen
                assert impl.cache_layout == layout, (label, impl.cache_layout)
                label += f" layout={layout}"
                if output is not None:
                    assert result is output
                assert result.shape == (tokens, heads * d) and result.dtype == act
                # The oracle over the keys the cache holds, once they are seen to be the ones
                # written.
                for s in range(len(prompt_lens)):
                    lo, hi = int(md.query_start_loc[s]), int(md.query_start_loc[s + 1])
                    k_new = key[lo:hi].reshape(-1, kv_heads, d)
                    v_new = value[lo:hi].reshape(-1, kv_heads, d)
                    old_k, old_v = history[li][s]
                    history[li][s] = (torch.cat([old_k, k_new]), torch.cat([old_v, v_new]))
                check_cache_holds(
                    kv_cache,
                    history[li],
                    tables,
                    block_size,
                    kv_heads,
                    d,
                    storage,
                    fp8,
                    scales,
                    label,
                    layout,
                )
                view = row_view(kv_cache, kv_heads, block_size, d, layout)
                kc = cache_f64(view[0], kv_cache_dtype if fp8 else "auto", scales[0])
                vc = cache_f64(view[1], kv_cache_dtype if fp8 else "auto", scales[1])
                q64 = to_f64(query).reshape(tokens, heads, d)
                for s in range(len(prompt_lens)):
                    lo, hi = int(md.query_start_loc[s]), int(md.query_start_loc[s + 1])
                    k, v = gather(kc, vc, tables[s], seq_lens[s], block_size)
                    want, _ = attend(q64[lo:hi], k, v, scale=impl.scale, **features)
                    assert_close(
                        result[lo:hi], want, float(np.abs(v).max()), act, f"{label} seq {s}"
                    )
            # Both layers have one geometry: one plan served them.
            steps = [v for v in md._objects.values() if isinstance(v, tuple)]
            assert len(steps) == 1, steps
            done = seq_lens


@pytest.mark.parametrize("kv_cache_layout", ["rows", "tiled"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3"])
def test_forward_cross_attention(seed, kv_cache_dtype, kv_cache_layout):
    """Encoder-decoder cross-attention: the prefill step writes the encoder's K/V through
    cross_slot_mapping; decode steps pass key=None and read them from the cache."""
    rng = random.Random(seed)
    act, heads, kv_heads, d, block_size = torch.bfloat16, 6, 2, 64, 16
    fp8 = FP8.get(kv_cache_dtype)
    storage = torch.uint8 if fp8 else act
    scales = (0.05, 0.04) if fp8 else (1.0, 1.0)
    enc_lens = [rng.randint(1, 40) for _ in range(3)]
    num_blocks = 12
    tables = [[0, 1, 2], [5, 4, 3], [9, 11, 10]]
    kv_cache = torch.zeros(
        PagedAttentionBackend.get_kv_cache_shape(num_blocks, block_size, kv_heads, d), dtype=storage
    )
    impl = PagedAttentionImpl(
        heads,
        d,
        0.125,
        num_kv_heads=kv_heads,
        kv_cache_dtype=kv_cache_dtype,
        attn_type=AttentionType.ENCODER_DECODER,
        kv_cache_layout=kv_cache_layout,
    )
    layer = ScaledLayer(*scales)
    builder = PagedAttentionMetadataBuilder(block_size)
    enc_k = activations(rng, sum(enc_lens), kv_heads, d, act)
    enc_v = activations(rng, sum(enc_lens), kv_heads, d, act)
    dec_lens = [rng.randint(1, 5) for _ in enc_lens]
    for step in range(3):
        q_lens = dec_lens if step == 0 else [1] * len(enc_lens)
        seqs = [sum(dec_lens) + step for _ in enc_lens]  # decoder positions do not matter here
        # The decoder's own cache is not this layer's: its slots are padding here.
        md = builder.build(
            q_lens,
            [max(q, s) for q, s in zip(q_lens, seqs, strict=True)],
            [[0]] * 3,
            [-1] * sum(q_lens),
            encoder_seq_lens=enc_lens,
            cross_block_tables=tables,
        )
        query = activations(rng, sum(q_lens), heads, d, act).reshape(sum(q_lens), -1)
        key = enc_k.reshape(sum(enc_lens), -1) if step == 0 else None
        value = enc_v.reshape(sum(enc_lens), -1) if step == 0 else None
        out = impl.forward(layer, query, key, value, kv_cache, md)
        view = row_view(kv_cache, kv_heads, block_size, d, kv_cache_layout)
        kc = cache_f64(view[0], kv_cache_dtype, scales[0])
        vc = cache_f64(view[1], kv_cache_dtype, scales[1])
        q64 = to_f64(query).reshape(-1, heads, d)
        at = 0
        for s, n in enumerate(enc_lens):
            k, v = gather(kc, vc, tables[s], n, block_size)
            want_k = enc_k[at : at + n].to(torch.float64).numpy()
            at += n
            if not fp8:
                assert np.array_equal(k, want_k), f"step {step} seq {s}: cross cache"
            lo, hi = int(md.query_start_loc[s]), int(md.query_start_loc[s + 1])
            want, _ = attend(q64[lo:hi], k, v, scale=0.125, attn_type="encoder_decoder")
            assert_close(
                out[lo:hi], want, float(np.abs(v).max()), act, f"cross step {step} seq {s}"
            )


@pytest.mark.parametrize("attn_type", [AttentionType.ENCODER_ONLY, AttentionType.ENCODER])
def test_forward_encoder(seed, attn_type):
    """Encoders attend bidirectionally over the batch's own rows; the cache is empty."""
    rng = random.Random(seed)
    heads, d = 12, 32
    impl = PagedAttentionImpl(heads, d, d**-0.5, attn_type=attn_type)
    lens = [rng.randint(1, 30) for _ in range(4)]
    md = PagedAttentionMetadataBuilder(16).build(lens, lens, [[]] * 4, slot_mapping=[])
    qkv = activations(rng, sum(lens), 3 * heads, d, torch.float32).reshape(sum(lens), -1)
    q, k, v = split_qkv(qkv, heads, heads, d)
    out = impl.forward(None, q, k, v, torch.empty(0), md)
    at = 0
    for s, n in enumerate(lens):
        q64 = to_f64(q[at : at + n]).reshape(n, heads, d)
        k64 = to_f64(k[at : at + n]).reshape(n, heads, d)
        v64 = to_f64(v[at : at + n]).reshape(n, heads, d)
        want, _ = attend(q64, k64, v64, scale=d**-0.5, attn_type=attn_type)
        assert_close(out[at : at + n], want, float(np.abs(v64).max()), torch.float32, f"seq {s}")
        at += n


def test_forward_profiling_and_warmup():
    impl = PagedAttentionImpl(4, 16, 0.25, num_kv_heads=2)
    query = torch.randn(7, 64)
    assert impl.forward(None, query, None, None, torch.empty(0), None) is query  # warm-up
    md = PagedAttentionMetadataBuilder(16).build([3, 4], [3, 4], [[0], [1]])
    key, value = torch.randn(7, 32), torch.randn(7, 32)
    out = impl.forward(None, query, key, value, torch.empty(0), md)
    want, _ = attend(
        to_f64(query[:3]).reshape(3, 4, 16),
        to_f64(key[:3]).reshape(3, 2, 16),
        to_f64(value[:3]).reshape(3, 2, 16),
        scale=0.25,
    )
    assert_close(out[:3], want, float(value.abs().max()), torch.float32, "profiling run")
    chunk = PagedAttentionMetadataBuilder(16).build([3], [5], [[0]])
    with pytest.raises(pagedattn.Error, match="kv_cache is empty but some sequence has keys"):
        impl.forward(None, query[:3], key[:3], value[:3], torch.empty(0), chunk)


def test_forward_steps_without_new_tokens():
    """A step with no new tokens writes nothing and returns no rows; key and value may still
    be given (empty), as an engine slices them."""
    impl = PagedAttentionImpl(4, 16, 0.25, num_kv_heads=2)
    kv_cache = torch.randn(PagedAttentionBackend.get_kv_cache_shape(3, 16, 2, 16))
    before = kv_cache.clone()
    empty_q, empty_kv = torch.empty(0, 64), torch.empty(0, 32)
    for md in (
        PagedAttentionMetadataBuilder(16).build([], [], []),
        PagedAttentionMetadataBuilder(16).build([0], [3], [[1]]),
    ):
        out = impl.forward(None, empty_q, empty_kv, empty_kv, kv_cache, md)
        assert out.shape == (0, 64)
    assert torch.equal(kv_cache, before)


def test_new_output_holds_zeros_in_padded_rows():
    """Rows past the batch's (a padded query): zeros in an output the impl makes, as the
    functions leave them; an output given keeps them as they were."""
    impl = PagedAttentionImpl(4, 16, 0.25, num_kv_heads=2)
    kv_cache = torch.zeros(PagedAttentionBackend.get_kv_cache_shape(3, 16, 2, 16))
    md = PagedAttentionMetadataBuilder(16).build([3], [3], [[2]])
    query, key, value = torch.randn(5, 64), torch.randn(5, 32), torch.randn(5, 32)
    out = impl.forward(None, query, key, value, kv_cache, md)
    assert torch.equal(out[3:], torch.zeros(2, 64)) and out[:3].abs().sum() > 0
    given = torch.full((5, 64), 7.0)
    impl.forward(None, query, key, value, kv_cache, md, output=given)
    assert torch.equal(given[3:], torch.full((2, 64), 7.0))
    assert torch.equal(given[:3], out[:3])
    encoder = PagedAttentionImpl(4, 16, 0.25, num_kv_heads=2, attn_type=AttentionType.ENCODER)
    out = encoder.forward(None, query, key, value, torch.empty(0), md)
    assert torch.equal(out[3:], torch.zeros(2, 64))


def test_kv_sharing_layer_writes_nothing():
    """A layer that reads another layer's cache (kv_sharing_target_layer_name) writes none."""
    md = PagedAttentionMetadataBuilder(4).build([2], [2], [[1]])
    kv_cache = torch.zeros(PagedAttentionBackend.get_kv_cache_shape(3, 4, 1, 8))
    owner = PagedAttentionImpl(2, 8, 0.3, num_kv_heads=1)
    reader = PagedAttentionImpl(2, 8, 0.3, num_kv_heads=1, kv_sharing_target_layer_name="layers.0")
    q, k, v = torch.randn(2, 16), torch.randn(2, 8), torch.randn(2, 8)
    owner.forward(None, q, k, v, kv_cache, md)
    before = kv_cache.clone()
    out_reader = reader.forward(None, q, k * 5, v * 5, kv_cache, md)
    assert torch.equal(kv_cache, before)
    assert torch.allclose(out_reader, owner.forward(None, q, k, v, kv_cache, md))


def test_backend_copy_and_swap():
    shape = PagedAttentionBackend.get_kv_cache_shape(4, 2, 1, 3)
    caches = [
        torch.arange(math.prod(shape), dtype=torch.float32).view(shape) + 100 * i for i in range(2)
    ]
    want = [c.clone() for c in caches]
    for w in want:
        w[:, 3] = w[:, 0]
    PagedAttentionBackend.copy_blocks(caches, torch.tensor([[0, 3]]))
    assert all(torch.equal(c, w) for c, w in zip(caches, want, strict=True))
    dst = torch.zeros(shape)
    PagedAttentionBackend.swap_blocks(caches[0], dst, {1: 2})
    assert torch.equal(dst[:, 2], caches[0][:, 1]) and dst[:, [0, 1, 3]].abs().sum() == 0


@pytest.mark.parametrize("kv_cache_layout", ["auto", "tiled"])
def test_kv_sharing_layers_agree_on_the_layout(kv_cache_layout):
    """A layer reading another layer's cache picks the same layout and reads what it wrote."""
    md = PagedAttentionMetadataBuilder(16).build([20], [20], [[2, 0]])
    kv_cache = torch.zeros(PagedAttentionBackend.get_kv_cache_shape(3, 16, 2, 64)).bfloat16()
    owner = PagedAttentionImpl(4, 64, 0.125, num_kv_heads=2, kv_cache_layout=kv_cache_layout)
    reader = PagedAttentionImpl(
        4, 64, 0.125, num_kv_heads=2, kv_sharing_target_layer_name="layers.0",
        kv_cache_layout=kv_cache_layout,
    )  # fmt: skip
    q = torch.randn(20, 256).bfloat16()
    k, v = torch.randn(20, 128).bfloat16(), torch.randn(20, 128).bfloat16()
    want = owner.forward(None, q, k, v, kv_cache, md)
    before = kv_cache.clone()
    got = reader.forward(None, q, None, None, kv_cache, md)
    assert reader.cache_layout == owner.cache_layout
    assert torch.equal(kv_cache, before) and torch.equal(got, want)


def test_backend_copy_and_swap_tiled(seed):
    """PagedAttentionBackend's block copy and swap move whole tiles: after them, an impl that
    writes and reads tiled caches sees each destination block as its source."""
    rng = random.Random(seed)
    heads, kv_heads, d, bs, nb = 7, 1, 80, 32, 6
    impl = PagedAttentionImpl(heads, d, d**-0.5, num_kv_heads=kv_heads, kv_cache_layout="tiled")
    shape = PagedAttentionBackend.get_kv_cache_shape(nb, bs, kv_heads, d)
    kv_cache = torch.zeros(shape, dtype=torch.bfloat16)
    builder = PagedAttentionMetadataBuilder(bs)
    n = 2 * bs
    qkv = activations(rng, n, heads + 2 * kv_heads, d, torch.bfloat16).reshape(n, -1)
    query, key, value = split_qkv(qkv, heads, kv_heads, d)
    first = impl.forward(None, query, key, value, kv_cache, builder.build([n], [n], [[4, 1]]))
    view = kv_cache.view(2, nb, kv_heads, bs, d)
    # The cache is tiled: its bytes are the rows' written keys in tiled order.
    want_k = key.reshape(n, kv_heads, d)[:bs].transpose(0, 1)
    assert same_bytes(view[0, 4], tile(want_k, 0))

    def reread(cache, table):
        md = builder.build([n], [n], [table], slot_mapping=[-1] * n)
        return impl.forward(None, query, None, None, cache, md)

    PagedAttentionBackend.copy_blocks([kv_cache], {4: [0, 5], 1: 2})
    assert torch.equal(reread(kv_cache, [0, 2]), first)
    assert torch.equal(reread(kv_cache, [5, 1]), first)
    pool = torch.zeros((2, nb + 3, shape[2]), dtype=torch.bfloat16)
    PagedAttentionBackend.swap_blocks(kv_cache, pool, torch.tensor([[4, 8], [1, 0]]))
    assert torch.equal(reread(pool, [8, 0]), first)


@pytest.mark.parametrize("attn_type", ["decoder", "encoder_only"])
def test_forward_takes_numpy_arrays(attn_type):
    """PYTHON.md's tensors are torch tensors or numpy arrays: the impl gives numpy arrays the
    same bytes as torch tensors over the same data."""
    heads, kv_heads, d, bs = 4, 2, 16, 4
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(5, n * d, generator=g) for n in (heads, kv_heads, kv_heads))
    md = pagedattn.PagedAttentionMetadataBuilder(bs).build([3, 2], [3, 2], [[1], [0]])
    results = []
    for as_numpy in (False, True):
        impl = pagedattn.PagedAttentionImpl(
            heads, d, d**-0.5, kv_heads, attn_type=attn_type, kv_cache_layout="rows"
        )
        shape = pagedattn.PagedAttentionBackend.get_kv_cache_shape(2, bs, kv_heads, d)
        kv_cache = torch.zeros(shape if attn_type == "decoder" else (0,))
        args = [t.numpy() if as_numpy else t for t in (q, k, v, kv_cache)]
        out = impl.forward(None, *args, md)
        assert isinstance(out, np.ndarray) == as_numpy and tuple(out.shape) == (5, heads * d)
        results.append((torch.as_tensor(out), torch.as_tensor(args[3])))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_default_cache_is_the_c_api_layout():
    """PYTHON.md's kv_cache has the C API's block layout: by default the impl writes the new
    K/V where write_kv puts them, also where the tiles would read faster (bf16, block 16)."""
    heads, kv_heads, d, bs, nb = 4, 2, 64, 16, 3
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(20, n * d, generator=g).bfloat16() for n in (heads, kv_heads, kv_heads))
    md = pagedattn.PagedAttentionMetadataBuilder(bs).build([20], [20], [[2, 0]])
    impl = pagedattn.PagedAttentionImpl(heads, d, d**-0.5, kv_heads)
    shape = pagedattn.PagedAttentionBackend.get_kv_cache_shape(nb, bs, kv_heads, d)
    kv_cache = torch.zeros(shape, dtype=torch.bfloat16)
    out = impl.forward(None, q, k, v, kv_cache, md)
    assert impl.cache_layout == "rows"
    want = torch.zeros(shape, dtype=torch.bfloat16)
    views = [want[i].view(nb, kv_heads, bs, d) for i in (0, 1)]
    pagedattn.write_kv(k.view(20, kv_heads, d), v.view(20, kv_heads, d), *views, md.slot_mapping)
    assert torch.equal(kv_cache.view(torch.int16), want.view(torch.int16))
    again = pagedattn.PagedAttentionImpl(heads, d, d**-0.5, kv_heads).forward(
        None, q, None, None, want, md
    )
    assert torch.equal(out.view(torch.int16), again.view(torch.int16))
