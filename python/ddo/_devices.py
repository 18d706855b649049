"""Device sets for the binding (docs/multi-gpu.md): the store device of donor mode.

enable_offload(module, devices=["cuda:0", "cuda:1"]) computes on the first device and keeps
every streamed unit on the second (the store); the library copies a unit from there into the
first device's slots. On the cpu device, devices=["cpu:0", "cpu:1"] emulates the pair (two
instances with their own memory). This module opens the store device, tells the plan its free
memory and the measured device->device rate (once per process and pair), and closes it after
the session.
"""
from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Tuple

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
    if len(devs) >= 2 and cfg.get("device_mode") == "split":
        raise _native.DdoError(
            "DDO_E_UNSUPPORTED",
            "device_mode='split' runs from the C API (ddo_session_options.split_devices) and "
            "`ddo run`; the binding does not give one module per device yet (docs/multi-gpu.md)")
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
