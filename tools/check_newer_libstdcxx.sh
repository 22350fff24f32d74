#!/usr/bin/env bash
# Checks that every C++ file includes the standard headers it uses, against a newer libstdc++
# than Debian 12's: newer libstdc++ releases include fewer headers from one another (no
# <cstdint> from <string>, no <algorithm> from <vector>, ...), so a file that compiles here can
# fail on a machine with a newer compiler, such as the GPU machine's image (docs/building.md,
# "Includes against a newer standard library").
#
#   tools/check_newer_libstdcxx.sh [BUILD_DIR]     (default /tmp/reshard-libstdcxx-check)
#
# Downloads Debian 13's libstdc++-14-dev into BUILD_DIR (apt with a private state folder: the
# system's package lists and sources are left alone; needs the network), configures a tree with
# clang, those headers (-nostdinc++), no precompiled headers and no CUDA, and parses every file
# of compile_commands.json with -fsyntax-only, plus the files only a CUDA build compiles, taken
# with the flags of a tree that has them (RESHARD_CUDA_TREE, default build/, when it holds them).
# Debian 12's clang 14 cannot parse all of libstdc++ 14 (its <ranges> and <format> need a newer
# compiler), so errors inside the library's own headers are expected and left out; an error in
# one of our files is a finding. Exits 0 when there is none, 1 otherwise. About 5 minutes on 2
# cores.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
dir="${1:-/tmp/reshard-libstdcxx-check}"
cuda_tree="${RESHARD_CUDA_TREE:-$root/build}"
mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
  >"$dir/apt/sources.list"
apt_opts=(-o Dir::Etc::sourcelist="$dir/apt/sources.list" -o Dir::Etc::sourceparts=-
  -o Dir::State::Lists="$dir/apt/lists" -o Dir::Cache="$dir/apt/cache" -o APT::Sandbox::User=root)
if ! ls "$dir"/libstdc++-14-dev_*.deb >/dev/null 2>&1; then
  apt-get "${apt_opts[@]}" update >"$dir/apt.log" 2>&1 ||
    { cat "$dir/apt.log" >&2; echo "check_newer_libstdcxx: apt-get update failed" >&2; exit 1; }
  (cd "$dir" && apt-get "${apt_opts[@]}" download libstdc++-14-dev >>"$dir/apt.log" 2>&1) ||
    { cat "$dir/apt.log" >&2; echo "check_newer_libstdcxx: downloading libstdc++-14-dev failed" >&2; exit 1; }
fi
rm -rf "$dir/headers"
dpkg-deb -x "$(ls "$dir"/libstdc++-14-dev_*.deb | head -1)" "$dir/headers"
std_flags="-nostdinc++ -isystem $dir/headers/usr/include/c++/14 -isystem $dir/headers/usr/include/x86_64-linux-gnu/c++/14"

tree="$dir/tree"
cmake -S . -B "$tree" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="$std_flags" -DRESHARD_PCH=OFF -DRESHARD_TEST_PCH=OFF \
  -DRESHARD_WITH_CUDA=OFF -DRESHARD_BUILD_PYTHON=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log" >&2
  echo "check_newer_libstdcxx: configuring the clang tree against libstdc++ 14 failed (above)" >&2
  exit 1
}

python3 - "$tree/compile_commands.json" "$cuda_tree" "$root" "$dir" "$std_flags" <<'EOF'
import concurrent.futures
import glob
import json
import os
import shlex
import subprocess
import sys

commands, cuda_tree, root, work, std_flags = sys.argv[1:]
headers = os.path.join(work, "headers")
jobs = []  # (file, argv, cwd)
seen = set()
for entry in json.load(open(commands)):
    argv, skip = [], False
    for arg in shlex.split(entry["command"]):
        if skip:
            skip = False
        elif arg in ("-o", "-MF", "-MT"):
            skip = True
        elif arg != "-c" and not arg.startswith("-MD"):
            argv.append(arg)
    jobs.append((entry["file"], argv, entry["directory"]))
    seen.add(os.path.realpath(entry["file"]))
compiled_here = len(jobs)
# C++ files this tree left out (a CUDA build's tests and benchmarks, the Python extension): with
# the definitions and include folders their target has in a tree that builds them.
for flags in glob.glob(os.path.join(cuda_tree, "**", "CMakeFiles", "*.dir", "flags.make"),
                       recursive=True):
    values = {}
    for line in open(flags):
        key, _, value = line.partition(" = ")
        values[key.strip()] = value.strip()
    target_dir = os.path.dirname(flags)
    for depfile in glob.glob(os.path.join(target_dir, "**", "*.cc.o.d"), recursive=True):
        # A make depfile: "object: source header...", the source first.
        with open(depfile) as f:
            source = f.read().split(":", 1)[1].replace("\\\n", " ").split()[0]
        if not source.startswith(root + "/") or os.path.realpath(source) in seen:
            continue
        seen.add(os.path.realpath(source))
        argv = (["clang++", "-std=c++20"] + shlex.split(std_flags) +
                shlex.split(values.get("CXX_DEFINES", "")) +
                shlex.split(values.get("CXX_INCLUDES", "")) + [source])
        jobs.append((source, argv, cuda_tree))
if len(jobs) == compiled_here:
    print("check_newer_libstdcxx: %s has no files beyond this tree's (not a Makefiles tree "
          "built with CUDA?): the CUDA-only files were not parsed" % cuda_tree)


def parse(job):
    source, argv, cwd = job
    done = subprocess.run(argv + ["-fsyntax-only", "-ferror-limit=0", "-w"], cwd=cwd,
                          capture_output=True, text=True)
    ours = [line for line in done.stderr.splitlines()
            if ": error: " in line and not line.startswith(headers)]
    return source, ours


findings = 0
with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
    for source, errors in pool.map(parse, jobs):
        if errors:
            findings += 1
            print("%s:\n  %s" % (os.path.relpath(source, root), "\n  ".join(errors)))
print("check_newer_libstdcxx: %d files parsed against libstdc++ 14, %d with errors in our code"
      % (len(jobs), findings))
sys.exit(1 if findings else 0)
EOF
