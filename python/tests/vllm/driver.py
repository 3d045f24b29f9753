"""Runs one vLLM engine in a fresh process and writes what it produced as JSON.

    python driver.py SPEC.json RESULT.json

SPEC: {"llm": {LLM kwargs}, "prompts": [text or [token ids]], "max_tokens": N,
"logprobs": K, "mode": "generate" | "embed", "env": {variables}}. RESULT: per prompt the
generated token ids and each chosen token's logprob with the top-K alternatives (generate), or
the embedding (embed); and "impls", the attention impl classes the model's layers use. A
process per engine: vLLM's state (its backend registry, its distributed groups) is per process,
and a test compares engines with and without pagedattn.
"""

from __future__ import annotations

import json
import os
import sys


def attention_impls(model) -> list[str]:
    return sorted(
        {
            f"{type(m.impl).__module__}.{type(m.impl).__qualname__}"
            for m in model.modules()
            if hasattr(m, "impl") and hasattr(m.impl, "forward")
        }
    )


def main() -> None:
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    os.environ.update(spec.get("env", {}))
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(**spec["llm"])
    prompts = [
        TokensPrompt(prompt_token_ids=p) if isinstance(p, list) else p for p in spec["prompts"]
    ]
    result: dict = {}
    if spec.get("mode", "generate") == "embed":
        outputs = llm.embed(prompts)
        result["embeddings"] = [o.outputs.embedding for o in outputs]
    else:
        params = SamplingParams(
            max_tokens=spec["max_tokens"],
            temperature=0.0,
            logprobs=spec.get("logprobs", 1),
            detokenize=False,
            ignore_eos=True,
        )
        outputs = llm.generate(prompts, params)
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outputs]
        result["prompt_lens"] = [len(o.prompt_token_ids) for o in outputs]
        result["logprobs"] = [
            [{str(t): lp.logprob for t, lp in step.items()} for step in o.outputs[0].logprobs]
            for o in outputs
        ]
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0":
        result["impls"] = sorted({n for names in llm.apply_model(attention_impls) for n in names})
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
