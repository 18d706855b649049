"""The binding's safety rails (internal): what keeps the books whole under hostile use.

The invariants (docs/python-limits.md says what they mean for a user):

  - Interrupts: every state change of the binding (a C acquire and the Python lease record,
    a DLPack view and its capsule, enable_offload's setup and its commit) runs inside
    ``shield()``: a signal whose Python handler would raise (Ctrl-C's KeyboardInterrupt, an
    alarm) arriving inside it is deferred to its end, so the C and the Python books always
    change together; the handler then runs once, at a point where the state is whole.
  - Autograd: ddo streams weights for inference. A forward run with grad mode on saves no
    view of ddo's memory for backward: ``saved_tensors()`` packs such a tensor as a marker
    whose unpacking (a backward that would read a streamed weight) raises one clear error,
    and a gradient for a managed Parameter raises the same error. Input gradients through
    frozen streamed weights are refused, never silently wrong.
  - Fork: a child forked while sessions exist has none of their threads; every managed
    forward in it raises one clear error (``check_fork``), never hangs.
  - Lifetime: a session whose DLPack views outlive close() lives until the last view dies;
    ``sweep()`` frees it (with its plan, checkpoint and device) at the next enable, close,
    garbage collection or exit after that.
"""

import atexit
import contextlib
import gc
import os
import signal
import threading
from types import FrameType
from typing import Any, Iterable, Iterator, List, Optional, Tuple

try:  # the C module: no enum conversions (signal's wrappers cost ~2 us a call)
    import _signal as _sig
except ImportError:  # pragma: no cover
    _sig = signal

from ._native import DdoError

INFERENCE_ONLY = ("ddo streams weights for inference; run the forward under torch.no_grad() "
                  "or torch.inference_mode() (a backward would read weight memory ddo has "
                  "already reused for other weights), or close() the OffloadResult to train")

# ---- interrupts ----

_SIGINT = int(signal.SIGINT)
_DEFERRABLE = tuple(int(getattr(signal, n)) for n in ("SIGINT", "SIGTERM", "SIGALRM", "SIGHUP",
                                                 "SIGUSR1", "SIGUSR2", "SIGVTALRM", "SIGPROF")
                    if hasattr(signal, n))


class _Later:
    """The handler a shield installs: records the signal for its end."""
    __slots__ = ("pending",)

    def __init__(self) -> None:
        self.pending: List[Tuple[int, Optional[FrameType]]] = []

    def __call__(self, signum: int, frame: Optional[FrameType]) -> None:
        self.pending.append((signum, frame))


def _shielded_now() -> bool:
    """A shield is open on this (main) thread: its recorder is SIGINT's handler (state kept
    in the handler itself, so no counter can be left behind by an interrupt)."""
    return isinstance(_sig.getsignal(_SIGINT), _Later)


@contextlib.contextmanager
def shield() -> Iterator[None]:
    """Defers Python signal handlers to the end of the block (main thread; a nested block
    defers to the outermost). Other threads never run signal handlers: a no-op there."""
    if threading.current_thread() is not threading.main_thread() or _shielded_now():
        yield
        return
    later = _Later()
    saved: List[Tuple[int, Any]] = []
    try:
        for s in _DEFERRABLE:
            h = _sig.getsignal(s)
            if callable(h) and (s == _SIGINT or not isinstance(h, _Later)):
                saved.append((s, h))
                _sig.signal(s, later)
        h = _sig.getsignal(_SIGINT)
        if (not saved or saved[0][0] != _SIGINT) and h is not None:
            saved.insert(0, (_SIGINT, h))  # SIGINT not callable: it marks the shield
            _sig.signal(_SIGINT, later)
        yield
    finally:
        for s, h in saved:
            _sig.signal(s, h)
        handlers = dict(saved)
        for signum, frame in later.pending:  # the state is whole again: the handlers run now
            h = handlers.get(signum)
            if callable(h):
                h(signum, frame)


# ---- autograd ----

class _Streamed:
    """What autograd keeps instead of a view of ddo's memory."""
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _storage_ptr(t: Any) -> int:
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return int(st.data_ptr())


def refuse_grad(*_: Any) -> None:
    raise DdoError("DDO_E_UNSUPPORTED", INFERENCE_ONLY)


def saved_tensors(result: Any) -> Any:
    """The saved-tensor hooks of a forward run with grad mode on: a tensor over ddo's memory
    (result._view_ptrs) is packed as a marker whose unpacking raises INFERENCE_ONLY."""
    import torch

    def pack(t: Any) -> Any:
        if t.device == result.device and t.numel() > 0 and \
                _storage_ptr(t) in result._view_ptrs:
            return _Streamed(result._view_ptrs[_storage_ptr(t)])
        return t

    def unpack(x: Any) -> Any:
        if isinstance(x, _Streamed):
            raise DdoError("DDO_E_UNSUPPORTED", f"backward through {x.name}: {INFERENCE_ONLY}")
        return x

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def needs_grad(args: Iterable[Any], params: Iterable[Any]) -> bool:
    """True when grad mode is on and a forward over these inputs and Parameters would build
    a graph (an input or a Parameter requires grad)."""
    import torch
    if not torch.is_grad_enabled():
        return False
    if any(p.requires_grad for p in params):
        return True
    return any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)


# ---- fork ----

def _after_fork_in_child() -> None:
    _GRAVEYARD.clear()  # the parent's sessions: their threads are not in this process


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def forked(pid: int) -> bool:
    """True in a process forked after pid (the process that made a session) made it."""
    return pid != os.getpid()


def check_fork(pid: int, what: str) -> None:
    if forked(pid):
        raise DdoError("DDO_E_STATE", f"{what}: this process was forked after enable_offload; "
                       f"the ddo session belongs to the parent process (its loader and copy "
                       f"threads do not exist here): call enable_offload again in the child "
                       f"on a fresh module (or use the 'spawn' start method)")


# ---- lifetime ----

# (session, plan, checkpoint, device, keep): sessions closed while DLPack views of them lived.
_GRAVEYARD: List[Tuple[Any, Any, Any, Any, Any]] = []


def bury(entry: Tuple[Any, Any, Any, Any, Any]) -> None:
    _GRAVEYARD.append(entry)
    sweep()


_sweeping: List[int] = []


def sweep() -> None:
    """Frees every buried session whose last view died (with its plan, checkpoint, setup)."""
    if not _GRAVEYARD or _sweeping:
        return
    _sweeping.append(1)  # not re-entered from a collection it triggers
    try:
        _sweep()
    finally:
        _sweeping.clear()


def _sweep() -> None:
    from . import _native
    L = _native._LIB
    if L is None:
        return
    for entry in list(_GRAVEYARD):
        s, plan, ck, setup, _keep = entry
        if L.ddo_session_view_count(s) != 0:
            continue
        _GRAVEYARD.remove(entry)
        L.ddo_session_destroy(s)
        if plan is not None:
            L.ddo_plan_destroy(plan)
        if ck is not None:
            L.ddo_checkpoint_destroy(ck)
        if setup is not None:
            L.ddo_setup_destroy(setup)  # and its device


atexit.register(sweep)
gc.callbacks.append(lambda phase, info: sweep() if phase == "stop" and _GRAVEYARD else None)
