"""The torchrun example (examples/python/torchrun_refit.py) as users launch it: six ranks under
torchrun, trainers holding DTensors (data-parallel Shard(0), TP Shard(0) and Shard(1), FSDP2 +
TP's _StridedShard), inference ranks holding plain tensors in a fused qkv buffer; ten refits,
every destination element checked against the trainers' full_tensor() after every refit."""
import os
import subprocess
import sys
import tempfile

import pytest

from ranks import UCX_ENV, free_port

EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                       "python", "torchrun_refit.py")


@pytest.mark.parametrize("comm", ["torch", "env"])
def test_torchrun_pair_refits_ten_times(comm):
    env = dict(os.environ, **UCX_ENV)
    env["OMP_NUM_THREADS"] = "1"
    # from_env under torchrun: the store at MASTER_ADDR:MASTER_PORT+1, served by rank 0; the
    # token from here (torchrun's --rdzv-id is "none" without a rendezvous backend).
    env["RESHARD_STORE_TOKEN"] = "pytest-torchrun"
    # torchrun's log directory: without --log-dir it makes a torchelastic_* directory in /tmp
    # and leaves it there.
    with tempfile.TemporaryDirectory(prefix="reshard-torchrun-") as logs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "6",
               "--master-addr", "127.0.0.1", "--master-port", str(free_port(2)),
               "--log-dir", logs, EXAMPLE, "--steps", "10", "--comm", comm]
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=300)
    assert done.returncode == 0, done.stdout
    for rank in range(6):
        assert "rank %d (" % rank in done.stdout, done.stdout
    assert done.stdout.count("10 refits verified against full_tensor()") == 6, done.stdout
