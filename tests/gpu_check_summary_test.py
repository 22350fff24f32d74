#!/usr/bin/env python3
"""tools/gpu_check_summary.py on outputs written in the formats its sources print.

The lines below use ctest's summary and its list of tests that did not pass, the printf formats
of bench/pack_bench.cc (its per-run table) and
bench/put_bench.cc (the --cuda ratio line), and the fields `reshard run --memory cuda --json`
prints (tools/reshard/cmd_run.cc): when one of them changes, this test says the summary no
longer reads it. Run by ctest (label unit); exits non-zero on the first mismatch.
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SUMMARY = os.path.join(HERE, "..", "tools", "gpu_check_summary.py")


def write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main():
    with tempfile.TemporaryDirectory() as out:
        # ctest: a skipped test counts as passed in the percentage and is listed as not run.
        write(os.path.join(out, "ctest.txt"),
              "1/4 Test #1: GpuStaging.StagingRingPacksSources ....   Passed    1.20 sec\n"
              "75% tests passed, 1 tests failed out of 4\n\n"
              "Total Test time (real) =   3.10 sec\n\n"
              "The following tests did not run:\n"
              "\t  2 - Backends/Fanout.Exact/Nccl_Tp2  # GetParam() = (Nccl, Tp2) (Skipped)\n\n"
              "The following tests FAILED:\n"
              "\t  3 - python_cuda (Subprocess aborted)\n"
              "Errors while running CTest\n")
        # Without a device every test skips: more than ten are counted, three named.
        write(os.path.join(out, "ctest-cuda-aware.txt"),
              "100% tests passed, 0 tests failed out of 11\n\n"
              "The following tests did not run:\n" +
              "".join("\t %2d - Gpu.T%d (Skipped)\n" % (i, i) for i in range(11)))
        # pack_bench: "%10lld %12.1f %12.1f %12.1f %9.0f%% %9.0f%% %6d" per run size, then the
        # strided copy table, whose rows must not be read as pack rows.
        rows = [(4, 50.0, 40.0, 1500.0, 3, 3, 4), (256, 1200.0, 1100.0, 1500.0, 80, 73, 16),
                (65536, 1400.0, 1450.0, 1500.0, 93, 97, 16)]
        text = "pack_bench: NVIDIA H100 (sm_90), 256 MiB of payload per case, median of 20\n"
        text += "%10s %12s %12s %12s %10s %10s %6s\n" % (
            "run bytes", "pack GB/s", "unpack GB/s", "memcpy GB/s", "pack/cpy", "unpack/cpy",
            "width")
        for r in rows:
            text += "%10d %12.1f %12.1f %12.1f %9.0f%% %9.0f%% %6d\n" % r
        text += "\nstrided copy (CUDA IPC fan-out), runs every other in both buffers\n"
        text += "%10d %12.1f %12.1f %12.1f %9.2fx\n" % (256, 10.0, 20.0, 1500.0, 0.5)
        write(os.path.join(out, "pack_bench.txt"), text)
        # put_bench --cuda: "  %-30s median %8.2f ms  (%6.2f GB/s)  strided refit / cudaMemcpy: %.2f"
        # then "  %-30s rounds by slab copies / cudaMemcpy: %.2f" and
        # "  %-30s one round per sender / cudaMemcpy: %.2f"
        write(os.path.join(out, "put_bench-system.txt"),
              "  %-30s median %8.2f ms  (%6.2f GB/s)  strided refit / cudaMemcpy: %.2f\n" % (
                  "cudaMemcpy device to device", 1.50, 715.83, 41.25) +
              "  %-30s rounds by slab copies / cudaMemcpy: %.2f\n" % ("", 38.5) +
              "  %-30s one round per sender / cudaMemcpy: %.2f\n" % ("", 44.0))
        report = {"ok": True, "median_ms": "12.50", "destination_bytes": 2 << 30,
                  "device_copy_ms": "5.00", "ratio_device_copy": 2.5,
                  "cuda_buffers_registered": 8, "cuda_buffers_staged": 0, "fanout": "cuda_ipc"}
        write(os.path.join(out, "cuda-aware-gpu_tp4_to_tp2x2_1gib.json"), json.dumps(report))
        write(os.path.join(out, "system-gpu_rows_to_cols_1gib.json"),
              json.dumps({"ok": False, "errors": ["rank 2 (exit 1): refit 1: mismatch"]}))
        table = subprocess.run([sys.executable, SUMMARY, out], check=True, capture_output=True,
                               text=True).stdout
    expected = [
        "| gpu tests (ctest -L gpu), system UCX | 2 of 4 passed, skipped: Backends/Fanout.Exact/Nccl_Tp2, "
        "FAILED: python_cuda (Subprocess aborted) | all pass |",
        "| gpu tests (ctest -L gpu), CUDA-aware UCX | 0 of 11 passed, 11 skipped (Gpu.T0, Gpu.T1, "
        "Gpu.T2 and 8 more) | all pass |",
        "| pack / unpack kernels, runs 256 B .. 65536 B | pack at least 80%, unpack at least 73% "
        "of cudaMemcpy | >= 70% of cudaMemcpy |",
        "| put_bench --cuda, 1 GiB rows -> columns, system UCX (staged) | 41.25x cudaMemcpy "
        "(landing rounds by slab copies instead of the kernel: 38.50x) (one landing round per "
        "sender: 44.00x) | - |",
        "| put_bench --cuda, 1 GiB rows -> columns, CUDA-aware UCX | not run | - |",
        "| reshard run --memory cuda, 1 GiB rows -> columns, 2 -> 2 ranks, system UCX (staged) | "
        "FAILED: rank 2 (exit 1): refit 1: mismatch | - |",
        "| reshard run --memory cuda, 1 GiB TP4 -> TP2 x DP2, fan-out, CUDA-aware UCX | median "
        "12.50 ms, cudaMemcpy of the 2.00 GiB written 5.00 ms: 2.50x; 8 CUDA buffers registered, "
        "0 staged; fan-out cuda_ipc | <= 1.5x cudaMemcpy |",
    ]
    lines = table.splitlines()
    for want in expected:
        if want not in lines:
            sys.stderr.write("missing row:\n  %s\nin the table:\n%s" % (want, table))
            return 1
    if len(lines) != 2 + 2 + 1 + 2 + 4:
        sys.stderr.write("expected 11 lines (header, 9 rows), got:\n%s" % table)
        return 1
    print("gpu_check_summary: %d rows as expected" % (len(lines) - 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
