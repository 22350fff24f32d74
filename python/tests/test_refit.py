"""Real refits between processes through the Python package (refit_worker.py is one rank)."""
import os

import pytest

from ranks import HERE, UCX_TCP_ENV, check_all, free_port, run_ranks

WORKER = os.path.join(HERE, "refit_worker.py")


def run(case, steps=10, env=None, flags=""):
    store = "127.0.0.1:%d" % free_port()
    return run_ranks(lambda r: [WORKER, "--rank", str(r), "--store", store, "--steps",
                                str(steps), "--case", case, "--flags", str(flags)],
                     world=4, env=env)


@pytest.mark.parametrize("env", [None, UCX_TCP_ENV], ids=["sm", "tcp"])
def test_ten_refits_byte_exact(env):
    check_all(run("refit", env=env))


def test_delta_refits_send_only_the_changes():
    # RefitHandle(..., delta=True): every refit after the first sends each network piece as a
    # delta of its last version (one element in ten changes), byte-exact on every destination.
    check_all(run("delta", steps=6))


def test_host_buffer_destinations_take_one_copy():
    check_all(run("hostbuffer", steps=3))


def test_refit_on_a_python_thread_releases_the_gil(tmp_path):
    check_all(run("thread", steps=3, flags=tmp_path))


def test_a_rank_refusing_its_buffer_fails_the_others_set_up_at_once():
    # Rank 3's destination is refused by the package's own checks, before the library's set-up.
    # It abandons its part of the collective set-up (RefitHandle::Abandon), so ranks 0-2, whose
    # buffers are good, fail with its error instead of DeadlineExceeded at their 60 s
    # setup_timeout (the ranks' deadline here is 120 s).
    results = run("one_bad_buffer", steps=1)
    code, out = results[3]
    assert code == 3, out
    refused = ('buffer "w" (destination of rank 3): the buffer holds fp64 elements but the spec '
               'stores fp32 there')
    assert refused in out
    for rank in (0, 1, 2):
        code, out = results[rank]
        assert code == 3, out
        assert "rank 3 failed before agreeing on the plan fingerprint" in out, out
        assert refused in out, out


def test_refused_buffers_name_buffer_side_and_rank():
    results = run("bad_buffers", steps=1)
    for rank in (2, 3):
        code, out = results[rank]
        assert code == 3, out
        assert ('buffer "w" (destination of rank %d): the buffer holds fp64 elements but the '
                'spec stores fp32 there' % rank) in out
    for rank in (0, 1):
        code, out = results[rank]
        assert code == 3, out
        assert 'buffer "w" (source of rank %d): the tensor is not contiguous' % rank in out


@pytest.mark.parametrize("case, message", [
    # RefitHandle(..., stage_ring_bytes=100): the minimum is eight 256-byte slots.
    ("small_ring", "stage_ring_bytes is 100, below the staging ring's minimum of 2048 bytes"),
    # RefitHandle(..., stage_round_bytes=100): the least landing round is 4096 bytes.
    ("small_rounds", "stage_round_bytes is 100, below the landing rounds' minimum of 4096 bytes"),
])
def test_a_staging_budget_below_the_minimum_fails_every_rank_naming_it(case, message):
    # The option reaches every rank's engine, which refuses it at set-up with the library's
    # message.
    results = run(case, steps=1)
    for rank in range(4):
        code, out = results[rank]
        assert code == 3, out
        assert ("rank %d: %s" % (rank, message)) in out, out

