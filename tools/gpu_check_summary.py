#!/usr/bin/env python3
"""The summary table of tools/gpu_check.sh: issue 11's GPU figures, from the outputs it kept.

    tools/gpu_check_summary.py OUT_DIR

Reads OUT_DIR/ctest{,-cuda-aware}.txt (`ctest -L gpu` of each build: passed, skipped, failed),
OUT_DIR/pack_bench.txt (the pack/unpack kernels against cudaMemcpy, per run size),
OUT_DIR/put_bench-{system,cuda-aware}.txt (the 1 GiB staged rows -> columns refit of put_bench
--cuda) and OUT_DIR/{system,cuda-aware}-<spec>.json (`reshard run --memory cuda --json` of the
two 1 GiB specs), and prints one Markdown table, each figure beside its target. A file that is
missing or unreadable is a row saying so, never an error: the table shows what the run produced.
"""
import json
import os
import re
import sys

PACK_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)%\s+(\d+)%")
PUT_RATIO = re.compile(r"strided refit / cudaMemcpy: ([\d.]+)")
PUT_SLABS = re.compile(r"rounds by slab copies / cudaMemcpy: ([\d.]+)")
PUT_ONE_ROUND = re.compile(r"one round per sender / cudaMemcpy: ([\d.]+)")
SPECS = [("gpu_rows_to_cols_1gib", "1 GiB rows -> columns, 2 -> 2 ranks"),
         ("gpu_tp4_to_tp2x2_1gib", "1 GiB TP4 -> TP2 x DP2, fan-out")]
UCX = [("system", "system UCX (staged)"), ("cuda-aware", "CUDA-aware UCX")]
SKIPPED_NAMED = 10  # more skipped tests than this are counted, not all named
CTEST_TOTAL = re.compile(r"(\d+)% tests passed, (\d+) tests? failed out of (\d+)")
# "  95 - Suite/Test.Name/Param  # GetParam() = (a, b) (Skipped)": the name, then the last (...).
CTEST_LISTED = re.compile(r"^\s*\d+ - (\S+)(?:\s.*)?\s\(([^()]+)\)\s*$")


def read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def test_rows(out):
    rows = []
    for name, what in [("ctest", "system UCX"), ("ctest-cuda-aware", "CUDA-aware UCX")]:
        label = "gpu tests (ctest -L gpu), %s" % what
        text = read(os.path.join(out, "%s.txt" % name))
        summary = CTEST_TOTAL.search(text or "")
        if not summary:
            rows.append((label, "not run" if text is None else "no ctest summary in the output",
                          "all pass"))
            continue
        failed, total = int(summary.group(2)), int(summary.group(3))
        # After its summary ctest lists the tests that did not pass: "  7 - name (Failed)".
        listed = [m.groups() for m in map(CTEST_LISTED.match, text.splitlines()) if m]
        skipped = [test for test, why in listed if why == "Skipped"]
        broken = ["%s (%s)" % (test, why) for test, why in listed if why != "Skipped"]
        figure = "%d of %d passed" % (total - failed - len(skipped), total)
        if len(skipped) > SKIPPED_NAMED:  # without a device: every test
            figure += ", %d skipped (%s and %d more)" % (
                len(skipped), ", ".join(skipped[:3]), len(skipped) - 3)
        elif skipped:
            figure += ", skipped: %s" % ", ".join(skipped)
        if broken:
            figure += ", FAILED: %s" % ", ".join(broken)
        rows.append((label, figure, "all pass"))
    return rows


def pack_rows(out):
    text = read(os.path.join(out, "pack_bench.txt"))
    if text is None:
        return [("pack / unpack kernels, runs >= 256 B", "not run", ">= 70% of cudaMemcpy")]
    pack, unpack, sizes = [], [], []
    for line in text.splitlines():
        m = PACK_ROW.match(line)
        if m and int(m.group(1)) >= 256:
            sizes.append(int(m.group(1)))
            pack.append(int(m.group(5)))
            unpack.append(int(m.group(6)))
    if not sizes:
        return [("pack / unpack kernels, runs >= 256 B", "no figures in pack_bench.txt",
                 ">= 70% of cudaMemcpy")]
    return [("pack / unpack kernels, runs %d B .. %d B" % (min(sizes), max(sizes)),
             "pack at least %d%%, unpack at least %d%% of cudaMemcpy" % (min(pack), min(unpack)),
             ">= 70% of cudaMemcpy")]


def put_rows(out):
    rows = []
    for tag, what in UCX:
        text = read(os.path.join(out, "put_bench-%s.txt" % tag))
        m = PUT_RATIO.search(text or "")
        figure = ("%sx cudaMemcpy" % m.group(1)) if m else ("not run" if text is None
                                                             else "no ratio in the output")
        slabs = PUT_SLABS.search(text or "")
        if m and slabs:
            figure += " (landing rounds by slab copies instead of the kernel: %sx)" % slabs.group(1)
        one_round = PUT_ONE_ROUND.search(text or "")
        if m and one_round:
            figure += " (one landing round per sender: %sx)" % one_round.group(1)
        rows.append(("put_bench --cuda, 1 GiB rows -> columns, %s" % what, figure, "-"))
    return rows


def run_rows(out):
    rows = []
    for tag, what in UCX:
        for spec, name in SPECS:
            text = read(os.path.join(out, "%s-%s.json" % (tag, spec)))
            target = "<= 1.5x cudaMemcpy" if tag == "cuda-aware" else "-"
            label = "reshard run --memory cuda, %s, %s" % (name, what)
            if text is None:
                rows.append((label, "not run", target))
                continue
            try:
                v = json.loads(text)
            except ValueError:
                rows.append((label, "no report (the run failed before printing it)", target))
                continue
            if not v.get("ok"):
                rows.append((label, "FAILED: %s" % "; ".join(v.get("errors", [])), target))
                continue
            fanout = v.get("fanout", "none")
            rows.append((label,
                         "median %s ms, cudaMemcpy of the %.2f GiB written %s ms: %.2fx; "
                         "%d CUDA buffers registered, %d staged; fan-out %s" % (
                             v.get("median_ms"), v.get("destination_bytes", 0) / 2**30,
                             v.get("device_copy_ms"), v.get("ratio_device_copy", 0),
                             v.get("cuda_buffers_registered", 0),
                             v.get("cuda_buffers_staged", 0), fanout),
                         target))
    return rows


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: gpu_check_summary.py OUT_DIR\n")
        return 2
    out = sys.argv[1]
    rows = test_rows(out) + pack_rows(out) + put_rows(out) + run_rows(out)
    print("| measure | figure | target |")
    print("|---|---|---|")
    for measure, figure, target in rows:
        print("| %s | %s | %s |" % (measure, figure, target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
