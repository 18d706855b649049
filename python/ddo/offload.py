"""enable_offload: a torch.nn.Module's weights streamed through a ddo session.

How it works (docs/python.md has the whole story):
  - The module's CPU tensors become a ddo checkpoint in host memory (one tensor per storage:
    tied weights are one). The session registers them in place (no second host copy), so the
    copy engine reads the module's own pages; they stay the module's, 1 x the model in RAM.
    With weight_codec the session codes them into host memory of its own instead, and the
    module's copies of the coded tensors are let go (close() reads them back, decoded).
  - The plan's units (blocks or leaves) are found in the module tree. A forward pre-hook on
    each unit's module acquires the unit on torch's current stream and binds its parameters
    to views of ddo's device memory (``param.data = view``: every Parameter keeps its
    identity); the forward hook puts empty placeholders back and releases the unit. Resident
    tensors are bound once; buffers and skipped tensors are moved to the device once.
  - The execution order is declared from the plan; the session prefetches ahead.
"""

from __future__ import annotations

import contextlib
import ctypes
import inspect
import json
import os
import re
import sys
import threading
import time
import weakref
from typing import Any, Callable, ContextManager, Dict, Literal, Optional, TypeVar, Union

import torch

from . import _devices, _enums, _hooks, _lease, _lib, _lora, _native, _quant, _talk, _torch
from ._native import DdoError

_PLACEMENT_RESIDENT = _enums.DDO_PLACEMENT_RESIDENT
_PLACEMENT_STREAMED = _enums.DDO_PLACEMENT_STREAMED
_PLACEMENT_SKIPPED = _enums.DDO_PLACEMENT_SKIPPED
# Modules whose forward reads their children's parameters without calling the children
# (MultiheadAttention reads out_proj.weight; TransformerEncoderLayer's eval fast path reads
# every child's weights in one fused op; the decoder layer has no such path).
_FUSED_READERS = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)
# Sessions closed while DLPack views of them still lived (freed when the last view dies).
_GRAVEYARD = _lease._GRAVEYARD
# id of every Parameter a live OffloadResult manages -> (a weak reference to it, a tag naming
# that result): one module tree is managed by one session (its parent or child is refused).
# (Not a WeakKeyDictionary: that compares tensors with ==.)
_MANAGED: Dict[int, Any] = {}


_FORWARD_CODE = None  # the code of the forward enable_offload installs (_root_on_stack)


_F = TypeVar("_F", bound=Callable[..., Any])


def _shielded(fn: _F) -> _F:
    """fn's state changes whole: a signal inside it is handled at its end (_lease.shield)."""
    def run(*args, **kwargs):
        with _lease.shield():
            return fn(*args, **kwargs)
    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    run.__annotations__ = dict(getattr(fn, "__annotations__", {}))
    run.__wrapped__ = fn  # type: ignore[attr-defined]  # inspect.signature: the real one
    return run  # type: ignore[return-value]


def _managed_by(p):
    """The tag of the result that manages Parameter p (None: none)."""
    entry = _MANAGED.get(id(p))
    return entry[1] if entry is not None and entry[0]() is p else None
# torch >= 2.1 runs a forward hook registered with always_call even when the forward raised.
_ALWAYS_CALL = "always_call" in inspect.signature(torch.nn.Module.register_forward_hook).parameters


class MetricsReport:
    """A metrics snapshot: ``as_dict()`` (the versioned JSON) and ``format_profile()``."""

    def __init__(self, handle, component=None, binding=None):
        self._h = handle
        self._component = component
        self._binding = binding  # what the binding itself did (unmanaged tensors)

    def __del__(self):
        if getattr(self, "_h", None) is not None and _native._LIB is not None:
            _native._LIB.ddo_metrics_destroy(self._h)
            self._h = None

    def as_dict(self) -> Dict[str, Any]:
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_to_json(
            self._h, self._component.encode() if self._component else None, ctypes.byref(p)))
        d = json.loads(_native.take_text(p))
        if self._binding is not None:
            d["binding"] = dict(self._binding)
        return d

    def get(self, name: str) -> float:
        v = ctypes.c_double()
        _native.check(_native.lib().ddo_metrics_get(self._h, name.encode(), ctypes.byref(v)))
        return v.value

    def format_profile(self, verbose: bool = False) -> str:
        """The profile for people: empty keys dropped; the planner's decisions wrapped under
        verbose=True, else one line saying how many there are."""
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_format_profile(self._h, ctypes.byref(p)))
        return _talk.tidy_profile(_native.take_text(p), verbose)

    def record(self, path: Union[str, "os.PathLike[str]"],
               component: Optional[str] = None) -> None:
        """Appends the snapshot as one JSON line to path (record_ddo_metrics)."""
        comp = component or self._component
        _native.check(_native.lib().ddo_metrics_record(
            self._h, comp.encode() if comp else None, str(path).encode()))


@contextlib.contextmanager
def cleanup_boundary(unload, value=None):
    """An error-only boundary (yields value): on an exception, call unload once and
    re-raise the original; a failing unload is attached to it as a note (never replaces it)."""
    try:
        yield value
    except BaseException as e:
        try:
            unload()
        except Exception as ce:  # the original error is what the caller needs
            note = f"ddo cleanup (unload) also failed: {ce}"
            if hasattr(e, "add_note"):
                e.add_note(note)
            else:
                e.__ddo_cleanup_error__ = ce
        raise


class _Param:
    """One ddo tensor and the Parameters (tied ones included) that show it."""
    __slots__ = ("index", "params", "dtype_name", "torch_dtype", "shape", "host", "placement",
                 "unit", "name")

    def __init__(self, index, name, host, dtype_name):
        self.index = index
        self.name = name
        self.params = []
        self.host = host
        self.dtype_name = dtype_name
        self.torch_dtype = host.dtype
        self.shape = tuple(host.shape)
        self.placement = _PLACEMENT_STREAMED
        self.unit = None


def _open_setup(cfg):
    """ddo_setup_create for cfg (execution_device, cuda:0 replaced by cpu when none answers),
    with this process's DDO_PROFILE_DIR and HOME for the profile directory."""
    env = [f"{k}={os.environ[k]}".encode() for k in ("DDO_PROFILE_DIR", "HOME")
           if k in os.environ]
    envp = (ctypes.c_char_p * (len(env) + 1))(*env, None)
    opts = _lib.SetupOptions()
    opts.envp = ctypes.cast(envp, ctypes.POINTER(ctypes.c_char_p))
    h = ctypes.c_void_p()
    _native.check(_native.lib().ddo_setup_create(cfg.h, ctypes.byref(opts), ctypes.byref(h)))
    return h


def _trim_host_heap():
    """Gives the pages of freed host tensors back to the system where the C library can
    (glibc's malloc_trim): torch's tensors of a few MiB live in malloc's heap, whose free
    pages below its top stay in RSS until trimmed. A no-op elsewhere."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)


def _nbytes(t):
    """The bytes of ddo tensor t (its shape and dtype)."""
    n = 1
    for d in t.shape:
        n *= d
    return n * torch.empty(0, dtype=t.torch_dtype).element_size()


def _collect(module, to_ddo):
    """The module's parameters as ddo tensors, deduplicated by storage, with their names.

    Children of an nn.Sequential / nn.ModuleList are named by their index for ddo (so they form
    a block group even when an OrderedDict gave them other names); ddo_names maps back.
    """
    ddo_path = {"": ""}
    for name, m in module.named_modules():
        base = ddo_path.get(name, name)
        if isinstance(m, (torch.nn.Sequential, torch.nn.ModuleList)):
            for i, (cname, _child) in enumerate(m.named_children()):
                full = f"{name}.{cname}" if name else cname
                ddo_path[full] = f"{base}.{i}" if base else str(i)
        for cname, _child in m.named_children():
            full = f"{name}.{cname}" if name else cname
            ddo_path.setdefault(full, f"{base}.{cname}" if base else cname)
    tensors, by_storage, modules_of = [], {}, {}
    for mname, m in module.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            _check_param(full, p, to_ddo)
            key = (p.data_ptr(), p.dtype, tuple(p.shape), tuple(p.stride()))
            entry = by_storage.get(key)
            if entry is None:
                base = ddo_path.get(mname, mname)
                ddo_name = f"{base}.{pname}" if base else pname
                data = _quant.plain_data(p)  # a subclass's bytes; the Parameter is kept
                entry = _Param(len(tensors), ddo_name, data, None)
                entry.dtype_name = _native.dtype_names()[to_ddo[data.dtype]]
                tensors.append(entry)
                by_storage[key] = entry
            if not any(q is p for q in entry.params):
                entry.params.append(p)
            modules_of.setdefault(id(p), []).append(m)
    return tensors, ddo_path, modules_of


_FORWARD_SOURCES = {}


def _forward_source(cls):
    """(source of cls.forward, its first argument's name); ('', '') where there is none:
    read once per class."""
    if cls not in _FORWARD_SOURCES:
        try:
            self_name = next(iter(inspect.signature(cls.forward).parameters), "self")
            _FORWARD_SOURCES[cls] = (inspect.getsource(cls.forward), self_name)
        except (OSError, TypeError, ValueError):
            _FORWARD_SOURCES[cls] = ("", "")
    return _FORWARD_SOURCES[cls]


def _reads_params(anc, rel, params):
    """True when anc's forward reads one of params through an attribute chain under its child
    rel (``F.linear(x, self.qkv.weight)``, torchvision's swin attention): the unit must then be
    acquired by anc, whose forward reads it, not by the child, whose forward never runs."""
    src, me = _forward_source(type(anc))
    if not src:
        return False
    head = r"\b%s\.%s((?:\.\w+)+)" % (re.escape(me), re.escape(rel[0]))
    for m in re.finditer(head, src):
        obj = getattr(anc, rel[0], None)
        for part in m.group(1).split(".")[1:]:
            obj = getattr(obj, part, None)
            if isinstance(obj, torch.nn.Parameter):
                if id(obj) in params:
                    return True
                break
            if not isinstance(obj, torch.nn.Module):
                break
    return False


def _check_param(name, p, to_ddo):
    """One line for a parameter ddo cannot move faithfully (_quant.refusal): Parameter
    subclasses over a plain tensor (GGUFParameter) and float8 dtypes pass."""
    why = _quant.refusal(name, p, to_ddo)
    if why is not None:
        raise DdoError("DDO_E_UNSUPPORTED", why)
    if p.device.type != "cpu":
        raise DdoError("DDO_E_INVALID_ARGUMENT",
                       f"parameter {name} is on {p.device}: enable_offload takes a module whose "
                       f"tensors are on the CPU (call module.to('cpu') first)")
    if not p.is_contiguous():
        raise DdoError("DDO_E_INVALID_ARGUMENT",
                       f"parameter {name} is not contiguous: ddo moves whole contiguous tensors "
                       f"(make it contiguous: p.data = p.data.contiguous())")


class OffloadResult:
    """A module whose weights ddo streams (routing.py: enable_offload, enable_dynamic_offload)."""

    def __init__(self, module, cfg, source=None, profile=None, before_session=None, talk=None):
        self.module = module
        # talk: what the binding says (_talk): {"label", "progress", "trace", "trace_owner"}.
        self._talk = dict(talk or {})
        self._trace = self._talk.get("trace")
        self._trace_pid = 0
        # before_session(self): called once the plan is built, before the session takes any
        # device memory (enable_pipeline_offload's stager makes room for it there).
        self._before_session = before_session
        self._cfg = cfg
        # read now: close() can run from __del__, after the config's own handle is gone
        self._show_profile = (cfg.get("show_profile") == "true", cfg.get("verbose") == "true")
        # profile: what profiles.prepare() found (measured rates and per-unit compute feed
        # the plan's cost model); profile_run() times every unit's forward (_timing).
        self._profile = profile
        self._timing = None
        # source: a checkpoint path (file, sharded index, folder) the module's parameters
        # (meta tensors) are read from, instead of the module's CPU tensors (_source.py).
        self._source = source
        self._lock = threading.Lock()
        self._owner = None  # [thread ident, depth] while a forward or a unit's hook runs
        self._in_root = 0   # root forwards running on the owner thread
        self._frames = []   # the owner's unit frames whose pre-hook succeeded (_enter)
        self._dirty = False  # a device copy was written: restored when no lease is held
        self._handles = []
        self._leases = {}
        self._root_units = ()
        # The first root forward's acquire order (each unit's first acquire): the plan's unit
        # order is declared at setup, and where the forward calls its units in another order
        # (a model's embedders often run in another order than they are declared) the
        # observed one is declared after that forward (_declare_observed). None: not observing.
        self._observed = None
        self._ph_versions = {}  # id(Parameter) -> its version when it got a placeholder
        self._res_versions = []  # (Parameter, version) of the resident tensors bound
        self._own_forward = None
        self._trace_t = {}  # units -> when their compute began (trace=)
        self._own_methods = []  # (module, name, own) of the methods refused while managed
        self._state = "new"
        self._ck = self._dev = self._plan = self._session = self._setup_h = None
        self._store = None  # donor mode's store device (_devices.py)
        self._streams = {}
        self._views = {}
        self._placeholders = {}
        self._moved = []
        self._versions = {}
        # Upstream's result fields (the route layer, routing.py, sets them for its routes).
        self.hook = self
        self.route = "dynamic_offload"
        self.settings = None
        self.should_move_to_execution_device = False
        self.event_payload = {}
        self.device = None
        self.unmanaged_bytes = 0
        self.host_bytes_released = 0
        self.device_bytes_after_close = None
        self.device_note = ""
        self._grad_hooks_armed = False
        self._pid = os.getpid()  # the process whose session this is (fork: _lease)
        self._pinned = {}  # units kept leased in C while a view of them escaped (_release)
        self._entered = set()  # the hooked unit groups entered in this root forward
        self._hooked = []  # (module name, units) of every hooked module but the root
        self._view_ptrs = {}  # storage address of every live view -> its tensor's name
        _lease.sweep()
        # Setup and commit in one shield: an interrupt anywhere in them is raised at its end,
        # inside this try, and the teardown leaves the module exactly as it was.
        try:
            with _lease.shield():
                self._setup()
                module._ddo_offload = self
                self._managed_tag = f"{type(module).__name__} at 0x{id(self):x} " \
                                    f"(enable_offload)"
                for t in self._tensors:
                    for p in t.params:
                        _MANAGED[id(p)] = (weakref.ref(p), self._managed_tag)
                self._state = "ready"
        except BaseException:
            with _lease.shield():
                self._state = "closed"  # never torn down twice (__del__ included)
                self._teardown()
            raise

    # ---- setup ----

    def _setup(self):
        L = _native.lib()
        to_ddo, _ = _torch.dtype_tables()
        for name, p in self.module.named_parameters():
            if _managed_by(p) is not None:
                raise DdoError("DDO_E_STATE", f"parameter {name} is already managed by ddo "
                               f"through another module of this tree ({_managed_by(p)}): one "
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
        self._store = _devices.open_store(self._cfg, dev, inputs)  # devices=[...]: donor mode
        plan = ctypes.c_void_p()
        _native.check(L.ddo_setup_plan(self._setup_h, self._ck, self._cfg.h,
                                       ctypes.byref(inputs), ctypes.byref(plan)),
                      L.ddo_setup_error(self._setup_h))
        self._plan = plan
        self.plan = json.loads(self._plan_json())
        if self._before_session is not None:
            self._before_session(self)
        if self.device.type == "cuda":
            torch.cuda.init()  # torch's context is the primary one ddo retains
        opts = _lib.SessionOptions()
        opts.config = self._cfg.h
        if self._store is not None:
            opts.store_device = self._store.h
        progress = _talk.Progress(self._label(), self._talk.get("progress"))
        opts.progress = progress.fn
        trace_units = []
        if self._trace is not None:
            self._trace_pid = self._trace.process(self._label())
            opts.trace = self._trace.session_fn(self._trace_pid, trace_units)
        s = ctypes.c_void_p()
        try:
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

    def _reserve_scratch(self):
        """The plan keeps device memory for the host's dequantization of the largest quantized
        layer (_quant.largest_scratch: its size at the compute dtype), unless the caller set
        dequant_scratch_bytes."""
        n, where = _quant.largest_scratch(self.module)
        self.dequant_scratch = {"bytes": n, "layer": where}
        cfg = self._cfg
        auto = getattr(cfg, "_ddo_auto_scratch", False)
        if (n or auto) and (auto or cfg.source("dequant_scratch_bytes") == "default"):
            cfg.override("dequant_scratch_bytes", str(n))
            cfg._ddo_auto_scratch = True

    def _label(self):
        return self._talk.get("label") or type(self.module).__name__

    def _tell_plan(self):
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


    def _measured_inputs(self, inputs):
        """What a profile measured beyond the setup's rates (ddo_setup_plan_inputs takes its
        bus and compute): the decoder's rate and each unit's compute (docs/plan.md, "Cost
        model")."""
        prof = self._profile
        if prof is None:
            return
        if not inputs.decode_bytes_per_s > 0 and prof.decode_bytes_per_s > 0:
            inputs.decode_bytes_per_s = prof.decode_bytes_per_s
        if prof.unit_compute:
            self._unit_compute_text = json.dumps(prof.unit_compute).encode()
            inputs.unit_compute_json = self._unit_compute_text

    def _host_checkpoint(self, to_ddo):
        descs = (_lib.TensorDesc * max(1, len(self._tensors)))()
        self._names = []
        self._shapes = []
        for i, t in enumerate(self._tensors):
            shape = (ctypes.c_uint64 * max(1, len(t.shape)))(*t.shape)
            name = t.name.encode()
            self._names.append(name)
            self._shapes.append(shape)
            descs[i].name = name
            descs[i].dtype = to_ddo[t.torch_dtype]
            descs[i].ndim = len(t.shape)
            descs[i].shape = shape
            descs[i].data = t.host.data_ptr() if t.host.numel() > 0 else None
        ck = ctypes.c_void_p()
        _native.check(_native.lib().ddo_checkpoint_create_from_memory_sized(
            descs, len(self._tensors), ctypes.sizeof(_lib.TensorDesc), ctypes.byref(ck)))
        self._ck = ck

    def _plan_json(self):
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_plan_to_json(self._plan, ctypes.byref(p)))
        return _native.take_text(p)

    def _place(self):
        L = _native.lib()
        loc = _lib.TensorLocation()
        for t in self._tensors:
            _native.check(L.ddo_plan_tensor_location(self._plan, t.index, ctypes.byref(loc)))
            t.placement = loc.placement
            t.unit = loc.unit if loc.placement == _PLACEMENT_STREAMED else None
        self._unit_count = L.ddo_plan_unit_count(self._plan)
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

    def _drop_owned_host(self):
        """weight_codec: the tensors the session coded into host memory of its own are never
        read from the module's copies again, so those copies are let go (host RAM then holds
        the coded bytes, not both); close() reads them back, decoded (_host_back)."""
        if self._source is not None:
            return
        L = _native.lib()
        owned = ctypes.c_bool()
        for t in self._tensors:
            if t.placement != _PLACEMENT_STREAMED:
                continue
            _native.check(L.ddo_session_tensor_host_owned(self._session, t.index,
                                                          ctypes.byref(owned)),
                          L.ddo_session_error(self._session))
            if owned.value:
                t.host = None
                self.host_bytes_released += _nbytes(t)

    def _host_back(self, t):
        """A host tensor with t's bytes, read from the session (ddo_session_tensor_read_host)."""
        host = torch.empty(t.shape, dtype=t.torch_dtype)
        L = _native.lib()
        _native.check(L.ddo_session_tensor_read_host(self._session, t.index,
                                                     ctypes.c_void_p(host.data_ptr()),
                                                     _nbytes(t)),
                      L.ddo_session_error(self._session))
        return host

    def _declare_order(self):
        if self._unit_count == 0:
            return
        self._declare(range(self._unit_count))
        self._observed = []

    def _declare(self, units):
        units = list(units)
        order = (ctypes.c_size_t * len(units))(*units)
        _native.check(_native.lib().ddo_session_declare_order(self._session, order, len(units)),
                      _native.lib().ddo_session_error(self._session))

    def _declare_observed(self):
        """After the first root forward that acquired units: where they were acquired in
        another order than the plan's, that order is declared (the units no forward acquired
        after it, in the plan's order). Else the session prefetches by the plan's order at
        every pass: on the VMM routes a unit then misses its prefetch where the order differs,
        and the slots its range maps shift each pass (remaps)."""
        seen, self._observed = self._observed, None
        if not seen:
            self._observed = []  # nothing acquired yet (every unit resident, or none called)
            return
        if seen == sorted(seen):
            return  # the plan's order (units no forward acquired, resident ones, aside)
        seen_set = set(seen)
        self._declare(seen + [u for u in range(self._unit_count) if u not in seen_set])

    def _move_unmanaged(self):
        """Buffers and skipped tensors: moved to the device once (reported in stats())."""
        self.unmanaged_bytes = 0
        for t in self._tensors:
            if t.placement == _PLACEMENT_SKIPPED:
                if t.index in getattr(self, "_file_backed", ()):  # from the file, once
                    t.host = self._source_ck_reader(t)
                dev_t = t.host.to(self.device)
                for p in t.params:
                    p.data = dev_t
                self.unmanaged_bytes += t.host.numel() * t.host.element_size()
                self._moved.append(("param", t))
        for name, m in self.module.named_modules():
            for bname, b in list(m.named_buffers(recurse=False)):
                if b is None or b.device == self.device:
                    continue
                if b.device.type == "meta":
                    full = f"{name}.{bname}" if name else bname
                    raise DdoError("DDO_E_INVALID_ARGUMENT",
                                   f"buffer {full} is on the meta device: ddo moves buffers to "
                                   f"the device once and needs their values (load them first)")
                m._buffers[bname] = b.to(self.device)
                self.unmanaged_bytes += b.numel() * b.element_size()
                self._moved.append(("buffer", m, bname, b))

    def _view(self, t):
        if 0 in t.shape:  # no bytes to back: no DLPack view (torch never frees an empty one)
            v = self._views.get((t.index, None))
            if v is None:
                v = self._views[(t.index, None)] = torch.empty(t.shape, dtype=t.torch_dtype,
                                                              device=self.device)
            return v
        L = _native.lib()
        addr = ctypes.c_void_p()
        if self.vmm or t.placement == _PLACEMENT_RESIDENT:
            key = (t.index, 0)
        else:
            _native.check(L.ddo_session_tensor_address(self._session, t.index,
                                                       ctypes.byref(addr)),
                          L.ddo_session_error(self._session))
            key = (t.index, addr.value)
        v = self._views.get(key)
        if v is None:
            # Every caller holds a shield (_acquire, _bind_residents): the view and its
            # record change together.
            v = _torch.view(self._session, t.index, t.dtype_name, t.torch_dtype, t.shape)
            if t.placement == _PLACEMENT_RESIDENT:
                self._views[key] = v
            # A streamed tensor's view is made per lease and never kept here: at release the
            # binding drops it, and a view still alive then escaped the lease (_release).
            self._view_ptrs[v.data_ptr()] = t.name  # a fresh view starts its storage
        return v

    def _make_views(self):
        """Nothing now: a streamed tensor's view is made per lease (on every route), so a view
        kept past its lease is seen at release (_release); resident views are made when bound.
        (Made once per session on VMM before, 1,200 views cost 7 ms on the build machine's
        CPU: that host time now falls in each pass.)"""

    def _placeholder(self, t):
        ph = self._placeholders.get((t.torch_dtype,))
        if ph is None:
            ph = torch.empty(0, dtype=t.torch_dtype, device=self.device)
            self._placeholders[(t.torch_dtype,)] = ph
        return ph

    def _to_placeholder(self, t):
        """t's Parameters show the empty placeholder; their versions are noted, so a write to
        one outside its lease (it would do nothing) is refused at its next binding."""
        ph = self._placeholder(t)
        for p in t.params:
            p.data = ph
            self._ph_versions[id(p)] = p._version

    def _placeholder_writes(self, tensors):
        """The refusal of writes to tensors' Parameters while they showed the placeholder
        (None: none); each write is refused once."""
        written = []
        for t in tensors:
            for p in t.params:
                before = self._ph_versions.get(id(p))
                if before is not None and p._version != before:
                    written.append(t.name)
                    self._ph_versions[id(p)] = p._version  # refused once, not forever
        if not written:
            return None
        return DdoError("DDO_E_STATE", f"{', '.join(sorted(set(written)))}: written in place "
                        f"while ddo held the weight off the device (outside its forward, where "
                        f"it is an empty placeholder): the write did nothing; merge such "
                        f"changes into the host module before enable_offload")

    def _bind_residents(self):
        err = self._placeholder_writes(
            [t for t in self._tensors if t.placement == _PLACEMENT_RESIDENT])
        self._res_versions = []
        for t in self._tensors:
            if t.placement == _PLACEMENT_RESIDENT:
                v = self._view(t)
                for p in t.params:
                    p.data = v
                    self._res_versions.append((p, p._version, t.name))
            elif t.placement == _PLACEMENT_STREAMED:
                self._to_placeholder(t)
        if getattr(self, "_lora", None) is not None:
            self._lora.bound(self._tensors)  # merged LoRAs replayed on fresh resident copies
        if err is not None:
            raise err

    def _hook_modules(self):
        """hook module -> the units its forward needs (a unit is hooked where it is read)."""
        by_ddo = {v: k for k, v in self._ddo_path.items()}
        needs = {}
        for u, name in enumerate(self._unit_names):
            tname = by_ddo.get(name, name)
            try:
                m = self.module.get_submodule(tname) if tname else self.module
            except AttributeError:
                raise DdoError("DDO_E_INTERNAL", f"unit {name}: no module {tname!r} in "
                               f"{type(self.module).__name__}") from None
            m = self._reader_of(self._caller_of(tname), m)
            needs.setdefault(id(m), (m, []))[1].append(u)
        inside = {}  # unit -> ids of every module under the modules hooked for it
        for m, units in needs.values():
            ids = {id(x) for x in m.modules()}
            for u in units:
                inside.setdefault(u, set()).update(ids)
        # A tied weight read by a module outside its unit: that module needs the unit too.
        for t in self._tensors:
            if t.placement != _PLACEMENT_STREAMED:
                continue
            for p in t.params:
                for m in self._modules_of.get(id(p), []):
                    if id(m) not in inside.get(t.unit, ()):
                        units = needs.setdefault(id(m), (m, []))[1]
                        if t.unit not in units:
                            units.append(t.unit)
        self._shared_readers(needs)
        return list(needs.values())

    def _shared_readers(self, needs):
        """A submodule object in two hooked modules' trees (one module shared by two blocks) is
        named, and its weights placed, under the first: the second hooked module needs that
        unit too, unless a module inside it is hooked for it."""
        hooked_for = {}
        for m, units in needs.values():
            for u in units:
                hooked_for.setdefault(u, set()).add(id(m))
        for m, units in list(needs.values()):
            below = {id(x) for x in m.modules()} - {id(m)}
            for p in m.parameters():
                t = self._entry_of.get(id(p))
                if t is None or t.placement != _PLACEMENT_STREAMED or t.unit in units or \
                        hooked_for.get(t.unit, set()) & below:
                    continue
                units.append(t.unit)

    def _caller_of(self, name):
        """name, or the nearest ancestor with a forward of its own where name's module has
        none (a ModuleList or ModuleDict block: its parent iterates it, so no hook of its
        own would ever run): the unit is bound where its parameters are used."""
        parts = name.split(".") if name else []
        while parts:
            m = self.module.get_submodule(".".join(parts))
            if getattr(type(m).forward, "__name__", "") != "_forward_unimplemented":
                break
            parts.pop()
        return ".".join(parts)

    def _reader_of(self, name, m):
        """The outermost ancestor that reads m's parameters itself (MultiheadAttention)."""
        found = self.module.get_submodule(name) if name else self.module
        parts = name.split(".") if name else []
        mine = {id(p) for p in found.parameters()}
        for k in range(len(parts)):
            anc = self.module.get_submodule(".".join(parts[:k])) if k else self.module
            if isinstance(anc, _FUSED_READERS) or _reads_params(anc, parts[k:], mine):
                return anc
        return found

    def _install_hooks(self):
        root = []
        self._entry_of = {id(p): t for t in self._tensors for p in t.params}
        hooks = self._hook_modules()
        slots = self.budgets()["slot_count"] if self._unit_count else 0
        for m, units in hooks:
            if len(units) > max(slots, 1):
                name = next((n for n, x in self.module.named_modules() if x is m), "?")
                leaf = self._plan_info.unit_granularity == _enums.DDO_UNIT_LEAF
                raise DdoError("DDO_E_BUDGET", f"{type(m).__name__} {name or '(root)'} reads "
                               f"the weights of {len(units)} units at once (its forward reads "
                               f"its children's weights itself) and the plan leases at most "
                               f"{slots}: " + ("use unit_granularity='block' or raise "
                                               "execution_slots" if leaf else
                                               f"raise execution_slots to {len(units)}"))
        for m, units in hooks:
            units = tuple(units)
            if m is self.module:  # acquired by the forward itself, around the whole call
                root.extend(units)
                continue
            self._hooked.append((next((n for n, x in self.module.named_modules() if x is m),
                                      "?"), units))
            leave = _torch.no_compile(lambda mod, args, out, units=units: self._leave(units, out))
            hid = _hooks.post_hook_last(m, leave, self._handles, _ALWAYS_CALL).id
            enter = _torch.no_compile(lambda mod, args, units=units, hid=hid: (
                _hooks.keep_last(mod, hid), self._enter(units, args))[1])
            _hooks.pre_hook_first(m, enter, self._handles)
        self._root_units = tuple(root)
        for m in {id(t_m): t_m for t in self._tensors for p in t.params
                  for t_m in self._modules_of.get(id(p), [])}.values():
            self._handles.append(m._register_state_dict_hook(self._state_dict_hook))
        self._refuse_merges()
        self._refuse_moves()
        self._own_forward = self.module.__dict__.get("forward")  # one a user installed
        orig = self.module.forward
        result = self

        def forward(*args, **kwargs):
            try:  # _begin inside: an interrupt right after it still aborts
                result._begin()
                if torch.is_grad_enabled():  # no view of ddo's memory saved for backward
                    result._arm_grad_hooks()
                    with _lease.saved_tensors(result):
                        out = orig(*args, **kwargs)
                else:
                    out = orig(*args, **kwargs)
            except BaseException as e:
                result._abort()
                result._note_unentered(e)
                raise
            result._end()
            return out

        global _FORWARD_CODE
        _FORWARD_CODE = forward.__code__  # one def: the same code for every result
        forward = _torch.no_compile(forward)
        self._orig_forward = orig  # recorded first: an interrupted setup still undoes it
        self.module.forward = forward

    def _refuse_merges(self):
        """LoRA merges (fuse_lora, merge_adapter, a LoRA layer's merge) are replayed on the
        device copies (_lora.py); other in-place merges stay refused."""
        self._lora = _lora.Lora(self)
        self._lora.install()

    def _refuse_moves(self):
        """A dtype or device move (.to(), .double(), .cuda(), .half(): torch's _apply) or a
        load_state_dict on a managed module would be undone silently at the next binding
        (ddo binds its own device copies): refused with one line on every module that holds
        a managed weight, until close()."""
        mods = {id(self.module): self.module}
        for t in self._tensors:
            for p in t.params:
                for m in self._modules_of.get(id(p), []):
                    mods.setdefault(id(m), m)
        kind = type(self.module).__name__

        def refuse(what):
            def refused(*args, **kwargs):
                raise DdoError("DDO_E_STATE", f"{what} of a module ddo manages ({kind}): ddo "
                               f"binds its own device copies of the weights, so the change "
                               f"would be undone silently; close() the OffloadResult first, "
                               f"change the module, then enable_offload again")
            return refused

        dtypes = {t.torch_dtype for t in self._tensors}
        device = self.device

        def moves_nothing(fn):
            """fn (torch's _apply conversion) leaves every managed dtype on ddo's device."""
            for dt in dtypes:
                out = fn(torch.empty(0, dtype=dt, device=device))
                if out.dtype != dt or out.device != device:
                    return False
            return True

        def casts_in_forward(fn):
            """fn changes dtypes only, and a forward of this result runs on this thread: a
            per-layer upcast (Diffusers' layerwise casting: storage dtype -> compute dtype
            before the layer's forward, back after it). torch rebinds p.data to the converted
            copies (the Parameters are kept); ddo binds its own views again at the unit's next
            acquire and never reads the copies back."""
            with self._lock:
                mine = self._owner is not None and self._owner[0] == threading.get_ident()
            if not mine:
                return False
            for dt in dtypes:
                out = fn(torch.empty(0, dtype=dt, device=device))
                if out.device != device:
                    return False
            self._recast = True  # resident views are bound again after the forward
            return True

        def guard_apply(m, refused):
            def _apply(fn, *args, **kwargs):  # a move to where the module is: allowed
                if moves_nothing(fn) or casts_in_forward(fn):
                    return type(m)._apply(m, fn, *args, **kwargs)
                return refused()
            return _apply

        for m in mods.values():
            for name, what in (("_apply", "a dtype or device move (.to(), .double(), .half(), "
                                "...)"), ("load_state_dict", "load_state_dict")):
                self._own_methods.append((m, name, m.__dict__.get(name)))
                m.__dict__[name] = guard_apply(m, refuse(what)) if name == "_apply" \
                    else refuse(what)

    def _state_dict_hook(self, module, state_dict, prefix, local_metadata):
        """state_dict() of a managed module holds the host values (not the placeholders or
        device views the Parameters show), as the unmanaged module's would; with keep_vars the
        Parameters themselves stay."""
        for pname, p in module._parameters.items():
            key = prefix + pname
            t = self._entry_of.get(id(p))
            if t is None or t.placement == _PLACEMENT_SKIPPED or state_dict.get(key) is p:
                continue
            if key in state_dict:
                state_dict[key] = _quant.detached_like(p, self._host_value(t))
        return state_dict

    def _host_value(self, t):
        """t's real values on the host: the module's copy, the session's (weight_codec), or
        the file's (a module loaded from files holds only empty placeholders)."""
        if t.index in getattr(self, "_file_backed", ()):
            return self._source_ck_reader(t)
        return t.host if t.host is not None else self._host_back(t)

    # ---- leases ----
    #
    # One thread at a time works on the session: the owner, from the first hook or forward
    # that claims it to the last that lets go (depth). The root forward acquires the units
    # hooked on the root module itself around the whole call; other units are acquired by
    # their modules' pre-hooks and released by their forward hooks. A pre-hook that succeeded
    # pushes its units on the owner's frame stack, and only the forward hook of a frame on the
    # stack releases anything (torch >= 2.1 calls always_call hooks after a failed pre-hook
    # too). Any error in a root forward aborts: every lease released, a written device copy
    # restored while the owner still holds the session, then the owner cleared.

    def _stream(self):
        native = _torch.current_stream_handle(self.device)
        st = self._streams.get(native)
        if st is None:
            st = ctypes.c_void_p()
            _native.check(_native.lib().ddo_stream_wrap(
                self._dev, ctypes.c_void_p(native) if native else None, ctypes.byref(st)))
            self._streams[native] = st
        return st

    def _claim(self):
        me = threading.get_ident()
        with self._lock:
            if self._owner is not None and self._owner[0] != me:
                raise DdoError("DDO_E_BUSY", "a forward of this module is already running on "
                               "another thread: one forward at a time per OffloadResult")
            if self._owner is None:
                self._owner = [me, 0]
                self._frames = []
            self._owner[1] += 1

    def _unclaim(self):
        """Ends one claim; the outermost restores a written copy (no lease held) and then lets
        the session go."""
        with self._lock:
            if self._owner is None or self._owner[0] != threading.get_ident():
                return
            self._owner[1] -= 1
            if self._owner[1] > 0:
                return
        self._let_go()

    def _let_go(self):
        """The owner's last step: a written copy restored while it still holds the session,
        then the owner, its frames and root depth cleared."""
        try:
            if self._dirty and not self._leases and self._state == "ready":
                self._restore()
        finally:
            with self._lock:
                self._owner = None
                self._frames = []
                self._in_root = 0

    @_shielded
    def _abort(self):
        """After an error in a root forward: every lease released unchecked, then _let_go."""
        with self._lock:
            mine = self._owner is not None and self._owner[0] == threading.get_ident()
        if not mine or _lease.forked(self._pid):  # another thread's, or a parent's
            return
        if self._observed:
            self._observed = []  # a forward that raised: its order is observed again
        try:
            for u in list(self._leases):
                self._release(u, check=False, whole=True)
        finally:
            self._let_go()

    def _restore(self):
        """A device copy was written in place (refused): the session drops and uploads its
        weights again from the host copy (unload + reload), so later forwards read the
        checkpoint's values, not the refused write. A failed reload leaves the result
        unloaded (reload() tries again)."""
        self._dirty = False
        self._unbind_all()
        self._release_pins()
        if self._pinned or self._escaped_views():  # never free under a live view: later
            self._dirty = True
            self._bind_residents()
            return
        L = _native.lib()
        _native.check(L.ddo_session_unload(self._session), L.ddo_session_error(self._session))
        self._state = "unloaded"
        _native.check(L.ddo_session_reload(self._session), L.ddo_session_error(self._session))
        self._state = "ready"
        self._make_views()
        self._bind_residents()

    def _root_on_stack(self):
        """A root forward of this result is running on this thread's stack (its frame is
        live): else a root depth left over (an interrupt that landed where no handler could
        release) is stale."""
        f = sys._getframe(2)
        while f is not None:
            if f.f_code is _FORWARD_CODE and f.f_locals.get("result") is self:
                return True
            f = f.f_back
        return False

    @_shielded
    def _begin(self):
        _lease.check_fork(self._pid, f"{type(self.module).__name__} forward")
        with self._lock:
            mine = self._owner is not None and self._owner[0] == threading.get_ident()
        stale = mine and (self._in_root == 0 or not self._root_on_stack())
        if stale:  # a unit's module called directly raised (torch without always_call)
            self._abort()
        if self._state != "ready":
            self._refuse()
        self._claim()
        self._in_root += 1
        try:
            if self._in_root == 1:
                self._entered = set()
                self._release_pins()
                if self._dirty and not self._leases:  # a restore a live view put off
                    self._restore()
                self._check_residents()  # a write between forwards, before this one computes
            for u in self._root_units:
                self._acquire(u)
        except BaseException:
            self._abort()
            raise

    @_shielded
    def _end(self):
        """The root forward returned: its units released (checked), the residents checked; the
        outermost root forward ends every claim made inside it (a unit's module that raised
        inside and was caught keeps none)."""
        try:
            self._release_all(reversed(self._root_units))
            self._in_root -= 1
            if self._in_root > 0:
                self._unclaim()
                return
            for u in list(self._leases):  # left by a hook that did not run
                self._release(u, check=False, whole=True)
            if getattr(self, "_recast", False):
                self._rebind_recast()
            self._check_residents()
            if self._observed is not None:
                self._declare_observed()
        except BaseException:
            self._abort()
            raise
        self._let_go()

    def _rebind_recast(self):
        """Resident Parameters a per-layer cast left on torch's converted copies show ddo's
        resident views again (the copies are freed; the values are the same bytes)."""
        self._recast = False
        for t in self._tensors:
            if t.placement != _PLACEMENT_RESIDENT:
                continue
            v = self._views.get((t.index, 0))
            for p in t.params:
                if v is not None and (p.dtype != v.dtype or p.data_ptr() != v.data_ptr()):
                    p.data = v

    def _check_residents(self):
        written = sorted({name for p, v, name in self._res_versions if p._version != v})
        if written:
            self._res_versions = [(p, p._version, name) for p, _v, name in self._res_versions]
            self._dirty = True
            raise DdoError("DDO_E_STATE", f"{', '.join(written)}: a resident weight was written "
                           f"in place; ddo uploads weights from the host copy, so the change "
                           f"would be lost at the next reload (merge such changes into the "
                           f"host module before enable_offload); the device copy is restored")

    def _refuse(self):
        if self._state == "unloaded":
            raise DdoError("DDO_E_STATE", f"{type(self.module).__name__}: ddo unloaded its "
                           f"weights: call reload() before a forward")
        raise DdoError("DDO_E_STATE", f"{type(self.module).__name__}: this OffloadResult is "
                       f"closed: its module runs unmanaged again only through its own forward")

    @_shielded
    def _enter(self, units, args=()):
        _lease.check_fork(self._pid, f"{type(self.module).__name__} forward")
        if self._in_root == 0 and _lease.needs_grad(
                args, [p for u in units for t in self._unit_tensors[u] for p in t.params]):
            raise DdoError("DDO_E_UNSUPPORTED", f"unit {self._unit_names[units[0]]} called "
                           f"outside its module's forward with grad mode on: "
                           f"{_lease.INFERENCE_ONLY}")
        self._claim()
        acquired = []
        try:
            if self._state != "ready":
                self._refuse()
            if _torch.capturing(self.device):
                raise DdoError("DDO_E_STATE", "acquire inside a CUDA-graph capture: ddo cannot "
                               "upload weights while a graph is captured (capture the compiled "
                               "blocks, not the hooks)")
            for u in units:
                self._acquire(u)
                acquired.append(u)
        except BaseException:
            for u in reversed(acquired):
                self._release(u, check=False)
            self._unclaim()
            raise
        self._frames.append(units)
        self._entered.add(units)
        if self._trace is not None:
            self._trace_t[units] = time.monotonic_ns()
        if self._timing is not None and len(units) == 1:
            self._timing.begin(units[0], self.device)

    @_shielded
    def _leave(self, units, out=None):
        with self._lock:
            mine = self._owner is not None and self._owner[0] == threading.get_ident()
        if not mine or not self._frames or self._frames[-1] is not units:
            return  # its pre-hook did not succeed (refused, or an earlier pre-hook raised)
        self._frames.pop()
        if self._trace is not None and units in self._trace_t:
            self._trace.span(self._trace_pid, _talk.TID_COMPUTE,
                             "+".join(self._unit_names[u] for u in units), "compute",
                             self._trace_t.pop(units), time.monotonic_ns())
        failed = out is None and sys.exc_info()[0] is not None  # always_call after a raise
        if self._timing is not None and len(units) == 1 and not failed:
            self._timing.end(units[0], self.device)
        try:
            self._release_all(reversed(units), check=not failed)
        finally:
            self._unclaim()

    def _release_all(self, units, check=True):
        """Releases each unit once; the first refusal is raised after all were released."""
        first = None
        for u in units:
            try:
                self._release(u, check=check)
            except DdoError as e:
                first = first or e
        if first is not None:
            raise first

    def _acquire(self, u):
        n = self._leases.get(u, 0)
        if n > 0:
            self._leases[u] = n + 1
            return
        err = self._placeholder_writes(self._unit_tensors[u])
        if err is not None:
            raise err
        L = _native.lib()
        if self._pinned.pop(u, None) is None:  # a pinned unit is still leased in C
            t0 = time.monotonic_ns() if self._trace is not None else 0
            rc = L.ddo_session_acquire(self._session, u, self._stream())
            if rc != 0 and self._pinned and _native.error_name(rc) == "DDO_E_BUSY":
                raise DdoError("DDO_E_BUSY", f"acquire {self._unit_names[u]}: every execution "
                               f"slot is leased, {len(self._pinned)} of them by units whose "
                               f"weights are still viewed outside their forward "
                               f"({', '.join(self._unit_names[k] for k in self._pinned)}): drop "
                               f"those tensors (or keep .clone()s)")
            _native.check(rc, L.ddo_session_error(self._session) if rc else None)
            if self._trace is not None:
                self._trace.span(self._trace_pid, _talk.TID_ACQUIRE, self._unit_names[u],
                                 "acquire", t0, time.monotonic_ns())
        self._leases[u] = 1
        if self._observed is not None and u not in self._observed:
            self._observed.append(u)
        for t in self._unit_tensors[u]:
            v = self._view(t)
            for p in t.params:
                p.data = v
        if getattr(self, "_lora", None) is not None:
            self._lora.bound(self._unit_tensors[u])  # merged LoRAs replayed on fresh copies
        self._versions[u] = [p._version for t in self._unit_tensors[u] for p in t.params]

    def _release(self, u, check=True, whole=False):
        """One lease of u ends (whole: every one); the last checks the unit's versions."""
        n = self._leases.get(u, 0)
        if n == 0:
            return
        if n > 1 and not whole:
            self._leases[u] = n - 1
            return
        del self._leases[u]
        written = [p for t in self._unit_tensors[u] for p in t.params]
        before = self._versions.pop(u, None)
        changed = before is not None and [p._version for p in written] != before
        for t in self._unit_tensors[u]:
            self._to_placeholder(t)
        if changed:
            self._dirty = True  # restored when no lease is held (_unclaim, _abort)
        L = _native.lib()
        if any(L.ddo_session_tensor_view_count(self._session, t.index)
               for t in self._unit_tensors[u]):
            # A view of the unit escaped its lease (a hook, a cache kept p.data): the unit
            # stays leased in C, so its memory is neither reused nor remapped while the view
            # lives; released once it died (_release_pins), or re-leased by its next forward.
            self._pinned[u] = True
        else:
            rc = L.ddo_session_release(self._session, u, self._stream())
            _native.check(rc, L.ddo_session_error(self._session) if rc else None)
        if changed and check:
            raise DdoError("DDO_E_STATE", f"unit {self._unit_names[u]}: a streamed weight was "
                           f"written in place during the forward; ddo re-uploads weights from "
                           f"the host copy, so the change would be lost (merge such changes "
                           f"into the host module before enable_offload); the device copy is "
                           f"restored")

    def _release_pins(self):
        """Units kept leased for an escaped view: released in C once their views died."""
        L = _native.lib()
        for u in list(self._pinned):
            if not any(L.ddo_session_tensor_view_count(self._session, t.index)
                       for t in self._unit_tensors[u]):
                del self._pinned[u]
                _native.check(L.ddo_session_release(self._session, u, self._stream()),
                              L.ddo_session_error(self._session))

    def _unbind_all(self):
        """Every managed Parameter shows its placeholder (no lease may be held)."""
        for t in self._tensors:
            if t.placement != _PLACEMENT_SKIPPED:
                self._to_placeholder(t)
        self._views.clear()
        self._view_ptrs.clear()

    def _escaped_views(self):
        """DLPack views of the session alive beyond the binding's own (self._views): a tensor
        derived from a weight that someone (a hook, a cache, autograd) still holds."""
        if self._session is None:
            return 0
        own = sum(1 for k in self._views if k[1] is not None)
        return max(0, _native.lib().ddo_session_view_count(self._session) - own)

    # ---- public ----

    def metrics_snapshot(self, collect_completed: bool = False,
                         component: Optional[str] = None) -> MetricsReport:
        """A MetricsReport of the session (collect_completed retires finished uploads)."""
        self._alive("metrics_snapshot")
        m = ctypes.c_void_p()
        L = _native.lib()
        _native.check(L.ddo_session_metrics(self._session, bool(collect_completed),
                                            ctypes.byref(m)), L.ddo_session_error(self._session))
        return MetricsReport(m, component, {"unmanaged_bytes": self.unmanaged_bytes,
                                            "unmanaged_tensors": len(self._moved),
                                            "host_bytes_released": self.host_bytes_released})

    def budgets(self) -> Dict[str, int]:
        """The plan's predicted peaks and limits (bytes), as a dict."""
        self._alive("budgets")
        b = _lib.PlanBudgets()
        _native.check(_native.lib().ddo_plan_budgets_get(self._plan, ctypes.byref(b)))
        return {k: getattr(b, k) for k, _ in _lib.PlanBudgets._fields_}

    def stable_addresses(self) -> Dict[str, Optional[int]]:
        """tensor name -> session-long device address on the VMM routes ({} on linear)."""
        self._alive("stable_addresses")
        if not self.vmm:
            return {}
        out = {}
        addr = ctypes.c_void_p()
        L = _native.lib()
        for t in self._tensors:
            if t.placement == _PLACEMENT_SKIPPED:
                continue
            _native.check(L.ddo_session_tensor_stable_address(self._session, t.index,
                                                              ctypes.byref(addr)),
                          L.ddo_session_error(self._session))
            out[t.name] = addr.value
        return out

    def cleanup_on_error(self) -> ContextManager[OffloadResult]:
        """On an exception: unload once, re-raise the original (a cleanup error becomes a note)."""
        return cleanup_boundary(self.unload, self)

    @_shielded
    def unload(self, release_host: bool = False) -> None:
        """Frees device weights; a forward raises until reload(). release_host=True frees the
        retained host store too (an inactive expert holds no RAM); reload() reads it again."""
        if self._state == "unloaded":
            if release_host:
                self._alive("unload")
                L = _native.lib()
                _native.check(L.ddo_session_release_host(self._session),
                              L.ddo_session_error(self._session))
            return
        self._alive("unload")
        self._not_in_forward("unload")
        for u in list(self._leases):
            self._release(u, check=False, whole=True)
        with self._lock:  # a unit's module that raised outside a forward left its claim
            self._owner, self._frames, self._in_root = None, [], 0
        self._unbind_all()
        self._release_pins()
        escaped = self._escaped_views()
        if escaped:  # never free under a live view: refused, the weights bound again
            self._make_views()
            self._bind_residents()
            raise DdoError("DDO_E_BUSY", f"unload: {escaped} view(s) of ddo's weight memory "
                           f"are still alive (a tensor derived from a weight, kept by a hook, "
                           f"a cache or an autograd graph); unloading would free memory they "
                           f"read: drop them (or keep .clone()s) and call unload() again")
        self._dirty = False  # reload() uploads every weight from the host copy again
        L = _native.lib()
        fn = L.ddo_session_release_host if release_host else L.ddo_session_unload
        _native.check(fn(self._session), L.ddo_session_error(self._session))
        self._state = "unloaded"

    @_shielded
    def reload(self) -> None:
        """Restores the device weights after unload(); forwards are bit-identical again."""
        if self._state == "ready":
            return
        self._alive("reload")
        L = _native.lib()
        _native.check(L.ddo_session_reload(self._session), L.ddo_session_error(self._session))
        self._state = "ready"
        self._make_views()
        self._bind_residents()  # raises, bound, if a weight was written while unloaded

    @_shielded
    def close(self) -> None:
        """Removes the hooks, ends the session; the module holds its host tensors again."""
        if self._state == "closed":
            return
        if not _lease.forked(self._pid):
            self._not_in_forward("close")
        if self._session is not None and self._state == "ready" and not _lease.forked(self._pid):
            for u in list(self._leases):
                self._release(u, check=False, whole=True)
        if self._session is not None and self._show_profile[0]:
            rep = self.metrics_snapshot(True).format_profile(self._show_profile[1])
            print(f"[{self._label()}]\n{rep}", file=sys.stderr)
        self._teardown()
        self._state = "closed"
        if self._trace is not None and self._talk.get("trace_owner"):
            self._trace.write()

    def _arm_grad_hooks(self):
        """A gradient for a managed weight raises one clear error (_lease.INFERENCE_ONLY).
        Registered at the first forward run with grad mode on, so a module used for inference
        only (torch.compile included) never carries a tensor hook."""
        if self._grad_hooks_armed:
            return
        with _lease.shield():
            for t in self._tensors:
                if t.placement != _PLACEMENT_SKIPPED:
                    for p in t.params:
                        if p.requires_grad:
                            self._handles.append(p.register_hook(_lease.refuse_grad))
            self._grad_hooks_armed = True

    def _note_unentered(self, e):
        """A failed forward in which hooked modules never ran: their weights were off the
        device (empty placeholders) if a parent read them itself; the error says which."""
        if not isinstance(e, RuntimeError) or isinstance(e, DdoError):
            return
        missing = [name for name, units in self._hooked if units not in self._entered]
        if not missing:
            return
        note = (f"ddo: the forward failed while these modules' forwards had not run, so their "
                f"streamed weights were off the device: {', '.join(missing[:6])}"
                f"{' ...' if len(missing) > 6 else ''}; if a parent module reads their weights "
                f"itself (a functional call), enable_offload with unit_granularity='block' "
                f"so the unit is the parent, or list the parent in always_resident_modules_pattern")
        if hasattr(e, "add_note"):
            e.add_note(note)
        else:
            e.args = (f"{e.args[0] if e.args else ''}\n{note}",) + tuple(e.args[1:])

    def _not_in_forward(self, what):
        """Refuses what while a forward of the module runs (on any thread)."""
        with self._lock:
            owner = self._owner
        if owner is None:
            return
        if owner[0] == threading.get_ident() and not self._root_on_stack():
            self._abort()  # a claim left by an interrupt or a unit called alone: no forward
            return
        raise DdoError("DDO_E_BUSY", f"{what}: a forward of {type(self.module).__name__} "
                       f"is running; call {what}() after it returns")

    def __del__(self):
        """A result dropped without close() (its module dropped too): its session, threads
        and device memory end here."""
        try:
            if getattr(self, "_state", "closed") != "closed" and _native._LIB is not None:
                self.close()
        except Exception:
            pass

    def _alive(self, what):
        if self._state == "closed":
            raise DdoError("DDO_E_STATE", f"{what}: this OffloadResult is closed")

    def _teardown(self):
        for h in self._handles:
            h.remove()
        self._handles = []
        if getattr(self, "_orig_forward", None) is not None:
            try:
                del self.module.forward
            except AttributeError:
                pass
            if self._own_forward is not None:  # a forward the user had installed
                self.module.forward = self._own_forward
            self._orig_forward = None
        lora = getattr(self, "_lora", None)
        if lora is not None:
            lora.teardown()
        for m, name, own in reversed(self._own_methods):
            m.__dict__.pop(name, None)
            if own is not None:
                m.__dict__[name] = own
        self._own_methods = []
        tag = getattr(self, "_managed_tag", None)
        for t in getattr(self, "_tensors", []):
            for p in t.params:
                if tag is not None and _managed_by(p) == tag:
                    del _MANAGED[id(p)]
        lost = None
        for t in getattr(self, "_tensors", []):
            if t.host is None and t.params:  # the session's own copy (weight_codec)
                try:
                    t.host = self._host_back(t)
                except DdoError as e:  # the rest is still torn down; this is raised after
                    lost = lost or e
                    continue
            for p in t.params:
                p.data = t.host
        if lora is not None and not _lease.forked(self._pid):
            try:
                lora.host_copies()  # merged LoRAs: host copies with them (_lora.py)
            except Exception as e:  # the rest is still torn down; this is raised after
                lost = lost or e
        for item in self._moved:
            if item[0] == "buffer":
                _, m, bname, b = item
                m._buffers[bname] = b
        self._moved = []
        self._views.clear()
        self._placeholders.clear()
        if self.device is not None and self.device.type == "cuda" and self._session is not None:
            torch.cuda.current_stream(self.device).synchronize()
        self._view_ptrs.clear()
        if _lease.forked(self._pid):  # the parent's session: its threads are not here; let it be
            self._session = self._plan = self._ck = self._dev = self._setup_h = None
            self._streams = {}
        L = _native.lib()
        alive = L.ddo_session_view_count(self._session) if self._session is not None else 0
        for st in self._streams.values():
            L.ddo_stream_destroy(st)
        self._streams = {}
        if alive:
            # A view escaped (someone kept p.data of a lease): its session lives on until the
            # view dies, with its plan, checkpoint and setup (its device; and the host
            # tensors); the next enable, close or exit after that frees them (_lease.sweep).
            _lease.bury((self._session, self._plan, self._ck, self._setup_h,
                         (self._tensors, self._store)))  # the store closes after the session
        else:
            if self._session is not None:
                L.ddo_session_destroy(self._session)
            if self._plan is not None:
                L.ddo_plan_destroy(self._plan)
            if self._ck is not None:
                L.ddo_checkpoint_destroy(self._ck)
            if self._dev is not None:
                caps = _lib.DeviceCaps()
                if L.ddo_device_caps_get(self._dev, ctypes.byref(caps)) == 0 and caps.is_cpu:
                    # The cpu device knows exactly what is still allocated: tests check 0.
                    self.device_bytes_after_close = caps.total_bytes - caps.free_bytes
            if self._setup_h is not None:
                L.ddo_setup_destroy(self._setup_h)  # and its device
            if self._store is not None:
                self._store.close()
        self._store = None
        self._session = self._plan = self._ck = self._dev = self._setup_h = None
        if getattr(self, "_source_restore", None) is not None:  # file-backed: meta again
            self._source_restore()
            self._source_restore = None
        if getattr(self.module, "_ddo_offload", None) is self:
            del self.module._ddo_offload
        if lost is not None:
            raise lost

    def __enter__(self) -> OffloadResult:
        return self

    def __exit__(self, *exc: Any) -> Literal[False]:
        self.close()
        return False

    def __repr__(self):
        return (f"<OffloadResult {type(self.module).__name__} route={self.plan.get('route')} "
                f"device={self.device} units={self._unit_count} state={self._state}>")
