"""One rank of the refit tests of test_refit.py (run as a script, one process per rank).

The spec: 4 ranks; trainers 0 and 1, inference ranks 2 and 3.
  w    fp32 16x12  rows over [0, 1]          -> columns over [2, 3]       (numpy buffers)
  q    bf16 8x4    rows over [0, 1]          -> rows over [2, 3] in "qkv"  (torch; vLLM-style
  k    bf16 4x4    replicated on [0, 1]      -> rows over [2, 3] in "qkv"   fused projection:
  v    bf16 4x4    columns over [0, 1]       -> rows over [2, 3] in "qkv"   q, k, v shards)
Values change every step; every destination element is checked after every refit, through the
tiles that spec.local_tiles gives (offset and strides into the rank's buffer).
"""
import argparse
import os
import sys
import threading
import time

import numpy as np
import torch

import reshard

TRAINERS = [0, 1]
INFERENCE = [2, 3]


def build_spec(one_domain=True, big=False):
    spec = reshard.RefitSpec()
    train = reshard.Mesh(TRAINERS)
    infer = reshard.Mesh(INFERENCE)
    spec.add_tensor("w", "fp32", [16, 12], reshard.Layout(train, [reshard.Shard(0)]),
                    reshard.Layout(infer, [reshard.Shard(1)]))
    # The fused buffer of one inference rank: its q rows (4x4), then k (2x4), then v (2x4).
    spec.add_tensor("q", torch.bfloat16, (8, 4), reshard.Layout(train, [reshard.Shard(0)]),
                    reshard.Layout(infer, [reshard.Shard(0)]).in_buffer("qkv", 0, [4, 1]))
    spec.add_tensor("k", torch.bfloat16, (4, 4), reshard.Layout(train, [reshard.Replicate()]),
                    reshard.Layout(infer, [reshard.Shard(0)]).in_buffer("qkv", 16, [4, 1]))
    spec.add_tensor("v", torch.bfloat16, (4, 4), reshard.Layout(train, [reshard.Shard(1)]),
                    reshard.Layout(infer, [reshard.Shard(0)]).in_buffer("qkv", 24, [4, 1]))
    if big:  # pieces of 64 KiB, where a delta of a few changed elements is far smaller
        spec.add_tensor("big", "fp32", [64, 512], reshard.Layout(train, [reshard.Shard(0)]),
                        reshard.Layout(infer, [reshard.Shard(1)]))
    if one_domain:  # else every rank is a domain of its own: every piece takes the network path
        spec.set_domains([[0, 1, 2, 3]])
    return spec


def full_value(spec_tensor, step, sparse=False):
    """The tensor's values at `step`: small integers, exact in bf16. `sparse`: only every tenth
    element differs from step 0's values (a different tenth each step), as RL updates leave most
    weights unchanged."""
    n = 1
    for s in spec_tensor.shape:
        n *= s
    salt = sum(map(ord, spec_tensor.name))
    index = torch.arange(n, dtype=torch.int64)
    if sparse:
        values = (index * 7 + salt + (index % 10 == step % 10) * (step * 13 + 1)) % 251
    else:
        values = (index * 7 + step * 13 + salt) % 251
    return values.reshape(spec_tensor.shape)


def tile_view(buffer_flat, tile):
    """The elements of `tile` in this rank's buffer (a 1-D torch view of the whole buffer)."""
    return buffer_flat.as_strided(tile.shape, tile.strides, tile.offset)


class NoStore:
    """A store nobody reads (the bad_buffers case fails before set-up on every rank): each
    rank's refusal is posted to it (RefitHandle abandons its part) and never read."""

    def set(self, key, value):
        pass

    def get(self, key, timeout):
        raise AssertionError("the store was used")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--case", default="refit")
    p.add_argument("--flags", default="", help="a directory for the thread case's flag files")
    a = p.parse_args()
    # hostbuffer: the network path (sm puts between domains), where a destination in a HostBuffer
    # is written with memcpy through the sender's mapping of it.
    # delta: sparse changes between refits, sent as deltas (HandleOptions::delta, docs/delta.md).
    delta = a.case == "delta"
    spec = build_spec(one_domain=a.case not in ("hostbuffer", "delta"), big=delta)
    if a.case == "bad_buffers":
        # Refused before any rendezvous: no store is needed (and none is served, so no rank
        # waits for a rank 0 that already left).
        comm = reshard.Communicator.from_store(NoStore(), a.rank, spec.world_size)
    else:
        comm = reshard.Communicator.connect(a.store, "pytest", a.rank, spec.world_size,
                                            serve_store=True, timeout=60)
    tensors = {t.name: t for t in spec.tensors}
    side = reshard.Side.source if a.rank in TRAINERS else reshard.Side.destination
    tiles = spec.local_tiles(a.rank, side)
    torch_dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}

    # One buffer per name: numpy for w, torch for the rest (both go through the same checks).
    buffers, flat = {}, {}
    for req in spec.local_buffers(a.rank):
        dtype = torch_dtypes[tensors[req.tensors[0]].dtype.spec_name]
        elements = req.bytes // torch.tensor([], dtype=dtype).element_size()
        if a.case == "hostbuffer" and side == reshard.Side.destination:
            # Shared memory: the sources memcpy into it through their mapping (one copy).
            host = reshard.HostBuffer.allocate(req.bytes, "pytest-%s" % req.name)
            flat[req.name] = torch.from_numpy(host.numpy()).view(dtype)
            buffers[req.name] = host
            continue
        t = torch.full((elements,), -1, dtype=dtype)
        flat[req.name] = t
        buffers[req.name] = t.numpy() if req.name == "w" else t
    if a.case == "one_bad_buffer" and a.rank == 3:  # the others' buffers are good
        buffers["w"] = np.zeros(16 * 6, np.float64)
    if a.case == "bad_buffers":  # every rank passes a buffer its own checks refuse
        if side == reshard.Side.destination:
            buffers["w"] = np.zeros(16 * 6, np.float64)
        else:
            buffers["w"] = flat["w"].reshape(-1, 2)[:, 0]
    kwargs = {"sources": buffers} if side == reshard.Side.source else {"destinations": buffers}
    if a.case == "small_ring":  # a staging ring budget below the library's minimum (2048 bytes)
        kwargs["stage_ring_bytes"] = 100
    elif a.case == "small_rounds":  # landing rounds below the library's minimum (4096 bytes)
        kwargs["stage_round_bytes"] = 100
    elif a.case == "refit":  # host buffers: the budgets pass through, no ring or round area
        kwargs["stage_ring_bytes"] = 1 << 20
        kwargs["stage_landing_bytes"] = 1 << 20
        kwargs["stage_round_bytes"] = 1 << 16
    try:
        handle = reshard.RefitHandle(comm, spec, setup_timeout=60, delta=delta, **kwargs)
    except reshard.errors.InvalidArgumentError as e:
        print("InvalidArgumentError:", e)
        return 3
    except reshard.Error as e:
        print("%s: %s" % (type(e).__name__, e))
        return 4

    for step in range(a.steps):
        if side == reshard.Side.source:
            for tile in tiles:
                full = full_value(tensors[tile.tensor], step, sparse=delta)
                region = full[tuple(slice(lo, hi) for lo, hi in zip(tile.lo, tile.hi))]
                tile_view(flat[tile.buffer], tile).copy_(region)
        if a.case == "thread" and side == reshard.Side.source:
            # Wait until both destinations' main threads wrote their flag for this step.
            flags = [os.path.join(a.flags, "dst%d-step%d" % (r, step)) for r in INFERENCE]
            deadline = time.monotonic() + 30
            while not all(os.path.exists(f) for f in flags):
                assert time.monotonic() < deadline, "destinations never ran Python beside a refit"
                time.sleep(0.01)
            handle.execute(timeout=60)
        elif a.case == "thread":
            # The refit on another Python thread, blocked until the sources put data, which they
            # do only after this (main) thread wrote its flag: this passes only because
            # execute() releases the GIL while it waits.
            error = []

            def run():
                try:
                    handle.execute(timeout=60)
                except BaseException as e:  # noqa: BLE001  (re-raised below)
                    error.append(e)
            worker = threading.Thread(target=run)
            worker.start()
            time.sleep(0.05)
            with open(os.path.join(a.flags, "dst%d-step%d" % (a.rank, step)), "w"):
                pass
            worker.join()
            if error:
                raise error[0]
        else:
            handle.start()
            handle.wait(timeout=60)
        if side == reshard.Side.destination:
            for tile in tiles:
                full = full_value(tensors[tile.tensor], step, sparse=delta)
                want = full[tuple(slice(lo, hi) for lo, hi in zip(tile.lo, tile.hi))]
                got = tile_view(flat[tile.buffer], tile)
                if not torch.equal(got.to(torch.int64), want):
                    print("rank %d step %d: tensor %s tile %s differs" % (a.rank, step,
                                                                        tile.tensor, tile))
                    return 1
        stats = handle.stats
        assert stats.epoch == step + 1, stats.epoch
        if a.case == "hostbuffer" and side == reshard.Side.source:
            assert stats.mapped_copies > 0, "no memcpy into the destinations' HostBuffers"
        assert stats.pieces_received == stats.pieces_expected
        assert stats.stage_ring_bytes == 0 and stats.bytes_ring_packed == 0, (
            "host buffers made a staging ring", stats.stage_ring_bytes)
        assert stats.stage_copy_bytes == 0, ("host buffers were staged", stats.stage_copy_bytes)
        assert stats.stage_landing_bytes == 0 and stats.stage_landing_rounds == 0, (
            "host buffers landed in rounds", stats.stage_landing_bytes)
        assert stats.stage_bounce_bytes == 0 and stats.bounced_data_messages == 0, (
            "data messages into host buffers were bounced", stats.bounced_data_messages)
        if step > 0:
            assert stats.registrations_this_refit == 0
        if delta and step > 0:  # every receiver holds the last refit: deltas, much smaller
            if side == reshard.Side.source:
                assert stats.delta_pieces > 0, "rank %d sent no delta" % a.rank
                assert stats.delta_stream_bytes * 2 < stats.delta_plain_bytes, (
                    stats.delta_stream_bytes, stats.delta_plain_bytes)
            else:
                assert stats.deltas_applied > 0, "rank %d applied no delta" % a.rank
    if a.case == "refit" and not torch.cuda.is_available():
        # stream= without a GPU: refused before the refit starts, the handle as it was.
        for bad in ("s", -1, True, 1.5):
            try:
                handle.start(stream=bad)
            except reshard.errors.InvalidArgumentError as e:
                assert "stream must be" in str(e), e
            else:
                raise AssertionError("start(stream=%r) was accepted" % (bad,))
        try:
            handle.start(stream=0)
        except reshard.errors.FailedPreconditionError as e:
            assert "did not start" in str(e), e
        else:
            raise AssertionError("start(stream=0) without a GPU was accepted")
        assert handle.epoch == a.steps and not handle.failed, (handle.epoch, handle.failed)
    print("rank %d: %d refits verified, epoch %d, last %.3f ms" %
          (a.rank, a.steps, handle.epoch, handle.stats.total_seconds * 1e3))
    handle.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
