"""What torch users need: layouts from DTensors and DeviceMeshes, and communicators on top of a
torch.distributed store. Importing reshard does not import torch; these import it when called.
"""
import datetime
import numbers

from . import _reshard
from .errors import InvalidArgumentError


def _rank_map(ranks):
    """torch global rank -> reshard rank, from the `ranks` argument of from_dtensor."""
    if ranks is None:
        return lambda r: r
    if isinstance(ranks, numbers.Integral):
        return lambda r: r + int(ranks)
    if callable(ranks):
        return ranks
    if hasattr(ranks, "__getitem__"):
        def lookup(r):
            try:
                return ranks[r]
            except (IndexError, KeyError):
                raise InvalidArgumentError(
                    "ranks maps no reshard rank to torch rank %d of the mesh" % r) from None
        return lookup
    raise InvalidArgumentError(
        "ranks must be None (reshard ranks are torch's), an offset, a sequence or mapping "
        "indexed by torch rank, or a function of the torch rank; not %r" % (ranks,))


def _check_rank_order(device_mesh, mesh_ranks, shape):
    """The preserve_rank_order trap: a DeviceMesh built with preserve_rank_order=False (torch's
    default) gives every mesh dim a process group whose ranks are sorted ascending, so
    distribute_tensor, full_tensor and FSDP place shard i on the i-th smallest rank of each
    group, while the mesh's metadata (get_coordinate, compute_local_shape_and_global_offset)
    says shard i lives at coordinate i as written. They disagree wherever a group is written out
    of ascending order; a layout taken from such a DTensor would describe data it does not hold."""
    if getattr(device_mesh, "_preserve_rank_order", False):
        return
    import itertools
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    for d, size in enumerate(shape):
        others = [range(n) if i != d else range(1) for i, n in enumerate(shape)]
        for base in itertools.product(*others):
            start = sum(c * s for c, s in zip(base, strides))
            group = [mesh_ranks[start + k * strides[d]] for k in range(size)]
            if group != sorted(group):
                names = getattr(device_mesh, "mesh_dim_names", None)
                label = " (%r)" % names[d] if names else ""
                raise InvalidArgumentError(
                    "DeviceMesh %s lists ranks %s along mesh dim %d%s out of ascending order but "
                    "was built with preserve_rank_order=False, so torch's collectives on it place "
                    "shards in ascending rank order, not where its placements say; build the mesh "
                    "with preserve_rank_order=True, or with ascending ranks along every dim"
                    % (device_mesh.mesh.tolist(), group, d, label))


def mesh_from_device_mesh(device_mesh, ranks=None):
    """A reshard.Mesh over the same ranks as a torch DeviceMesh, in its written order
    (`ranks` maps torch global ranks to reshard ranks, see Layout.from_dtensor)."""
    tensor = device_mesh.mesh
    shape = [int(n) for n in tensor.shape]
    torch_ranks = [int(r) for r in tensor.flatten().tolist()]
    _check_rank_order(device_mesh, torch_ranks, shape)
    rank_of = _rank_map(ranks)
    mapped = []
    for r in torch_ranks:
        m = rank_of(r)
        if not isinstance(m, numbers.Integral):
            raise InvalidArgumentError("ranks maps torch rank %d to %r, not an int" % (r, m))
        mapped.append(int(m))
    return _reshard.Mesh(shape, mapped)


def placements_from_torch(placements, ndim, what="placements"):
    """reshard placements from DTensor placements: Shard(d), Replicate() and _StridedShard(d,
    split_factor); Partial is refused (a partial sum is not a value to copy)."""
    from torch.distributed.tensor import placement_types as pt
    out = []
    for i, p in enumerate(placements):
        strided = getattr(pt, "_StridedShard", None)
        if strided is not None and isinstance(p, strided):
            out.append(_reshard.StridedShard(_dim(p.dim, ndim, what, i), int(p.split_factor)))
        elif isinstance(p, pt.Shard):
            out.append(_reshard.Shard(_dim(p.dim, ndim, what, i)))
        elif isinstance(p, pt.Replicate):
            out.append(_reshard.Replicate())
        elif isinstance(p, pt.Partial):
            raise InvalidArgumentError(
                "%s[%d] is %r: the DTensor holds partial results that still need a reduction, "
                "not values reshard can copy; reduce it first (dt.redistribute(mesh, "
                "[Replicate()] * mesh.ndim) or dt.full_tensor())" % (what, i, p))
        else:
            raise InvalidArgumentError(
                "%s[%d] is %r, which reshard does not know (it takes Shard, _StridedShard and "
                "Replicate)" % (what, i, p))
    return out


def _dim(dim, ndim, what, i):
    d = dim + ndim if dim < 0 else dim
    if not 0 <= d < ndim:
        raise InvalidArgumentError("%s[%d] shards dim %d of a %d-D tensor" % (what, i, dim, ndim))
    return d


def _naming(name):
    """A context that prefixes the InvalidArgumentError raised inside it with `tensor "name": `
    (nothing when name is None): the layout helpers see a DTensor or a mesh, not its name."""
    import contextlib

    @contextlib.contextmanager
    def prefix():
        try:
            yield
        except InvalidArgumentError as e:
            if name is None:
                raise
            raise InvalidArgumentError('tensor "%s": %s' % (name, e)) from None
    return prefix()


def layout_from_dtensor(dt, ranks=None, name=None):
    """The reshard.Layout of a DTensor: its device mesh (ranks mapped by `ranks`: None when
    reshard's ranks are torch's, an int offset, a sequence or mapping indexed by torch rank, or
    a function) and its placements. The layout describes every rank, so each rank can add the
    tensor to the same spec; use Layout.from_mesh where a rank holds no DTensor of that mesh.
    `name` (the tensor's name in the spec) is only for errors, which then begin with it."""
    with _naming(name):
        if not hasattr(dt, "device_mesh") or not hasattr(dt, "placements"):
            raise InvalidArgumentError("from_dtensor takes a torch DTensor, not a %s"
                                       % type(dt).__qualname__)
        return layout_from_mesh(dt.device_mesh, dt.placements, dt.ndim, ranks)


def layout_from_mesh(device_mesh, placements, ndim, ranks=None, name=None):
    """The reshard.Layout of a tensor with `ndim` dims placed on a torch DeviceMesh by DTensor
    `placements`, on any rank (also one outside the mesh). `name`: as for from_dtensor."""
    with _naming(name):
        if len(placements) != device_mesh.ndim:
            raise InvalidArgumentError("%d placements for a %d-D DeviceMesh"
                                       % (len(placements), device_mesh.ndim))
        return _reshard.Layout(mesh_from_device_mesh(device_mesh, ranks),
                               placements_from_torch(placements, ndim))


_reshard.Layout.from_dtensor = staticmethod(layout_from_dtensor)
_reshard.Layout.from_mesh = staticmethod(layout_from_mesh)
_reshard.Mesh.from_device_mesh = staticmethod(mesh_from_device_mesh)


class TorchStore:
    """reshard's store callbacks over a torch.distributed Store (TCPStore, FileStore,
    PrefixStore ...): keys under `prefix`, waits bounded by the library's deadlines."""

    def __init__(self, store, prefix="reshard/"):
        import torch.distributed as dist
        self._store = dist.PrefixStore(prefix, store) if prefix else store

    def set(self, key, value):
        self._store.set(key, value)

    def get(self, key, timeout):
        if timeout <= 0:  # a poll: look once (the library polls some keys between progress)
            if not self._store.check([key]):
                raise TimeoutError("key %r not set" % key)
            return self._store.get(key)
        try:
            self._store.wait([key], datetime.timedelta(seconds=timeout))
        except RuntimeError as e:  # torch.distributed.DistStoreError on timeout
            if "timeout" in str(e).lower():
                raise TimeoutError("key %r not set within %.3f s" % (key, timeout)) from None
            raise
        return self._store.get(key)

    def delete(self, key):
        self._store.delete_key(key)


def _communicator_from_store(store, rank, world_size, prefix="reshard/"):
    """A Communicator whose rendezvous goes through a torch.distributed Store (or any object
    with set(key, bytes), get(key, timeout_seconds) -> bytes that raises TimeoutError, and
    optionally delete(key)). Every rank of the refit world must use the same store and prefix."""
    if hasattr(store, "wait") and hasattr(store, "delete_key"):  # a torch.distributed.Store
        store = TorchStore(store, prefix)
    return _reshard.Communicator._from_callbacks(
        store.set, store.get, getattr(store, "list", None), getattr(store, "delete", None),
        int(rank), int(world_size))


def _communicator_from_torch(prefix="reshard/"):
    """A Communicator over torch.distributed's default process group: reshard's ranks and world
    are torch's (torch.distributed.get_rank / get_world_size), the rendezvous goes through the
    default group's store (the one init_process_group made: torchrun's TCPStore) under
    `prefix`."""
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_initialized():
        raise InvalidArgumentError(
            "Communicator.from_torch needs torch.distributed.init_process_group first "
            "(or use Communicator.from_env under torchrun)")
    store = dist.distributed_c10d._get_default_store()
    return _communicator_from_store(store, dist.get_rank(), dist.get_world_size(), prefix)


_reshard.Communicator.from_store = staticmethod(_communicator_from_store)
_reshard.Communicator.from_torch = staticmethod(_communicator_from_torch)
