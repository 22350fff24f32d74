"""reshard: refit model weights from trainer ranks to inference ranks, moving only the regions
each destination needs (one-sided UCX puts; fan-out inside NVLink domains).

    import reshard
    spec = reshard.RefitSpec()
    spec.add_tensor("w", "bf16", [4096, 1024],
                    reshard.Layout(reshard.Mesh.range(0, 2), [reshard.Shard(0)]),
                    reshard.Layout(reshard.Mesh([2, 3]), [reshard.Shard(1)]))
    comm = reshard.Communicator.from_env()          # torchrun, Slurm, mpirun or RESHARD_*
    handle = reshard.RefitHandle(comm, spec, sources={"w": w_shard})   # collective set-up, once
    for step in range(steps):
        handle.execute(timeout=60)                  # every rank, every step

From torch: ``reshard.Layout.from_dtensor(dt)`` gives a DTensor's layout, buffers may be torch
tensors (host or CUDA), and ``reshard.Communicator.from_torch()`` rendezvous through
torch.distributed's store. docs/python.md is the guide; errors are reshard.errors' classes.
"""
import sys as _sys

# torch first, when it is installed: libreshard links libnccl.so.2 and libcudart.so.13 (from
# /usr/local/cuda when the build found CUDA), and the dynamic linker resolves a soname to the
# first library loaded under it. Loaded after reshard, torch would get the system's (possibly
# older) NCCL and fail to import ("undefined symbol: ncclCommResume"); loaded first, its NCCL
# serves both. docs/python.md, "torch and CUDA libraries".
if "torch" not in _sys.modules:
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        del torch

from . import errors
from ._reshard import (
    __version__, DType, Side, MemoryKind, QuantScheme, Schedule, Fanout, Placement, Shard,
    StridedShard, Replicate, Mesh, Layout, TensorDesc, BufferRequirement, LocalTile, RefitSpec,
    Communicator, Stats, HostBuffer, quant_block_shape,
)
from .errors import Error
from ._handle import RefitHandle
from ._spec import as_dtype
from . import _torch  # noqa: F401  (adds Layout.from_dtensor, Communicator.from_torch ...)

__all__ = [
    "__version__", "DType", "Side", "MemoryKind", "QuantScheme", "Schedule", "Fanout",
    "Placement", "Shard", "StridedShard", "Replicate", "Mesh", "Layout", "TensorDesc",
    "BufferRequirement", "LocalTile", "RefitSpec", "Communicator", "Stats", "HostBuffer",
    "RefitHandle",
    "Error", "errors", "as_dtype", "quant_block_shape",
]
