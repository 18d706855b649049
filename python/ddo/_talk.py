"""What the binding tells people: sizes in adaptive units, the setup progress bar, the
Perfetto trace and the one-line warnings.

- size(n): bytes as "512 B", "96.50 KiB", "6.25 MiB", "21.30 GiB" (never "0.00 GiB").
- Progress: the library's setup progress (ddo_session_options.progress: "read", "register",
  "allocate", "resident", "sidecar" while coding) as a bar per phase; tqdm when it can be
  imported (or the tqdm-compatible class given), else a plain bar on stderr. On by default
  when stderr is a terminal.
- Trace: the Chrome/Perfetto trace-event JSON that ``ddo bench --trace`` writes, with the
  same tracks: "host: acquire (wait)" and "host: compute issue" from the binding's hooks,
  "session: copy engine (uploads)" and "session: map / unmap / reclaim" from the library's
  trace callback (ddo_session_options.trace), one process per component. Open it at
  https://ui.perfetto.dev (Open trace file).
"""

import json
import os
import sys
import threading
import time
import warnings
from types import FrameType
from typing import IO, Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib

_UNITS = ("KiB", "MiB", "GiB", "TiB")


def size(n: float) -> str:
    """n bytes in the largest binary unit that keeps the number >= 1 ("0 B", "96.50 KiB")."""
    n = int(n)
    if abs(n) < 1024:
        return f"{n} B"
    v = float(n)
    for unit in _UNITS:
        v /= 1024.0
        if abs(v) < 1024 or unit == _UNITS[-1]:
            return f"{v:.2f} {unit}"
    return f"{n} B"  # not reached


def warn(message: str, stacklevel: Optional[int] = None) -> None:
    """A ddo warning (UserWarning, "ddo: " first), pointing at the first line outside the
    ddo package (the user's call)."""
    if stacklevel is None:
        pkg = os.path.dirname(os.path.abspath(__file__))
        f: Optional[FrameType] = sys._getframe(0)
        stacklevel = 1
        while f is not None and (os.path.abspath(f.f_code.co_filename).startswith(pkg) or
                                 f.f_code.co_filename.endswith("contextlib.py")):
            f, stacklevel = f.f_back, stacklevel + 1
    warnings.warn(f"ddo: {message}", stacklevel=stacklevel)


class _StderrBar:
    """The tqdm subset Progress uses (total, update, close), drawn on stderr."""

    def __init__(self, total: float = 0, desc: str = "", unit: str = "B", unit_scale: bool = True,
                 leave: bool = True, file: Optional[IO[str]] = None) -> None:
        self.total, self.desc, self.n = int(total or 0), desc, 0
        self.file = file or sys.stderr
        self._last = -1.0
        self._draw()

    def update(self, k: int) -> None:
        self.n += k
        self._draw()

    def _draw(self) -> None:
        frac = self.n / self.total if self.total else 1.0
        now = time.monotonic()
        if now - self._last < 0.1 and self.n < self.total:
            return
        self._last = now
        width = 30
        fill = int(round(frac * width))
        self.file.write(f"\r{self.desc} [{'#' * fill}{'.' * (width - fill)}] {frac:4.0%} "
                        f"{size(self.n)} / {size(self.total)}")
        self.file.flush()

    def close(self) -> None:
        self._last = -1.0
        self._draw()
        self.file.write("\n")
        self.file.flush()


def _bar_class(progress: Any) -> Any:
    """The bar factory: a tqdm-compatible class given, tqdm's, else the stderr bar."""
    if callable(progress) and not isinstance(progress, bool):
        return progress
    try:
        from tqdm import tqdm
    except ImportError:
        return _StderrBar
    return tqdm


class Progress:
    """ddo_progress_fn for one session: a bar per setup phase.

    progress: None (on when stderr is a terminal), True, False, or a tqdm-compatible class
    (called as cls(total=, desc=, unit="B", unit_scale=True, leave=True); update(n); close()).
    """

    def __init__(self, label: str, progress: Any = None) -> None:
        if progress is None:
            progress = bool(getattr(sys.stderr, "isatty", lambda: False)())
        self.enabled = progress is not False
        self.label = label
        self._cls: Any = _bar_class(progress) if self.enabled else None
        self._bar: Any = None
        self._phase: Optional[str] = None
        self._done = 0
        self.phases: List[Tuple[str, int]] = []  # (phase, total) in the order they began
        # (tests read it); a NULL callback when off
        self.fn: Any = _lib.PROGRESS_FN(self._call) if self.enabled else _lib.PROGRESS_FN(0)

    def _call(self, user: Any, phase_c: Optional[bytes], done: int, total: int) -> None:
        try:  # never raise into the library
            phase = phase_c.decode(errors="replace") if phase_c else "setup"
            if phase != self._phase:
                self._end()
                self._phase, self._done = phase, 0
                self.phases.append((phase, int(total)))
                self._bar = self._cls(total=int(total), desc=f"ddo {self.label}: {phase}",
                                      unit="B", unit_scale=True, leave=True)
            step = int(done) - self._done
            if step > 0:
                self._bar.update(step)
                self._done = int(done)
        except Exception:  # a broken bar must not break the setup
            self._bar = None

    def _end(self) -> None:
        if self._bar is not None:
            try:
                self._bar.close()
            except Exception:
                pass
        self._bar = None

    def close(self) -> None:
        self._end()
        self._phase = None


def tidy_profile(text: str, verbose: bool = False, width: int = 100) -> str:
    """ddo_metrics_format_profile's text for people: ``key=`` with no value dropped; the
    ``decisions`` line (400+ characters) wrapped with verbose, else one line."""
    import textwrap
    out: List[str] = []
    for line in text.splitlines():
        words = [w for w in line.split(" ") if not (w.endswith("=") and "=" not in w[:-1])]
        line = " ".join(words)
        stripped = line.lstrip()
        if stripped.startswith("decisions "):
            indent = line[:len(line) - len(stripped)]
            items = stripped[len("decisions "):].split()
            if not verbose:
                out.append(f"{indent}decisions  {len(items)} planner decisions "
                           f"(format_profile(verbose=True) lists them)")
                continue
            out.extend(textwrap.wrap(" ".join(items), width=width,
                                     initial_indent=f"{indent}decisions  ",
                                     subsequent_indent=indent + " " * 11,
                                     break_on_hyphens=False))
            continue
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


TRACKS = ("", "host: acquire (wait)", "host: compute issue", "device: compute stream",
          "host: release", "step", "session: copy engine (uploads)",
          "session: map / unmap / reclaim")
TID_ACQUIRE, TID_COMPUTE, TID_COPY, TID_MAP = 1, 2, 6, 7


class Trace:
    """A Perfetto trace shared by the sessions of one call (a module, or every component of a
    pipeline); written by write() (close() of the result or of the pipeline does)."""

    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.path = str(path)
        self._events: List[Tuple[int, int, str, str, int, int]] = []
        self._lock = threading.Lock()
        self._names: List[str] = []
        self._t0 = time.monotonic_ns()
        self._fns: List[Any] = []
        try:  # checked before any setup work, as the CLI checks --metrics
            with open(self.path, "a"):
                pass
        except OSError as e:
            raise ValueError(f"trace={self.path!r}: cannot write ({e.strerror})") from None

    def process(self, name: str) -> int:
        """A new process track (one per session); returns its pid."""
        with self._lock:
            self._names.append(name)
            return len(self._names)

    def span(self, pid: int, tid: int, name: str, cat: str, begin_ns: int, end_ns: int) -> None:
        with self._lock:
            self._events.append((pid, tid, name, cat, begin_ns, max(0, end_ns - begin_ns)))

    def session_fn(self, pid: int, unit_names: Sequence[str]) -> Any:
        """ddo_session_options.trace for one session (thread-safe: a lock around a list)."""
        def call(user: Any, kind: Optional[bytes], unit: int, begin_ns: int, end_ns: int,
                 nbytes: int) -> None:
            try:
                k = kind.decode() if kind else "?"
                name = unit_names[unit] if unit < len(unit_names) else k
                self.span(pid, TID_COPY if k == "upload" else TID_MAP, name, k,
                          begin_ns, end_ns)
            except Exception:
                pass
        fn = _lib.TRACE_FN(call)
        self._fns.append(fn)  # kept alive while a session may call it
        return fn

    def write(self) -> str:
        with self._lock:
            events = sorted(self._events, key=lambda e: e[4])
            names = list(self._names)
        out: List[Dict[str, Any]] = []
        for pid, name in enumerate(names, 1):
            out.append({"ph": "M", "pid": pid, "name": "process_name",
                        "args": {"name": name}})
            for tid in range(1, len(TRACKS)):
                out.append({"ph": "M", "pid": pid, "tid": tid, "name": "thread_name",
                            "args": {"name": TRACKS[tid]}})
        for pid, tid, name, cat, begin, dur in events:
            out.append({"ph": "X", "pid": pid, "tid": tid, "cat": cat, "name": name,
                        "ts": round((begin - self._t0) / 1e3, 3), "dur": round(dur / 1e3, 3)})
        with open(self.path, "w") as f:
            json.dump({"displayTimeUnit": "ms", "traceEvents": out}, f)
            f.write("\n")
        return self.path
