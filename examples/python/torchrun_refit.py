#!/usr/bin/env python3
"""A trainer/inference pair in one torchrun job: trainers hold DTensors, inference ranks hold
plain tensors in vLLM-style fused layouts, and reshard refits the weights every step.

    torchrun --standalone --nproc-per-node 6 examples/python/torchrun_refit.py --steps 10

Ranks 0-3 are trainers on a 2 x 2 (dp, tp) DeviceMesh; ranks 4-5 are one inference engine with
tensor parallelism 2. Everything runs on the CPU with gloo; with GPUs the same code refits
CUDA tensors (buffers on the current device). The weights, per trainer layout:
  embed       Shard(0) over dp, replicated over tp           (data-parallel shards, uneven)
  up_proj     _StridedShard(0, 2) over dp, Shard(0) over tp  (FSDP2 on top of TP; even, as
                                                              torch's distribute_tensor needs)
  down_proj   Shard(0) over dp, Shard(1) over tp             (TP row-parallel, FSDP on dim 0)
  q, k, v     Shard(0) over dp, Shard(0) over tp             (TP column-parallel)
On the inference ranks q, k and v live in one fused qkv buffer per rank (its q rows, then its k
rows, then its v rows), up_proj and down_proj are TP-sharded and embed is replicated.

Each step the trainers write new values into their DTensors in place (as an optimizer step
would); after the refit, rank 0 broadcasts every tensor's full_tensor() and every inference rank
checks each element it holds against it. Rendezvous goes through torchrun's own store
(reshard.Communicator.from_torch); --comm env uses Communicator.from_env instead.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.tensor import DeviceMesh, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.placement_types import _StridedShard

import reshard

TRAINERS = [[0, 1], [2, 3]]  # (dp, tp)
INFERENCE = [4, 5]           # tp
TP = 2

# name: (shape, trainer placements, inference placements)
TENSORS = {
    "embed": ((31, 8), [Shard(0), Replicate()], [reshard.Replicate()]),
    "up_proj": ((24, 8), [_StridedShard(0, split_factor=TP), Shard(0)], [reshard.Shard(0)]),
    "down_proj": ((8, 22), [Shard(0), Shard(1)], [reshard.Shard(1)]),
    "q": ((16, 8), [Shard(0), Shard(0)], [reshard.Shard(0)]),
    "k": ((8, 8), [Shard(0), Shard(0)], [reshard.Shard(0)]),
    "v": ((8, 8), [Shard(0), Shard(0)], [reshard.Shard(0)]),
}
QKV = ("q", "k", "v")


def weights(name, step):
    """The full tensor at `step` (what the optimizer produced): exact in bf16."""
    shape = TENSORS[name][0]
    n = shape[0] * shape[1]
    salt = sum(map(ord, name))
    values = (torch.arange(n) * 5 + step * 11 + salt) % 241
    return values.reshape(shape).to(torch.bfloat16)


def build_spec(trainer_mesh, dtensors):
    """The same spec on every rank: trainer layouts from the DTensors where this rank holds them
    (from the mesh and placements elsewhere), inference layouts written by hand."""
    spec = reshard.RefitSpec()
    infer = reshard.Mesh(INFERENCE)
    qkv_offset = 0
    for name, (shape, placements, infer_placements) in TENSORS.items():
        if name in dtensors:
            src = reshard.Layout.from_dtensor(dtensors[name])
            assert src.mesh == reshard.Layout.from_mesh(trainer_mesh, placements, 2).mesh
        else:
            src = reshard.Layout.from_mesh(trainer_mesh, placements, len(shape))
        dst = reshard.Layout(infer, infer_placements)
        if name in QKV:
            dst.in_buffer("qkv", qkv_offset, [shape[1], 1])
            qkv_offset += shape[0] // TP * shape[1]
        spec.add_tensor(name, torch.bfloat16, shape, src, dst)
    spec.set_domains([[0, 1, 2, 3, 4, 5]])
    return spec


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--comm", choices=["torch", "env"], default="torch")
    a = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 6:
        sys.exit("run with torchrun --nproc-per-node 6 (got a world of %d)" % world)
    # Every rank builds the trainers' mesh (creating its process groups is collective).
    trainer_mesh = DeviceMesh("cpu", torch.tensor(TRAINERS), mesh_dim_names=("dp", "tp"))
    trainer = rank < 4

    dtensors = {}
    if trainer:
        for name, (shape, placements, _) in TENSORS.items():
            dtensors[name] = distribute_tensor(weights(name, -1), trainer_mesh, placements)
    spec = build_spec(trainer_mesh, dtensors)
    comm = (reshard.Communicator.from_torch() if a.comm == "torch"
            else reshard.Communicator.from_env())

    if trainer:
        # The DTensors themselves are the source buffers (each gives its local shard).
        handle = reshard.RefitHandle(comm, spec, sources=dtensors)
    else:
        buffers = {r.name: torch.zeros(r.bytes // 2, dtype=torch.bfloat16)
                   for r in spec.local_buffers(rank)}
        tiles = spec.local_tiles(rank, reshard.Side.destination)
        handle = reshard.RefitHandle(comm, spec, destinations=buffers)

    for step in range(a.steps):
        if trainer:
            for name, dt in dtensors.items():  # the optimizer step, in place
                fresh = distribute_tensor(weights(name, step), trainer_mesh, dt.placements)
                dt.to_local().copy_(fresh.to_local())
        handle.execute(timeout=60)
        # The reference: the trainers' full tensors, as torch assembles them.
        for name in TENSORS:
            full = (dtensors[name].full_tensor() if trainer
                    else torch.empty(TENSORS[name][0], dtype=torch.bfloat16))
            dist.broadcast(full, src=0)
            if not trainer:
                for tile in (t for t in tiles if t.tensor == name):
                    got = buffers[tile.buffer].as_strided(tile.shape, tile.strides, tile.offset)
                    want = full[tuple(slice(lo, hi) for lo, hi in zip(tile.lo, tile.hi))]
                    if not torch.equal(got, want):
                        sys.exit("rank %d step %d: %s differs from the trainers' full_tensor()"
                                 % (rank, step, name))
    stats = handle.stats
    print("rank %d (%s): %d refits verified against full_tensor(); last refit %.2f ms, %d bytes "
          "received, %d pieces" % (rank, "trainer" if trainer else "inference", a.steps,
                                   stats.total_seconds * 1e3, stats.bytes_network_received,
                                   stats.pieces_received), flush=True)
    handle.close()
    # Gloo's worker threads drop their last collective's tensors just after the caller sees it
    # complete; one that does so after the interpreter began finalizing needs the GIL and aborts
    # the process ("terminate called without an active exception", seen about once in 35 runs).
    # The barrier waits with the GIL released, so they finish before we exit.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
