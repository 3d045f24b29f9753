"""An independent reference for the Python tests: float64 attention with explicit masks over
keys and values gathered from the cache by plain loops. It shares no code with pagedattn
(dtype conversions are torch's own)."""

from __future__ import annotations

import math

import numpy as np
import torch

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def to_f64(t: torch.Tensor) -> np.ndarray:
    return t.to(torch.float64).numpy()


def cache_f64(cache: torch.Tensor, kv_cache_dtype: str, scale: float) -> np.ndarray:
    """A cache tensor's real values: FP8 bytes (uint8 or float8) decoded and scaled."""
    if kv_cache_dtype in FP8:
        return to_f64(cache.view(FP8[kv_cache_dtype])) * scale
    if cache.dtype in FP8_MAX:
        return to_f64(cache) * scale
    return to_f64(cache)


def encode(x: torch.Tensor, cache_dtype: torch.dtype, fp8: torch.dtype | None, scale: float):
    """What a cache of `cache_dtype` holds for activations x: x itself rounded, or for FP8
    x / scale (one f32 division) saturated to the format's largest value."""
    if fp8 is None:
        return x.to(cache_dtype)
    q = x.to(torch.float32) / torch.tensor(scale, dtype=torch.float32)
    q = q.clamp(-FP8_MAX[fp8], FP8_MAX[fp8])
    return q.to(fp8).view(cache_dtype) if cache_dtype != fp8 else q.to(fp8)


def gather(key_cache, value_cache, block_table, seq_len, block_size):
    """Keys and values 0..seq_len-1 of a sequence from [num_blocks, kv_heads, block_size, d]
    float64 caches, one token at a time."""
    kv_heads, d = key_cache.shape[1], key_cache.shape[3]
    keys = np.zeros((seq_len, kv_heads, d))
    values = np.zeros((seq_len, kv_heads, d))
    for t in range(seq_len):
        block = int(block_table[t // block_size])
        for h in range(kv_heads):
            keys[t, h] = key_cache[block, h, t % block_size]
            values[t, h] = value_cache[block, h, t % block_size]
    return keys, values


def visible(attn_type: str, i: int, j: int, window: int) -> bool:
    """Whether the query at position i sees the key at position j (API.md's masks)."""
    if attn_type == "decoder" and j > i:
        return False
    if window:
        if attn_type == "encoder_only":
            return abs(i - j) < window
        return i - window < j <= i
    return True


def mask(attn_type: str, n_q: int, n_k: int, window: int) -> np.ndarray:
    """[n_q, n_k]: query r (position n_k - n_q + r) sees key j."""
    m = np.zeros((n_q, n_k), dtype=bool)
    for r in range(n_q):
        for j in range(n_k):
            m[r, j] = visible(attn_type, n_k - n_q + r, j, window)
    return m


def attend(
    q, keys, values, *, scale, attn_type="decoder", window=0, soft_cap=0.0, alibi=None, sinks=None
):
    """One sequence: q [n_q, H, d], keys/values [n_k, KVH, d] (float64). Query r has position
    n_k - n_q + r. Returns out [n_q, H, d] and lse [n_q, H]; a row that sees no key gets zeros
    and -inf."""
    n_q, heads, d = q.shape
    n_k, kv_heads = keys.shape[0], keys.shape[1]
    group = heads // kv_heads
    seen = mask(attn_type, n_q, n_k, window)
    distance = np.arange(n_k)[None, :] - (n_k - n_q + np.arange(n_q))[:, None]  # j - i
    out = np.zeros((n_q, heads, d))
    lse = np.full((n_q, heads), -math.inf)
    for h in range(heads):
        kh = h // group
        s = scale * (q[:, h, :] @ keys[:, kh, :].T)
        if soft_cap:
            s = soft_cap * np.tanh(s / soft_cap)
        if alibi is not None:
            s = s + alibi[h] * distance
        for r in range(n_q):
            row = s[r][seen[r]]
            if row.size == 0:
                continue
            top = row.max() if sinks is None else max(row.max(), sinks[h])
            weights = np.exp(row - top)
            total = weights.sum() + (math.exp(sinks[h] - top) if sinks is not None else 0.0)
            out[r, h] = weights @ values[seen[r], kh, :] / total
            lse[r, h] = top + math.log(total)
    return out, lse


TOLERANCE = {
    torch.float32: (2e-4, 2e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 8e-3),
}


def assert_close(got: torch.Tensor, want: np.ndarray, vmax: float, dtype, label: str):
    """|got - want| <= rtol |want| + atol max|v|; rows that see no key must be exact zeros."""
    rtol, atol = TOLERANCE[dtype]
    g = to_f64(got).reshape(want.shape)
    err = np.abs(g - want)
    limit = rtol * np.abs(want) + atol * max(vmax, 1e-30)
    bad = np.argwhere(~(err <= limit))
    assert bad.size == 0, (
        f"{label}: {len(bad)} elements off, first at {tuple(bad[0])}: "
        f"got {g[tuple(bad[0])]!r}, want {want[tuple(bad[0])]!r}"
    )


def assert_lse(got: torch.Tensor, want: np.ndarray, label: str):
    g = got.to(torch.float64).numpy()
    both_inf = np.isinf(g) & np.isinf(want) & (g < 0) & (want < 0)
    with np.errstate(invalid="ignore"):
        err = np.where(both_inf, 0.0, np.abs(g - want))
    bad = np.argwhere(~(err <= 1e-3))
    assert bad.size == 0, (
        f"{label}: lse off at {tuple(bad[0])}: got {g[tuple(bad[0])]}, want {want[tuple(bad[0])]}"
    )
