"""The binding's Windows side, checked on Linux: the library discovery order of _lib.py (explicit
path, DDO_LIBRARY, DDO_VMM_LIBRARY_PATH, the package's libddo.dll then ddo.dll), the `ddo`
command starting ddo/bin/ddo.exe as a child, and the backend's win_amd64 refusals. The
Windows branch is selected by replacing _on_windows (os.name cannot be changed: pathlib
follows it). The real wheel is checked under Wine by tools/windows/check-wheel.sh."""

import os
import shutil
import subprocess
import sys

import pytest

import ddo
from ddo import _lib, _tool
from conftest import ROOT

BACKEND = ROOT / "python" / "build_backend" / "ddo_build.py"


@pytest.fixture
def windows(monkeypatch, tmp_path):
    """The Windows order with an empty package folder (tmp_path/ddo) outside any checkout."""
    ddo.library_version()  # the real library loaded first, by the Linux order (this file alone)
    pkg = tmp_path / "site" / "ddo"
    pkg.mkdir(parents=True)
    monkeypatch.setattr(_lib, "_on_windows", lambda: True)
    monkeypatch.setattr(_lib, "_package_dir", lambda: pkg)
    monkeypatch.delenv("DDO_LIBRARY", raising=False)
    monkeypatch.delenv("DDO_VMM_LIBRARY_PATH", raising=False)
    return pkg


def _real_library():
    return ddo.library_version()[1]


def test_windows_candidates_in_the_documented_order(windows, monkeypatch):
    monkeypatch.setenv("DDO_LIBRARY", r"C:\explicit\libddo.dll")
    monkeypatch.setenv("DDO_VMM_LIBRARY_PATH", r"C:\vmm\ddo.dll")
    got = _lib._candidates("D:/arg/libddo.dll")
    assert got == [("argument", "D:/arg/libddo.dll"),
                   ("DDO_LIBRARY", r"C:\explicit\libddo.dll"),
                   ("DDO_VMM_LIBRARY_PATH", r"C:\vmm\ddo.dll"),
                   ("package", str(windows / "libddo.dll")),
                   ("package", str(windows / "ddo.dll"))]


def test_linux_order_has_no_vmm_variable(monkeypatch):
    monkeypatch.setattr(_lib, "_on_windows", lambda: False)
    monkeypatch.setenv("DDO_VMM_LIBRARY_PATH", "/elsewhere/libddo.so")
    origins = [o for o, _ in _lib._candidates(None)]
    assert "DDO_VMM_LIBRARY_PATH" not in origins and origins[:1] != ["DDO_VMM_LIBRARY_PATH"]
    assert all(p.endswith("libddo.so") for o, p in _lib._candidates(None) if o != "DDO_LIBRARY")


def test_windows_loads_from_ddo_vmm_library_path(windows, monkeypatch):
    monkeypatch.setenv("DDO_VMM_LIBRARY_PATH", _real_library())
    lib = _lib.load()
    assert lib.ddo_path == _real_library() and lib.ddo_version == ddo.__version__


def test_windows_ddo_library_comes_before_the_vmm_variable(windows, monkeypatch, tmp_path):
    monkeypatch.setenv("DDO_LIBRARY", _real_library())
    monkeypatch.setenv("DDO_VMM_LIBRARY_PATH", str(tmp_path / "absent.dll"))
    assert _lib.load().ddo_path == _real_library()


def test_windows_bad_vmm_path_is_an_error_not_skipped(windows, monkeypatch, tmp_path):
    shutil.copyfile(_real_library(), windows / "libddo.dll")
    monkeypatch.setenv("DDO_VMM_LIBRARY_PATH", str(tmp_path / "absent.dll"))
    with pytest.raises(_lib.LibraryError) as e:
        _lib.load()
    assert "DDO_VMM_LIBRARY_PATH" in str(e.value) and "absent.dll" in str(e.value)


@pytest.mark.parametrize("present", [("libddo.dll",), ("ddo.dll",), ("libddo.dll", "ddo.dll")])
def test_windows_package_copy(windows, present):
    for name in present:
        shutil.copyfile(_real_library(), windows / name)
    lib = _lib.load()
    assert lib.ddo_path == str(windows / present[0])


def test_windows_nothing_found_names_every_path(windows):
    with pytest.raises(_lib.LibraryError) as e:
        _lib.load()
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("ddo: libddo.dll not found")
    assert str(windows / "libddo.dll") in msg and str(windows / "ddo.dll") in msg
    assert "libddo.so" not in msg


def test_windows_tool_runs_ddo_exe_as_a_child(monkeypatch, tmp_path, capfd):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "ddo.exe"  # a stand-in that reports its arguments
    exe.write_text("#!/bin/sh\necho \"child: $*\"\nexit 7\n")
    exe.chmod(0o755)
    monkeypatch.setattr(_tool, "_on_windows", lambda: True)
    monkeypatch.setattr(_tool, "_HERE", tmp_path)
    assert _tool.tool_path() == exe
    assert _tool.main(["version", "--json"]) == 7  # returned, not exec'd: this test goes on
    assert capfd.readouterr().out == "child: version --json\n"
    exe.unlink()
    assert _tool.main(["version"]) == 1
    err = capfd.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "ddo.exe absent" in err


def test_windows_tool_child_finishes_its_cleanup_on_ctrl_c(monkeypatch, tmp_path):
    """On Windows a Ctrl-C reaches the `ddo` command and the tool it started (one console):
    the command waits for the tool's own cleanup and returns its status. Here the interrupt
    is given to both as the console would: SIGINT to the stand-in child, KeyboardInterrupt
    in this process's wait."""
    import signal
    import time
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "ddo.exe"
    done = tmp_path / "cleaned"
    exe.write_text(f"#!/bin/sh\ntrap 'sleep 0.3; touch {done}; exit 130' INT\n"
                   f"touch {tmp_path}/started\nwhile :; do sleep 0.05; done\n")
    exe.chmod(0o755)
    monkeypatch.setattr(_tool, "_on_windows", lambda: True)
    monkeypatch.setattr(_tool, "_HERE", tmp_path)
    real = subprocess.Popen

    class Console(real):  # the first wait is interrupted by the console's Ctrl-C
        interrupted = False

        def wait(self, timeout=None):
            if not Console.interrupted:
                Console.interrupted = True
                while not (tmp_path / "started").exists():
                    time.sleep(0.01)
                self.send_signal(signal.SIGINT)
                raise KeyboardInterrupt
            return super().wait(timeout)
    monkeypatch.setattr(subprocess, "Popen", Console)
    assert _tool.main(["run", "x"]) == 130
    assert Console.interrupted and done.exists()  # not killed in the middle of its cleanup


def _backend(*args):
    return subprocess.run([sys.executable, str(BACKEND), "--platform", "win_amd64", *args],
                          capture_output=True, text=True, timeout=60)


def test_win_wheel_backend_refuses_without_the_dll(tmp_path):
    p = _backend("--build-dir", str(tmp_path), "--out", str(tmp_path / "dist"))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "libddo.dll not found" in lines[0] and "make wheel-win" in lines[0]
    assert not (tmp_path / "dist").exists() or not list((tmp_path / "dist").glob("*.whl"))


def test_win_wheel_backend_refuses_linux_files(tmp_path):
    shutil.copyfile(_real_library(), tmp_path / "libddo.dll")  # an ELF file by a Windows name
    (tmp_path / "ddo.exe").write_bytes(b"MZ" + bytes(200))
    p = _backend("--build-dir", str(tmp_path), "--out", str(tmp_path / "dist"))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, p.stderr
    assert "libddo.dll is not a 64-bit Windows (x86-64 PE) file" in lines[0]
    assert not list(tmp_path.glob("dist/*.whl"))


def test_package_files_leave_out_native_libraries(tmp_path, monkeypatch):
    import importlib.util
    spec = importlib.util.spec_from_file_location("ddo_build_t", BACKEND)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pkg = tmp_path / "python" / "ddo"
    (pkg / "bin").mkdir(parents=True)
    for name in ("__init__.py", "libddo.so", "libddo.dll", "ddo.dll", "bin/ddo.exe"):
        (pkg / name).write_text("x")
    (tmp_path / "python" / "ddo_vmm_bootstrap.py").write_text("x")
    monkeypatch.setattr(mod, "PROJECT", tmp_path / "python")
    assert sorted(a for a, _ in mod._package_files()) == ["ddo/__init__.py",
                                                          "ddo_vmm_bootstrap.py"]


def test_bootstrap_finds_the_package_dll_on_windows(monkeypatch, tmp_path):
    import importlib.util
    spec = importlib.util.spec_from_file_location("boot_t", ROOT / "python" / "ddo_vmm_bootstrap.py")
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)
    (tmp_path / "ddo").mkdir()
    monkeypatch.setattr(boot, "_HERE", tmp_path)
    monkeypatch.setattr(boot, "_on_windows", lambda: True)
    with pytest.raises(boot.BootstrapError) as e:
        boot.resolve_library(environ={})
    assert "libddo.dll" in str(e.value) and "ddo.dll" in str(e.value)
    (tmp_path / "ddo" / "ddo.dll").write_bytes(b"")
    assert boot.resolve_library(environ={}) == (str(tmp_path / "ddo" / "ddo.dll"), "package")
    assert boot.resolve_library(environ={"DDO_VMM_LIBRARY_PATH": "X"}) == \
        ("X", "DDO_VMM_LIBRARY_PATH")


def test_heap_trim_is_linux_only(monkeypatch):
    """glibc's malloc_trim after enable_offload lets go of host copies: on Windows
    ctypes.CDLL(None) raises TypeError (the name is required there), so it is not tried."""
    import ctypes
    from ddo import _result_ownership

    def windows_cdll(name, *a, **k):
        if name is None:
            raise TypeError("argument of type 'NoneType' is not iterable")
        raise AssertionError(name)
    monkeypatch.setattr(ctypes, "CDLL", windows_cdll)
    monkeypatch.setattr(sys, "platform", "win32")
    _result_ownership._trim_host_heap()  # returns, no TypeError
    monkeypatch.setattr(sys, "platform", "linux")
    with pytest.raises(TypeError):
        _result_ownership._trim_host_heap()  # the stand-in really raises where it is called
