"""Sinks are a layer's weights, which vLLM allocates uninitialised and loads after the attention
impl is made: the impl is made whatever the allocation holds (NaN included), and it serves the
loaded values, whether the engine announces them (process_weights_after_loading) or not."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import activations
from oracle import assert_close, attend, gather, to_f64

import pagedattn

pytest.importorskip("vllm")
from steps import metadata

from pagedattn.vllm.impl import PagedAttnImpl

HEADS, KV_HEADS, D, BS, NB = 6, 2, 32, 16, 4


def one_step(impl, rng, sinks):
    """A prompt of 20 tokens and one of 9 over fresh f32 pages, checked against the oracle."""
    query_lens = seq_lens = [20, 9]
    tables = [[2, 0], [3, 1]]
    slots = [tables[s][p // BS] * BS + p % BS for s in range(2) for p in range(seq_lens[s])]
    n = sum(query_lens)
    act = torch.float32
    query = activations(rng, n, HEADS, D, act)
    key, value = (activations(rng, n, KV_HEADS, D, act) for _ in range(2))
    pages = torch.zeros((NB, KV_HEADS, BS, 2 * D), dtype=act)
    output = torch.empty((n, HEADS, D), dtype=act)
    impl.forward(
        None, query, key, value, pages, metadata(query_lens, seq_lens, tables, slots), output
    )
    tiles = pages.view(NB, KV_HEADS, 2, BS, D)
    at = 0
    for s, q in enumerate(query_lens):
        k, v = gather(to_f64(tiles[:, :, 0]), to_f64(tiles[:, :, 1]), tables[s], seq_lens[s], BS)
        want, _ = attend(to_f64(query[at : at + q]), k, v, scale=D**-0.5, sinks=sinks)
        assert_close(output[at : at + q], want, float(abs(v).max()), act, f"sequence {s}")
        at += q


@pytest.mark.parametrize("announced", [True, False])
def test_sinks_loaded_after_construction(monkeypatch, seed, announced):
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "rows")
    rng = random.Random(seed)
    sinks = torch.full((HEADS,), float("nan"))  # what an uninitialised allocation may hold
    impl = PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS, sinks=sinks)
    loaded = [rng.uniform(-2.0, 3.0) for _ in range(HEADS)]
    sinks.copy_(torch.tensor(loaded))
    if announced:
        impl.process_weights_after_loading(torch.float32)
    one_step(impl, rng, loaded)


def test_sinks_not_finite_once_loaded():
    sinks = torch.zeros(HEADS)
    impl = PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS, sinks=sinks)
    sinks[3] = float("inf")
    with pytest.raises(pagedattn.Error, match=r"sinks\[3\] = inf is not finite"):
        impl.process_weights_after_loading(torch.float32)


def test_sinks_changed_in_place_are_seen(monkeypatch, seed):
    """A weight reload may copy new sinks into the tensor without announcing them: the next
    step serves the new values."""
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "rows")
    rng = random.Random(seed)
    sinks = torch.zeros(HEADS)
    impl = PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS, sinks=sinks)
    impl.process_weights_after_loading(torch.float32)
    one_step(impl, rng, [0.0] * HEADS)
    reloaded = [rng.uniform(-2.0, 3.0) for _ in range(HEADS)]
    sinks.copy_(torch.tensor(reloaded))
    one_step(impl, rng, reloaded)
