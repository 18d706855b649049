"""`import ddo` loads no library: libddo is opened on first use (ddo._native.lib()), so a
program that imports ddo and never calls it does not need one, and a broken DDO_LIBRARY is
reported by the first call, not by the import. Checked in a child process from the mapped
files of the process (/proc/self/maps)."""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PYTHON_DIR

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")


def _child(code, env=None):
    e = dict(os.environ, **(env or {}))
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(PYTHON_DIR),
                       env=e, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split()


def test_import_maps_no_libddo_and_first_use_does():
    out = _child("""
        def mapped():
            return any(("libddo" in l or "ddo.dll" in l) for l in open("/proc/self/maps"))
        import ddo, ddo.config, ddo.compat, ddo.settings, ddo.offload, ddo.routing
        print(mapped(), ddo._native._LIB is None)
        ddo.DynamicOffloadConfig.fields()          # the catalog: the first use
        print(mapped(), ddo._native._LIB is None)
    """)
    assert out == ["False", "True", "True", "False"]


def test_a_missing_library_fails_the_first_call_not_the_import():
    out = _child("""
        import ddo
        print("imported")
        try:
            ddo.library_version()
        except ddo.LibraryError as e:
            print("LibraryError", "/nonexistent/libddo.so" in str(e))
    """, {"DDO_LIBRARY": "/nonexistent/libddo.so"})
    assert out == ["imported", "LibraryError", "True"]
