"""How the extension reads a tensor: through one DLPack export where torch gives it, through
the tensor's attributes otherwise; both readers agree with torch on the data address, dtype,
shape and strides of every view the library may be handed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pagedattn import _ext

DTYPES = {
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.float8_e5m2: "float8_e5m2",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
}


def views(dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The shapes and strides an engine passes: fused-QKV slices, heads, empty batches."""
    base = torch.arange(5 * 48).reshape(5, 48).to(dtype)
    return {
        "dense": base,
        "query slice": base[:, :32],
        "value slice": base[:, 40:],
        "one row of a fused qkv": base[2:3, 8:24],
        "heads": base[:, 16:].view(5, 4, 8),
        "transposed": base.t(),
        "expanded": base[:1].expand(3, 48),
        "empty": base[2:2],
        "scalar": base[1, 3],
        "rows of a 3-D cache": torch.zeros((2, 3, 16), dtype=dtype)[1],
    }


def torch_view(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), DTYPES[t.dtype], tuple(t.shape), tuple(t.stride()))


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES.values()))
def test_both_readers_agree_with_torch(dtype):
    for name, t in views(dtype).items():
        want = torch_view(t)
        for reader in ("auto", "dlpack", "attributes"):
            assert _ext.tensor_view(t, reader) == want, (name, reader)


def test_tensors_that_need_grad_are_read_in_place():
    t = torch.randn(4, 8, requires_grad=True)
    assert _ext.tensor_view(t, "auto") == torch_view(t.detach())


def test_dtypes_outside_the_library_are_named_by_the_attributes():
    t = torch.zeros(3, 4, dtype=torch.float64)
    assert _ext.tensor_view(t, "dlpack") is None
    assert _ext.tensor_view(t, "auto")[1] == "torch.float64"
    assert _ext.tensor_view(t, "attributes")[1] == "torch.float64"


def test_numpy_arrays_through_the_buffer_protocol():
    a = np.arange(60, dtype=np.float32).reshape(6, 10)[1:, 2:7]
    address = a.__array_interface__["data"][0]
    assert _ext.tensor_view(a, "auto") == (address, "float32", (5, 5), (10, 1))
    with pytest.raises(ValueError, match="reader = 'dlpack' needs a torch tensor"):
        _ext.tensor_view(a, "dlpack")
