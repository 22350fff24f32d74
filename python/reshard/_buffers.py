"""Buffers from Python objects: torch tensors (and DTensors, Parameters), DLPack and
buffer-protocol arrays (numpy, cupy, jax ...), reshard.HostBuffer (shared memory: one-copy
writes from same-host peers), or raw (address, bytes[, kind]) tuples.

Each becomes (side, name, address, bytes, memory kind, owner) for the extension; the owner keeps
the memory alive as long as the refit handle. Checked here, before any collective set-up:
contiguity (reshard writes a buffer's bytes in place, so a strided view would be written wrong),
the device (host memory, or CUDA memory of the current device), and the element type against
the spec's tensors in that buffer (a byte view, uint8 or int8, is always accepted). The library
checks the size and names the expected bytes.
"""
from . import _reshard
from .errors import InvalidArgumentError

_SIDE_WORDS = {_reshard.Side.source: "source", _reshard.Side.destination: "destination"}

# DLPack (code, bits) -> the spec's dtype name. Codes: kDLInt 0, kDLUInt 1, kDLFloat 2,
# kDLBfloat 4, kDLBool 6, kDLFloat8_e4m3fn 10, kDLFloat8_e5m2 12 (DLPack 1.1).
_DLPACK_DTYPES = {
    (0, 8): "i8", (0, 16): "i16", (0, 32): "i32", (0, 64): "i64", (1, 8): "u8",
    (2, 16): "fp16", (2, 32): "fp32", (2, 64): "fp64", (4, 16): "bf16", (6, 8): "bool",
    (10, 8): "fp8e4m3", (12, 8): "fp8e5m2",
}
_BYTE_DTYPES = ("u8", "i8")
# DLPack device types: kDLCPU 1, kDLCUDA 2, kDLCUDAHost 3 (pinned host memory), kDLCUDAManaged 13.
_HOST_DEVICES = (1, 3)
_CUDA_DEVICES = (2,)


def _torch_dtype_name(dtype):
    import torch
    names = {
        torch.bool: "bool", torch.uint8: "u8", torch.int8: "i8", torch.int16: "i16",
        torch.int32: "i32", torch.int64: "i64", torch.float16: "fp16", torch.bfloat16: "bf16",
        torch.float32: "fp32", torch.float64: "fp64",
    }
    for attr, name in (("float8_e4m3fn", "fp8e4m3"), ("float8_e5m2", "fp8e5m2")):
        if hasattr(torch, attr):
            names[getattr(torch, attr)] = name
    return names.get(dtype)


def _is_torch_tensor(obj):
    torch = _torch_if_imported()
    return torch is not None and isinstance(obj, torch.Tensor)


def _torch_if_imported():
    import sys
    return sys.modules.get("torch")


def _where(name, side, rank):
    return 'buffer "%s" (%s of rank %d)' % (name, _SIDE_WORDS[side], rank)


def _describe(obj):
    return "%s.%s" % (type(obj).__module__, type(obj).__qualname__)


def _from_torch(obj, where):
    """(address, bytes, kind, dtype name, owner) of a torch tensor."""
    torch = _torch_if_imported()
    tensor = obj
    # A DTensor's memory is its local shard; a Parameter's is its data.
    to_local = getattr(tensor, "to_local", None)
    if to_local is not None and hasattr(tensor, "placements"):
        tensor = to_local()
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        raise InvalidArgumentError(
            "%s: the tensor is not contiguous (shape %s, strides %s); reshard reads and writes "
            "the buffer's bytes in place, so pass a contiguous tensor (a .contiguous() copy "
            "would not be the tensor you use)" % (where, tuple(tensor.shape), tensor.stride()))
    device = tensor.device
    if device.type == "cpu":
        kind = _reshard.MemoryKind.host
    elif device.type == "cuda":
        current = torch.cuda.current_device()
        if device.index != current:
            raise InvalidArgumentError(
                "%s: the tensor is on %s but this process's current CUDA device is cuda:%d; "
                "reshard refits the current device's memory (torch.cuda.set_device(%d) first)"
                % (where, device, current, device.index))
        kind = _reshard.MemoryKind.cuda
    else:
        raise InvalidArgumentError(
            "%s: the tensor is on device %s; reshard moves host and CUDA memory only"
            % (where, device))
    name = _torch_dtype_name(tensor.dtype)
    return tensor.data_ptr(), tensor.numel() * tensor.element_size(), kind, name, tensor


def _from_array(obj, where):
    """(address, bytes, kind, dtype name, owner) of a DLPack or buffer-protocol array."""
    try:
        info = _reshard._array_info(obj)
    except TypeError:
        raise InvalidArgumentError(
            "%s: a %s is not a buffer: pass a torch tensor, an array that supports DLPack or "
            "the buffer protocol (numpy, cupy ...), or (address, bytes[, 'host'|'cuda'])"
            % (where, _describe(obj))) from None
    if not info["contiguous"]:
        raise InvalidArgumentError(
            "%s: the array is not C-contiguous; reshard reads and writes the buffer's bytes in "
            "place, so pass a contiguous array" % where)
    device = info["device_type"]
    if device in _HOST_DEVICES:
        kind = _reshard.MemoryKind.host
    elif device in _CUDA_DEVICES:
        kind = _reshard.MemoryKind.cuda
    else:
        raise InvalidArgumentError(
            "%s: the array lives on DLPack device type %d; reshard moves host and CUDA memory "
            "only" % (where, device))
    name = _DLPACK_DTYPES.get((info["dtype_code"], info["dtype_bits"]))
    return info["address"], info["elements"] * info["itemsize"], kind, name, obj


def _from_raw(obj, where):
    if not (2 <= len(obj) <= 3) or not all(isinstance(v, int) for v in obj[:2]):
        raise InvalidArgumentError(
            "%s: a raw buffer is (address, bytes) or (address, bytes, 'host'|'cuda'), not %r"
            % (where, obj))
    kind = _reshard.MemoryKind.host
    if len(obj) == 3:
        kinds = {"host": _reshard.MemoryKind.host, "cuda": _reshard.MemoryKind.cuda}
        if obj[2] not in kinds and not isinstance(obj[2], _reshard.MemoryKind):
            raise InvalidArgumentError(
                "%s: the memory kind must be 'host' or 'cuda', not %r" % (where, obj[2]))
        kind = kinds.get(obj[2], obj[2])
    return obj[0], obj[1], kind, None, None


def buffer_args(spec, rank, sources, destinations):
    """The extension's buffer tuples for `rank`, every object checked (see the module comment)."""
    args = []
    for side, given in ((_reshard.Side.source, sources), (_reshard.Side.destination, destinations)):
        if not given:
            continue
        expected = {}
        for tile in spec.local_tiles(rank, side):
            expected.setdefault(tile.buffer, set()).add(tile.dtype.spec_name)
        for name, obj in given.items():
            if not isinstance(name, str):
                raise InvalidArgumentError(
                    "buffer names are strings (the spec's buffer or tensor names), not %r" % (name,))
            where = _where(name, side, rank)
            if isinstance(obj, _reshard.HostBuffer):
                address, nbytes, kind, dtype, owner = (
                    obj.address, obj.nbytes, _reshard.MemoryKind.host, None, obj)
            elif _is_torch_tensor(obj):
                address, nbytes, kind, dtype, owner = _from_torch(obj, where)
            elif isinstance(obj, tuple):
                address, nbytes, kind, dtype, owner = _from_raw(obj, where)
            else:
                address, nbytes, kind, dtype, owner = _from_array(obj, where)
            wanted = expected.get(name)
            if dtype is not None and wanted and dtype not in _BYTE_DTYPES and wanted != {dtype}:
                raise InvalidArgumentError(
                    "%s: the buffer holds %s elements but the spec stores %s there; pass a buffer "
                    "of that type or a uint8 view of its bytes"
                    % (where, dtype, " and ".join(sorted(wanted))))
            args.append((side, name, int(address), int(nbytes), kind, owner))
    return args
