"""from_pretrained_with_dynamic_offload: a model built on the meta device and associated with
its checkpoint files, so that enable_offload streams it from the files (no CPU copy first).

The model's parameters are created on the meta device (init_empty_weights; buffers stay real,
persistent buffers are read from the files), every parameter is matched to its checkpoint
tensor (names, dtypes, shapes; one line on a mismatch), and the module remembers its source:
``enable_offload(result.module, ...)`` (or ``apply_dynamic=True``) then builds a ddo session
whose checkpoint is the files themselves. Where ``torch_dtype`` differs from a file's dtype the
weights cannot be streamed as stored bytes: the loader reads them into host tensors of the
asked dtype instead and says so (``result.load_note``, a warning).
"""

import contextlib
import os
import warnings

import torch

from . import _native, _source
from .config import DynamicOffloadConfig


@contextlib.contextmanager
def init_empty_weights():
    """Parameters registered inside are created on the meta device (buffers stay real)."""
    orig = torch.nn.Module.register_parameter

    def register(self, name, param):
        orig(self, name, param)
        if param is not None and param.device.type != "meta":
            cls = type(param)
            self._parameters[name] = cls(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = register
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = orig


class DynamicOffloadLoadResult:
    """What from_pretrained_with_dynamic_offload returns (upstream's fields).

    module: the model (meta parameters associated with the files, or host tensors on the
    dtype fallback); source: the checkpoint path; hook: the OffloadResult when apply_dynamic;
    should_move_to_execution_device: True when no ddo session was attached; load_note.
    """

    def __init__(self, module, source, hook=None, load_note="", profile=None):
        self.module = module
        self.source = source
        self.hook = hook
        self.should_move_to_execution_device = hook is None
        self.load_note = load_note
        self._profile = profile

    def profile_run(self):
        if self.hook is not None:
            return self.hook.profile_run()
        return contextlib.nullcontext(self)

    def __repr__(self):
        return (f"<DynamicOffloadLoadResult {type(self.module).__name__} source={self.source} "
                f"hook={'attached' if self.hook is not None else 'none'}>")


def _build(model_loader, path, subfolder, kwargs):
    if model_loader is None:
        try:
            from diffusers import AutoModel as model_loader
        except ImportError as e:
            raise _native.DdoError("DDO_E_UNSUPPORTED", f"from_pretrained_with_dynamic_offload: "
                                   f"no model_loader given and Diffusers' AutoModel cannot be "
                                   f"imported ({e}): pass model_loader=YourModelClass") from None
    with init_empty_weights():
        if hasattr(model_loader, "load_config") and hasattr(model_loader, "from_config"):
            cfg = model_loader.load_config(path, subfolder=subfolder) if subfolder else \
                model_loader.load_config(path)
            return model_loader.from_config(cfg, **kwargs)
        if callable(model_loader):
            return model_loader(**kwargs)
    raise TypeError(f"model_loader must be a class with from_config/load_config or a callable "
                    f"building the model, not {type(model_loader).__name__}")


def materialize(module, source, torch_dtype=None):
    """Reads every meta parameter of module from source into host tensors (the dtype fallback
    and the non-streaming routes): after this the module is an ordinary CPU module."""
    ck = _source.open_checkpoint(source)
    try:
        by_index, loads = _source.match(module, ck, str(source), torch_dtype is None)
        _, to_torch = _source._torch_tables()
        tab = _source.table(ck)
        for i, m, bname, dt, shape in loads:
            m._buffers[bname] = _source.read_tensor(ck, i, dt, shape)
        index_of = {id(p): i for i, ps in by_index.items() for p in ps}

        def read(p):
            i = index_of.get(id(p))
            if i is None:
                return None
            _n, dt, shape, _nb = tab[i]
            t = _source.read_tensor(ck, i, to_torch[dt], shape)
            return t.to(torch_dtype) if torch_dtype is not None and t.dtype != torch_dtype \
                else t

        _source.replace_params(module, read)
    finally:
        _native.lib().ddo_checkpoint_destroy(ck)
    if getattr(module, "_ddo_source", None) is not None:
        del module._ddo_source
    return module


def _checkpoint_path(path, subfolder):
    p = os.path.join(str(path), subfolder) if subfolder else str(path)
    return p


def from_pretrained_with_dynamic_offload(path, *, model_loader=None, dynamic_offload_config=None,
                                         apply_dynamic=False, profile_name=None,
                                         build_profile=None, torch_dtype=None, subfolder=None,
                                         **from_pretrained_kwargs):
    """Builds the model without its weights in host RAM and associates it with the files.

    model_loader: a Diffusers model class (from_config/load_config) or a callable returning
    the model (called with from_pretrained_kwargs); None: Diffusers' AutoModel. apply_dynamic:
    attach the ddo session now (ddo.enable_offload with dynamic_offload_config and the profile
    options); otherwise call ddo.enable_offload(result.module, ...) later. A profile request
    needs apply_dynamic (upstream's rule).
    """
    if (profile_name or build_profile) and not apply_dynamic:
        raise ValueError("profile_name/build_profile need apply_dynamic=True (the profile is "
                         "prepared when the ddo session is attached)")
    if dynamic_offload_config is not None and \
            not isinstance(dynamic_offload_config, DynamicOffloadConfig):
        raise TypeError("dynamic_offload_config must be a ddo.DynamicOffloadConfig")
    source = _checkpoint_path(path, subfolder)
    module = _build(model_loader, path, subfolder, from_pretrained_kwargs)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"the model loader returned {type(module).__name__}, not a "
                        f"torch.nn.Module")
    if torch_dtype is not None:
        module.to(torch_dtype)  # meta parameters: only their dtype changes
    ck = _source.open_checkpoint(source)
    try:
        by_index, _loads = _source.match(module, ck, source, check_dtype=torch_dtype is None)
        tab = _source.table(ck)
    finally:
        _native.lib().ddo_checkpoint_destroy(ck)
    note = ""
    _, to_torch = _source._torch_tables()
    if torch_dtype is not None and any(to_torch[tab[i][1]] != torch_dtype for i in by_index
                                       if to_torch[tab[i][1]].is_floating_point):
        files = sorted({_native.dtype_names()[tab[i][1]] for i in by_index})
        note = (f"torch_dtype {torch_dtype} differs from the checkpoint's {', '.join(files)}: "
                f"the weights were loaded into host tensors (not streamed from the files)")
        warnings.warn(f"ddo: {note}", stacklevel=2)
        materialize(module, source, torch_dtype)
    else:
        _source.load_buffers(module, source)
        module._ddo_source = source
    hook = None
    if apply_dynamic:
        from .routing import enable_offload
        kw = {}
        if profile_name:
            kw["profile_name"] = profile_name
        if build_profile:
            kw["build_profile"] = True
        hook = enable_offload(module, route="dynamic_offload", config=dynamic_offload_config,
                              **kw)
    return DynamicOffloadLoadResult(module, source, hook, note)
