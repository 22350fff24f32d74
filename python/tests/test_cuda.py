"""CUDA tensors as buffers and stream-ordered refits (skipped without a CUDA device): a refit
between two processes of CUDA bf16 tensors, started on side streams behind slow kernels, with a
copy of the destination queued behind record_completion(). Over shared memory (puts) and over
tcp (data messages, which reach the device through the pinned bounce area)."""
import os

import pytest
import torch

from ranks import HERE, check_all, free_port, run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize("tls", ["sm,self,cuda_copy,cuda_ipc", "tcp,self,cuda_copy"],
                         ids=["sm", "tcp"])
def test_cuda_tensors_refit_after_stream_work(tls):
    store = "127.0.0.1:%d" % free_port()
    worker = os.path.join(HERE, "cuda_worker.py")
    messages = tls.startswith("tcp")
    check_all(run_ranks(lambda r: [worker, "--rank", str(r), "--store", store] +
                        (["--data-messages"] if messages else []), world=2,
                        env={"UCX_TLS": tls, "UCX_NET_DEVICES": "lo" if messages else "all"}))
