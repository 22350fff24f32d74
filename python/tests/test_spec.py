"""The spec types, their errors and the buffer checks, in one process (no refit)."""
import numpy as np
import pytest
import torch

import reshard


def two_by_two():
    spec = reshard.RefitSpec()
    spec.add_tensor("w", torch.bfloat16, torch.Size([8, 6]),
                    reshard.Layout(reshard.Mesh.range(0, 2), [reshard.Shard(0)]),
                    reshard.Layout(reshard.Mesh([2, 3]), [reshard.Shard(1)]))
    return spec


def test_version_and_dtypes():
    assert reshard.__version__.count(".") == 2
    assert reshard.as_dtype("bf16") == reshard.DType.bf16
    assert reshard.as_dtype(torch.float8_e4m3fn) == reshard.DType.fp8e4m3
    assert reshard.DType.fp32.itemsize == 4
    with pytest.raises(ValueError, match="unknown dtype 'bfloat'"):
        reshard.as_dtype("bfloat")
    with pytest.raises(ValueError, match="has no reshard equivalent"):
        reshard.as_dtype(torch.complex64)


def test_json_round_trip_and_tiles():
    spec = two_by_two()
    again = reshard.RefitSpec.from_json(spec.to_json())
    assert again.to_json() == spec.to_json()
    assert spec.world_size == 4
    (req,) = spec.local_buffers(3)
    assert (req.name, req.side, req.bytes, req.tensors) == ("w", reshard.Side.destination, 48,
                                                              ["w"])
    (tile,) = spec.local_tiles(3, reshard.Side.destination)
    assert (tile.lo, tile.hi, tile.shape, tile.strides) == ([0, 3], [8, 6], [8, 3], [3, 1])
    assert spec.local_tiles(3, reshard.Side.source) == []


def test_invalid_specs_raise_value_errors_naming_tensor_and_field():
    spec = reshard.RefitSpec()
    spec.add_tensor("w", "fp32", [8], reshard.Layout(reshard.Mesh([0, 1]), [reshard.Shard(1)]),
                    reshard.Layout(reshard.Mesh([2]), [reshard.Replicate()]))
    with pytest.raises(reshard.errors.InvalidArgumentError) as e:
        spec.validate()
    assert isinstance(e.value, ValueError) and e.value.code == "INVALID_ARGUMENT"
    assert 'tensor "w": src.placements[0]' in str(e.value)
    with pytest.raises(ValueError, match="line 1"):
        reshard.RefitSpec.from_json("{")


def test_store_callback_errors_reach_the_caller():
    def broken_set(key, value):
        raise OSError("disk full")
    with pytest.raises(reshard.errors.UnavailableError,
                       match="store callback set raised OSError: disk full"):
        comm = reshard.Communicator.from_store(_Store(set=broken_set), rank=0, world_size=4)
        reshard.RefitHandle(comm, two_by_two(), setup_timeout=5,
                            sources={"w": torch.zeros(24, dtype=torch.bfloat16)})


class _Store:
    """A store of the callback protocol in a dict (one process)."""

    def __init__(self, set=None):
        self.data = {}
        if set is not None:
            self.set = set

    def set(self, key, value):
        self.data[key] = value

    def get(self, key, timeout):
        if key not in self.data:
            raise TimeoutError(key)
        return self.data[key]


def test_buffers_are_checked_before_set_up():
    spec = two_by_two()
    comm = reshard.Communicator.from_store(_Store(), rank=2, world_size=4)
    with pytest.raises(reshard.errors.InvalidArgumentError,
                       match=r'buffer "w" \(destination of rank 2\): the buffer holds fp32 '
                             r'elements but the spec stores bf16 there'):
        reshard.RefitHandle(comm, spec, destinations={"w": torch.zeros(24)})
    with pytest.raises(reshard.errors.InvalidArgumentError, match="not C-contiguous"):
        reshard.RefitHandle(comm, spec, destinations={"w": np.zeros((6, 8), np.uint16).T})
    with pytest.raises(reshard.errors.InvalidArgumentError, match="not a buffer"):
        reshard.RefitHandle(comm, spec, destinations={"w": "no memory here"})
    with pytest.raises(reshard.errors.InvalidArgumentError, match="raw buffer is"):
        reshard.RefitHandle(comm, spec, destinations={"w": (1, 2, 3, 4)})


class _DLPackOnly:
    """An array known only through the DLPack protocol (as cupy or jax arrays are)."""

    def __init__(self, tensor):
        self._tensor = tensor

    def __dlpack__(self, **kwargs):
        return self._tensor.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._tensor.__dlpack_device__()


def test_dlpack_arrays_are_buffers():
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    info = reshard._reshard._array_info(_DLPackOnly(t))
    assert info["address"] == t.data_ptr()
    assert (info["elements"], info["itemsize"], info["dtype_code"], info["dtype_bits"]) == (
        24, 4, 2, 32)
    assert info["device_type"] == 1 and info["contiguous"]
    assert not reshard._reshard._array_info(_DLPackOnly(t.t()))["contiguous"]
    spec = two_by_two()
    comm = reshard.Communicator.from_store(_Store(), rank=2, world_size=4)
    with pytest.raises(reshard.errors.InvalidArgumentError, match="holds fp32 elements"):
        reshard.RefitHandle(comm, spec, destinations={"w": _DLPackOnly(t)})
