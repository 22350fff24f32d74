"""Layouts from DTensors against torch itself: for random meshes (any rank order), shapes (even,
uneven, empty shards) and placements (Shard, Replicate, _StridedShard), every rank's tile that
reshard.Layout.from_dtensor + RefitSpec.local_tiles give equals torch's
compute_local_shape_and_global_offset (DTensors made with DTensor.from_local: only their
metadata matters here). One process: torch's fake process group lets one rank
build DeviceMeshes and DTensors of a 64-rank world."""
import random

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard
from torch.testing._internal.distributed.fake_pg import FakeStore

import reshard

WORLD = 64


@pytest.fixture(scope="module", autouse=True)
def fake_world():
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    yield
    dist.destroy_process_group()


def device_mesh(shape, ranks, preserve_rank_order=True):
    return DeviceMesh("cpu", torch.tensor(ranks).reshape(shape),
                      preserve_rank_order=preserve_rank_order)


def indices_of(global_shape, mesh_shape, coord, placements, dim):
    """torch's global indices of `dim` on `coord` (the list its _StridedShard logic tracks)."""
    idx = list(range(global_shape[dim]))
    for mesh_dim, p in enumerate(placements):
        if not isinstance(p, (Shard, _StridedShard)) or p.dim != dim:
            continue
        n = mesh_shape[mesh_dim]
        sf = p.split_factor if isinstance(p, _StridedShard) else 1
        pieces = []
        for outer in torch.tensor(idx, dtype=torch.int64).chunk(sf) if idx else []:
            chunks = list(outer.chunk(n))
            if coord[mesh_dim] < len(chunks):
                pieces.extend(chunks[coord[mesh_dim]].tolist())
        idx = pieces
    return idx


def random_case(rng):
    ndim = rng.randint(1, 3)
    shape = [rng.choice([0, 1, 2, 3, 5, 6, 7, 8, 12, 13]) for _ in range(ndim)]
    mesh_ndim = rng.randint(1, 3)
    mesh_shape = [rng.randint(1, 4) for _ in range(mesh_ndim)]
    size = 1
    for n in mesh_shape:
        size *= n
    ranks = rng.sample(range(WORLD), size)  # any order
    placements = []
    for axis in range(mesh_ndim):
        kind = rng.random()
        dim = rng.randrange(ndim)
        if kind < 0.25:
            placements.append(Replicate())
        elif kind < 0.6:
            placements.append(Shard(dim))
        else:
            # The FSDP2 + TP split factor (the later axes sharding the dim), or another one.
            later = 1
            for later_axis in range(axis + 1, mesh_ndim):
                later *= mesh_shape[later_axis]
            sf = later if rng.random() < 0.5 else rng.randint(1, 4)
            placements.append(_StridedShard(dim, split_factor=sf))
    return shape, mesh_shape, ranks, placements


def spec_of(shape, layout):
    spec = reshard.RefitSpec()
    spec.add_tensor("t", "fp32", shape, layout,
                    reshard.Layout(reshard.Mesh([WORLD]), [reshard.Replicate()]))
    return spec


def test_random_layouts_agree_with_torch():
    rng = random.Random(20261202)
    checked = rejected = 0
    for case in range(400):
        shape, mesh_shape, ranks, placements = random_case(rng)
        mesh = device_mesh(mesh_shape, ranks)
        dt = DTensor.from_local(torch.empty(0), mesh, placements, shape=torch.Size(shape),
                                stride=tuple(_strides(shape)), run_check=False)
        layout = reshard.Layout.from_dtensor(dt)
        assert layout.mesh == reshard.Layout.from_mesh(mesh, placements, len(shape)).mesh
        spec = spec_of(shape, layout)
        coords = list(torch.cartesian_prod(*[torch.arange(n) for n in mesh_shape])
                      .reshape(-1, len(mesh_shape)).tolist())
        contiguous = all(
            idx == list(range(idx[0], idx[0] + len(idx))) if idx else True
            for coord in coords for d in range(len(shape))
            for idx in [indices_of(shape, mesh_shape, coord, placements, d)])
        if not contiguous:
            with pytest.raises(reshard.errors.InvalidArgumentError, match="contiguous"):
                spec.validate()
            rejected += 1
            continue
        for coord in coords:
            rank = ranks[sum(c * s for c, s in zip(coord, _strides(mesh_shape)))]
            local_shape, offset = _compute_local_shape_and_global_offset(
                shape, mesh_shape, coord, placements)
            tiles = spec.local_tiles(rank, reshard.Side.source)
            assert len(tiles) == 1, (case, rank)
            tile = tiles[0]
            where = "case %d %s %s %s rank %d coord %s" % (case, shape, mesh_shape, placements,
                                                         rank, coord)
            assert tuple(tile.shape) == tuple(local_shape), where
            assert tuple(tile.lo) == tuple(offset), where
        checked += 1
    print("layouts: %d agree with torch, %d non-contiguous refused" % (checked, rejected))
    assert checked >= 200 and rejected >= 10


def _strides(shape):
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return strides


def test_from_dtensor_reads_mesh_and_placements():
    mesh = device_mesh([2, 2], [0, 2, 1, 3])
    placements = [_StridedShard(0, split_factor=2), Shard(0)]
    local = torch.empty(2, 8)
    dt = DTensor.from_local(local, mesh, placements, shape=torch.Size([8, 8]),
                            stride=(8, 1), run_check=False)
    layout = reshard.Layout.from_dtensor(dt)
    assert layout.mesh == reshard.Mesh([2, 2], [0, 2, 1, 3])
    assert layout.placements == [reshard.StridedShard(0, 2), reshard.Shard(0)]
    # torch's docstring example: rank (0, 1) holds rows 4-5, rank (1, 0) rows 2-3.
    spec = spec_of([8, 8], layout)
    assert spec.local_tiles(2, reshard.Side.source)[0].lo == [4, 0]
    assert spec.local_tiles(1, reshard.Side.source)[0].lo == [2, 0]
    shifted = reshard.Layout.from_dtensor(dt, ranks=10)
    assert shifted.mesh.ranks == [10, 12, 11, 13]
    mapped = reshard.Layout.from_dtensor(dt, ranks={0: 7, 1: 6, 2: 5, 3: 4})
    assert mapped.mesh.ranks == [7, 5, 6, 4]


def test_partial_is_refused():
    mesh = device_mesh([2], [0, 1])
    with pytest.raises(reshard.errors.InvalidArgumentError,
                       match=r"placements\[0\] is Partial\(sum\).*reduce it first"):
        reshard.Layout.from_mesh(mesh, [Partial()], 2)
    # Given the tensor's name, the error begins with it (the helpers cannot know it otherwise).
    with pytest.raises(reshard.errors.InvalidArgumentError,
                       match=r'^tensor "layers.0.mlp.w1": placements\[0\] is Partial\(sum\)'):
        reshard.Layout.from_mesh(mesh, [Partial()], 2, name="layers.0.mlp.w1")
    with pytest.raises(reshard.errors.InvalidArgumentError,
                       match=r'^tensor "bias": from_dtensor takes a torch DTensor, not a Tensor'):
        reshard.Layout.from_dtensor(torch.zeros(2), name="bias")


def test_unsorted_mesh_without_preserve_rank_order_is_refused():
    mesh = device_mesh([2, 2], [2, 3, 0, 1], preserve_rank_order=False)
    with pytest.raises(reshard.errors.InvalidArgumentError,
                       match=r"lists ranks \[2, 0\] along mesh dim 0 out of ascending order.*"
                             r"preserve_rank_order=True"):
        reshard.Layout.from_mesh(mesh, [Shard(0), Replicate()], 2)
    # Ascending along every dim (a transposed mesh): nothing to refuse.
    ok = device_mesh([2, 2], [0, 2, 1, 3], preserve_rank_order=False)
    assert reshard.Layout.from_mesh(ok, [Shard(0), Shard(1)], 2).mesh.ranks == [0, 2, 1, 3]
