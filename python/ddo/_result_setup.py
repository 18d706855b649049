"""OffloadResult's setup (internal): the library's host layer (device, plan inputs, profile),
the plan, the session, and then the placement, the views and the hooks."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any, List

import torch

from . import _devices, _lib, _native, _quant, _talk, _torch
from ._native import DdoError
from ._result_hooks import Hooks
from ._result_ownership import _collect, _trim_host_heap
from ._result_state import _PLACEMENT_STREAMED, _managed_by, _nbytes


def _open_setup(cfg: _native.Config) -> ctypes.c_void_p:
    """ddo_setup_create for cfg (execution_device, cuda:0 replaced by cpu when none answers),
    with this process's DDO_PROFILE_DIR and HOME for the profile directory."""
    env = [f"{k}={os.environ[k]}".encode() for k in ("DDO_PROFILE_DIR", "HOME", "USERPROFILE")
           if k in os.environ]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    opts = _lib.SetupOptions()
    opts.envp = ctypes.cast(envp, ctypes.POINTER(ctypes.c_char_p))
    h = ctypes.c_void_p()
    _native.check(_native.lib().ddo_setup_create(cfg.h, ctypes.byref(opts), ctypes.byref(h)))
    return h


class Setup(Hooks):
    """Builds the plan and the session for the module (once, from OffloadResult.__init__)."""

    def _setup(self) -> None:
        L = _native.lib()
        to_ddo, _ = _torch.dtype_tables()
        for name, p in self.module.named_parameters():
            # (a wrapper's inner tensors are what a session registers: _quant.stored_parts)
            held = [t for _s, _d, t in _quant.stored_parts(p)] if _quant.is_wrapper(p) else [p]
            by = next((_managed_by(t) for t in held if _managed_by(t) is not None), None)
            if by is not None:
                raise DdoError("DDO_E_STATE", f"parameter {name} is already managed by ddo "
                               f"through another module of this tree ({by}): one "
                               f"session per module tree; close() that result first")
        self._reserve_scratch()
        if self._source is not None:
            from . import _source
            self._tensors, self._ddo_path, self._modules_of, self._ck = \
                _source.file_checkpoint(self, self.module, self._source,
                                        self._cfg.get("load_safetensors_backend"))
        else:
            self._tensors, self._ddo_path, self._modules_of = _collect(self.module, to_ddo)
            self._host_checkpoint(to_ddo)
        # The library's host layer, as the tool's: the device (cuda:0 replaced by cpu when none
        # answers), the plan inputs (the device's figures, the profile's measured rates, the
        # bus and compute measured once per process) and the workload profile.
        self._setup_h = _open_setup(self._cfg)
        dev = ctypes.c_void_p(L.ddo_setup_device(self._setup_h))
        self._dev = dev
        self.device_note = (L.ddo_setup_note(self._setup_h) or b"").decode()
        caps = _lib.DeviceCaps()
        _native.check(L.ddo_device_caps_get(dev, ctypes.byref(caps)), L.ddo_device_error(dev))
        self.device = torch.device("cpu") if caps.is_cpu else torch.device("cuda", caps.ordinal)
        if caps.is_cpu and self.device_note and self._cfg.source("execution_device") == "default":
            # (no component name: a pipeline's components share one warning at the caller's line)
            _talk.warn(f"{self.device_note} (execution_device='cpu' says so and silences this)")
        if self._profile is not None:
            # prepare() applied it to the configuration; the setup keeps its measured rates
            # for the plan inputs and its directory and context (the same apply again).
            _native.check(L.ddo_setup_profile_apply(self._setup_h, self._cfg.h, self._ck, None,
                                                    None, None),
                          L.ddo_setup_error(self._setup_h))
        inputs = _lib.PlanInputs()
        _native.check(L.ddo_setup_plan_inputs(self._setup_h, ctypes.byref(inputs)),
                      L.ddo_setup_error(self._setup_h))
        self._measured_inputs(inputs)
        self._first_inputs(inputs)
        self._share = _devices.open_share(self._cfg)  # device_mode='split': share mode
        self._store = _devices.open_store(self._cfg, dev, inputs)  # devices=[...]: donor mode
        plan = ctypes.c_void_p()
        key = "" if self._share is None else _devices.fingerprint(
            [(t.name, t.dtype_name, t.shape) for t in self._tensors])
        with _devices.share_step(self._share, "planning", key):  # every rank, or none
            _native.check(L.ddo_setup_plan(self._setup_h, self._ck, self._cfg.h,
                                           ctypes.byref(inputs), ctypes.byref(plan)),
                          L.ddo_setup_error(self._setup_h))
        self._plan = plan
        if self._share is not None:  # every rank runs rank 0's plan
            text = self._share.same_plan(self._plan_json())
            if self._share.plan_replaced:
                theirs = ctypes.c_void_p()
                _native.check(L.ddo_plan_from_json(text.encode(), ctypes.byref(theirs)))
                L.ddo_plan_destroy(plan)
                self._plan = plan = theirs
            self._unit_shares = {}
        self.plan = json.loads(self._plan_json())
        if self._before_session is not None:
            self._before_session(self)
        if self.device.type == "cuda":
            cuda: Any = torch.cuda  # (torch 1.13 leaves init unannotated)
            cuda.init()  # torch's context is the primary one ddo retains
        opts = _lib.SessionOptions()
        opts.config = self._cfg.h
        if self._store is not None:
            opts.store_device = self._store.h
        if self._share is not None:
            opts.share_rank, opts.share_count = self._share.rank, self._share.world
        progress = _talk.Progress(self._label(), self._talk.get("progress"))
        opts.progress = progress.fn
        trace_units: List[str] = []
        if self._trace is not None:
            self._trace_pid = self._trace.process(self._label())
            opts.trace = self._trace.session_fn(self._trace_pid, trace_units)
        s = ctypes.c_void_p()
        try:
            with _devices.share_step(self._share, "creating its session"):
                _native.check(L.ddo_session_create(plan, self._ck, dev, ctypes.byref(opts),
                                                   ctypes.byref(s)))
        finally:
            progress.close()
        self._session = s
        if self._store is not None and self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # the store device's calls bound its context
        self._place()
        trace_units.extend(self._unit_names)
        self._tell_plan()
        self._drop_owned_host()
        self._declare_order()
        self._move_unmanaged()
        self._bind_residents()  # the Parameters let go of the released copies here
        self._make_views()
        self._install_hooks()
        if self.host_bytes_released:
            _trim_host_heap()

    def _reserve_scratch(self) -> None:
        """The plan keeps device memory for the host's dequantization of the largest quantized
        layer (_quant.largest_scratch: its size at the compute dtype), unless the caller set
        dequant_scratch_bytes."""
        n, where = _quant.largest_scratch(self.module)
        self.dequant_scratch = {"bytes": n, "layer": where}
        cfg = self._cfg
        auto = getattr(cfg, "_ddo_auto_scratch", False)
        if (n or auto) and (auto or cfg.source("dequant_scratch_bytes") == "default"):
            cfg.override("dequant_scratch_bytes", str(n))
            setattr(cfg, "_ddo_auto_scratch", True)  # (a later component's setup)

    def _tell_plan(self) -> None:
        """verbose: the plan's summary on stderr; a warning when nothing can stream."""
        b = self.budgets()
        total = sum(_nbytes(t) for t in self._tensors)
        streamed = sum(_nbytes(t) for t in self._tensors if t.placement == _PLACEMENT_STREAMED)
        if self._cfg.get("verbose") == "true":
            print(f"ddo: {self._label()}: route {self.plan.get('route')}, "
                  f"{self._unit_count} units, {len(self._tensors)} tensors "
                  f"({_talk.size(total)}): streamed {_talk.size(streamed)}, resident "
                  f"{_talk.size(b['resident_bytes'])}, {b['slot_count']} slots x "
                  f"{_talk.size(b['slot_bytes'])}; device weights "
                  f"{_talk.size(b['device_weights_peak'])}"
                  f" of {_talk.size(b['device_weights_limit'])}" + (
                      f"; dequantization scratch {_talk.size(self.dequant_scratch['bytes'])} "
                      f"kept ({self.dequant_scratch['layer']})"
                      if self.dequant_scratch["bytes"] else ""), file=sys.stderr)
        if streamed == 0 and b["device_weights_limit"] and total > b["device_weights_limit"]:
            _talk.warn(f"{self._label()}: the plan streams nothing although the model "
                       f"({_talk.size(total)}) exceeds the device budget "
                       f"({_talk.size(b['device_weights_limit'])}): its tensors are under "
                       f"small_tensor_threshold_bytes="
                       f"{self._cfg.get('small_tensor_threshold_bytes')} or not in a unit")
        elif self._unit_count == 0 and total > 0 and self._cfg.source(
                "always_resident_modules_pattern").startswith(("default", "preset")):
            # (a pattern the caller gave that keeps everything resident is not a surprise)
            _talk.warn(f"{self._label()}: no unit to stream was found in {len(self._tensors)} "
                       f"tensors ({_talk.size(total)}): all stay on the device (tensors under "
                       f"small_tensor_threshold_bytes="
                       f"{self._cfg.get('small_tensor_threshold_bytes')}"
                       f" are moved once; ddo streams blocks of nn.ModuleList/nn.Sequential and "
                       f"leaf modules)")

    def _measured_inputs(self, inputs: _lib.PlanInputs) -> None:
        """What a profile measured beyond the setup's rates (ddo_setup_plan_inputs takes its
        bus and compute): the decoder's rate and each unit's compute (docs/plan.md, "Cost
        model")."""
        prof = self._profile
        if prof is not None and not inputs.decode_bytes_per_s > 0 and \
                prof.decode_bytes_per_s > 0:
            inputs.decode_bytes_per_s = prof.decode_bytes_per_s
        # A profile's calibration, else (a re-plan) what the second forward timed.
        from_profile = prof is not None and bool(prof.unit_compute)
        uc = prof.unit_compute if from_profile else getattr(self, "_timed_compute", None)
        self._compute_measured = "profile" if from_profile else "second_forward" if uc else None
        if uc:
            self._unit_compute_text = json.dumps(uc).encode()
            inputs.unit_compute_json = self._unit_compute_text

    def _first_inputs(self, inputs: _lib.PlanInputs) -> None:
        """The device memory in use when the first plan read the device, and what torch's
        allocator held then (the first forward's activation need is measured above it:
        _result_replan); a re-plan plans with the same memory in use (torch's cache then holds
        the first forward's activations, which the measured reserve already counts)."""
        used = getattr(self, "_first_used", None)
        total, free = int(inputs.device_total_bytes), int(inputs.device_free_bytes)
        if used is not None:
            if free > 0:
                inputs.device_free_bytes = max(0, total - used) if total > 0 else free
            return
        # Memory a staged pipeline's other components give back before this session (the
        # stager unloads them) counts as free in the first plan, and is not in use after it.
        room = int(self._device_room()) if self._device_room is not None else 0
        inputs.device_reclaimable_bytes = room
        self._first_used = max(0, total - free - room) if free > 0 and total > free else 0
        cuda: Any = torch.cuda  # (torch 1.13 leaves parts unannotated)
        self._torch_reserved = int(cuda.memory_reserved(self.device)) \
            if self.device is not None and self.device.type == "cuda" else 0

    def _place(self) -> None:
        L = _native.lib()
        loc = _lib.TensorLocation()
        for t in self._tensors:
            _native.check(L.ddo_plan_tensor_location(self._plan, t.index, ctypes.byref(loc)))
            t.placement = loc.placement
            t.unit = loc.unit if loc.placement == _PLACEMENT_STREAMED else None
            t.offset = int(loc.offset)
        self._unit_count = int(L.ddo_plan_unit_count(self._plan))
        self._unit_cuts = {}  # made at a unit's first lease (_result_views)
        self._unit_ps = {}
        self._unit_names = []
        self._unit_tensors = []
        info = _lib.UnitInfo()
        for u in range(self._unit_count):
            _native.check(L.ddo_plan_unit(self._plan, u, ctypes.byref(info)))
            self._unit_names.append(info.name.decode())
            n = ctypes.c_size_t()
            idx = L.ddo_plan_unit_tensors(self._plan, u, ctypes.byref(n))
            members = [self._tensors[idx[k]] for k in range(n.value)]
            self._unit_tensors.append([t for t in members if t.placement == _PLACEMENT_STREAMED])
        # The plan's facts (ddo_plan_info): on the VMM routes a tensor keeps its device address
        # for the whole session, so its views are bound once.
        self._plan_info = _lib.PlanInfo()
        _native.check(L.ddo_plan_info_get(self._plan, ctypes.byref(self._plan_info)))
        self.vmm = bool(self._plan_info.stable_addresses)

    def _declare_order(self) -> None:
        if self._unit_count == 0:
            return
        self._declare(range(self._unit_count))
        self._observed = []
