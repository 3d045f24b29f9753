"""The plugin's impl over a chunk of new tokens after cached ones, with each logit feature a
model may give a layer (window, ALiBi, soft cap, sinks), in causal steps and in the
bidirectional ones of vLLM's non-causal decoders: checked against the float64 oracle on the
pages as the impl left them, and the non-causal window against vLLM's own CPU_ATTN kernel.
The engine-level tests run tiny models whose tokens hardly depend on these features; here the
features move every output."""

from __future__ import annotations

import random
import types

import pytest
import torch
from helpers import activations
from oracle import assert_close, attend, gather, to_f64

pytest.importorskip("vllm")
from steps import metadata
from vllm import _custom_ops as ops
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

from pagedattn.vllm.backend import PagedAttnMetadataBuilder
from pagedattn.vllm.impl import PagedAttnImpl

HEADS, KV_HEADS, D, BS, NB = 4, 2, 32, 8, 12
STOCK_BS = 32  # vLLM's kernel wants block sizes it aligns to
TABLES = [[5, 1, 7, 3], [2, 9, 0, 11]]
PROMPT = [19, 7]  # the first step's tokens, then a chunk of 6 and a single token
CHUNK = [6, 1]


class Scales:
    """A layer's FP8 scales as vLLM's Attention holds them (unused by float pages)."""

    _k_scale_float = 1.0
    _v_scale_float = 1.0


def slots(firsts, counts, bs=BS):
    return [
        TABLES[s][p // bs] * bs + p % bs
        for s in range(2)
        for p in range(firsts[s], firsts[s] + counts[s])
    ]


FEATURES = {
    "none": {},
    "window": {"sliding_window": 5},
    "alibi": {"alibi_slopes": [0.5, 0.25, 0.125, 0.0625]},
    "soft_cap": {"logits_soft_cap": 0.3},
    "sinks": {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])},
}


def impl_for(feature):
    impl = PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS, **FEATURES[feature])
    impl.process_weights_after_loading(torch.float32)
    return impl


def oracle_features(feature):
    f = FEATURES[feature]
    return {
        "window": f.get("sliding_window") or 0,
        "alibi": f.get("alibi_slopes"),
        "soft_cap": f.get("logits_soft_cap") or 0.0,
        "sinks": f["sinks"].tolist() if "sinks" in f else None,
    }


def two_steps(impl, rng, causal, write_with=None, bs=BS):
    """A causal prompt step, then a chunk (and a decode) over it, causal or not; returns the
    pages, the second step's query and output. write_with: None (forward writes each step's
    K/V) or a callable that writes them itself before a forward given key = value = None."""
    pages = torch.zeros((NB, KV_HEADS, bs, 2 * D))
    prompt_q = activations(rng, sum(PROMPT), HEADS, D, torch.float32)
    prompt_k, prompt_v = (activations(rng, sum(PROMPT), KV_HEADS, D, torch.float32) for _ in "kv")
    prompt_slots = slots([0, 0], PROMPT, bs)
    md = metadata(PROMPT, PROMPT, TABLES, prompt_slots)
    if write_with is not None:
        write_with(prompt_k, prompt_v, pages, torch.tensor(prompt_slots, dtype=torch.int64))
        prompt_k = prompt_v = None
    impl.forward(Scales(), prompt_q, prompt_k, prompt_v, pages, md, torch.empty_like(prompt_q))
    n = sum(CHUNK)
    query = activations(rng, n, HEADS, D, torch.float32, magnitude=3.0)
    key, value = (activations(rng, n, KV_HEADS, D, torch.float32) for _ in "kv")
    lens = [p + c for p, c in zip(PROMPT, CHUNK, strict=True)]
    chunk_slots = slots(PROMPT, CHUNK, bs)
    md = metadata(CHUNK, lens, TABLES, chunk_slots, causal=causal)
    output = torch.empty_like(query)
    if write_with is not None:
        write_with(key, value, pages, torch.tensor(chunk_slots, dtype=torch.int64))
        key = value = None
    impl.forward(Scales(), query, key, value, pages, md, output)
    return pages, query, output


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("feature", list(FEATURES))
def test_features_over_a_cached_prefix(monkeypatch, seed, feature, causal):
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "rows")
    pages, query, output = two_steps(impl_for(feature), random.Random(seed), causal)
    tiles = pages.view(NB, KV_HEADS, 2, BS, D)
    at = 0
    for s, q in enumerate(CHUNK):
        n_k = PROMPT[s] + q
        k, v = gather(to_f64(tiles[:, :, 0]), to_f64(tiles[:, :, 1]), TABLES[s], n_k, BS)
        want, _ = attend(
            to_f64(query[at : at + q]), k, v, scale=D**-0.5,
            attn_type="decoder" if causal else "encoder_only", **oracle_features(feature),
        )  # fmt: skip
        assert_close(output[at : at + q], want, float(abs(v).max()), torch.float32, f"seq {s}")
        at += q


def test_noncausal_window_is_vllms(monkeypatch, seed):
    """vLLM's CPU_ATTN kernel, called on the same pages, masks a non-causal window on both
    sides of the query; the plugin must agree."""
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "rows")
    window = FEATURES["window"]["sliding_window"]
    pages, query, output = two_steps(
        impl_for("window"), random.Random(seed), causal=False, bs=STOCK_BS
    )
    lens = torch.tensor([p + c for p, c in zip(PROMPT, CHUNK, strict=True)], dtype=torch.int32)
    qsl = torch.tensor([0, CHUNK[0], sum(CHUNK)], dtype=torch.int32)
    isa = _get_attn_isa(torch.float32, STOCK_BS, D, "auto")
    # vLLM's pages hold the same tokens in its own order: written by its own cache op.
    every = torch.tensor(slots([0, 0], lens.tolist(), STOCK_BS), dtype=torch.int64)
    tiles = pages.view(NB, KV_HEADS, 2, STOCK_BS, D)
    keys = tiles[every // STOCK_BS, :, 0, every % STOCK_BS].contiguous()
    values = tiles[every // STOCK_BS, :, 1, every % STOCK_BS].contiguous()
    kv = torch.zeros((NB, KV_HEADS, 2 * STOCK_BS, D))
    key_cache, value_cache = kv.chunk(2, dim=2)
    ops.cpu_attn_reshape_and_cache(keys, values, key_cache, value_cache, every, isa)
    schedule = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=2, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=D, seq_lens=lens,
        dtype=torch.float32, query_start_loc=qsl, causal=False, sliding_window_size=window,
        isa=isa, enable_kv_split=False, kv_cache_dtype="auto",
    )  # fmt: skip
    stock = torch.zeros_like(output)
    ops.cpu_attention_with_kv_cache(
        query=query, key_cache=key_cache, value_cache=value_cache, output=stock,
        query_start_loc=qsl, seq_lens=lens, scale=D**-0.5, causal=False, alibi_slopes=None,
        sliding_window=window, block_table=torch.tensor(TABLES, dtype=torch.int32), softcap=0.0,
        scheduler_metadata=schedule, s_aux=None,
    )  # fmt: skip
    assert torch.allclose(output, stock, rtol=1e-4, atol=1e-5), float((output - stock).abs().max())


@pytest.mark.parametrize("attn_type", [AttentionType.ENCODER, AttentionType.ENCODER_ONLY])
def test_encoder_window_on_both_sides(seed, attn_type):
    """Encoder layers (an encoder-decoder model's and encoder-only models') take vLLM's non-causal
    window: on both sides of a query, over the batch's own rows."""
    rng = random.Random(seed)
    window = FEATURES["window"]["sliding_window"]
    impl = PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS, sliding_window=window, attn_type=attn_type)
    n = sum(PROMPT)
    query = activations(rng, n, HEADS, D, torch.float32)
    key, value = (activations(rng, n, KV_HEADS, D, torch.float32) for _ in "kv")
    md = metadata(PROMPT, PROMPT, TABLES, [-1] * n, causal=False)
    output = torch.empty_like(query)
    impl.forward(Scales(), query, key, value, torch.empty(0), md, output)
    at = 0
    for s, q in enumerate(PROMPT):
        rows = slice(at, at + q)
        want, _ = attend(
            to_f64(query[rows]), to_f64(key[rows]), to_f64(value[rows]), scale=D**-0.5,
            attn_type="encoder_only", window=window,
        )  # fmt: skip
        assert_close(output[rows], want, float(value.abs().max()), torch.float32, f"seq {s}")
        at += q


def test_kv_cache_update_apart_from_forward(monkeypatch, seed):
    """do_kv_cache_update (what vLLM's DFlash drafter calls), first to touch the pages or not,
    writes what a forward would write, in the layout the impl picks."""
    monkeypatch.setenv("PAGEDATTN_KV_LAYOUT", "auto")
    writes_itself, written_apart = impl_for("none"), impl_for("none")
    pages, _, output = two_steps(writes_itself, random.Random(seed), causal=True)

    def update(key, value, kv_cache, slot_mapping):
        written_apart.do_kv_cache_update(Scales(), key, value, kv_cache, slot_mapping)

    pages_apart, _, output_apart = two_steps(
        written_apart, random.Random(seed), causal=True, write_with=update
    )
    assert written_apart.cache_layout == writes_itself.cache_layout
    assert torch.equal(pages_apart, pages)
    assert torch.equal(output_apart, output)


def test_sinks_of_the_wrong_length_are_refused_at_construction():
    with pytest.raises(ValueError, match=r"sinks has 3 entries; the layer has num_heads = 4"):
        PagedAttnImpl(HEADS, D, D**-0.5, KV_HEADS, sinks=torch.zeros(3))


def test_kv_transfer_is_refused_at_startup():
    """A KV connector would move pages in vLLM's own order: the builder, made at the engine's
    start, refuses it."""
    config = types.SimpleNamespace(kv_transfer_config=object())
    with pytest.raises(NotImplementedError, match=r"KV transfer \(kv_transfer_config\)"):
        PagedAttnMetadataBuilder(None, [], config, torch.device("cpu"))
