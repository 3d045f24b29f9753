"""The plugin's choice of cache layout, in this process (no engine): PAGEDATTN_KV_LAYOUT read
at construction (a bad value names the variable), "auto" resolved at the first step to
kv_layout_preferred's answer and kept, and the bytes a step writes into vLLM's pages in that
layout (read back through helpers.untile), with the attention the oracle gives."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from helpers import activations, same_bytes, untile
from oracle import assert_close, attend, gather, to_f64

import pagedattn

pytest.importorskip("vllm")
from steps import metadata

from pagedattn.vllm.impl import PagedAttnImpl

HEADS, KV_HEADS, D, BS, NB = 14, 2, 64, 32, 6


def test_bad_layout_variable(monkeypatch):
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "diagonal")
    with pytest.raises(
        ValueError,
        match=r"PAGEDATTN_KV_LAYOUT = 'diagonal' is not 'rows', 'tiled' or 'auto'",
    ):
        PagedAttnImpl(HEADS, D, 0.125, KV_HEADS)


@pytest.mark.parametrize("setting", ["auto", "rows", "tiled", ""])
def test_pages_hold_the_chosen_layout(monkeypatch, seed, setting):
    """Two steps (a prompt and a chunk beside a decode), bf16 over vLLM's bf16 pages."""
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", setting)
    rng = random.Random(seed)
    impl = PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS)
    act = torch.bfloat16
    want = {"": "auto"}.get(setting, setting)
    assert impl.kv_cache_layout == want
    pages = torch.zeros((NB, KV_HEADS, BS, 2 * D), dtype=act)
    tables = [[4, 1, 3], [0, 5, 2]]
    history = [torch.zeros((0, 2, KV_HEADS, D), dtype=act) for _ in tables]
    done = [0, 0]
    for step, query_lens in enumerate([[40, 70], [30, 1]]):
        seq_lens = [done[s] + q for s, q in enumerate(query_lens)]
        slots = [
            tables[s][p // BS] * BS + p % BS for s in range(2) for p in range(done[s], seq_lens[s])
        ]
        n = sum(query_lens)
        query = activations(rng, n, HEADS, D, act)
        key, value = (activations(rng, n, KV_HEADS, D, act) for _ in range(2))
        output = torch.empty((n, HEADS, D), dtype=act)
        md = metadata(query_lens, seq_lens, [t for t in tables], slots)
        impl.forward(None, query, key, value, pages, md, output)
        layout = pagedattn.kv_layout_preferred(act, act, BS, D) if want == "auto" else want
        assert impl.cache_layout == layout
        label = f"step {step} setting {setting!r} layout {layout}"
        tiles = pages.view(NB, KV_HEADS, 2, BS, D)
        k_rows, v_rows = tiles[:, :, 0], tiles[:, :, 1]
        if layout == "tiled":
            k_rows, v_rows = untile(k_rows, 0), untile(v_rows, 1)
        at = 0
        for s, q in enumerate(query_lens):
            new = torch.stack([key[at : at + q], value[at : at + q]], 1)
            history[s] = torch.cat([history[s], new])
            k, v = gather(to_f64(k_rows), to_f64(v_rows), tables[s], seq_lens[s], BS)
            assert same_bytes(torch.from_numpy(k).to(act), history[s][:, 0]), label
            assert same_bytes(torch.from_numpy(v).to(act), history[s][:, 1]), label
            want_out, _ = attend(to_f64(query[at : at + q]), k, v, scale=D**-0.5)
            assert_close(output[at : at + q], want_out, float(np.abs(v).max()), act, label)
            at += q
        done = seq_lens
