"""Engines for the vLLM tests: each run is a fresh process (driver.py) with pagedattn serving
CPU_ATTN or with vLLM's own backend (PAGEDATTN_VLLM=0); runs are remembered for the session so
that tests sharing an engine's output load its model once."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

DRIVER = Path(__file__).with_name("driver.py")
SCRATCH = Path(
    os.environ.get("PAGEDATTN_SCRATCH", Path.home() / ".cache" / "pagedattn" / "scratch")
)
_runs: dict[str, dict] = {}
# What vLLM's own backend says when this CPU lacks a feature it needs (not a failure of a run).
STOCK_REFUSALS = ("FP8 KV cache on CPU requires",)


class StockRefused(Exception):
    """vLLM's own backend refuses the spec on this CPU; the message is vLLM's."""


def engine_env(pagedattn: bool, multiprocessing: bool = False) -> dict[str, str]:
    SCRATCH.mkdir(parents=True, exist_ok=True)
    for sub in ("vllm", "tmp", "inductor"):
        (SCRATCH / sub).mkdir(exist_ok=True)
    env = dict(os.environ)
    env.update(
        {
            "PAGEDATTN_VLLM": "1" if pagedattn else "0",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocessing else "0",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(SCRATCH / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(SCRATCH / "inductor"),
            "TMPDIR": str(SCRATCH / "tmp"),
        }
    )
    return env


def run_engine(spec: dict, pagedattn: bool = True, multiprocessing: bool = False) -> dict:
    """What driver.py returns for `spec`, run once per session per (spec, backend)."""
    key = json.dumps([spec, pagedattn, multiprocessing], sort_keys=True)
    if key in _runs:
        return _runs[key]
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    spec_path = SCRATCH / f"spec-{digest}.json"
    result_path = SCRATCH / f"result-{digest}.json"
    env = engine_env(pagedattn, multiprocessing)
    spec_path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(spec_path), str(result_path)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # vLLM logs to stdout
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        refusal = next(
            (line for line in done.stdout.splitlines() if any(r in line for r in STOCK_REFUSALS)),
            None,
        )
        if not pagedattn and refusal is not None:
            raise StockRefused(refusal.split("Error: ", 1)[-1])
        raise AssertionError(
            f"vLLM run failed ({'pagedattn' if pagedattn else 'stock'}):\n{done.stdout[-6000:]}"
        )
    result = json.loads(result_path.read_text())
    result["log"] = done.stdout
    _runs[key] = result
    return result


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_greedy_agrees(ours: dict, theirs: dict, tie: float | None, label: str) -> list[str]:
    """Tokens identical; with `tie` given, a divergence is allowed where the reference's top
    two logprobs were within `tie` of each other (a near-tie), and is reported."""
    notes = []
    for p, (a, b) in enumerate(zip(ours["tokens"], theirs["tokens"], strict=True)):
        at = first_divergence(a, b)
        if at is None:
            continue
        if tie is None:
            raise AssertionError(f"{label}: prompt {p} diverges at token {at}: {a[at]} vs {b[at]}")
        step = theirs["logprobs"][p][at]
        ours_lp = step.get(str(a[at]))
        top = step[str(b[at])]
        margin = None if ours_lp is None else top - ours_lp
        assert margin is not None and margin <= tie, (
            f"{label}: prompt {p} diverges at token {at} ({a[at]} vs {b[at]}) without a near-tie: "
            f"the reference's logprobs there are {step}"
        )
        notes.append(f"{label}: prompt {p} diverges at token {at} after a near-tie ({margin:.2e})")
    return notes
