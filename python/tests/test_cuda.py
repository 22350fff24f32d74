"""CUDA tensors as buffers and stream-ordered refits (skipped without a CUDA device): a refit
between two processes of CUDA bf16 tensors, started on side streams behind slow kernels, with a
copy of the destination queued behind record_completion()."""
import os

import pytest
import torch

from ranks import HERE, check_all, free_port, run_ranks

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def test_cuda_tensors_refit_after_stream_work():
    store = "127.0.0.1:%d" % free_port()
    worker = os.path.join(HERE, "cuda_worker.py")
    check_all(run_ranks(lambda r: [worker, "--rank", str(r), "--store", store], world=2,
                        env={"UCX_TLS": "sm,self,cuda_copy,cuda_ipc"}))
