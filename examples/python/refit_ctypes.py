#!/usr/bin/env python3
"""A two-process refit driven through reshard's C API with ctypes (no numpy needed).

The spec: an 8x6 int32 matrix row-sharded over ranks 0 and 1 (the "trainer" layout) is refitted
into a column-sharded layout over the same ranks, three times with new values each time; every
rank verifies every element it receives.

Run both ranks yourself (rank 0 serves the rendezvous store):
    python3 refit_ctypes.py --lib /path/to/libreshard.so --rank 0 --world 2 --store 127.0.0.1:29700 &
    python3 refit_ctypes.py --lib /path/to/libreshard.so --rank 1 --world 2 --store 127.0.0.1:29700
or let it spawn the ranks as subprocesses:
    python3 refit_ctypes.py --lib /path/to/libreshard.so --spawn 2
Set UCX_TLS (e.g. tcp with UCX_NET_DEVICES=lo, or sm,self) as for any reshard program.
"""
import argparse
import ctypes
import json
import os
import socket
import subprocess
import sys

SPEC = {
    "tensors": [{
        "name": "w", "dtype": "i32", "shape": [8, 6],
        "src": {"mesh": [0, 1], "placements": ["S(0)"]},
        "dst": {"mesh": [0, 1], "placements": ["S(1)"]},
    }]
}
SOURCE, DESTINATION = 0, 1


class Buffer(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("side", ctypes.c_int32), ("data", ctypes.c_void_p),
                ("bytes", ctypes.c_int64), ("memory_kind", ctypes.c_int32)]


class Stats(ctypes.Structure):
    _fields_ = [("epoch", ctypes.c_uint64), ("bytes_network_sent", ctypes.c_int64),
                ("bytes_network_received", ctypes.c_int64), ("bytes_local", ctypes.c_int64),
                ("pieces_received", ctypes.c_int64), ("pieces_expected", ctypes.c_int64),
                ("puts", ctypes.c_int64), ("registrations_this_refit", ctypes.c_int64),
                ("start_seconds", ctypes.c_double), ("wait_seconds", ctypes.c_double),
                ("total_seconds", ctypes.c_double), ("data_messages", ctypes.c_int64),
                ("single_copy_writes", ctypes.c_int64), ("mapped_copies", ctypes.c_int64),
                ("quantize_seconds", ctypes.c_double), ("amax_exchange_seconds", ctypes.c_double),
                ("quantize_buffer_bytes", ctypes.c_int64),
                ("delta_pieces", ctypes.c_int64), ("delta_full_pieces", ctypes.c_int64),
                ("delta_stream_bytes", ctypes.c_int64), ("delta_plain_bytes", ctypes.c_int64),
                ("delta_shadow_bytes", ctypes.c_int64), ("deltas_applied", ctypes.c_int64),
                ("cuda_buffers_registered", ctypes.c_int64), ("cuda_buffers_staged", ctypes.c_int64),
                ("bytes_staged_to_host", ctypes.c_int64), ("bytes_staged_to_device", ctypes.c_int64),
                ("delta_device_shadow_bytes", ctypes.c_int64),
                ("delta_pinned_bytes", ctypes.c_int64),
                ("stage_ring_bytes", ctypes.c_int64), ("stage_ring_batches", ctypes.c_int64),
                ("bytes_ring_packed", ctypes.c_int64), ("stage_copy_bytes", ctypes.c_int64),
                ("stage_landing_bytes", ctypes.c_int64), ("stage_landing_rounds", ctypes.c_int64),
                ("stage_round_scatters", ctypes.c_int64), ("local_copy_launches", ctypes.c_int64),
                ("stage_bounce_bytes", ctypes.c_int64), ("bounced_data_messages", ctypes.c_int64),
                ("bounce_waits", ctypes.c_int64), ("landing_area_bytes", ctypes.c_int64),
                ("send_scratch_bytes", ctypes.c_int64),
                ("delta_relay_early_segments", ctypes.c_int64),
                ("relay_early_bytes", ctypes.c_int64)]


class Reshard:
    """Thin wrapper: every failing call raises with the library's message."""

    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        L = self.lib
        L.reshard_last_error.restype = ctypes.c_char_p
        L.reshard_version.restype = ctypes.c_char_p
        L.reshard_comm_connect.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32,
                                           ctypes.c_int32, ctypes.c_int32, ctypes.c_int64,
                                           ctypes.POINTER(ctypes.c_void_p)]
        L.reshard_comm_destroy.argtypes = [ctypes.c_void_p]
        L.reshard_spec_from_json.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
        L.reshard_spec_destroy.argtypes = [ctypes.c_void_p]
        L.reshard_spec_buffer_count.argtypes = [ctypes.c_void_p, ctypes.c_int32,
                                                ctypes.POINTER(ctypes.c_int32)]
        L.reshard_spec_buffer_info.argtypes = [ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                               ctypes.POINTER(ctypes.c_char_p),
                                               ctypes.POINTER(ctypes.c_int32),
                                               ctypes.POINTER(ctypes.c_int64)]
        L.reshard_handle_create.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.POINTER(Buffer), ctypes.c_int32,
                                            ctypes.c_char_p, ctypes.c_int32,
                                            ctypes.POINTER(ctypes.c_void_p)]
        L.reshard_handle_execute.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        L.reshard_handle_stats_sized.argtypes = [ctypes.c_void_p, ctypes.POINTER(Stats),
                                                 ctypes.c_size_t]
        L.reshard_handle_destroy.argtypes = [ctypes.c_void_p]

    def check(self, status, what):
        if status != 0:
            raise RuntimeError("%s failed with status %d: %s" %
                               (what, status, self.lib.reshard_last_error().decode()))


def run_rank(args):
    rs = Reshard(args.lib)
    L = rs.lib
    comm, spec, handle = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    rs.check(L.reshard_comm_connect(args.store.encode(), args.token.encode(), args.rank,
                                    args.world, 1, 30000, ctypes.byref(comm)), "connect")
    rs.check(L.reshard_spec_from_json(json.dumps(SPEC).encode(), ctypes.byref(spec)), "spec")
    count = ctypes.c_int32()
    rs.check(L.reshard_spec_buffer_count(spec, args.rank, ctypes.byref(count)), "buffer_count")
    arrays, descs = {}, (Buffer * count.value)()
    for i in range(count.value):
        name, side, nbytes = ctypes.c_char_p(), ctypes.c_int32(), ctypes.c_int64()
        rs.check(L.reshard_spec_buffer_info(spec, args.rank, i, ctypes.byref(name),
                                            ctypes.byref(side), ctypes.byref(nbytes)), "info")
        array = (ctypes.c_int32 * (nbytes.value // 4))()
        arrays[side.value] = array
        descs[i] = Buffer(name.value, side.value, ctypes.cast(array, ctypes.c_void_p),
                          nbytes.value, 0)
    rs.check(L.reshard_handle_create(comm, spec, descs, count.value, b"ctypes", 0,
                                     ctypes.byref(handle)), "handle_create")
    src, dst = arrays[SOURCE], arrays[DESTINATION]
    for step in range(1, 4):
        # Source tile: rows [4*rank, 4*rank + 4), all 6 columns; value = step*1000 + flat index.
        for i in range(24):
            src[i] = step * 1000 + args.rank * 24 + i
        for i in range(24):
            dst[i] = -1
        rs.check(L.reshard_handle_execute(handle, 20000), "execute")
        # Destination tile: all 8 rows, columns [3*rank, 3*rank + 3).
        for r in range(8):
            for c in range(3):
                want = step * 1000 + r * 6 + 3 * args.rank + c
                if dst[r * 3 + c] != want:
                    raise RuntimeError("rank %d step %d: w[%d][%d] = %d, expected %d" %
                                       (args.rank, step, r, 3 * args.rank + c, dst[r * 3 + c], want))
        stats = Stats()
        # Sized: a library newer than these fields writes only the ones this struct has.
        rs.check(L.reshard_handle_stats_sized(handle, ctypes.byref(stats), ctypes.sizeof(stats)),
                 "stats")
        print("rank %d refit %d verified: %d bytes received, %d pieces, %.2f ms" %
              (args.rank, stats.epoch, stats.bytes_network_received, stats.pieces_received,
               stats.total_seconds * 1e3), flush=True)
        if step > 1 and stats.registrations_this_refit != 0:
            raise RuntimeError("refit %d registered memory" % step)
    L.reshard_handle_destroy(handle)
    L.reshard_spec_destroy(spec)
    L.reshard_comm_destroy(comm)
    print("rank %d: OK (reshard %s)" % (args.rank, L.reshard_version().decode()), flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="path of libreshard.so")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--store", default="127.0.0.1:29700")
    p.add_argument("--token", default=os.environ.get("RESHARD_STORE_TOKEN", "ctypes-example"))
    p.add_argument("--spawn", type=int, default=0, help="start this many ranks as subprocesses")
    args = p.parse_args()
    if args.spawn:
        store = "127.0.0.1:%d" % free_port()
        procs = [subprocess.Popen([sys.executable, __file__, "--lib", args.lib, "--rank", str(r),
                                   "--world", str(args.spawn), "--store", store,
                                   "--token", args.token]) for r in range(args.spawn)]
        codes = []
        for proc in procs:
            try:
                codes.append(proc.wait(timeout=90))
            except subprocess.TimeoutExpired:
                proc.kill()
                codes.append(-9)
        print("exit codes:", codes)
        return 0 if all(c == 0 for c in codes) else 1
    try:
        run_rank(args)
    except RuntimeError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
