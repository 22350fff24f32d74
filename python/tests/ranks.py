"""Starting the ranks of a multi-process test: each rank is its own Python process (a fresh
interpreter: UCX and CUDA do not survive fork), with UCX's transports and a deadline set
explicitly (DESIGN §5: shared memory between processes of this host, loopback for tcp)."""
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
UCX_ENV = {"UCX_TLS": "sm,self", "UCX_NET_DEVICES": "all"}
UCX_TCP_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo"}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv_of_rank, world, timeout=120, env=None):
    """Runs `python argv_of_rank(rank)` for every rank at once; returns [(returncode, output)].
    Every rank is killed when the deadline passes (its return code is then None)."""
    full_env = dict(os.environ)
    full_env.update(UCX_ENV)
    full_env.update(env or {})
    procs = [subprocess.Popen([sys.executable] + argv_of_rank(r), env=full_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out, _ = p.communicate()
            results.append((None, out + "\n[killed at the %d s deadline]" % timeout))
    return results


def check_all(results):
    """Fails with every failing rank's output."""
    bad = [(r, code, out) for r, (code, out) in enumerate(results) if code != 0]
    assert not bad, "\n".join("--- rank %d exited %s:\n%s" % (r, code, out) for r, code, out in bad)
