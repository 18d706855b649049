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

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from typing import Any, Callable, ContextManager, Dict, Iterator, Optional, Tuple, Union

import torch

from . import _native, _source
from .config import DynamicOffloadConfig


@contextlib.contextmanager
def init_empty_weights() -> Iterator[None]:
    """Parameters registered inside are created on the meta device (buffers stay real)."""
    orig = torch.nn.Module.register_parameter

    def register(self: torch.nn.Module, name: str, param: Optional[torch.nn.Parameter]) -> None:
        orig(self, name, param)
        if param is not None and param.device.type != "meta":
            cls = type(param)
            if _source._quant_subclass(param):  # GGUF-style: its type and attributes kept
                self._parameters[name] = _source._like(param, _source._quant_plain(param)
                                                       .to("meta"))
            else:
                self._parameters[name] = cls(param.to("meta"),
                                             requires_grad=param.requires_grad)

    setattr(torch.nn.Module, "register_parameter", register)
    try:
        yield
    finally:
        setattr(torch.nn.Module, "register_parameter", orig)


class DynamicOffloadLoadResult:
    """What from_pretrained_with_dynamic_offload returns (upstream's fields).

    module: the model (meta parameters associated with the files, or host tensors on the
    dtype fallback or from a from_pretrained loader); source: the checkpoint path (None when
    the loader read the weights itself); hook: the OffloadResult when apply_dynamic;
    should_move_to_execution_device: True when no ddo session was attached; load_note.
    """

    def __init__(self, module: torch.nn.Module, source: Optional[str], hook: Any = None,
                 load_note: str = "", profile: Any = None) -> None:
        self.module = module
        self.source = source
        self.hook = hook
        self.should_move_to_execution_device = hook is None
        self.load_note = load_note
        self._profile = profile

    def profile_run(self) -> ContextManager[Any]:
        if self.hook is not None:
            run: ContextManager[Any] = self.hook.profile_run()
            return run
        return contextlib.nullcontext(self)

    def __repr__(self) -> str:
        return (f"<DynamicOffloadLoadResult {type(self.module).__name__} source={self.source} "
                f"hook={'attached' if self.hook is not None else 'none'}>")


LOADER_SHAPES = ("a Diffusers model class (load_config/from_config: built on the meta device), "
                 "an object with from_pretrained(path, **kwargs) (upstream's loader: it reads "
                 "the weights), or a callable loader(path, **kwargs) returning the model "
                 "(called with its parameters on the meta device)")


def _build(model_loader: Any, path: Any, subfolder: Optional[str], torch_dtype: Optional[torch.dtype],
           kwargs: Dict[str, Any]) -> Tuple[torch.nn.Module, str]:
    """(module, how): the model from model_loader by the loader contract
    (getattr(model_loader, "from_pretrained", model_loader)(path, **kwargs)), on the meta
    device where the loader lets ddo build it without its weights."""
    if model_loader is None:
        try:
            from diffusers import AutoModel
            model_loader = AutoModel
        except Exception as e:  # a broken install raises more than ImportError
            raise _native.DdoError("DDO_E_UNSUPPORTED", f"from_pretrained_with_dynamic_offload: "
                                   f"no model_loader given and Diffusers' AutoModel cannot be "
                                   f"imported ({_native.exc_line(e)}): pass "
                                   f"model_loader=YourModelClass") from None
    if hasattr(model_loader, "load_config") and hasattr(model_loader, "from_config"):
        with init_empty_weights():
            cfg = model_loader.load_config(path, subfolder=subfolder) if subfolder else \
                model_loader.load_config(path)
            return model_loader.from_config(cfg, **kwargs), "from_config"
    # Upstream's loader gets every keyword the caller gave, subfolder and torch_dtype included.
    call_kw = dict(kwargs)
    if subfolder is not None:
        call_kw["subfolder"] = subfolder
    if torch_dtype is not None:
        call_kw["torch_dtype"] = torch_dtype
    from_pretrained = getattr(model_loader, "from_pretrained", None)
    if from_pretrained is not None and callable(from_pretrained):
        _check_callable(from_pretrained, path, call_kw, "model_loader.from_pretrained")
        return from_pretrained(path, **call_kw), "from_pretrained"
    if callable(model_loader):
        _check_callable(model_loader, path, call_kw, "model_loader")
        with init_empty_weights():
            return model_loader(path, **call_kw), "callable"
    raise TypeError(f"from_pretrained_with_dynamic_offload: model_loader must be "
                    f"{LOADER_SHAPES}; {type(model_loader).__name__} is none of them")


def _check_callable(fn: Callable[..., Any], path: Any, kw: Dict[str, Any], what: str) -> None:
    """One line when fn cannot be called as fn(path, **kw) (checked before calling it)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: just call it
        return
    try:
        sig.bind(path, **kw)
    except TypeError as e:
        raise TypeError(f"from_pretrained_with_dynamic_offload: {what} cannot be called as "
                        f"{what}(path{''.join(', ' + k + '=...' for k in kw)}) ({e}); "
                        f"model_loader must be {LOADER_SHAPES}") from None


def materialize(module: torch.nn.Module, source: Any,
                torch_dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
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

        def read(p: torch.nn.Parameter) -> Optional[torch.Tensor]:
            i = index_of.get(id(p))
            if i is None:
                return None
            _n, dt, shape, _nb = tab[i]
            t = _source.read_tensor(ck, i, _source.torch_dtype_of(dt, to_torch),
                                    _source.stored_shape(dt, shape))
            return t.to(torch_dtype) if torch_dtype is not None and t.dtype != torch_dtype \
                else t

        _source.replace_params(module, read)
    finally:
        _native.lib().ddo_checkpoint_destroy(ck)
    if getattr(module, "_ddo_source", None) is not None:
        del module._ddo_source
    return module


def _checkpoint_path(path: Any, subfolder: Optional[str]) -> str:
    p = os.path.join(str(path), subfolder) if subfolder else str(path)
    return p


def from_pretrained_with_dynamic_offload(
        path: Union[str, "os.PathLike[str]"], *, model_loader: Any = None,
        dynamic_offload_config: Optional[DynamicOffloadConfig] = None,
        apply_dynamic: bool = False, profile_name: Optional[str] = None,
        build_profile: Optional[bool] = None, torch_dtype: Optional[torch.dtype] = None,
        subfolder: Optional[str] = None,
        **from_pretrained_kwargs: Any) -> DynamicOffloadLoadResult:
    """Builds the model without its weights in host RAM and associates it with the files.

    model_loader, in upstream's contract (getattr(model_loader, "from_pretrained",
    model_loader)(path, **from_pretrained_kwargs), subfolder and torch_dtype included):
      - a Diffusers model class (load_config/from_config; None: Diffusers' AutoModel): built
        with from_config(load_config(path)) on the meta device, associated with the files;
      - an object with from_pretrained(path, **kwargs): called as upstream does; it reads the
        weights into host tensors, which enable_offload streams from host memory (the files
        are not associated; load_note says so);
      - a callable loader(path, **kwargs): called with its parameters created on the meta
        device, and associated with the files.
    Anything else, or a callable that cannot take (path, **kwargs), is refused with one line
    naming these shapes. apply_dynamic: attach the ddo session now (ddo.enable_dynamic_offload
    with dynamic_offload_config and the profile options, which the loader never sees);
    otherwise call ddo.enable_offload(result.module, ...) later. A profile request needs
    apply_dynamic (upstream's rule).
    """
    if (profile_name or build_profile) and not apply_dynamic:
        raise ValueError("profile_name/build_profile need apply_dynamic=True (the profile is "
                         "prepared when the ddo session is attached)")
    if dynamic_offload_config is not None and \
            not isinstance(dynamic_offload_config, DynamicOffloadConfig):
        raise TypeError("dynamic_offload_config must be a ddo.DynamicOffloadConfig")
    source = _checkpoint_path(path, subfolder)
    module, how = _build(model_loader, path, subfolder, torch_dtype, from_pretrained_kwargs)
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"the model loader returned {type(module).__name__}, not a "
                        f"torch.nn.Module")
    if not any(p.device.type == "meta" for p in module.parameters()):
        # The loader read the weights itself (from_pretrained): an ordinary host module,
        # which enable_offload streams from host memory; the files are not associated.
        note = (f"model_loader.{how} loaded the weights into host tensors: they are streamed "
                f"from host memory, not from the files") if how != "callable" else \
            "model_loader returned host tensors: they are streamed from host memory"
        hook = _attach(module, apply_dynamic, dynamic_offload_config, profile_name,
                       build_profile)
        return DynamicOffloadLoadResult(module, None, hook, note)
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
        setattr(module, "_ddo_source", source)  # a plain attribute (not a tensor or module)
    hook = _attach(module, apply_dynamic, dynamic_offload_config, profile_name, build_profile)
    return DynamicOffloadLoadResult(module, source, hook, note)


def _attach(module: torch.nn.Module, apply_dynamic: bool, config: Any, profile_name: Optional[str],
            build_profile: Optional[bool]) -> Any:
    """The ddo session of apply_dynamic=True (the dynamic route, with the profile options)."""
    if not apply_dynamic:
        return None
    from .routing import enable_dynamic_offload
    kw: Dict[str, Any] = {}
    if profile_name:
        kw["profile_name"] = profile_name
    if build_profile:
        kw["build_profile"] = True
    return enable_dynamic_offload(module, config=config, **kw)
