"""One engine step's metadata for the plugin's impl, made in the test's process (no engine)."""

from __future__ import annotations

import numpy as np
import torch

from pagedattn import _ext
from pagedattn.vllm.backend import PagedAttnMetadata


def metadata(query_lens, seq_lens, tables, slots, causal=True) -> PagedAttnMetadata:
    """A step (causal, or vLLM's bidirectional decoders'): query_lens[s] new tokens of
    sequence s, which then holds seq_lens[s], its blocks tables[s] (rows of equal length), the
    new tokens' cache slots in order."""
    qsl = torch.tensor(np.concatenate(([0], np.cumsum(query_lens))), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    table = torch.tensor(tables, dtype=torch.int32)
    return PagedAttnMetadata(
        num_actual_tokens=int(qsl[-1]),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc=qsl,
        seq_lens=lens,
        causal=causal,
        batch=_ext.Batch(qsl, lens, table, torch.tensor(slots, dtype=torch.int64)),
    )
