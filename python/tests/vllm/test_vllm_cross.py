"""Cross-attention (encoder-decoder models) through vLLM's own wrapper of the backend
(``create_cross_attention_backend``): its builder hands this backend the decoder's slot mapping
and sets the encoder's only afterwards, and its impl leaves the cache write to ours. The
encoder's K/V must land in the cross cache's slots, and the decoder's queries must attend over
all of them. Checked against the float64 oracle on the pages as the impl left them."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import activations
from oracle import assert_close, attend, gather, to_f64

pytest.importorskip("vllm")
from vllm.model_executor.layers.attention.cross_attention import (
    create_cross_attention_backend,
)
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.kv_cache_interface import CrossAttentionSpec

from pagedattn.vllm.backend import PagedAttnBackend

HEADS, KV_HEADS, D, BS, NB = 4, 2, 32, 4, 12


def builder(cross):
    """vLLM's cross-attention builder over ours, made without an engine (its __init__ wants a
    whole VllmConfig; build needs only the spec and the device)."""
    b = object.__new__(cross.get_builder_cls())
    b.kv_cache_spec = CrossAttentionSpec(
        block_size=BS, num_kv_heads=KV_HEADS, head_size=D, dtype=torch.float32
    )
    b.device = torch.device("cpu")
    b.encoder_only = False
    b.impls = []
    return b


def step(query_lens, computed, encoder_lens, tables):
    """Common metadata of one decoder step: request i has query_lens[i] new decoder tokens
    after computed[i] (0: its first step, when its encoder output arrives), encoder_lens[i]
    encoder tokens in the cross cache's blocks tables[i]."""
    qsl = torch.tensor(np.concatenate(([0], np.cumsum(query_lens))), dtype=torch.int32)
    seq = torch.tensor(
        [c + q for c, q in zip(computed, query_lens, strict=True)], dtype=torch.int32
    )
    table = torch.tensor(tables, dtype=torch.int32)
    decoder_slots = torch.tensor(  # where the decoder's own cache would take them: not here
        [table[i, p // BS] * BS + p % BS for i, q in enumerate(query_lens) for p in range(q)],
        dtype=torch.int64,
    )
    enc = torch.tensor(encoder_lens, dtype=torch.int32)
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl,
        seq_lens=seq,
        num_reqs=len(query_lens),
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=int(seq.max()),
        block_table_tensor=table,
        slot_mapping=decoder_slots,
        causal=True,
        seq_lens_cpu_upper_bound=seq,
        encoder_seq_lens=enc,
        encoder_seq_lens_cpu=enc.numpy(),
    )


def test_cross_attention_writes_the_encoder_slots(monkeypatch, seed):
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "rows")  # pages the oracle gathers row by row
    rng = random.Random(seed)
    cross = create_cross_attention_backend(PagedAttnBackend)
    impl = cross.get_impl_cls()(HEADS, D, D**-0.5, KV_HEADS, attn_type="encoder_decoder")
    # Request 0 starts (its 9 encoder tokens arrive), request 1 decodes over the 6 it wrote
    # in an earlier step, request 2 starts with 3 prompt tokens over 5 encoder tokens.
    query_lens, computed, encoder_lens = [2, 1, 3], [0, 4, 0], [9, 6, 5]
    tables = [[7, 2, 9], [4, 0, 11], [5, 10, 1]]
    md = builder(cross).build(0, step(query_lens, computed, encoder_lens, tables))
    pages = torch.zeros((NB, KV_HEADS, BS, 2 * D))
    tiles = pages.view(NB, KV_HEADS, 2, BS, D)
    earlier = (
        activations(rng, 6, KV_HEADS, D, torch.float32),
        activations(rng, 6, KV_HEADS, D, torch.float32),
    )
    for t in range(6):  # request 1's encoder K/V, written by its first step
        tiles[tables[1][t // BS], :, 0, t % BS] = earlier[0][t]
        tiles[tables[1][t // BS], :, 1, t % BS] = earlier[1][t]
    arriving = 9 + 5  # only the starting requests' encoder outputs come with this step
    key, value = (activations(rng, arriving, KV_HEADS, D, torch.float32) for _ in range(2))
    n = sum(query_lens)
    query = activations(rng, n, HEADS, D, torch.float32)
    output = torch.empty((n, HEADS, D))
    impl.forward(None, query, key, value, pages, md, output)

    # The encoder tokens, in the cache where vLLM's own cross slot mapping puts them.
    assert md.slot_mapping.tolist() == [
        tables[i][t // BS] * BS + t % BS for i in (0, 2) for t in range(encoder_lens[i])
    ]
    new = {0: (key[:9], value[:9]), 2: (key[9:], value[9:]), 1: earlier}
    at = 0
    for i, q in enumerate(query_lens):
        k, v = gather(
            to_f64(tiles[:, :, 0]), to_f64(tiles[:, :, 1]), tables[i], encoder_lens[i], BS
        )
        np.testing.assert_array_equal(k, to_f64(new[i][0]), err_msg=f"request {i}'s keys")
        np.testing.assert_array_equal(v, to_f64(new[i][1]), err_msg=f"request {i}'s values")
        want, _ = attend(to_f64(query[at : at + q]), k, v, scale=D**-0.5, attn_type="encoder")
        assert_close(
            output[at : at + q], want, float(np.abs(v).max()), torch.float32, f"request {i}"
        )
        at += q
