"""pytest setup for the binding's tests: the package from python/ and the library from the build
tree (DDO_LIBRARY, set by CTest), or with DDOTEST_INSTALLED=1 the installed wheel's package
(run.sh installs it in a fresh venv); the cpu device, and a clean DDO_* environment."""

import importlib.util
import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("DDOTEST_INSTALLED") == "1"
if not INSTALLED:
    sys.path.insert(0, str(ROOT / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
# The directory that holds the ddo package under test (children put it on their sys.path).
PYTHON_DIR = pathlib.Path(importlib.util.find_spec("ddo").origin).resolve().parents[1]
if INSTALLED and PYTHON_DIR == ROOT / "python":
    raise RuntimeError(f"DDOTEST_INSTALLED=1 but ddo comes from the source tree ({PYTHON_DIR})")

# Zero-resident streaming on the cpu device: every block is a streamed unit.
ZERO_RESIDENT = dict(execution_device="cpu", always_resident_modules_pattern="^$",
                     small_tensor_threshold_bytes=0, resident_module_budget_gb=0)


def ddo_tool():
    """The ddo tool under test: DDO_BIN (CTest and the installed-wheel run set it), else the one
    beside DDO_LIBRARY, else build/ddo; None where none is there."""
    for p in (os.environ.get("DDO_BIN"),
              os.path.join(os.path.dirname(os.environ.get("DDO_LIBRARY", "")), "ddo"),
              str(ROOT / "build" / "ddo")):
        if p and os.path.isfile(p) and os.access(p, os.X_OK):
            return p
    return None


def load_bench(name):
    """bench/<name>.py as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"{name}_bench", ROOT / "bench" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def without_diffusers(monkeypatch):
    """The routes a machine without Diffusers gets (CI's): tests of ddo's own staging use it
    on a machine where Diffusers is importable too (the GPU machine's)."""
    import ddo.routing
    monkeypatch.setattr(ddo.routing, "_diffusers_available", lambda: False)


@pytest.fixture(autouse=True)
def _no_ddo_environment(monkeypatch):
    for k in list(os.environ):
        if k.startswith("DDO_") and k not in ("DDO_LIBRARY", "DDO_BIN"):
            monkeypatch.delenv(k)
