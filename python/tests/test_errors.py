"""The error catalogue: each bad argument raises the exception PYTHON.md names, with a message
that names the argument and the value, and leaves the cache and the output as they were."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import pagedattn
from pagedattn import (
    PagedAttentionBackend,
    PagedAttentionImpl,
    PagedAttentionMetadata,
    PagedAttentionMetadataBuilder,
)

H, KVH, D, BS, NB = 4, 2, 16, 4, 6


def make_world(block_size: int, head_size: int, seed: int) -> dict:
    """A cache of the given geometry with a sequence of 6 tokens in blocks 3 and 1, a decode
    query and an output, all filled with known bytes."""
    g = torch.Generator().manual_seed(seed)
    return {
        "key_cache": torch.randn((NB, KVH, block_size, head_size), generator=g),
        "value_cache": torch.randn((NB, KVH, block_size, head_size), generator=g),
        "query": torch.randn((1, H, head_size), generator=g),
        "out": torch.full((1, H, head_size), 7.0),
        "qsl": torch.tensor([0, 1], dtype=torch.int32),
        "lens": torch.tensor([6], dtype=torch.int32),
        "table": torch.tensor([[3, 1]], dtype=torch.int32),
        "key": torch.randn((2, KVH, head_size), generator=g),
        "value": torch.randn((2, KVH, head_size), generator=g),
        "slots": torch.tensor([13, 4], dtype=torch.int64),
    }


@pytest.fixture
def world():
    """make_world's default geometry, with copies of what a refused call must leave alone."""
    w = make_world(BS, D, 7)
    w["before"] = {k: v.clone() for k, v in w.items() if k in ("key_cache", "value_cache", "out")}
    return w


def unchanged(w):
    for name, before in w["before"].items():
        assert torch.equal(w[name], before), f"{name} was written by a call that raised"


def attend(w, **overrides):
    args = {
        "query": w["query"], "key_cache": w["key_cache"], "value_cache": w["value_cache"],
        "query_start_loc": w["qsl"], "seq_lens": w["lens"], "block_tables": w["table"],
    }  # fmt: skip
    kwargs = {"out": w["out"]}
    for k, v in overrides.items():
        (args if k in args else kwargs)[k] = v
    return pagedattn.paged_attention(*args.values(), **kwargs)


def write(w, **overrides):
    args = {
        "key": w["key"], "value": w["value"], "key_cache": w["key_cache"],
        "value_cache": w["value_cache"], "slot_mapping": w["slots"],
    }  # fmt: skip
    kwargs = {}
    for k, v in overrides.items():
        (args if k in args else kwargs)[k] = v
    return pagedattn.write_kv(*args.values(), **kwargs)


META = torch.empty((1, H, D), device="meta")  # another device (no GPU here): the same check as CUDA

# (id, call, exception, status, message pattern)
CATALOGUE = [
    (
        "query on another device",
        lambda w: attend(w, query=META),
        pagedattn.Error,
        "invalid_argument",
        r"query is on device meta; pagedattn reads CPU tensors in place and copies nothing",
    ),
    (
        "query of a sparse layout",
        lambda w: attend(w, query=w["query"].to_sparse()),
        pagedattn.Error,
        "invalid_argument",
        r"query has layout torch.sparse_coo; pagedattn reads strided tensors",
    ),
    (
        "query of ints",
        lambda w: attend(w, query=w["query"].to(torch.int32)),
        pagedattn.Error,
        "invalid_argument",
        r"query has dtype int32; activations are float32, float16 or bfloat16",
    ),
    (
        "query of float64",
        lambda w: attend(w, query=w["query"].double()),
        pagedattn.Error,
        "invalid_argument",
        r"query has dtype torch.float64; activations are",
    ),
    (
        "out of another dtype",
        lambda w: attend(w, out=w["out"].half()),
        pagedattn.Error,
        "invalid_argument",
        r"out has dtype float16; query has float32",
    ),
    (
        "query with a strided last dimension",
        lambda w: attend(w, query=torch.randn(1, H, 2 * D)[:, :, ::2]),
        pagedattn.Error,
        "invalid_argument",
        r"query \(shape \[1, 4, 16\]\) has stride 2 in dimension 2",
    ),
    (
        "query as a list",
        lambda w: attend(w, query=[[0.0]]),
        TypeError,
        None,
        r"query must be a torch.Tensor or a numpy array, not list",
    ),
    (
        "query of 2 dimensions",
        lambda w: attend(w, query=w["query"].view(1, H * D)),
        pagedattn.Error,
        "invalid_argument",
        r"query has shape \[1, 64\]; it must be \[num_tokens",
    ),
    (
        "head size of the query and cache differ",
        lambda w: attend(w, query=torch.randn(1, H // 2, 2 * D), out=None),
        pagedattn.Error,
        "invalid_argument",
        r"cache->head_size = 16 does not match the layer's head_size = 32",
    ),
    (
        "num_heads not divisible by num_kv_heads",
        lambda w: attend(w, query=torch.randn(1, 3, D), out=None),
        pagedattn.Error,
        "invalid_argument",
        r"config->num_kv_heads = 2 does not divide num_heads = 3",
    ),
    (
        "head size over 1024",
        lambda w: pagedattn.varlen_attention(
            torch.randn(1, 1, 1025),
            torch.randn(1, 1, 1025),
            torch.randn(1, 1, 1025),
            torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32),
        ),
        pagedattn.Error,
        "invalid_argument",
        r"head_size = 1025",
    ),
    (
        "block id outside the cache",
        lambda w: attend(w, block_tables=torch.tensor([[3, 9]], dtype=torch.int32)),
        pagedattn.Error,
        "out_of_range",
        r"block_tables\[0\]\[1\] = 9 is outside \[0, 6\)",
    ),
    (
        "block_tables of int64",
        lambda w: attend(w, block_tables=w["table"].long()),
        pagedattn.Error,
        "invalid_argument",
        r"block_tables has dtype int64; it must be int32",
    ),
    (
        "seq_lens needing more blocks than the table has",
        lambda w: attend(w, seq_lens=torch.tensor([9], dtype=torch.int32)),
        pagedattn.Error,
        "out_of_range",
        r"seq_lens\[0\] = 9 needs 3 blocks of 4 tokens but block_table_stride = 2",
    ),
    (
        "query_start_loc of the wrong length",
        lambda w: attend(w, query_start_loc=torch.tensor([0, 1, 1], dtype=torch.int32)),
        pagedattn.Error,
        "invalid_argument",
        r"query_start_loc has 3 entries; seq_lens has 1, so it needs 2",
    ),
    (
        "more query rows claimed than the tensor has",
        lambda w: attend(w, query_start_loc=torch.tensor([0, 2], dtype=torch.int32)),
        pagedattn.Error,
        "invalid_argument",
        r"query has 1 rows; the batch has query_start_loc\[-1\] = 2 query rows",
    ),
    (
        "out read-only (numpy)",
        lambda w: pagedattn.paged_attention(
            w["query"].numpy(),
            w["key_cache"].numpy(),
            w["value_cache"].numpy(),
            w["qsl"].numpy(),
            w["lens"].numpy(),
            w["table"].numpy(),
            out=np.broadcast_to(np.float32(0), (1, H, D)),
        ),
        pagedattn.Error,
        "invalid_argument",
        r"out",
    ),
    (
        "kv_cache_dtype unknown",
        lambda w: attend(w, kv_cache_dtype="int4"),
        pagedattn.Error,
        "invalid_argument",
        r"kv_cache_dtype = 'int4' is not one of 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2'",
    ),
    (
        "fp8 kv_cache_dtype over a float cache",
        lambda w: attend(w, kv_cache_dtype="fp8"),
        pagedattn.Error,
        "invalid_argument",
        r"kv_cache_dtype 'fp8_e4m3' needs a cache of float8 or uint8 bytes; key_cache is float32",
    ),
    (
        "uint8 cache without an FP8 format",
        lambda w: attend(
            w,
            key_cache=w["key_cache"].view(torch.uint8)[..., :D],
            value_cache=w["value_cache"].view(torch.uint8)[..., :D],
        ),
        pagedattn.Error,
        "invalid_argument",
        r"key_cache holds uint8: say which FP8 format",
    ),
    (
        "FP8 scale of zero",
        lambda w: attend(
            w,
            key_cache=torch.zeros((NB, KVH, BS, D), dtype=torch.uint8),
            value_cache=torch.zeros((NB, KVH, BS, D), dtype=torch.uint8),
            kv_cache_dtype="fp8",
            k_scale=0.0,
        ),
        pagedattn.Error,
        "invalid_argument",
        r"k_scale = 0 must be finite and > 0",
    ),
    (
        "cache tiles not dense",
        lambda w: attend(
            w,
            key_cache=w["key_cache"].transpose(2, 3),
            value_cache=w["value_cache"].transpose(2, 3),
        ),
        pagedattn.Error,
        "invalid_argument",
        r"does not hold each \[block_size, head_size\] tile dense",
    ),
    (
        "key and value caches of different layouts",
        lambda w: attend(w, value_cache=w["value_cache"][:, :1]),
        pagedattn.Error,
        "invalid_argument",
        r"value_cache \(float32, shape \[6, 1, 4, 16\]\) does not have key_cache's dtype, "
        r"shape and strides",
    ),
    (
        "overlapping cache blocks (a stride-0 view)",
        lambda w: attend(
            w,
            key_cache=w["key_cache"][:1].expand(NB, KVH, BS, D),
            value_cache=w["value_cache"][:1].expand(NB, KVH, BS, D),
        ),
        pagedattn.Error,
        "invalid_argument",
        r"key_cache has stride 0 in dimension 0: its blocks overlap",
    ),
    (
        "overlapping cache blocks (a short block stride)",
        lambda w: attend(
            w,
            key_cache=w["key_cache"].as_strided((NB, KVH, BS, D), (BS * D, BS * D, D, 1)),
            value_cache=w["value_cache"].as_strided((NB, KVH, BS, D), (BS * D, BS * D, D, 1)),
        ),
        pagedattn.Error,
        "invalid_argument",
        r"block_stride = 64 is smaller than",
    ),
    (
        "slot outside the cache",
        lambda w: write(w, slot_mapping=torch.tensor([13, 99])),
        pagedattn.Error,
        "out_of_range",
        r"slot_mapping\[1\] = 99 is outside \[0, 24\) \(negative slots are padding\)",
    ),
    (
        "slot_mapping of int32",
        lambda w: write(w, slot_mapping=w["slots"].int()),
        pagedattn.Error,
        "invalid_argument",
        r"slot_mapping has dtype int32; it must be int64",
    ),
    (
        "fewer key rows than slots",
        lambda w: write(w, key=w["key"][:1], value=w["value"][:1]),
        pagedattn.Error,
        "invalid_argument",
        r"key has 1 rows; slot_mapping has 2 entries",
    ),
    (
        "key and value of different dtypes",
        lambda w: write(w, value=w["value"].bfloat16()),
        pagedattn.Error,
        "invalid_argument",
        r"value has dtype bfloat16; key has float32",
    ),
    (
        "key of the wrong width",
        lambda w: write(w, key=torch.randn(2, KVH * D + 2), value=torch.randn(2, KVH * D + 2)),
        pagedattn.Error,
        "invalid_argument",
        r"key has shape \[2, 34\]: 34 elements per row where num_kv_heads \* head_size = 32",
    ),
    (
        "key heads of the wrong size",
        lambda w: write(w, key=torch.randn(2, KVH, D + 1), value=torch.randn(2, KVH, D + 1)),
        pagedattn.Error,
        "invalid_argument",
        r"key has shape \[2, 2, 17\]: heads of 17 elements where head_size = 16",
    ),
    (
        "key split into the wrong heads (the right width)",
        lambda w: write(w, key=torch.randn(2, 2 * KVH, D // 2), value=torch.randn(2, KVH, D)),
        pagedattn.Error,
        "invalid_argument",
        r"key has shape \[2, 4, 8\]: heads of 8 elements where head_size = 16",
    ),
    (
        "key of four dimensions",
        lambda w: write(w, key=torch.randn(2, KVH, 2, D // 2), value=torch.randn(2, KVH, D)),
        pagedattn.Error,
        "invalid_argument",
        r"key has shape \[2, 2, 2, 8\]; it must be \[rows, num_kv_heads \* head_size\] or "
        r"\[rows, heads, head_size\]",
    ),
    (
        "block pair outside the cache",
        lambda w: pagedattn.copy_blocks([(w["key_cache"], w["value_cache"])], [(0, 1), (2, 6)]),
        pagedattn.Error,
        "out_of_range",
        r"block_pairs\[1\]\[1\] = 6 is outside \[0, 6\) of caches\[0\]",
    ),
    (
        "swap between caches of different geometry",
        lambda w: pagedattn.swap_blocks(
            (w["key_cache"], w["value_cache"]),
            (torch.zeros(NB, KVH, 2 * BS, D), torch.zeros(NB, KVH, 2 * BS, D)),
            {0: 1},
        ),
        pagedattn.Error,
        "invalid_argument",
        r"dst \(block_size 8, .*\) does not match src \(block_size 4",
    ),
    (
        "merge with an lse of the wrong shape",
        lambda w: pagedattn.merge_states(
            w["out"], torch.zeros(1, H), w["out"], torch.zeros(2, H), out=w["out"]
        ),
        pagedattn.Error,
        "invalid_argument",
        r"lse_b has shape \[2, 4\]; it must be \[1, num_heads = 4\]",
    ),
    (
        "ctx of the wrong type",
        lambda w: attend(w, ctx="cpu"),
        TypeError,
        None,
        r"ctx must be a pagedattn.Context or None, not str",
    ),
    (
        "alibi_slopes of the wrong length",
        lambda w: attend(w, alibi_slopes=[0.1, 0.2]),
        pagedattn.Error,
        "invalid_argument",
        r"alibi_slopes has 2 entries; the layer has num_heads = 4",
    ),
    (
        "negative sliding window",
        lambda w: attend(w, sliding_window=-2),
        pagedattn.Error,
        "invalid_argument",
        r"sliding_window = -2",
    ),
]


@pytest.mark.parametrize("case", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_catalogue(world, case):
    _, call, exception, status, pattern = case
    with pytest.raises(exception, match=pattern) as info:
        call(world)
    if status is not None:
        assert info.value.status == status
        assert isinstance(info.value, ValueError)
    unchanged(world)


def test_negative_row_stride_is_refused(world):
    query = np.ascontiguousarray(np.broadcast_to(world["query"].numpy(), (2, H, D)))[::-1]
    with pytest.raises(pagedattn.Error, match=r"query's dimension 0 has a negative stride"):
        pagedattn.paged_attention(
            query,
            world["key_cache"].numpy(),
            world["value_cache"].numpy(),
            np.array([0, 2], dtype=np.int32),
            world["lens"].numpy(),
            world["table"].numpy(),
        )


def test_forward_refuses_before_writing():
    """The fused forward checks the attention before the write: a bad block table leaves the
    cache as it was, though the slots were good."""
    kv_cache = torch.randn(PagedAttentionBackend.get_kv_cache_shape(NB, BS, KVH, D))
    before = kv_cache.clone()
    impl = PagedAttentionImpl(H, D, 0.25, num_kv_heads=KVH)
    md = PagedAttentionMetadataBuilder(BS).build([2], [6], [[3, 1]])
    bad = PagedAttentionMetadataBuilder(BS).build([2], [6], [[3, 7]], slot_mapping=md.slot_mapping)
    output = torch.full((2, H * D), 3.0)
    q, k, v = torch.randn(2, H * D), torch.randn(2, KVH * D), torch.randn(2, KVH * D)
    with pytest.raises(
        pagedattn.Error, match=r"block_tables\[0\]\[1\] = 7 is outside \[0, 6\)"
    ) as info:
        impl.forward(None, q, k, v, kv_cache, bad, output=output)
    assert info.value.status == "out_of_range"
    assert torch.equal(kv_cache, before) and torch.equal(output, torch.full((2, H * D), 3.0))
    with pytest.raises(
        pagedattn.Error, match=r"out has 1 rows; the batch has query_start_loc\[-1\] = 2 query rows"
    ):
        impl.forward(None, q, k, v, kv_cache, md, output=output[:1])
    assert torch.equal(kv_cache, before)
    with pytest.raises(pagedattn.Error, match=r"slot_mapping\[0\] = 99 is outside"):
        impl.forward(
            None,
            q,
            k,
            v,
            kv_cache,
            PagedAttentionMetadataBuilder(BS).build([2], [6], [[3, 1]], slot_mapping=[99, 4]),
            output=output,
        )
    assert torch.equal(kv_cache, before) and torch.equal(output, torch.full((2, H * D), 3.0))
    # A decoder's every new token needs a slot: with fewer, the attention would read keys that
    # were never written.
    short = PagedAttentionMetadataBuilder(BS).build([2], [6], [[3, 1]], slot_mapping=[13])
    with pytest.raises(
        pagedattn.Error, match=r"slot_mapping has 1 entries; the batch has 2 new tokens"
    ) as info:
        impl.forward(None, q, k, v, kv_cache, short, output=output)
    assert info.value.status == "invalid_argument"
    assert torch.equal(kv_cache, before) and torch.equal(output, torch.full((2, H * D), 3.0))


@pytest.mark.parametrize(
    "args, pattern",
    [
        (([1], [1], [[2**32 + 1]]), r"block_tables\[0\]\[0\] = 4294967297 does not fit int32"),
        (([1], [2**32 + 1], [[0]]), r"seq_lens\[0\] = 4294967297 does not fit int32"),
        (([2**31], [2**31], [[0]]), r"query_lens\[0\] = 2147483648 does not fit int32"),
    ],
)
def test_metadata_values_that_do_not_fit(args, pattern):
    """Lengths and block ids are int32 in the library: a larger value is refused, not wrapped."""
    with pytest.raises(pagedattn.Error, match=pattern) as info:
        PagedAttentionMetadataBuilder(BS).build(*args)
    assert info.value.status == "out_of_range"


@pytest.mark.parametrize(
    "mapping, exception, pattern",
    [
        ([[0, 1, 2, 3]], pagedattn.Error, r"block_mapping\[0\] = \[0, 1, 2, 3\] is not a"),
        ([0, 3], TypeError, r"block_mapping\[0\] = 0 must be a \(source, destination\) pair"),
        ("01", TypeError, r"block_mapping must be an int64 \[n, 2\] tensor, .* not str"),
        ([[0, 1], [2]], pagedattn.Error, r"block_mapping\[1\] = \[2\] is not a"),
        ([(0.9, 2.7)], TypeError, r"block_mapping\[0\] = \(0.9, 2.7\) must hold integer"),
        ({0: [1.5]}, TypeError, r"block_mapping\[0\] = \(0, 1.5\) must hold integer"),
    ],
)
def test_block_mappings_that_are_not_pairs(mapping, exception, pattern):
    kv_cache = torch.randn(PagedAttentionBackend.get_kv_cache_shape(NB, BS, KVH, D))
    before = kv_cache.clone()
    with pytest.raises(exception, match=pattern):
        pagedattn.copy_blocks([kv_cache], mapping)
    with pytest.raises(exception, match=pattern):
        pagedattn.swap_blocks(kv_cache, kv_cache.clone(), mapping)
    assert torch.equal(kv_cache, before)


@pytest.mark.parametrize(
    "args, exception, pattern",
    [
        ((10, 0, 4, 64), pagedattn.Error, r"block_size = 0 must be >= 1"),
        ((-5, 16, 4, 64), pagedattn.Error, r"num_blocks = -5 must be >= 0"),
        ((10, 16, -4, 64), pagedattn.Error, r"num_kv_heads = -4 must be >= 1"),
        ((10, 16, 4, 0), pagedattn.Error, r"head_size = 0 is outside the supported range"),
        ((10, 16.0, 4, 64), TypeError, r"block_size must be an int, not float"),
    ],
)
def test_kv_cache_shape_refuses_bad_sizes(args, exception, pattern):
    with pytest.raises(exception, match=pattern):
        PagedAttentionBackend.get_kv_cache_shape(*args)


def test_copy_blocks_wants_a_list_of_caches():
    kv_cache = torch.randn(PagedAttentionBackend.get_kv_cache_shape(NB, BS, KVH, D))
    before = kv_cache.clone()
    with pytest.raises(
        TypeError, match=r"kv_caches must be a list of per-layer caches, not Tensor"
    ):
        pagedattn.copy_blocks(kv_cache, [[0, 1]])
    assert torch.equal(kv_cache, before)


def test_forward_names_an_argument_of_the_wrong_kind():
    impl = PagedAttentionImpl(4, 64, 0.1, num_kv_heads=2)
    md = PagedAttentionMetadataBuilder(BS).build([2], [2], [[0]])
    kv_cache = torch.zeros(PagedAttentionBackend.get_kv_cache_shape(NB, BS, 2, 64))
    q, kv = torch.randn(2, 4 * 64), torch.randn(2, 2 * 64)
    cases = [
        (
            (q.tolist(), kv, kv, kv_cache, md),
            r"query must be a torch.Tensor or a numpy array, not list",
        ),
        ((q, kv, kv, "cache", md), r"kv_cache must be a torch.Tensor or a numpy array, not str"),
        (
            (q, kv, kv, kv_cache, {"seq_lens": [2]}),
            r"attn_metadata must be a PagedAttentionMetadata",
        ),
        (
            (q, kv.tolist(), kv, kv_cache, md),
            r"key must be a torch.Tensor or a numpy array",
        ),
    ]
    for args, pattern in cases:
        with pytest.raises(TypeError, match=pattern):
            impl.forward(None, *args)
    assert not kv_cache.any()  # nothing written


def test_metadata_fields_hold_tensors():
    with pytest.raises(TypeError, match=r"query_start_loc must be a torch.Tensor or a numpy array"):
        PagedAttentionMetadata([0, 2], torch.tensor([2]), torch.zeros(1, 1), torch.zeros(2))
    md = PagedAttentionMetadataBuilder(BS).build([2], [2], [[0]])
    with pytest.raises(TypeError, match=r"encoder_seq_lens must be a torch.Tensor, a numpy"):
        md.encoder_seq_lens = [3]
    assert md.encoder_seq_lens is None  # the refused value was not kept


def test_wrongly_typed_names_are_type_errors():
    with pytest.raises(TypeError, match=r"kv_cache_dtype must be a str, not int"):
        PagedAttentionImpl(4, 64, 0.1, kv_cache_dtype=5)
    with pytest.raises(TypeError, match=r"attn_type must be a str, not NoneType"):
        PagedAttentionImpl(4, 64, 0.1, attn_type=None)


def test_impl_refuses_at_construction():
    with pytest.raises(pagedattn.Error, match=r"head_size = 2000"):
        PagedAttentionImpl(4, 2000, 0.1)
    with pytest.raises(
        pagedattn.Error, match=r"config->num_kv_heads = 4 does not divide num_heads = 6"
    ):
        PagedAttentionImpl(6, 64, 0.1, num_kv_heads=4)
    with pytest.raises(pagedattn.Error, match=r"attn_type = 'causal' is not one of"):
        PagedAttentionImpl(4, 64, 0.1, attn_type="causal")
    with pytest.raises(pagedattn.Error, match=r"kv_cache_dtype = 'fp4'"):
        PagedAttentionImpl(4, 64, 0.1, kv_cache_dtype="fp4")
    with pytest.raises(pagedattn.Error, match=r"sinks has 3 entries; the layer has num_heads = 4"):
        PagedAttentionImpl(4, 64, 0.1, sinks=[0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"head_size = 0 is outside the supported range 1\.\.1024"):
        PagedAttentionBackend.validate_head_size(0)


def test_context_arguments(monkeypatch):
    with pytest.raises(pagedattn.Error, match=r"num_threads = 0 must be >= 1"):
        pagedattn.Context(0)
    with pytest.raises(TypeError, match="num_threads must be an int or None"):
        pagedattn.Context("2")
    monkeypatch.setenv("PA_NUM_THREADS", "two")
    with pytest.raises(pagedattn.Error, match=r"PA_NUM_THREADS = 'two' is not a thread count >= 1"):
        pagedattn.Context()
    monkeypatch.setenv("PA_NUM_THREADS", "1")
    assert pagedattn.Context().num_threads == 1
    monkeypatch.setenv("PA_ISA", "sse9")
    with pytest.raises(pagedattn.Error, match="PA_ISA"):
        pagedattn.Context()


def test_forked_child_gets_a_clear_error():
    """A context made before a fork has no threads in the child: it refuses instead of hanging."""
    code = (
        "import os, pagedattn, torch\n"
        "ctx = pagedattn.Context(2)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        z = torch.zeros\n"
        "        pagedattn.merge_states(z(1,1,4), z(1,1), z(1,1,4), z(1,1), ctx=ctx)\n"
        "        os._exit(3)\n"
        "    except pagedattn.Error as e:\n"
        "        os._exit(0 if 'forked' in str(e) else 4)\n"
        "    os._exit(5)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "z = torch.zeros\n"
        "pagedattn.merge_states(z(1,1,4), z(1,1), z(1,1,4), z(1,1))\n"
        "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], timeout=60, env=dict(os.environ))
    assert result.returncode == 0


def test_context_reports_its_kernels(monkeypatch):
    ctx = pagedattn.Context(1)
    assert ctx.isa in ("scalar", "avx2", "avx512")
    paths = ["scalar", "avx2", "avx512", "avx512bf16", "amx"]
    assert ctx.kernel_path in paths
    monkeypatch.setenv("PA_ISA", "avx512")
    capped = pagedattn.Context(1)
    assert paths.index(capped.kernel_path) <= paths.index("avx512")


def test_context_threads_argument():
    with pytest.raises(pagedattn.Error, match=r"threads = 'gpu' is not 'own' or 'openmp'"):
        pagedattn.Context(threads="gpu")


TILED_NEEDS = r"layout = PA_KV_TILED needs block_size and head_size multiples of 16; they are"

# (id, geometry, call, exception, status, message pattern)
LAYOUT_CATALOGUE = [
    (
        "layout unknown (attention)",
        (16, 64),
        lambda w: attend(w, layout="bogus"),
        pagedattn.Error,
        "invalid_argument",
        r"^layout = 'bogus' is not 'rows' or 'tiled'$",
    ),
    (
        "layout unknown (write)",
        (16, 64),
        lambda w: write(w, layout="bogus"),
        pagedattn.Error,
        "invalid_argument",
        r"^layout = 'bogus' is not 'rows' or 'tiled'$",
    ),
    (
        "layout of the wrong type",
        (16, 64),
        lambda w: write(w, layout=1),
        TypeError,
        None,
        r"layout must be 'rows' or 'tiled', not int",
    ),
    (
        "tiled write, block size 8",
        (8, 64),
        lambda w: write(w, layout="tiled"),
        pagedattn.Error,
        "unsupported",
        rf"^pa_write_kv: cache->{TILED_NEEDS} 8 and 64$",
    ),
    (
        "tiled attention, block size 8",
        (8, 64),
        lambda w: attend(w, layout="tiled"),
        pagedattn.Error,
        "unsupported",
        rf"^pa_paged_attention: cache->{TILED_NEEDS} 8 and 64$",
    ),
    (
        "tiled write, head size 40",
        (16, 40),
        lambda w: write(w, layout="tiled"),
        pagedattn.Error,
        "unsupported",
        rf"^pa_write_kv: cache->{TILED_NEEDS} 16 and 40$",
    ),
    (
        "tiled attention, head size 40",
        (16, 40),
        lambda w: attend(w, layout="tiled"),
        pagedattn.Error,
        "unsupported",
        rf"^pa_paged_attention: cache->{TILED_NEEDS} 16 and 40$",
    ),
    (
        "tiled copy, block size 8",
        (8, 64),
        lambda w: pagedattn.copy_blocks(
            [(w["key_cache"], w["value_cache"])], [(0, 1)], layout="tiled"
        ),
        pagedattn.Error,
        "unsupported",
        rf"^pa_copy_blocks: caches\[0\]->{TILED_NEEDS} 8 and 64$",
    ),
    (
        "swap between layouts",
        (16, 64),
        lambda w: pagedattn.swap_blocks(
            (w["key_cache"], w["value_cache"]),
            (w["key_cache"], w["value_cache"]),
            {0: 1},
            layout="tiled",
            dst_layout="rows",
        ),
        pagedattn.Error,
        "invalid_argument",
        r"^pa_swap_blocks: dst->layout = 0 differs from src->layout = 1; blocks are copied as "
        r"stored$",
    ),
    (
        "swap between layouts (combined caches)",
        (16, 64),
        lambda w: pagedattn.swap_blocks(
            w["key_cache"].view(2, NB // 2, -1),
            w["value_cache"].view(2, NB // 2, -1),
            {0: 1},
            dst_layout="tiled",
        ),
        pagedattn.Error,
        "invalid_argument",
        r"^pa_swap_blocks: dst->layout = 1 differs from src->layout = 0",
    ),
    (
        "kv_layout_preferred of float64",
        (16, 64),
        lambda w: pagedattn.kv_layout_preferred(torch.float64, torch.bfloat16, 16, 64),
        pagedattn.Error,
        "invalid_argument",
        r"act_dtype = torch.float64 is not float32, float16, bfloat16, fp8_e4m3 or fp8_e5m2",
    ),
    (
        "kv_layout_preferred of a uint8 cache",
        (16, 64),
        lambda w: pagedattn.kv_layout_preferred(torch.bfloat16, torch.uint8, 16, 64),
        pagedattn.Error,
        "invalid_argument",
        r"cache_dtype = torch.uint8 .* name the format, 'fp8_e4m3' or 'fp8_e5m2'",
    ),
]


@pytest.mark.parametrize("case", LAYOUT_CATALOGUE, ids=[c[0] for c in LAYOUT_CATALOGUE])
def test_layout_catalogue(case):
    """Layout errors: a name the extension cannot map, and what the library refuses (its
    message and status): tiled caches off multiples of 16, a swap between layouts. Nothing is
    written."""
    _, (block_size, head_size), call, exception, status, pattern = case
    w = make_world(block_size, head_size, 11)
    w["before"] = {k: v.clone() for k, v in w.items() if k in ("key_cache", "value_cache", "out")}
    with pytest.raises(exception, match=pattern) as info:
        call(w)
    if status is not None:
        assert info.value.status == status
        assert isinstance(info.value, ValueError)
    unchanged(w)


def test_impl_layout_errors():
    """kv_cache_layout: a bad name raises at construction; a tiled cache the geometry does not
    allow raises the library's error at the first forward, having written nothing."""
    with pytest.raises(
        pagedattn.Error, match=r"kv_cache_layout = 'columns' is not 'auto', 'rows' or 'tiled'"
    ):
        PagedAttentionImpl(H, 64, 0.1, num_kv_heads=KVH, kv_cache_layout="columns")
    d = 40
    impl = PagedAttentionImpl(H, d, 0.1, num_kv_heads=KVH, kv_cache_layout="tiled")
    assert impl.cache_layout == "tiled"
    kv_cache = torch.randn(PagedAttentionBackend.get_kv_cache_shape(NB, 16, KVH, d))
    before = kv_cache.clone()
    md = PagedAttentionMetadataBuilder(16).build([2], [6], [[3]])
    output = torch.full((2, H * d), 3.0)
    q, k, v = torch.randn(2, H * d), torch.randn(2, KVH * d), torch.randn(2, KVH * d)
    with pytest.raises(pagedattn.Error, match=rf"^pa_paged_attention: cache->{TILED_NEEDS}") as e:
        impl.forward(None, q, k, v, kv_cache, md, output=output)
    assert e.value.status == "unsupported"
    assert torch.equal(kv_cache, before) and torch.equal(output, torch.full((2, H * d), 3.0))


def test_block_tables_of_a_wider_table():
    """Rows spaced wider than they are long (the first columns of a larger table) are read in
    place, and a sequence whose blocks run past the view's columns is refused: the library
    alone would read on into the next columns."""
    w = make_world(BS, D, 11)
    query = torch.randn((2, H, D))
    wide = torch.tensor([[3, 1, 5], [2, 0, 4]], dtype=torch.int32)
    qsl, lens = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([6, 5], dtype=torch.int32)
    args = (query, w["key_cache"], w["value_cache"], qsl, lens)
    dense = pagedattn.paged_attention(*args, wide[:, :2].contiguous())
    assert torch.equal(pagedattn.paged_attention(*args, wide[:, :2]), dense)
    out = torch.full((2, H, D), 7.0)
    with pytest.raises(
        pagedattn.Error,
        match=r"seq_lens\[0\] = 6 needs 2 blocks of 4 tokens but block_tables has 1 columns",
    ) as info:
        pagedattn.paged_attention(*args, wide[:, :1], out=out)
    assert info.value.status == "out_of_range"
    assert torch.equal(out, torch.full((2, H, D), 7.0))
    with pytest.raises(pagedattn.Error, match=r"block_tables .* has strides \[1, 2\]"):
        pagedattn.paged_attention(*args, wide.t()[:2, :2].t().contiguous().t())


def test_cache_pairs_of_the_wrong_kind():
    with pytest.raises(
        TypeError, match=r"kv_caches\[0\]\[0\] must be a torch.Tensor or a numpy array, not list"
    ):
        pagedattn.copy_blocks([([1], [2])], {0: 1})


def test_swaps_between_unlike_caches_name_the_callers_terms():
    flat = torch.zeros(PagedAttentionBackend.get_kv_cache_shape(NB, BS, KVH, D))
    pair = (torch.zeros((NB, KVH, BS, D)), torch.zeros((NB, KVH, BS, D)))
    with pytest.raises(pagedattn.Error, match=r"src_kv_cache is a \[2, num_blocks, block_el"):
        pagedattn.swap_blocks(flat, pair, {0: 1})
    other = torch.zeros((2, NB, BS * KVH * D), dtype=torch.bfloat16)
    with pytest.raises(
        pagedattn.Error,
        match=r"dst_kv_cache holds blocks of 128 bf16 elements, src_kv_cache blocks of 128 "
        r"f32 elements",
    ):
        pagedattn.swap_blocks(flat, other, {0: 1})
    assert not flat.any() and not other.any()
    # FP8 bytes as uint8 and as float8 are one cache dtype to the library.
    raw = torch.arange(2 * NB * 8, dtype=torch.uint8).reshape(2, NB, 8)
    fp8 = torch.zeros((2, NB, 8), dtype=torch.float8_e4m3fn)
    pagedattn.swap_blocks(raw, fp8, {2: 0})
    assert torch.equal(fp8.view(torch.uint8)[:, 0], raw[:, 2])


def test_sizes_take_numpy_integers():
    shape = PagedAttentionBackend.get_kv_cache_shape(np.int64(10), np.int32(16), 4, np.int64(64))
    assert shape == (2, 10, 16 * 4 * 64) and all(type(n) is int for n in shape)
    assert PagedAttentionMetadataBuilder(np.int64(4)).block_size == 4
    assert PagedAttentionMetadataBuilder(torch.tensor(8)).block_size == 8
    for bad, kind in (
        (True, "bool"),
        (torch.tensor(True), "Tensor"),
        (torch.tensor([4]), "Tensor"),
    ):
        with pytest.raises(TypeError, match=rf"block_size must be an int, not {kind}"):
            PagedAttentionMetadataBuilder(bad)


def test_layer_integers_take_numpy_integers():
    """The layer's integer settings take what every other integer argument takes."""
    w = make_world(BS, D, 11)
    want = attend(w, sliding_window=3).clone()
    for window in (np.int64(3), torch.tensor(3)):
        assert torch.equal(attend(w, sliding_window=window), want)
    impl = PagedAttentionImpl(
        np.int64(4), np.int64(8), 0.3, np.int64(2), sliding_window=torch.tensor(5)
    )
    assert (impl.num_heads, impl.head_size, impl.num_kv_heads) == (4, 8, 2)
    assert all(type(n) is int for n in (impl.num_heads, impl.head_size, impl.num_kv_heads))
    PagedAttentionBackend.validate_head_size(np.int32(64))
    for call in (
        lambda: attend(w, sliding_window=True),
        lambda: PagedAttentionImpl(4, 8, 0.3, 2, sliding_window=np.bool_(True)),
        lambda: PagedAttentionBackend.validate_head_size(True),
    ):
        with pytest.raises(TypeError, match=r"(sliding_window|head_size) must be an int, not"):
            call()


@pytest.mark.parametrize(
    "args, exception, pattern",
    [
        ((1, 2, [[0]]), TypeError, r"query_lens must be a list of ints or an integer tensor, not"),
        (([0], [-1], [[0]]), pagedattn.Error, r"seq_lens\[0\] = -1 is negative"),
        (([1], [5], [[0, -1]]), pagedattn.Error, r"block_tables\[0\]\[1\] = -1 is not a block"),
    ],
)
def test_metadata_builder_names_bad_lengths_and_blocks(args, exception, pattern):
    """A derived slot_mapping never turns a bad block id into a padding slot."""
    with pytest.raises(exception, match=pattern):
        PagedAttentionMetadataBuilder(BS).build(*args)


def test_merge_states_holds_lse_to_the_outputs_rows():
    out = torch.zeros(4, 2, 8)
    with pytest.raises(pagedattn.Error, match=r"lse_a has shape \[8\]; it must be \[4, num_heads"):
        pagedattn.merge_states(out, torch.zeros(8), out, torch.zeros(4, 2))
