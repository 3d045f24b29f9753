"""Threads: two Python threads with their own contexts call at once and get the bytes that
sequential calls give; the GIL is released while the library works; a context shared by two
threads serialises them; a steady-state forward allocates no tensor."""

from __future__ import annotations

import gc
import itertools
import threading
import time
import weakref

import torch

import pagedattn
from pagedattn import PagedAttentionBackend, PagedAttentionImpl, PagedAttentionMetadataBuilder


def workload(seed: int, ctx: pagedattn.Context):
    """A mixed batch (prompts, a chunk, decodes) over a bf16 cache, run as forward steps."""
    g = torch.Generator().manual_seed(seed)
    heads, kv_heads, d, bs = 8, 2, 64, 16
    num_blocks = 64
    kv_cache = torch.zeros(
        PagedAttentionBackend.get_kv_cache_shape(num_blocks, bs, kv_heads, d), dtype=torch.bfloat16
    )
    impl = PagedAttentionImpl(heads, d, d**-0.5, num_kv_heads=kv_heads, ctx=ctx)
    tables = torch.randperm(num_blocks, generator=g, dtype=torch.int32)[:48].view(4, 12).tolist()
    steps = [([100, 37, 80, 5], [100, 37, 80, 5]), ([1, 60, 1, 1], [101, 97, 81, 6])]
    builder = PagedAttentionMetadataBuilder(bs)
    inputs = []
    for q_lens, seq_lens in steps:
        n = sum(q_lens)
        qkv = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g).to(torch.bfloat16)
        inputs.append((builder.build(q_lens, seq_lens, tables), qkv))

    def run():
        kv_cache.zero_()
        outs = []
        for md, qkv in inputs:
            q = qkv[:, : heads * d]
            k = qkv[:, heads * d : (heads + kv_heads) * d]
            v = qkv[:, (heads + kv_heads) * d :]
            for _ in range(5):
                outs.append(impl.forward(None, q, k, v, kv_cache, md).clone())
        return outs

    return run


def test_two_threads_match_sequential_calls():
    runs = [workload(seed, pagedattn.Context(2)) for seed in (1, 2)]
    sequential = [run() for run in runs]
    results = [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        barrier.wait()
        results[i] = runs[i]()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        assert len(results[i]) == len(sequential[i])
        for a, b in zip(results[i], sequential[i], strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def longest_pause_during(call) -> tuple[float, float]:
    """Runs call() on another thread while this one spins: the call's duration and this
    thread's longest pause during it (a held GIL would pause it for the whole call)."""
    started, done = threading.Event(), threading.Event()
    span = []

    def run():
        started.set()
        begin = time.perf_counter()
        call()
        span.append((begin, time.perf_counter()))
        done.set()

    t = threading.Thread(target=run)
    t.start()
    started.wait()
    stamps = []
    while not done.is_set():
        stamps.append(time.perf_counter())
    t.join()
    begin, end = span[0]
    inside = [begin] + [s for s in stamps if begin < s < end] + [end]
    return end - begin, max(b - a for a, b in itertools.pairwise(inside))


def test_the_gil_is_released_during_a_call():
    """While one thread is inside a long library call, another runs Python throughout."""
    ctx = pagedattn.Context(1)
    heads, d, n = 8, 128, 2048
    q = torch.randn(n, heads, d)
    cu = torch.tensor([0, n], dtype=torch.int32)
    duration, pause = longest_pause_during(
        lambda: pagedattn.varlen_attention(q, q, q, cu, cu, attn_type="decoder", ctx=ctx)
    )
    assert duration > 0.05, f"a call of {duration:.3f} s is too short to tell"
    assert pause < duration / 4, f"paused {pause:.3f} s of a {duration:.3f} s call"


def test_a_shared_context_serialises_callers():
    ctx = pagedattn.Context(2)
    runs = [workload(seed, ctx) for seed in (3, 4)]
    sequential = [run() for run in runs]
    results = [None, None]
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, runs[i]())) for i in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        for a, b in zip(results[i], sequential[i], strict=True):
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def test_steady_forward_allocates_no_tensor():
    """With output given, a forward after the step's first makes no tensor (the profiler
    records none and no memory)."""
    ctx = pagedattn.Context(1)
    heads, kv_heads, d, bs = 8, 2, 64, 16
    kv_cache = torch.zeros(PagedAttentionBackend.get_kv_cache_shape(8, bs, kv_heads, d))
    impl = PagedAttentionImpl(heads, d, 0.125, num_kv_heads=kv_heads, ctx=ctx)
    md = PagedAttentionMetadataBuilder(bs).build([1, 3], [20, 3], [[0, 1], [2]])
    qkv = torch.randn(4, (heads + 2 * kv_heads) * d)
    q, k, v = (
        qkv[:, : heads * d],
        qkv[:, heads * d : (heads + kv_heads) * d],
        qkv[:, (heads + kv_heads) * d :],
    )
    out = torch.empty(4, heads * d)
    impl.forward(None, q, k, v, kv_cache, md, out)  # the first layer of the step makes the plan
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    ) as prof:
        for _ in range(10):
            impl.forward(None, q, k, v, kv_cache, md, out)
    events = prof.events()
    assert sum(e.cpu_memory_usage for e in events) == 0
    assert not [
        e.name for e in events if "empty" in e.name or "zeros" in e.name or "copy" in e.name
    ]


def test_openmp_team_context_gives_the_own_pool_bytes():
    """threads='openmp' runs the work on torch's OpenMP team: the same bytes as a pool."""
    team = pagedattn.Context(threads="openmp")
    assert team.threads == "openmp" and team.num_threads >= 1
    own = pagedattn.Context(team.num_threads)
    assert own.threads == "own"
    a, b = workload(5, team)(), workload(5, own)()
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.view(torch.int16), y.view(torch.int16))


def test_a_context_goes_with_its_last_user():
    """An impl made over its own context keeps it only while the impl lives: the context (and
    its threads) must not outlive every user, whatever the package keeps per context."""
    ctx = pagedattn.Context(2)
    impl = pagedattn.PagedAttentionImpl(2, 8, 0.3, 2, ctx=ctx)
    md = pagedattn.PagedAttentionMetadataBuilder(4).build([1], [1], [[0]])
    kv_cache = torch.zeros(pagedattn.PagedAttentionBackend.get_kv_cache_shape(1, 4, 2, 8))
    impl.forward(None, torch.randn(1, 16), torch.randn(1, 16), torch.randn(1, 16), kv_cache, md)
    gone = weakref.ref(ctx)
    del impl, ctx, md
    gc.collect()
    assert gone() is None, "the context outlived its last user"
