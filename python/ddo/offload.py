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

import contextlib
import ctypes
import inspect
import json
import sys
import threading
import time
import weakref

import torch

from . import _enums, _lib, _native, _talk, _torch
from ._native import DdoError

_PLACEMENT_RESIDENT = _enums.DDO_PLACEMENT_RESIDENT
_PLACEMENT_STREAMED = _enums.DDO_PLACEMENT_STREAMED
_PLACEMENT_SKIPPED = _enums.DDO_PLACEMENT_SKIPPED
# Modules whose forward reads their children's parameters without calling the children
# (MultiheadAttention reads out_proj.weight; TransformerEncoderLayer's eval fast path reads
# every child's weights in one fused op; the decoder layer has no such path).
_FUSED_READERS = (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)
# Owners freed while DLPack views of their session still lived (kept so views stay valid).
_GRAVEYARD = []
# id of every Parameter a live OffloadResult manages -> (a weak reference to it, a tag naming
# that result): one module tree is managed by one session (its parent or child is refused).
# (Not a WeakKeyDictionary: that compares tensors with ==.)
_MANAGED = {}


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

    def as_dict(self):
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_to_json(
            self._h, self._component.encode() if self._component else None, ctypes.byref(p)))
        d = json.loads(_native.take_text(p))
        if self._binding is not None:
            d["binding"] = dict(self._binding)
        return d

    def get(self, name):
        v = ctypes.c_double()
        _native.check(_native.lib().ddo_metrics_get(self._h, name.encode(), ctypes.byref(v)))
        return v.value

    def format_profile(self, verbose=False):
        """The profile for people: empty keys dropped; the planner's decisions wrapped under
        verbose=True, else one line saying how many there are."""
        p = ctypes.c_void_p()
        _native.check(_native.lib().ddo_metrics_format_profile(self._h, ctypes.byref(p)))
        return _talk.tidy_profile(_native.take_text(p), verbose)

    def record(self, path, component=None):
        """Appends the snapshot as one JSON line to path (record_ddo_metrics)."""
        comp = component or self._component
        _native.check(_native.lib().ddo_metrics_record(
            self._h, comp.encode() if comp else None, str(path).encode()))


@contextlib.contextmanager
def cleanup_boundary(unload, value=None):
    """The seed's error-only boundary (yields value): on an exception, call unload once and
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
                entry = _Param(len(tensors), ddo_name, p.data, None)
                entry.dtype_name = _native.dtype_names()[to_ddo[p.dtype]]
                tensors.append(entry)
                by_storage[key] = entry
            if not any(q is p for q in entry.params):
                entry.params.append(p)
            modules_of.setdefault(id(p), []).append(m)
    return tensors, ddo_path, modules_of


def _check_param(name, p, to_ddo):
    if type(p) is not torch.nn.Parameter or type(p.data) is not torch.Tensor:
        kind = type(p).__name__ if type(p) is not torch.nn.Parameter else type(p.data).__name__
        raise DdoError("DDO_E_UNSUPPORTED",
                       f"parameter {name}: {kind} is a tensor subclass ddo "
                       f"cannot move as plain bytes: route this module through the "
                       f"compatibility route (route='diffusers_group_offload' or 'none')")
    if p.is_quantized or p.is_sparse or p.dtype not in to_ddo:
        raise DdoError("DDO_E_UNSUPPORTED",
                       f"parameter {name}: dtype {p.dtype} ({'quantized' if p.is_quantized else 'no ddo dtype'}) "
                       f"cannot be moved as plain bytes: use the compatibility route "
                       f"(route='diffusers_group_offload' or 'none')")
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
        self._state = "new"
        self._ck = self._dev = self._plan = self._session = None
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
        try:
            self._setup()
        except BaseException:
            self._teardown()
            raise
        module._ddo_offload = self
        self._managed_tag = f"{type(module).__name__} at 0x{id(self):x} (enable_offload)"
        for t in self._tensors:
            for p in t.params:
                _MANAGED[id(p)] = (weakref.ref(p), self._managed_tag)
        self._state = "ready"

    # ---- setup ----

    def _setup(self):
        L = _native.lib()
        to_ddo, _ = _torch.dtype_tables()
        for name, p in self.module.named_parameters():
            if _managed_by(p) is not None:
                raise DdoError("DDO_E_STATE", f"parameter {name} is already managed by ddo "
                               f"through another module of this tree ({_managed_by(p)}): one "
                               f"session per module tree; close() that result first")
        if self._source is not None:
            from . import _source
            self._tensors, self._ddo_path, self._modules_of, self._ck = \
                _source.file_checkpoint(self, self.module, self._source,
                                        self._cfg.get("load_safetensors_backend"))
        else:
            self._tensors, self._ddo_path, self._modules_of = _collect(self.module, to_ddo)
            self._host_checkpoint(to_ddo)
        note = ctypes.create_string_buffer(256)
        dev = ctypes.c_void_p()
        _native.check(L.ddo_device_create_from_config(self._cfg.h, None, ctypes.byref(dev),
                                                      note, 256))
        self._dev = dev
        self.device_note = note.value.decode()
        caps = _lib.DeviceCaps()
        _native.check(L.ddo_device_caps_get(dev, ctypes.byref(caps)), L.ddo_device_error(dev))
        self.device = torch.device("cpu") if caps.is_cpu else torch.device("cuda", caps.ordinal)
        if caps.is_cpu and self.device_note and self._cfg.source("execution_device") == "default":
            # (no component name: a pipeline's components share one warning at the caller's line)
            _talk.warn(f"{self.device_note} (execution_device='cpu' says so and silences this)")
        inputs = _lib.PlanInputs()
        _native.check(L.ddo_plan_inputs_get(dev, ctypes.byref(inputs)))
        self._measured_inputs(inputs)
        plan = ctypes.c_void_p()
        _native.check(L.ddo_plan_build(self._ck, self._cfg.h, ctypes.byref(inputs),
                                       ctypes.byref(plan)))
        self._plan = plan
        self.plan = json.loads(self._plan_json())
        if self._before_session is not None:
            self._before_session(self)
        if self.device.type == "cuda":
            torch.cuda.init()  # torch's context is the primary one ddo retains
        opts = _lib.SessionOptions()
        opts.config = self._cfg.h
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
                  f" of {_talk.size(b['device_weights_limit'])}", file=sys.stderr)
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
        """What a profile measured, where the device reports nothing: the bus and compute
        rates and each unit's compute (docs/plan.md, "Cost model")."""
        prof = self._profile
        if prof is None:
            return
        m = prof.measured or {}
        if not inputs.bus_bytes_per_s > 0 and m.get("bus_bytes_per_s", 0) > 0:
            inputs.bus_bytes_per_s = m["bus_bytes_per_s"]
        if not inputs.flops_per_s > 0 and m.get("flops_per_s", 0) > 0:
            inputs.flops_per_s = m["flops_per_s"]
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
            v = _torch.view(self._session, t.index, t.dtype_name, t.torch_dtype, t.shape)
            self._views[key] = v
        return v

    def _make_views(self):
        """On the VMM routes every streamed tensor's view, made now (an address that stays the
        session's): the first forward then only binds them (creating about 1,200 DLPack views
        costs 7 ms on the build machine's CPU, host time otherwise spent in the first step)."""
        if not self.vmm:
            return
        for t in self._tensors:
            if t.placement == _PLACEMENT_STREAMED:
                self._view(t)

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
            m = self._reader_of(tname, m)
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

    def _reader_of(self, name, m):
        """The outermost ancestor that reads m's parameters itself (MultiheadAttention)."""
        found = m
        parts = name.split(".") if name else []
        for k in range(len(parts)):
            anc = self.module.get_submodule(".".join(parts[:k])) if k else self.module
            if isinstance(anc, _FUSED_READERS):
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
                leaf = self.plan.get("unit_granularity", "block") == "leaf"
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
            self._handles.append(m.register_forward_pre_hook(
                _torch.no_compile(lambda mod, args, units=units: self._enter(units))))
            leave = _torch.no_compile(lambda mod, args, out, units=units: self._leave(units, out))
            self._handles.append(m.register_forward_hook(leave, **(
                {"always_call": True} if _ALWAYS_CALL else {})))
        self._root_units = tuple(root)
        for m in {id(t_m): t_m for t in self._tensors for p in t.params
                  for t_m in self._modules_of.get(id(p), [])}.values():
            self._handles.append(m._register_state_dict_hook(self._state_dict_hook))
        self._refuse_merges()
        self._own_forward = self.module.__dict__.get("forward")  # one a user installed
        orig = self.module.forward
        result = self

        @_torch.no_compile
        def forward(*args, **kwargs):
            result._begin()
            try:
                out = orig(*args, **kwargs)
            except BaseException:
                result._abort()
                raise
            result._end()
            return out

        self.module.forward = forward
        self._orig_forward = orig

    # Methods that write adapters into the weights in place through p.data (not seen by the
    # version counters): refused while ddo manages the module.
    _MERGES = ("fuse_lora", "merge_adapter")

    def _refuse_merges(self):
        self._own_merges = {}
        for name in self._MERGES:
            if not callable(getattr(self.module, name, None)):
                continue
            self._own_merges[name] = self.module.__dict__.get(name)

            def refused(*args, _name=name, **kwargs):
                raise DdoError("DDO_E_STATE", f"{type(self.module).__name__}.{_name}: it writes "
                               f"into the weights in place, and ddo uploads them from the host "
                               f"copy, so the merge would be lost: {_name} before "
                               f"enable_offload (or close(), {_name}, enable_offload again)")

            setattr(self.module, name, refused)

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
                state_dict[key] = t.host if t.host is not None else self._host_back(t)
        return state_dict

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

    def _abort(self):
        """After an error in a root forward: every lease released unchecked, then _let_go."""
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
        L = _native.lib()
        _native.check(L.ddo_session_unload(self._session), L.ddo_session_error(self._session))
        self._state = "unloaded"
        _native.check(L.ddo_session_reload(self._session), L.ddo_session_error(self._session))
        self._state = "ready"
        self._make_views()
        self._bind_residents()

    def _begin(self):
        with self._lock:
            stale = (self._owner is not None and self._owner[0] == threading.get_ident() and
                     self._in_root == 0)
        if stale:  # a unit's module called directly raised (torch without always_call)
            self._abort()
        if self._state != "ready":
            self._refuse()
        self._claim()
        self._in_root += 1
        try:
            if self._in_root == 1:
                self._check_residents()  # a write between forwards, before this one computes
            for u in self._root_units:
                self._acquire(u)
        except BaseException:
            self._abort()
            raise

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
            self._check_residents()
            if self._observed is not None:
                self._declare_observed()
        except BaseException:
            self._abort()
            raise
        self._let_go()

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

    def _enter(self, units):
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
        if self._trace is not None:
            self._trace_t[units] = time.monotonic_ns()
        if self._timing is not None and len(units) == 1:
            self._timing.begin(units[0], self.device)

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
        t0 = time.monotonic_ns() if self._trace is not None else 0
        rc = L.ddo_session_acquire(self._session, u, self._stream())
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
        rc = L.ddo_session_release(self._session, u, self._stream())
        _native.check(rc, L.ddo_session_error(self._session) if rc else None)
        if changed and check:
            raise DdoError("DDO_E_STATE", f"unit {self._unit_names[u]}: a streamed weight was "
                           f"written in place during the forward; ddo re-uploads weights from "
                           f"the host copy, so the change would be lost (merge such changes "
                           f"into the host module before enable_offload); the device copy is "
                           f"restored")

    def _unbind_all(self):
        """Every managed Parameter shows its placeholder (no lease may be held)."""
        for t in self._tensors:
            if t.placement != _PLACEMENT_SKIPPED:
                self._to_placeholder(t)
        self._views.clear()

    # ---- public ----

    def metrics_snapshot(self, collect_completed=False, component=None):
        """A MetricsReport of the session (collect_completed retires finished uploads)."""
        self._alive("metrics_snapshot")
        m = ctypes.c_void_p()
        L = _native.lib()
        _native.check(L.ddo_session_metrics(self._session, bool(collect_completed),
                                            ctypes.byref(m)), L.ddo_session_error(self._session))
        return MetricsReport(m, component, {"unmanaged_bytes": self.unmanaged_bytes,
                                            "unmanaged_tensors": len(self._moved),
                                            "host_bytes_released": self.host_bytes_released})

    def budgets(self):
        """The plan's predicted peaks and limits (bytes), as a dict."""
        self._alive("budgets")
        b = _lib.PlanBudgets()
        _native.check(_native.lib().ddo_plan_budgets_get(self._plan, ctypes.byref(b)))
        return {k: getattr(b, k) for k, _ in _lib.PlanBudgets._fields_}

    def stable_addresses(self):
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

    def cleanup_on_error(self):
        """On an exception: unload once, re-raise the original (a cleanup error becomes a note)."""
        return cleanup_boundary(self.unload, self)

    def unload(self):
        """Frees device weights; a forward raises until reload()."""
        if self._state == "unloaded":
            return
        self._alive("unload")
        for u in list(self._leases):
            self._release(u, check=False, whole=True)
        with self._lock:  # a unit's module that raised outside a forward left its claim
            self._owner, self._frames, self._in_root = None, [], 0
        self._unbind_all()
        self._dirty = False  # reload() uploads every weight from the host copy again
        L = _native.lib()
        _native.check(L.ddo_session_unload(self._session), L.ddo_session_error(self._session))
        self._state = "unloaded"

    def reload(self):
        """Restores the device weights after unload(); forwards are bit-identical again."""
        if self._state == "ready":
            return
        self._alive("reload")
        L = _native.lib()
        _native.check(L.ddo_session_reload(self._session), L.ddo_session_error(self._session))
        self._state = "ready"
        self._make_views()
        self._bind_residents()  # raises, bound, if a weight was written while unloaded

    def close(self):
        """Removes the hooks, ends the session; the module holds its host tensors again."""
        if self._state == "closed":
            return
        if self._session is not None and self._state == "ready":
            for u in list(self._leases):
                self._release(u, check=False, whole=True)
        if self._session is not None and self._cfg.get("show_profile") == "true":
            rep = self.metrics_snapshot(True).format_profile(self._cfg.get("verbose") == "true")
            print(f"[{self._label()}]\n{rep}", file=sys.stderr)
        self._teardown()
        self._state = "closed"
        if self._trace is not None and self._talk.get("trace_owner"):
            self._trace.write()

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
        for name, own in getattr(self, "_own_merges", {}).items():
            self.module.__dict__.pop(name, None)
            if own is not None:
                setattr(self.module, name, own)
        self._own_merges = {}
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
        for item in self._moved:
            if item[0] == "buffer":
                _, m, bname, b = item
                m._buffers[bname] = b
        self._moved = []
        self._views.clear()
        self._placeholders.clear()
        if self.device is not None and self.device.type == "cuda" and self._session is not None:
            torch.cuda.current_stream(self.device).synchronize()
        L = _native.lib()
        alive = L.ddo_session_view_count(self._session) if self._session is not None else 0
        for st in self._streams.values():
            L.ddo_stream_destroy(st)
        self._streams = {}
        if self._session is not None:
            L.ddo_session_destroy(self._session)
        if alive:
            # A view escaped (someone kept p.data of a lease): its session lives on until the
            # view dies, and needs its plan, checkpoint and device (and the host tensors).
            _GRAVEYARD.append((self._plan, self._ck, self._dev, self._tensors))
        else:
            if self._plan is not None:
                L.ddo_plan_destroy(self._plan)
            if self._ck is not None:
                L.ddo_checkpoint_destroy(self._ck)
            if self._dev is not None:
                caps = _lib.DeviceCaps()
                if L.ddo_device_caps_get(self._dev, ctypes.byref(caps)) == 0 and caps.is_cpu:
                    # The cpu device knows exactly what is still allocated: tests check 0.
                    self.device_bytes_after_close = caps.total_bytes - caps.free_bytes
                L.ddo_device_destroy(self._dev)
        self._session = self._plan = self._ck = self._dev = None
        if getattr(self, "_source_restore", None) is not None:  # file-backed: meta again
            self._source_restore()
            self._source_restore = None
        if getattr(self.module, "_ddo_offload", None) is self:
            del self.module._ddo_offload
        if lost is not None:
            raise lost

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        return (f"<OffloadResult {type(self.module).__name__} route={self.plan.get('route')} "
                f"device={self.device} units={self._unit_count} state={self._state}>")
