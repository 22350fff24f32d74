"""Checks that the tests run against this build: they import the reshard package installed in
the venv (scripts/python-install.sh), which must carry the extension this build tree made
(ctest passes its path as RESHARD_BUILT_EXTENSION) and the Python files of this checkout."""
import filecmp
import os
import struct
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ranks.py, the workers


def build_id(path):
    """The GNU build id of an ELF file (kept when installation rewrites the run path)."""
    with open(path, "rb") as f:
        data = f.read()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", data, shoff + i * shentsize + 4)
        offset, size = struct.unpack_from("<QQ", data, shoff + i * shentsize + 0x18)
        if sh_type != 7:  # SHT_NOTE
            continue
        pos = offset
        while pos + 12 <= offset + size:
            namesz, descsz, note_type = struct.unpack_from("<III", data, pos)
            name_end = pos + 12 + ((namesz + 3) & ~3)
            if note_type == 3 and data[pos + 12:pos + 12 + namesz] == b"GNU\0":
                return data[name_end:name_end + descsz].hex()
            pos = name_end + ((descsz + 3) & ~3)
    return None


def pytest_sessionstart(session):
    import reshard
    built = os.environ.get("RESHARD_BUILT_EXTENSION")
    if not built:
        return
    installed = reshard._reshard.__file__
    package_dir = os.path.dirname(reshard.__file__)
    source_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reshard")
    stale = build_id(built) != build_id(installed) or any(
        not filecmp.cmp(os.path.join(source_dir, f), os.path.join(package_dir, f), shallow=False)
        for f in os.listdir(source_dir) if f.endswith(".py"))
    if stale:
        pytest.exit("the reshard package in %s is not this build's (%s); run "
                    "scripts/python-install.sh" % (package_dir, built), returncode=1)
