"""The `ddo` command (console script) and `python -m ddo`: both start the C tool shipped in the
package (ddo/bin/ddo; ddo/bin/ddo.exe in the win_amd64 wheel) with this process's arguments.
On Windows the tool runs as a child whose exit status becomes this process's (Windows has no
exec that keeps the process). They need no torch: ``import ddo`` calls
``exec_if_command`` first, which replaces the process with the tool before torch is imported.
"""

import importlib
import os
import pathlib
import subprocess
import sys
from typing import List, Optional, Sequence

_HERE = pathlib.Path(__file__).resolve().parent


def _on_windows() -> bool:
    """Whether this is Windows (tests replace this to check the Windows path on Linux)."""
    return os.name == "nt"


def tool_path() -> pathlib.Path:
    """The packaged tool (present in an installed wheel)."""
    return _HERE / "bin" / ("ddo.exe" if _on_windows() else "ddo")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Replaces this process with the tool (on Windows: runs it and returns its exit status);
    returns 1 (one line on stderr) when it is absent."""
    tool = tool_path()
    if not os.access(tool, os.X_OK):
        sys.stderr.write(f"ddo: the tool is not in this package ({tool} absent): install the "
                         f"wheel (`make wheel`, then pip install dist/ddo-*.whl) or run "
                         f"./build/ddo in a source build\n")
        return 1
    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    if _on_windows():
        return _run_child([str(tool), *args])
    os.execv(str(tool), ["ddo", *args])
    return 1  # not reached


def _run_child(cmd: List[str]) -> int:
    """Windows: the tool as a child on this console. A Ctrl-C reaches both processes; this one
    keeps waiting while the tool removes its partial outputs and ends (its exit status says
    so), where subprocess.call would kill it in the middle of that."""
    p = subprocess.Popen(cmd)
    while True:
        try:
            return p.wait()
        except KeyboardInterrupt:
            continue


def _launched_as_command() -> bool:
    """Whether this interpreter runs the `ddo` console script or `python -m ddo`."""
    orig: List[str] = list(getattr(sys, "orig_argv", None) or [])  # Python >= 3.10
    if sys.argv and sys.argv[0] == "-m":
        return bool(orig) and "-m" in orig and orig[orig.index("-m") + 1:][:1] == ["ddo"]
    main_file = getattr(sys.modules.get("__main__"), "__file__", None) or ""
    if _on_windows():  # pip's launcher: Scripts\ddo.exe runs the __main__.py zipped inside it
        exe = os.path.basename(sys.argv[0] if sys.argv else "").lower()
        return exe == "ddo.exe" and "ddo.exe" in main_file.lower()
    if os.path.basename(main_file) != "ddo":
        return False
    try:  # the wrapper pip writes for [project.scripts]
        with open(main_file, "rb") as f:
            return b"from ddo.__main__ import main" in f.read(4096)
    except OSError:
        return False


def exec_if_command() -> None:
    """Starts the tool when this import is the `ddo` command (see the module's docstring)."""
    if _launched_as_command() and os.access(tool_path(), os.X_OK):
        sys.exit(main())


def require_torch() -> None:
    """One line naming what to install when torch cannot be imported."""
    try:
        importlib.import_module("torch")
    except ImportError as e:
        raise ImportError(
            f"ddo needs torch >= 1.13 in this interpreter ({sys.executable}; {e}): "
            f"`pip install torch` (or ddo[torch]); on Debian torch is python3-torch, which "
            f"belongs to /usr/bin/python3 (a venv sees it with --system-site-packages)") from None

