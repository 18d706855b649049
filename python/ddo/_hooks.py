"""Hook order (internal): ddo's pre-hook runs before every other pre-hook of its module, and
its forward hook after every other forward hook, so a user's hook (or torch's own, such as
weight_norm's) always sees the real weights, never the empty placeholders ddo binds outside
a unit's lease. torch >= 2.0 has prepend=; on torch 1.13 the hook dicts (ordered) are
reordered. A hook a user registers later is put behind ddo's again at each forward."""

import inspect
from typing import Any, Callable, List

import torch

_PREPEND = "prepend" in inspect.signature(torch.nn.Module.register_forward_pre_hook).parameters


def pre_hook_first(module: Any, fn: Callable[..., Any], handles: List[Any]) -> Any:
    """Registers fn as module's first forward pre-hook (its handle appended to handles)."""
    if _PREPEND:
        h = module.register_forward_pre_hook(fn, prepend=True)
    else:
        h = module.register_forward_pre_hook(fn)
        module._forward_pre_hooks.move_to_end(h.id, last=False)
    handles.append(h)
    return h


def post_hook_last(module: Any, fn: Callable[..., Any], handles: List[Any],
                   always_call: bool) -> Any:
    """Registers fn as module's forward hook (last; keep_last keeps it there)."""
    h = module.register_forward_hook(fn, **({"always_call": True} if always_call else {}))
    handles.append(h)
    return h


def keep_last(module: Any, hook_id: int) -> None:
    """Moves ddo's forward hook behind any registered after it (a dict's order is its call
    order; O(1))."""
    hooks = module._forward_hooks
    if hooks and next(reversed(hooks)) != hook_id and hook_id in hooks:
        hooks.move_to_end(hook_id)
