"""ddo_vmm_bootstrap: the route request read from flags/DDO_* without torch, the native library
resolved in its documented order and checked, a clear line for a missing or invalid library, and
no torch import in the parent."""

import os
import subprocess
import sys

import pytest

from conftest import PYTHON_DIR, ROOT

sys.path.insert(0, str(PYTHON_DIR))
import ddo_vmm_bootstrap as boot  # noqa: E402

LIB = os.environ.get("DDO_LIBRARY") or str(
    PYTHON_DIR / "ddo" / "libddo.so" if (PYTHON_DIR / "ddo" / "libddo.so").exists()
    else ROOT / "build" / "libddo.so")


def test_vmm_fast_requested():
    assert boot.vmm_fast_requested(["--ddo-backend", "vmm"], {})
    assert boot.vmm_fast_requested(["--ddo-backend=vmm", "--ddo-preset", "auto"], {})
    assert not boot.vmm_fast_requested(["--ddo-backend", "vmm", "--ddo-preset",
                                        "nvme_baseline"], {})
    assert not boot.vmm_fast_requested([], {})
    assert boot.vmm_fast_requested([], {"DDO_BACKEND": "VMM"})
    assert not boot.vmm_fast_requested(["--ddo-backend", "linear"], {"DDO_BACKEND": "vmm"})
    assert boot.vmm_fast_requested([], {"DDO_EXECUTION_MODE": "vmm_fast_runtime"})


def test_order_explicit_then_environment_then_discovery(tmp_path):
    env = {"DDO_VMM_LIBRARY_PATH": "/from/env.so"}
    assert boot.resolve_library("/explicit.so", env) == ("/explicit.so", "library_path")
    assert boot.resolve_library(None, env) == ("/from/env.so", "DDO_VMM_LIBRARY_PATH")
    try:
        path, origin = boot.resolve_library(None, {})
    except boot.BootstrapError as e:
        assert "DDO_VMM_LIBRARY_PATH" in str(e)
    else:
        assert origin in ("package", "checkout build") and os.path.isfile(path)


def test_resolved_library_is_passed_on():
    env = {}
    out = boot.ensure_vmm_fast_process(LIB, environ=env)
    assert out["library_path"] == LIB and out["fresh_process"] is False
    assert env["DDO_LIBRARY"] == LIB and env["DDO_VMM_LIBRARY_PATH"] == LIB
    assert out["version"].count(".") == 2


def test_missing_and_invalid_libraries_fail_clearly(tmp_path):
    with pytest.raises(boot.BootstrapError) as e:
        boot.ensure_vmm_fast_process(tmp_path / "absent.so", environ={})
    assert "absent.so" in str(e.value) and "\n" not in str(e.value)
    bad = tmp_path / "libddo.so"
    bad.write_text("not a library")
    with pytest.raises(boot.BootstrapError) as e:
        boot.ensure_vmm_fast_process(environ={"DDO_VMM_LIBRARY_PATH": str(bad)})
    assert "DDO_VMM_LIBRARY_PATH" in str(e.value) and "not a usable libddo" in str(e.value)
    libc = "/lib/x86_64-linux-gnu/libc.so.6"
    if os.path.exists(libc):
        with pytest.raises(boot.BootstrapError):
            boot.ensure_vmm_fast_process(libc, environ={})


def test_parent_imports_neither_torch_nor_ddo():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import ddo_vmm_bootstrap as b; "
            "r = b.ensure_vmm_fast_process(sys.argv[2]) if b.vmm_fast_requested() else None; "
            "assert r is not None; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.') or "
            "m == 'ddo' or m.startswith('ddo.')]; assert not bad, bad; print('clean')")
    out = subprocess.run([sys.executable, "-c", code, str(PYTHON_DIR), LIB,
                          "--ddo-backend", "vmm"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "clean"


def test_allocator_cache_mib_is_written_for_the_child():
    # Default 512 MiB, DDO_VMM_TORCH_CACHE_MIB written, a pre-existing value not
    # honoured. ddo does not replace torch's allocator, so it has no effect on ddo itself.
    env = {"DDO_VMM_TORCH_CACHE_MIB": "64"}
    out = boot.ensure_vmm_fast_process(LIB, environ=env)
    assert env["DDO_VMM_TORCH_CACHE_MIB"] == "512" and out["allocator_cache_mib"] == 512
    out = boot.ensure_vmm_fast_process(LIB, allocator_cache_mib=1024, environ=env)
    assert env["DDO_VMM_TORCH_CACHE_MIB"] == "1024" and out["allocator_cache_mib"] == 1024
    assert "no effect" in out["allocator_cache_note"]
    for bad in (-1, "lots", 1.5):
        with pytest.raises(ValueError) as e:
            boot.ensure_vmm_fast_process(LIB, allocator_cache_mib=bad, environ={})
        assert "allocator_cache_mib" in str(e.value)
