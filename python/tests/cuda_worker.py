"""One rank of test_cuda.py: rank 0 holds w (CUDA bf16, 256 x 128) row-sharded over itself
alone, rank 1 receives it column-sharded. Each step rank 0 writes new values on a side stream
behind a slow kernel and passes that stream to execute(), which must read them only after; rank
1 poisons its destination on its side stream behind a slow kernel, starts the refit on that
stream (which must write only after the poison), records the refit's completion on it and
queues a copy of the destination there, which must see the new values. --data-messages (tcp):
rank 1 checks that every refit's data messages reached its tensor through the bounce area."""
import argparse
import sys

import torch

import reshard


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--data-messages", action="store_true")
    a = p.parse_args()
    torch.cuda.set_device(0)
    spec = reshard.RefitSpec()
    spec.add_tensor("w", torch.bfloat16, (256, 128),
                    reshard.Layout(reshard.Mesh([0]), [reshard.Shard(0)]),
                    reshard.Layout(reshard.Mesh([1]), [reshard.Shard(1)]))
    comm = reshard.Communicator.connect(a.store, "cuda", a.rank, 2, serve_store=True)
    w = torch.zeros(256, 128, dtype=torch.bfloat16, device="cuda")
    side = torch.cuda.Stream()
    if a.rank == 0:
        handle = reshard.RefitHandle(comm, spec, sources={"w": w})
    else:
        handle = reshard.RefitHandle(comm, spec, destinations={"w": w})
    for step in range(5):
        want = (torch.arange(256 * 128, device="cuda") % 97 + step).reshape(256, 128)
        if a.rank == 0:
            with torch.cuda.stream(side):
                torch.cuda._sleep(1_000_000)  # a slow producer: the refit must wait for it
                w.copy_(want.to(torch.bfloat16))
            handle.execute(timeout=60, stream=side)
        else:
            with torch.cuda.stream(side):
                torch.cuda._sleep(1_000_000)
                w.fill_(-1)
            handle.start(stream=side)
            handle.record_completion(side)
            with torch.cuda.stream(side):
                seen = w.clone()  # queued behind the refit's completion
            handle.wait(timeout=60)
            side.synchronize()
            if not torch.equal(seen.float(), want.float()):
                print("rank 1 step %d: wrong values" % step)
                return 1
            stats = handle.stats
            bounced = (stats.stage_bounce_bytes, stats.bounced_data_messages, stats.bounce_waits)
            if a.data_messages and (stats.stage_bounce_bytes != 8 * 256 * 1024 or
                                    stats.bounced_data_messages < 1):
                print("rank 1 step %d: data messages not bounced (area, messages, waits) = %s"
                      % (step, bounced))
                return 1
            if not a.data_messages and bounced != (0, 0, 0):
                print("rank 1 step %d: puts went through a bounce area: %s" % (step, bounced))
                return 1
    print("rank %d: 5 CUDA refits verified" % a.rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
