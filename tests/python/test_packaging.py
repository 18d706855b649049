"""Packaging: the wheel's backend refuses to pack without its native files, the `ddo` command and
`python -m ddo` start the packaged tool, `import ddo` without torch and a mismatched libddo.so
each fail in one line, and (run.sh's installed run) the installed library needs only the C
runtime."""

import os
import shutil
import subprocess
import sys

import pytest

import ddo
from conftest import INSTALLED, PYTHON_DIR, ROOT

BACKEND = ROOT / "python" / "build_backend" / "ddo_build.py"
PACKAGE = PYTHON_DIR / "ddo"


def _python(code, **env):
    e = dict(os.environ, PYTHONPATH=str(PYTHON_DIR), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=120)


def test_import_without_torch_says_what_to_install():
    p = _python("import sys; sys.modules['torch'] = None; import ddo")
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ddo needs torch >= 1.13"), last
    assert "python3-torch" in last and "/usr/bin/python3" in last and sys.executable in last


def test_mismatched_library_names_path_and_version(monkeypatch):
    from ddo import _lib
    version, path = ddo.library_version()
    monkeypatch.setattr(_lib, "ABI_VERSION", (0, 99))
    with pytest.raises(_lib.LibraryError) as e:
        _lib.load(path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg and f"is libddo {version}" in msg
    assert "needs 0.99.x" in msg


def test_python_m_ddo_starts_the_packaged_tool():
    p = subprocess.run([sys.executable, "-m", "ddo", "version"], capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(PYTHON_DIR)), timeout=120)
    if (PACKAGE / "bin" / "ddo").exists():
        assert p.returncode == 0, p.stderr
        assert p.stdout.split() == ["ddo", ddo.__version__]
    else:  # a source checkout: the tool is ./build/ddo
        assert p.returncode == 1
        assert len(p.stderr.strip().splitlines()) == 1 and "not in this package" in p.stderr


@pytest.mark.skipif(not INSTALLED, reason="the installed wheel (run.sh with DDOTEST_WHEEL)")
def test_installed_wheel_is_complete_and_self_contained():
    assert (PACKAGE / "py.typed").is_file()
    for f in (PACKAGE / "libddo.so", PACKAGE / "bin" / "ddo"):
        assert os.access(f, os.X_OK), f
        if shutil.which("objdump"):
            out = subprocess.run(["objdump", "-p", str(f)], capture_output=True, text=True,
                                 check=True).stdout
            needed = {line.split()[1] for line in out.splitlines()
                      if line.strip().startswith("NEEDED")}
            assert needed <= {"libc.so.6", "libm.so.6", "ld-linux-x86-64.so.2"}, (f, needed)
    # The console script (DDO_BIN in run.sh's installed run) is the tool.
    p = subprocess.run([os.environ["DDO_BIN"], "--help"], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.startswith("usage: ddo")


def test_wheel_backend_refuses_without_the_library(tmp_path):
    out = tmp_path / "dist"
    p = subprocess.run([sys.executable, str(BACKEND), "--build-dir", str(tmp_path),
                        "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "libddo.so not found" in lines[0] and "make wheel" in lines[0]
    assert not list(out.glob("*.whl"))


def test_wheel_backend_refuses_a_mismatched_build(tmp_path):
    (tmp_path / "libddo.so").write_bytes(b"")
    tool = tmp_path / "ddo"
    tool.write_text("#!/bin/sh\necho ddo 9.9.9\n")
    tool.chmod(0o755)
    p = subprocess.run([sys.executable, str(BACKEND), "--build-dir", str(tmp_path),
                        "--out", str(tmp_path / "dist")], capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "9.9.9" in lines[0] and ddo.__version__ in lines[0]
