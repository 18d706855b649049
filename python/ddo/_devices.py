"""Device sets for the binding (docs/multi-gpu.md): the store device of donor mode, and the
ranks of share mode.

enable_offload(module, devices=["cuda:0", "cuda:1"]) computes on the first device and keeps
every streamed unit on the second (the store); the library copies a unit from there into the
first device's slots. On the cpu device, devices=["cpu:0", "cpu:1"] emulates the pair (two
instances with their own memory). This module opens the store device, tells the plan its free
memory and the measured device->device rate (once per process and pair), and closes it after
the session.

enable_offload(module, device_mode="split") in a process of an initialised torch.distributed
group (torchrun: one process per GPU) is share mode: every rank runs rank 0's plan, uploads only
its share of each streamed unit over its own link (ddo_session_options.share_rank), and the
binding completes the unit with one all-gather of the group after each acquire
(ddo_session_unit_share), so each GPU takes in weights at up to N x one link's rate.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.distributed  # noqa: F401  (share mode's group; torch.distributed.is_available())

from . import _lib, _native

_PEER: Dict[Tuple[str, str], float] = {}  # (to, from) -> measured bytes/s, once per process
_MEASURE_BYTES = 64 << 20


def devices_of(cfg: _native.Config) -> List[str]:
    """The configured device set (empty: none)."""
    return [d.strip() for d in cfg.get("devices").replace(";", ",").split(",") if d.strip()]


class StoreDevice:
    """An owned ddo_device: donor mode's store, destroyed after the session that uses it."""

    def __init__(self, spec: str) -> None:
        self.spec = spec
        self.h: Optional[ctypes.c_void_p] = None
        h = ctypes.c_void_p()
        _native.check(_native.lib().ddo_device_create(spec.encode(), None, ctypes.byref(h)))
        self.h = h

    def caps(self) -> _lib.DeviceCaps:
        caps = _lib.DeviceCaps()
        L = _native.lib()
        _native.check(L.ddo_device_caps_get(self.h, ctypes.byref(caps)), L.ddo_device_error(self.h))
        return caps

    def close(self) -> None:
        if self.h is not None and _native._LIB is not None:
            _native._LIB.ddo_device_destroy(self.h)
        self.h = None

    def __del__(self) -> None:
        self.close()


def open_store(cfg: _native.Config, dev: Optional[ctypes.c_void_p],
               inputs: _lib.PlanInputs) -> Optional[StoreDevice]:
    """The store device of a donor set (None without one), its figures into the plan inputs:
    its free memory and, unless peer_link_gbps gives it, the measured link to dev."""
    devs = devices_of(cfg)
    if len(devs) < 2 or cfg.get("device_mode") != "donor":
        return None
    store = StoreDevice(devs[1])
    try:
        inputs.store_free_bytes = store.caps().free_bytes
        if not float(cfg.get("peer_link_gbps") or 0) > 0:
            key = (devs[0], devs[1])
            if key not in _PEER:
                rate = ctypes.c_double(0.0)
                rc = _native.lib().ddo_device_measure_peer(dev, store.h, _MEASURE_BYTES,
                                                           ctypes.byref(rate))
                _PEER[key] = rate.value if rc == 0 else 0.0
            inputs.peer_bytes_per_s = _PEER[key]
    except BaseException:
        store.close()
        raise
    return store


class Share:
    """Share mode's rank in a torch.distributed group: rank r of world processes, one device
    each, all running rank 0's plan."""

    def __init__(self, group: Any, rank: int, world: int, backend: str) -> None:
        self.group, self.rank, self.world, self.backend = group, rank, world, backend
        self.gathers = 0  # all-gathers issued (one per acquire of a unit with a share)
        self.plan_replaced = False  # this rank's own plan differed from rank 0's

    def agree(self, what: str, failed: Optional[str], key: str) -> None:
        """Every rank says whether it got past `what` (failed: its error, None when it did) and
        gives its key, which every rank must share: another rank's failure, or a key unlike
        rank 0's, fails this rank too with one line naming that rank, where it would otherwise
        wait in the next collective for a rank that never comes."""
        dist: Any = torch.distributed  # (torch 1.13 leaves it unannotated)
        box: List[Any] = [None] * self.world
        dist.all_gather_object(box, (failed, key), group=self.group)
        for r, (err, k) in enumerate(box):
            if err is not None and r != self.rank:
                raise _native.DdoError("DDO_E_STATE",
                                       f"device_mode='split': rank {r} failed {what}: {err}")
            if k != box[0][1]:
                raise _native.DdoError(
                    "DDO_E_INVALID_ARGUMENT",
                    f"device_mode='split': rank {r}'s module is not rank 0's (tensors {k} "
                    f"against {box[0][1]}): every rank must hold the same model, since each "
                    f"uploads its share of every block from its own copy")

    @contextlib.contextmanager
    def step(self, what: str, key: str = "") -> Iterator[None]:
        """A setup step every rank passes or none does (agree)."""
        try:
            yield
        except BaseException as e:
            with contextlib.suppress(Exception):
                self.agree(what, _native.exc_line(e), key)
            raise
        self.agree(what, None, key)

    def same_plan(self, text: str) -> str:
        """Rank 0's plan text (ddo_plan_to_json), on every rank: the collective calls of the
        ranks match only when they stream the same units in the same slots."""
        dist: Any = torch.distributed  # (torch 1.13 leaves it unannotated)
        box: List[Any] = [text]
        dist.broadcast_object_list(box, src=0, group=self.group)
        theirs = str(box[0])
        self.plan_replaced = theirs != text
        return theirs

    def gather(self, flat: torch.Tensor, share: int) -> None:
        """The all-gather that completes a unit: its view's first world x share bytes, in
        place, this rank contributing bytes [rank x share, (rank + 1) x share)."""
        dist: Any = torch.distributed  # (torch 1.13 leaves it unannotated)
        whole = flat[:share * self.world]
        mine = whole[self.rank * share:(self.rank + 1) * share]
        into = getattr(dist, "all_gather_into_tensor", None)
        if self.backend == "nccl" and into is not None:
            into(whole, mine, group=self.group)  # in place: NCCL's sendbuff inside recvbuff
        else:  # gloo (the cpu device): the list form, through buffers of its own (its work
            # may outlive the call, and must not keep a view of the unit past its lease)
            parts = [torch.empty_like(mine) for _ in range(self.world)]
            dist.all_gather(parts, mine.clone(), group=self.group)
            whole.copy_(torch.cat(parts))
        self.gathers += 1


def share_step(share: Optional[Share], what: str,
               key: str = "") -> "contextlib.AbstractContextManager[None]":
    """share.step(what, key), or nothing outside share mode."""
    return share.step(what, key) if share is not None else contextlib.nullcontext()


def fingerprint(tensors: Sequence[Tuple[str, str, Sequence[int]]]) -> str:
    """A short digest of a module's tensors (name, dtype, shape), the same on every rank that
    holds the same model."""
    h = hashlib.sha256()
    for name, dtype, shape in tensors:
        h.update(f"{name}:{dtype}:{tuple(shape)};".encode())
    return f"{len(tensors)} tensors, digest {h.hexdigest()[:12]}"


def open_share(cfg: _native.Config) -> Optional[Share]:
    """Share mode's rank (None outside it): device_mode='split' with no device set, in a
    process of an initialised torch.distributed group of two or more."""
    devs = devices_of(cfg)
    if cfg.get("device_mode") != "split":
        return None
    if len(devs) >= 2:
        raise _native.DdoError(
            "DDO_E_UNSUPPORTED",
            "device_mode='split' with devices=[...] (one process driving every device) runs "
            "from the C API (ddo_session_options.split_devices) and `ddo run`; in Python run "
            "one process per device (torchrun) with torch.distributed initialised and no "
            "devices=[...] (docs/multi-gpu.md)")
    dist: Any = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise _native.DdoError(
            "DDO_E_INVALID_ARGUMENT",
            "device_mode='split' in Python runs one process per device: initialise "
            "torch.distributed first (torchrun, dist.init_process_group) and give each process "
            "its own execution_device (docs/multi-gpu.md)")
    world = dist.get_world_size()
    if world < 2:
        return None
    return Share(None, dist.get_rank(), world, str(dist.get_backend()))
