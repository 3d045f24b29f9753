"""Real trained models end to end through vLLM with pagedattn serving attention, against
Hugging Face transformers and against vLLM's own CPU_ATTN: SmolLM2-135M (decoder, GQA, a long
prompt prefilled in chunks beside decodes) in f32 and bf16, and in f32 with the KV cache
layout forced to tiled and to rows (PAGEDATTN_KV_LAYOUT), all-MiniLM-L6-v2 embeddings
(encoder-only), Gemma-3-270M past its 512-token sliding window (MQA, head size 256).

The models come from PyPI packages, converted once by scripts/fetch_models.py into
$PAGEDATTN_MODELS (default ~/.cache/pagedattn/models)."""

from __future__ import annotations

import subprocess
import sys
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
from engines import assert_greedy_agrees, run_engine

import pagedattn

PAGEDATTN_IMPL = "pagedattn.vllm.impl.PagedAttnImpl"
SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "fetch_models.py"

STORY = (
    "The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his "
    "father had taught him. At the top he trimmed the wick, polished the great lens and watched "
    "the ships pass along the rocky coast, writing each one into the logbook by the window. "
)
PROMPTS = [
    "Once upon a time, there was a little",
    "The three primary colors are",
    "Write a short poem about the sea.\n" + STORY,
    "Summarize the following story in one sentence.\n" + STORY * 12,  # over 600 tokens
]


@cache
def model_dir(name: str) -> str:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", name], capture_output=True, text=True, check=True
    )
    return done.stdout.split()[-1]


@cache
def tokenized(name: str) -> tuple[list[int], ...]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir(name))
    return tuple(tokenizer(p).input_ids for p in PROMPTS)


def generate_spec(name: str, dtype: str, max_tokens: int, prompts=None, **llm) -> dict:
    kwargs = {
        "model": model_dir(name),
        "dtype": dtype,
        "enforce_eager": True,
        "max_model_len": 2048,
        # A 256-token budget per step: the long prompt is prefilled in chunks, in the same
        # steps as the other prompts' decodes.
        "max_num_batched_tokens": 256,
        "seed": 0,
    }
    kwargs.update(llm)
    prompts = [list(p) for p in (prompts or tokenized(name))]
    return {"llm": kwargs, "prompts": prompts, "max_tokens": max_tokens, "logprobs": 5}


@cache
def transformers_greedy(name: str, max_tokens: int) -> tuple[tuple[int, ...], ...]:
    """transformers' own greedy continuation of each prompt, in f32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(name), dtype=torch.float32)
    outs = []
    for ids in tokenized(name):
        prompt = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(
                prompt, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False
            )
        outs.append(tuple(out[0, len(ids) :].tolist()))
    return tuple(outs)


def worst_logprob_gap(ours: dict, stock: dict) -> float:
    """The largest |logprob - stock's| of a token ours chose."""
    worst = 0.0
    for p, (a, b) in enumerate(zip(ours["logprobs"], stock["logprobs"], strict=True)):
        for t, (mine, theirs) in enumerate(zip(a, b, strict=True)):
            chosen = str(ours["tokens"][p][t])
            worst = max(worst, abs(mine[chosen] - theirs[chosen]))
    return worst


def test_smollm2_f32_matches_transformers_and_stock():
    spec = generate_spec("smollm2-135m-instruct", "float32", 32)
    assert max(len(p) for p in spec["prompts"]) > 600
    ours = run_engine(spec)
    assert ours["impls"] == [PAGEDATTN_IMPL]
    stock = run_engine(spec, pagedattn=False)
    reference = {"tokens": [list(t) for t in transformers_greedy("smollm2-135m-instruct", 32)]}
    assert_greedy_agrees(ours, reference, None, "SmolLM2 f32 vs transformers")
    assert_greedy_agrees(ours, stock, None, "SmolLM2 f32 vs stock CPU_ATTN")
    worst = worst_logprob_gap(ours, stock)
    print(f"SmolLM2 f32: largest |logprob - stock's| of a chosen token: {worst:.2e}")
    assert worst <= 1e-3


@pytest.mark.parametrize("layout", ["tiled", "rows"])
def test_smollm2_f32_kv_layout_matches_stock(layout):
    """PAGEDATTN_KV_LAYOUT forces the cache layout (head size 64, block size 128: both are
    possible); either gives stock CPU_ATTN's tokens, with the long prompt chunked beside
    decodes. The stock run is the f32 test's."""
    spec = generate_spec("smollm2-135m-instruct", "float32", 32)
    stock = run_engine(spec, pagedattn=False)
    ours = run_engine({**spec, "env": {"PAGEDATTN_KV_LAYOUT": layout}})
    assert ours["impls"] == [PAGEDATTN_IMPL]
    assert f"KV cache layout {layout})" in ours["log"]
    assert_greedy_agrees(ours, stock, None, f"SmolLM2 f32, {layout} cache vs stock CPU_ATTN")
    worst = worst_logprob_gap(ours, stock)
    print(f"SmolLM2 f32, {layout} cache: largest |logprob - stock's|: {worst:.2e}")
    assert worst <= 1e-3


def test_smollm2_bf16_matches_stock_up_to_near_ties():
    spec = generate_spec("smollm2-135m-instruct", "bfloat16", 32)
    ours, stock = run_engine(spec), run_engine(spec, pagedattn=False)
    assert ours["impls"] == [PAGEDATTN_IMPL]
    # The layout "auto" picks for bf16 over a bf16 cache, head size 64, vLLM's CPU block size
    # 128: tiled on the amx path (AMX tiles read the cache in place), rows elsewhere.
    layout = pagedattn.kv_layout_preferred("bfloat16", "bfloat16", 128, 64)
    assert f"KV cache layout {layout})" in ours["log"]
    # bf16 logits of SmolLM2's magnitude (16 to 32) are 0.125 apart: two such steps between
    # the two best tokens is a tie that either backend's rounding may break.
    for note in assert_greedy_agrees(ours, stock, 0.25, "SmolLM2 bf16 vs stock CPU_ATTN"):
        print(note)


def test_gemma3_past_its_sliding_window_matches_transformers():
    """Five of Gemma 3's six layers see a 512-token window: a prompt over 512 tokens."""
    name = "gemma-3-270m"
    long_prompt = [tokenized(name)[3]]
    assert len(long_prompt[0]) > 512
    spec = generate_spec(name, "float32", 16, prompts=long_prompt)
    ours = run_engine(spec)
    assert ours["impls"] == [PAGEDATTN_IMPL]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(name), dtype=torch.float32)
    with torch.no_grad():
        out = model.generate(
            torch.tensor(long_prompt), max_new_tokens=16, min_new_tokens=16, do_sample=False
        )
    reference = {"tokens": [out[0, len(long_prompt[0]) :].tolist()]}
    assert_greedy_agrees(ours, reference, None, "Gemma 3 f32 vs transformers")


SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]


def test_minilm_embeddings_match_transformers():
    """Encoder-only attention through vLLM's pooling runner, against transformers' mean
    pooling."""
    from transformers import AutoModel, AutoTokenizer

    path = model_dir("all-minilm-l6-v2")
    spec = {
        "llm": {"model": path, "runner": "pooling", "dtype": "float32", "enforce_eager": True,
                "seed": 0},
        "prompts": SENTENCES,
        "mode": "embed",
    }  # fmt: skip
    ours = run_engine(spec)
    assert ours["impls"] == [PAGEDATTN_IMPL]
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, dtype=torch.float32)
    batch = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch.attention_mask[..., None].float()
    want = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    got = np.array(ours["embeddings"])
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    print(f"all-MiniLM-L6-v2: cosine with transformers {cosine.min():.6f} .. {cosine.max():.6f}")
    assert cosine.min() >= 0.9999
