"""One rank of test_cuda.py: rank 0 holds w (CUDA bf16, 256 x 128) row-sharded over itself
alone, rank 1 receives it column-sharded; rank 0 writes new values on a side stream each step
and passes that stream to execute(), which must order the refit after them."""
import argparse
import sys

import torch

import reshard


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--store", required=True)
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
            handle.execute(timeout=60)
            if not torch.equal(w.float(), want.float()):
                print("rank 1 step %d: wrong values" % step)
                return 1
    print("rank %d: 5 CUDA refits verified" % a.rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
