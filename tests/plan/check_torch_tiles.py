#!/usr/bin/env python3
"""reshard's tiles against torch's own, for random layouts with R, S(d) and _S(d, k).

Usage: check_torch_tiles.py RESHARD [--cases N] [--seed S]

For every random layout (mesh of 1 to 3 axes, tensors of 1 to 3 dims with uneven and empty
shards, placements mixing Replicate, Shard and _StridedShard) this asks torch two things:
  - the data each rank holds: torch's own sharding (`placement._split_tensor`, which
    distribute_tensor uses), applied left to right to a tensor of global indices; a layout is
    contiguous when every rank's indices along every dim are one range;
  - every rank's (local_shape, global_offset) from
    torch.distributed.tensor._utils._compute_local_shape_and_global_offset.
The contiguous layouts go to `reshard plan SPEC --tiles` in batches: every rank's tile must equal
torch's shape and offset (an empty shard's offset is the dim's size in both). Each non-contiguous
layout goes alone: reshard must refuse it (status 2) with the sentence naming the tensor and
"not one contiguous range". Exit status 0 when all agree, 1 otherwise; it prints the figures.
"""
import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile

import torch
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Replicate, Shard, _StridedShard


def random_layout(rng):
    """(shape, mesh_shape, placements as (kind, dim, split_factor)) with kind 'R' or 'S'."""
    ndim = rng.randint(1, 3)
    shape = [0 if rng.random() < 0.05 else rng.randint(1, 13 if ndim == 1 else 9)
             for _ in range(ndim)]
    mesh_ndim = rng.randint(1, 3)
    mesh = [rng.randint(1, 4) for _ in range(mesh_ndim)]
    placements = []
    for _ in range(mesh_ndim):
        if rng.random() < 0.2:
            placements.append(("R", -1, 1))
        else:
            # Mostly one dim, so that axes nest and strided shards matter.
            d = 0 if rng.random() < 0.6 else rng.randint(0, ndim - 1)
            placements.append(("S", d, 1))
    for a, (kind, d, _) in enumerate(placements):
        if kind != "S" or rng.random() < 0.4:
            continue
        later = 1
        for b in range(a + 1, mesh_ndim):
            if placements[b][0] == "S" and placements[b][1] == d:
                later *= mesh[b]
        # FSDP2 + TP's split factor (the later axes sharding the dim), else an arbitrary one.
        k = later if later > 1 and rng.random() < 0.6 else rng.randint(2, 5)
        placements[a] = ("S", d, k)
    return shape, mesh, placements


def torch_placements(placements):
    out = []
    for kind, d, k in placements:
        if kind == "R":
            out.append(Replicate())
        elif k == 1:
            out.append(Shard(d))
        else:
            out.append(_StridedShard(d, split_factor=k))
    return out


def spelling(p):
    # torch's str(): "R", "S(d)" and "_S(d, k)" are the spec's spellings.
    s = str(p)
    assert s == "R" or s.startswith("S(") or s.startswith("_S("), s
    return s


def torch_indices(shape, mesh, tplacements, coord):
    """Per dim, the global indices the rank at `coord` holds, by torch's own sharding."""
    held = []
    for d, n in enumerate(shape):
        view = [1] * len(shape)
        view[d] = n
        held.append(torch.arange(n).view(view))
    for a, p in enumerate(tplacements):
        if isinstance(p, Replicate):
            continue
        d = p.dim
        shards, _ = p._split_tensor(held[d], mesh[a], with_padding=False, contiguous=True)
        held[d] = shards[coord[a]]
    return [h.reshape(-1).tolist() for h in held]


def check_layout(shape, mesh, placements):
    """(contiguous, {rank: (local_shape, global_offset)}) from torch."""
    tp = torch_placements(placements)
    contiguous = True
    tiles = {}
    for rank, coord in enumerate(itertools.product(*[range(m) for m in mesh])):
        local, offset = _compute_local_shape_and_global_offset(shape, mesh, list(coord), tp)
        held = torch_indices(shape, mesh, tp, coord)
        for d, idx in enumerate(held):
            # torch's two views of a rank's shard agree with each other.
            assert len(idx) == local[d], (shape, mesh, placements, coord, d, idx, local)
            assert (idx[0] if idx else shape[d]) == offset[d], (shape, mesh, placements, coord, d)
            if idx and idx[-1] - idx[0] + 1 != len(idx):
                contiguous = False
        tiles[rank] = (list(local), list(offset))
    return contiguous, tiles


def layout_json(shape, mesh, placements, name):
    size = 1
    for m in mesh:
        size *= m
    ranks = list(range(size))

    def nest(level, start):
        if level == len(mesh):
            return ranks[start]
        step = 1
        for m in mesh[level + 1:]:
            step *= m
        return [nest(level + 1, start + i * step) for i in range(mesh[level])]

    return {
        "name": name, "dtype": "u8", "shape": shape,
        "src": {"mesh": nest(0, 0), "placements": [spelling(p) for p in torch_placements(placements)]},
        "dst": {"mesh": [0], "placements": ["R"]},
    }


def run_reshard(reshard, tensors, workdir):
    path = os.path.join(workdir, "spec.json")
    with open(path, "w") as f:
        json.dump({"tensors": tensors}, f)
    return subprocess.run([reshard, "plan", path, "--tiles"], capture_output=True, text=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reshard", help="the reshard CLI")
    parser.add_argument("--cases", type=int, default=800)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    rng = random.Random(args.seed)

    contiguous_layouts, rejected_layouts = [], []
    strided = fsdp = uneven_strided = empty_strided = 0
    for case in range(args.cases):
        shape, mesh, placements = random_layout(rng)
        ok, tiles = check_layout(shape, mesh, placements)
        has_strided = any(k > 1 for _, _, k in placements)
        if ok:
            contiguous_layouts.append((case, shape, mesh, placements, tiles))
            if has_strided:
                strided += 1
                sizes = {tuple(local) for local, _ in tiles.values()}
                uneven_strided += len(sizes) > 1
                empty_strided += any(0 in local for local, _ in tiles.values())
                for a, (kind, d, k) in enumerate(placements):
                    later = 1
                    for b in range(a + 1, len(mesh)):
                        if placements[b][0] == "S" and placements[b][1] == d:
                            later *= mesh[b]
                    fsdp += k > 1 and k == later
        else:
            rejected_layouts.append((case, shape, mesh, placements))

    failures = []
    with tempfile.TemporaryDirectory() as workdir:
        batch = 50
        for start in range(0, len(contiguous_layouts), batch):
            group = contiguous_layouts[start:start + batch]
            tensors = [layout_json(s, m, p, "t%d" % c) for c, s, m, p, _ in group]
            result = run_reshard(args.reshard, tensors, workdir)
            if result.returncode != 0:
                failures.append("reshard refused a batch of contiguous layouts: " + result.stderr.strip())
                continue
            listed = {entry["name"]: entry for entry in json.loads(result.stdout)}
            for case, shape, mesh, placements, tiles in group:
                got = {t["rank"]: (t["shape"], t["offset"]) for t in listed["t%d" % case]["src"]}
                if got != tiles:
                    failures.append("layout %d shape %s mesh %s placements %s: reshard %s, torch %s" % (
                        case, shape, mesh, [spelling(p) for p in torch_placements(placements)],
                        sorted(got.items()), sorted(tiles.items())))
        for case, shape, mesh, placements in rejected_layouts:
            name = "t%d" % case
            result = run_reshard(args.reshard, [layout_json(shape, mesh, placements, name)], workdir)
            if (result.returncode != 2 or 'tensor "%s"' % name not in result.stderr
                    or "not one contiguous range" not in result.stderr):
                failures.append("layout %d shape %s mesh %s placements %s is not contiguous in torch, "
                                "but reshard answered %d: %s" % (
                                    case, shape, mesh,
                                    [spelling(p) for p in torch_placements(placements)],
                                    result.returncode, (result.stderr or result.stdout).strip()[:300]))

    print("torch %s: %d random layouts; %d contiguous, every rank's (local_shape, global_offset) "
          "compared (%d with _StridedShard: %d FSDP2+TP split factors, %d uneven, %d with empty "
          "shards); %d not contiguous, each refused by reshard" % (
              torch.__version__, args.cases, len(contiguous_layouts), strided, fsdp, uneven_strided,
              empty_strided, len(rejected_layouts)))
    for f in failures[:20]:
        print("MISMATCH: " + f)
    if failures:
        print("%d of %d layouts disagree" % (len(failures), args.cases))
        return 1
    print("all agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
