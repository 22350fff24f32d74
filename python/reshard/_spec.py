"""Python conveniences on the spec types: dtypes from strings and torch dtypes, shapes from any
sequence (torch.Size included)."""
from . import _reshard
from .errors import InvalidArgumentError

_BY_NAME = {d.spec_name: d for d in _reshard.DType.__members__.values()}


def as_dtype(dtype):
    """A reshard.DType from a DType, its spec name ("bf16", "fp8e4m3" ...) or a torch.dtype."""
    if isinstance(dtype, _reshard.DType):
        return dtype
    if isinstance(dtype, str):
        if dtype in _BY_NAME:
            return _BY_NAME[dtype]
        raise InvalidArgumentError("unknown dtype %r; reshard's are %s"
                                   % (dtype, ", ".join(sorted(_BY_NAME))))
    from ._buffers import _torch_dtype_name
    try:
        name = _torch_dtype_name(dtype)
    except ImportError:
        name = None
    if name is None:
        raise InvalidArgumentError("dtype %r has no reshard equivalent (reshard's are %s)"
                                   % (dtype, ", ".join(sorted(_BY_NAME))))
    return _BY_NAME[name]


_add_tensor = _reshard.RefitSpec.add_tensor


def _add_tensor_any(self, name, dtype, shape, src, dst):
    """Appends a tensor: `dtype` a DType, spec name or torch.dtype; `shape` any sequence of
    ints; `src` and `dst` Layouts. Returns the spec, for chaining."""
    return _add_tensor(self, name, as_dtype(dtype), [int(n) for n in shape], src, dst)


_reshard.RefitSpec.add_tensor = _add_tensor_any
