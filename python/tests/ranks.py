"""Starting the ranks of a multi-process test: each rank is its own process, with UCX's
transports and a deadline set explicitly (DESIGN §5: shared memory between processes of this
host, loopback for tcp).

Ranks are forked from a fork server (multiprocessing's "forkserver": a fresh interpreter started
once per pytest session that has imported numpy and torch and nothing else), so a rank starts in
milliseconds instead of importing torch again (seconds per rank: most of these tests' time). UCX
and CUDA do not survive fork, so neither is ever initialised in the server: each rank starts its
own, as a rank started from a shell does. A rank runs its worker script as `python script args`
would (`__name__ == "__main__"`, sys.argv), with fds 1 and 2 in a file of its own, so the
library's output on stderr is kept as well as Python's."""
import contextlib
import multiprocessing
import os
import runpy
import socket
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
UCX_ENV = {"UCX_TLS": "sm,self", "UCX_NET_DEVICES": "all"}
UCX_TCP_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}

_context = None


def _fork_server():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(["numpy", "torch"])
    return _context


def free_port(count=1):
    """A port P of 127.0.0.1 such that P .. P+count-1 were all free (torchrun's store uses
    MASTER_PORT and reshard's from_env store MASTER_PORT+1)."""
    for _ in range(100):
        with contextlib.ExitStack() as held:
            first = held.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                for extra in range(1, count):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port + extra))
            except OSError:
                continue
            return port
    raise RuntimeError("no %d consecutive free ports on 127.0.0.1" % count)


def _run_rank(argv, env, output):
    """The body of one rank's process: `python argv[0] argv[1:]` with `env` added."""
    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.environ.update(env)
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    code = 0
    try:
        runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as e:  # sys.exit(main()) of the worker
        code = e.code
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def run_ranks(argv_of_rank, world, timeout=120, env=None):
    """Runs `python argv_of_rank(rank)` for every rank at once; returns [(returncode, output)].
    Every rank is killed when the deadline passes (its return code is then None)."""
    full_env = dict(UCX_ENV)
    full_env.update(env or {})
    context = _fork_server()
    with tempfile.TemporaryDirectory(prefix="reshard-ranks-") as tmp:
        outputs = [os.path.join(tmp, "rank%d.out" % r) for r in range(world)]
        procs = [context.Process(target=_run_rank, args=(argv_of_rank(r), full_env, outputs[r]))
                 for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout
        killed = False
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
            if p.exitcode is None:  # past the deadline: every rank still running is killed
                killed = True
                for q in procs:
                    if q.exitcode is None:
                        q.kill()
        for p in procs:
            p.join()
        results = []
        for p, output in zip(procs, outputs):
            try:
                with open(output, errors="replace") as f:
                    out = f.read()
            except FileNotFoundError:
                out = ""
            if killed and p.exitcode == -9:
                results.append((None, out + "\n[killed at the %d s deadline]" % timeout))
            else:
                results.append((p.exitcode, out))
        return results


def check_all(results):
    """Fails with every failing rank's output."""
    bad = [(r, code, out) for r, (code, out) in enumerate(results) if code != 0]
    assert not bad, "\n".join("--- rank %d exited %s:\n%s" % (r, code, out) for r, code, out in bad)
