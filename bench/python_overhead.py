"""What the Python layer adds to the library call, for a decode step.

For each shape, in one process over the same data:
- C attention: pa_paged_attention alone, looped in C by the extension (arguments converted
  once): the call at its warmest, with nothing between calls;
- paged_attention and PagedAttentionImpl.forward (which writes the new token's K/V, then
  attends) with the output given, each looped from Python, with the context timing its
  library calls: a figure's "outside" is its time per call minus the time it spent inside
  the library, that is what the Python layer adds (argument conversion included).
Each is timed as `calls` back-to-back calls, in rounds that alternate between them; a figure
is its fastest round.

Usage: python bench/python_overhead.py [--threads N] [--rounds R]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

import pagedattn
from pagedattn import PagedAttentionBackend, PagedAttentionImpl, PagedAttentionMetadataBuilder, _ext

HEADS, KV_HEADS, HEAD_SIZE, BLOCK = 32, 8, 128, 16
SHAPES = [(1, 128), (16, 1024)]  # (sequences, keys each)


def setup(num_seqs: int, keys: int, ctx: pagedattn.Context):
    dtype = torch.bfloat16
    blocks_each = (keys + BLOCK - 1) // BLOCK
    num_blocks = num_seqs * blocks_each
    kv_cache = torch.randn(
        PagedAttentionBackend.get_kv_cache_shape(num_blocks, BLOCK, KV_HEADS, HEAD_SIZE)
    ).to(dtype)
    tables = torch.randperm(num_blocks, dtype=torch.int32).view(num_seqs, blocks_each)
    md = PagedAttentionMetadataBuilder(BLOCK).build([1] * num_seqs, [keys] * num_seqs, tables)
    impl = PagedAttentionImpl(HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, num_kv_heads=KV_HEADS, ctx=ctx)
    qkv = torch.randn(num_seqs, (HEADS + 2 * KV_HEADS) * HEAD_SIZE).to(dtype)
    query = qkv[:, : HEADS * HEAD_SIZE]
    key = qkv[:, HEADS * HEAD_SIZE : (HEADS + KV_HEADS) * HEAD_SIZE]
    value = qkv[:, (HEADS + KV_HEADS) * HEAD_SIZE :]
    output = torch.empty(num_seqs, HEADS * HEAD_SIZE, dtype=dtype)
    return kv_cache, md, impl, query, key, value, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=None, help="context threads (default: all)")
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    ctx = pagedattn.Context(args.threads)
    print(
        f"pagedattn {pagedattn.__version__}, {ctx.num_threads} threads, isa {ctx.isa}; "
        f"decode, {HEADS}/{KV_HEADS} heads, head size {HEAD_SIZE}, bf16, block {BLOCK}"
    )
    print("us per call (fastest round); 'outside': time per call outside the library")
    print(
        f"{'shape':>10} {'C attention':>10} {'paged_attention':>16} {'forward':>10} "
        f"{'forward inside':>15} {'paged_attention outside':>24} {'forward outside':>16}"
    )
    for num_seqs, keys in SHAPES:
        measure(ctx, num_seqs, keys, args.rounds)
    cold_control(ctx, args.rounds)


def measure(ctx: pagedattn.Context, num_seqs: int, keys: int, rounds: int) -> None:
    kv_cache, md, impl, query, key, value, output = setup(num_seqs, keys, ctx)
    k_view = kv_cache[0].view(-1, KV_HEADS, BLOCK, HEAD_SIZE)
    v_view = kv_cache[1].view(-1, KV_HEADS, BLOCK, HEAD_SIZE)
    q3, out3 = query.view(num_seqs, HEADS, HEAD_SIZE), output.view(num_seqs, HEADS, HEAD_SIZE)
    impl.forward(None, query, key, value, kv_cache, md, output)  # makes the plan and the cache view
    batch, plan = md.library_step(impl._step_key, ctx, impl._layer, False)
    cache = impl._library_cache(kv_cache, None, query)
    calls = 2000 if keys * num_seqs <= 4096 else 20

    def c_call(n):
        _ext.time_forward(ctx, impl._layer, plan, query, None, None, cache, batch, output, n)

    def functional(n):
        for _ in range(n):
            pagedattn.paged_attention(
                q3,
                k_view,
                v_view,
                md.query_start_loc,
                md.seq_lens,
                md.block_tables,
                out=out3,
                ctx=ctx,
                layout=impl.cache_layout,  # the bytes forward wrote
            )

    def forward(n):
        f = impl.forward
        for _ in range(n):
            f(None, query, key, value, kv_cache, md, output)

    best = {"c": math.inf}
    for name in ("py", "fwd"):
        best[name] = best[name + "_inside"] = math.inf
    for _ in range(rounds):
        best["c"] = min(best["c"], timed(ctx, c_call, calls)[0])
        for name, fn in (("py", functional), ("fwd", forward)):
            wall, inside = timed(ctx, fn, calls)
            if wall < best[name]:
                best[name], best[name + "_inside"] = wall, inside
    us = {name: t * 1e6 for name, t in best.items()}
    print(
        f"{num_seqs:>4}x{keys:<5} {us['c']:>10.2f} {us['py']:>16.2f} {us['fwd']:>10.2f} "
        f"{us['fwd_inside']:>15.2f} {us['py'] - us['py_inside']:>24.2f} "
        f"{us['fwd'] - us['fwd_inside']:>16.2f}"
    )


def cold_control(ctx: pagedattn.Context, rounds: int) -> None:
    """The 1 x 128 forward with 64 MiB read between calls (what a 16 x 1024 step streams
    through the caches): its time outside the library is the Python layer running from
    cold caches, the part of the large shape's figure that is not the layer's own work."""
    kv_cache, md, impl, query, key, value, output = setup(1, 128, ctx)
    flush = torch.ones(16 * 1024 * 1024)  # 64 MiB of float32
    impl.forward(None, query, key, value, kv_cache, md, output)
    best = math.inf
    for _ in range(rounds):
        outside = 0.0
        for _ in range(20):
            flush.add_(1.0)
            ctx.library_seconds = 0
            ctx.timing = True
            start = time.perf_counter()
            impl.forward(None, query, key, value, kv_cache, md, output)
            outside += time.perf_counter() - start - ctx.library_seconds
            ctx.timing = False
        best = min(best, outside / 20)
    print(f"control: 1x128 forward after reading 64 MiB, outside the library: {best * 1e6:.2f} us")


def timed(ctx: pagedattn.Context, fn, calls: int) -> tuple[float, float]:
    """(wall time, time inside library calls) per call of `calls` calls of fn."""
    ctx.library_seconds = 0
    ctx.timing = True
    start = time.perf_counter()
    fn(calls)
    wall = time.perf_counter() - start
    ctx.timing = False
    return wall / calls, ctx.library_seconds / calls


if __name__ == "__main__":
    main()
