"""The binding under hostile use (torch 1.13, the cpu device): escaped views and autograd,
interrupts, hook order and module trees, fork, lifetime, state. docs/python-limits.md says
what is supported; each test here checks one of its promises."""

import gc
import os
import random
import signal
import time

import pytest
import torch
from torch import nn

import ddo
from ddo import _lease
from conftest import ZERO_RESIDENT

INFERENCE = "ddo streams weights for inference"
# torch 1.13 wraps an error raised in a saved-tensor hook in a RuntimeError; torch 2.x raises it as is
BACKWARD_ERRORS = (RuntimeError, ddo.DdoError)


def chain(n=4, dim=16, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(*[nn.Linear(dim, dim) for _ in range(n)])


def run(m, x):
    with torch.no_grad():
        return m(x)


def enable(m, backend="linear", gran="leaf", **kw):
    return ddo.enable_offload(m, backend=backend, unit_granularity=gran,
                              **dict(ZERO_RESIDENT, **kw))


def closed_clean(r):
    r.close()
    assert r.device_bytes_after_close in (0, None)


# ---- 1. escaped views: autograd, unload, close ----

@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_input_gradients_through_frozen_weights_are_refused_never_wrong(backend):
    m = chain()
    for p in m.parameters():
        p.requires_grad_(False)
    x = torch.randn(3, 16, requires_grad=True)
    ref = run(m, x)
    r = enable(m, backend)
    y = m(x)  # grad mode on: the forward itself runs, its values exact
    assert torch.equal(y.detach(), ref)
    with pytest.raises(BACKWARD_ERRORS, match=INFERENCE):
        y.sum().backward()
    assert x.grad is None  # nothing silently wrong
    assert torch.equal(run(m, x), ref)  # and the module is usable afterwards
    closed_clean(r)


def test_backward_with_trainable_weights_says_inference():
    m = chain(seed=1)
    x = torch.randn(2, 16)
    r = enable(m)
    with pytest.raises(BACKWARD_ERRORS, match=INFERENCE):
        m(x).sum().backward()
    assert all(p.grad is None for p in m.parameters())
    closed_clean(r)


def test_a_unit_called_directly_with_grad_is_refused():
    m = chain(seed=2)
    r = enable(m)
    with pytest.raises(ddo.DdoError, match=INFERENCE):
        m[1](torch.randn(2, 16))
    assert torch.equal(run(m, torch.zeros(1, 16)), run(m, torch.zeros(1, 16)))
    closed_clean(r)


@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_unload_with_a_live_view_is_refused_and_close_keeps_it_valid(backend):
    m = chain(seed=3)
    x = torch.randn(2, 16)
    ref = run(m, x)
    want = m[0].weight.detach().clone()
    kept = []
    h = m[0].register_forward_hook(lambda mod, a, o: kept.append(mod.weight.data))
    r = enable(m, backend)
    run(m, x)
    h.remove()
    for _ in range(3):  # other units come and go: the kept view's unit stays leased
        assert torch.equal(run(m, x), ref)
    assert torch.equal(kept[0], want)
    with pytest.raises(ddo.DdoError, match="still alive") as e:
        r.unload()
    assert e.value.code == "DDO_E_BUSY"
    assert torch.equal(run(m, x), ref)  # refused: the module still runs
    kept.clear()
    gc.collect()
    r.unload()  # the view is gone: now it unloads
    r.reload()
    assert torch.equal(run(m, x), ref)
    # close() with a live view: the session (and the view's memory) lives until it dies.
    h = m[0].register_forward_hook(lambda mod, a, o: kept.append(mod.weight.data))
    run(m, x)
    h.remove()
    buried = len(_lease._GRAVEYARD)
    r.close()
    assert len(_lease._GRAVEYARD) == buried + 1
    assert torch.equal(kept[0], want)  # the session lives on while the view does
    kept.clear()
    _lease.sweep()
    assert len(_lease._GRAVEYARD) == buried  # freed when the last view went


def test_views_kept_by_hooks_pin_their_units_until_every_slot_is_held():
    m = chain(n=6, seed=15)
    x = torch.randn(2, 16)
    ref = run(m, x)
    r = enable(m, execution_slots=2)
    kept = []
    hooks = [m[i].register_forward_hook(lambda mod, a, o: kept.append(mod.weight.data))
             for i in range(6)]
    with pytest.raises(ddo.DdoError, match="still viewed outside their forward") as e:
        run(m, x)
    assert e.value.code == "DDO_E_BUSY"
    for h in hooks:
        h.remove()
    kept.clear()
    assert torch.equal(run(m, x), ref)  # the views died: the units were released
    closed_clean(r)


@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_a_refused_write_with_a_live_view_is_restored_once_the_view_died(backend):
    m = chain(seed=16)
    x = torch.randn(2, 16)
    ref = run(m, x)
    kept = []

    def keep_and_write(mod, args, out):
        kept.append(mod.weight.data)
        with torch.no_grad():
            mod.weight.add_(1)

    h = m[0].register_forward_hook(keep_and_write)
    r = enable(m, backend)
    with pytest.raises(ddo.DdoError, match="written in place during the forward"):
        run(m, x)
    h.remove()
    kept.clear()
    for _ in range(2):
        assert torch.equal(run(m, x), ref)  # the host copy's values again
    closed_clean(r)


def test_unload_and_close_during_a_forward_are_refused():
    m = chain(seed=4)
    x = torch.randn(2, 16)
    ref = run(m, x)
    r = enable(m)
    seen = []

    def inside(mod, args):
        for call in (r.unload, r.close):
            try:
                call()
            except ddo.DdoError as e:
                seen.append(e.code)

    h = m[2].register_forward_pre_hook(inside)
    assert torch.equal(run(m, x), ref)
    h.remove()
    assert seen == ["DDO_E_BUSY", "DDO_E_BUSY"]
    closed_clean(r)


# ---- 2. interrupts ----

class _Boom(BaseException):
    pass


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _disarm(old):
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_interrupt_fuzzer(backend):
    """KeyboardInterrupt (SIGALRM) at random points of enable_offload, forwards and close,
    for a bounded time: afterwards the module is always usable with exact values, a refused
    enable leaves it unmanaged, and every closed session gives back all device memory."""
    rng = random.Random(32)
    m = chain(n=6, dim=24, seed=5)
    m[3].register_forward_pre_hook(lambda mod, a: None)  # a user hook, before enable
    x = torch.randn(2, 24)
    ref = run(m, x)
    hosts = [p.detach().clone() for p in m.parameters()]
    deadline = time.monotonic() + 6
    gc.collect()
    threads, buried = _threads(), len(_lease._GRAVEYARD)
    old = signal.signal(signal.SIGALRM, _raise_interrupt)
    try:
        _fuzz(m, x, ref, hosts, backend, rng, deadline)
    finally:
        _disarm(old)
    gc.collect()
    assert _threads() <= threads  # every session's threads ended: no session leaked
    assert len(_lease._GRAVEYARD) == buried


def _fuzz(m, x, ref, hosts, backend, rng, deadline):
    iters = interrupted = 0
    while time.monotonic() < deadline:
        iters += 1
        try:  # the one-shot timer may fire anywhere up to its disarming
            try:
                signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.00002, 0.004))
                r = enable(m, backend)
                for _ in range(rng.randint(1, 4)):
                    run(m, x)
                    if rng.random() < 0.2:
                        r.unload()
                        r.reload()
                r.close()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            interrupted += 1
        r = getattr(m, "_ddo_offload", None)  # a result the interrupt kept from the caller
        if r is not None:
            r.reload()  # a no-op unless the interrupt fell between unload() and reload()
            assert torch.equal(run(m, x), ref)
            closed_clean(r)
        assert not hasattr(m, "_ddo_offload")
        assert torch.equal(run(m, x), ref)  # unmanaged, exact
        assert all(torch.equal(p, h) for p, h in zip(m.parameters(), hosts))
    assert iters > 20 and interrupted > 5, (iters, interrupted)
    r = enable(m, backend)  # and it can be managed again
    assert torch.equal(run(m, x), ref)
    closed_clean(r)


def test_the_shield_defers_a_signal_to_its_end():
    old = signal.signal(signal.SIGALRM, lambda s, f: (_ for _ in ()).throw(_Boom()))
    try:
        done = []
        with pytest.raises(_Boom):
            with _lease.shield():
                os.kill(os.getpid(), signal.SIGALRM)
                for _ in range(1000):
                    pass
                done.append(1)  # reached: the handler waited for the end
        assert done == [1]
    finally:
        signal.signal(signal.SIGALRM, old)


# ---- 3. hooks and module trees ----

def test_a_users_pre_hook_registered_first_sees_the_real_weights():
    m = chain(seed=6)
    want = m[1].weight.detach().clone()
    seen = []
    m[1].register_forward_pre_hook(lambda mod, a: seen.append(mod.weight.detach().clone()))
    r = enable(m)
    run(m, torch.randn(2, 16))
    assert torch.equal(seen[-1], want)
    closed_clean(r)


def test_weight_norm_with_leaf_units():
    torch.manual_seed(7)
    m = nn.Sequential(nn.utils.weight_norm(nn.Linear(16, 16)), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(3, 16)
    ref = run(m, x)
    r = enable(m)
    assert torch.equal(run(m, x), ref)
    closed_clean(r)


class _Nested(nn.Module):
    """Blocks that are ModuleLists, iterated by the parent (no forward of their own)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(8)
        self.blocks = nn.ModuleList([nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
                                     for _ in range(3)])

    def forward(self, x):
        for block in self.blocks:
            for layer in block:
                x = layer(x)
        return x


@pytest.mark.parametrize("gran", ["block", "leaf"])
def test_modulelist_blocks_iterated_by_their_parent(gran):
    m = _Nested()
    x = torch.randn(2, 8)
    ref = run(m, x)
    r = enable(m, gran=gran)
    assert torch.equal(run(m, x), ref)
    closed_clean(r)


class _FunctionalAttention(nn.Module):
    """torchvision-like: the forward reads a child's weights functionally (qkv) and calls
    another child (proj)."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(torch.nn.functional.linear(x, self.qkv.weight, self.qkv.bias).relu())


class _SwinLike(nn.Module):
    def __init__(self, dim=8, depth=3):
        super().__init__()
        torch.manual_seed(14)
        self.layers = nn.Sequential(*[nn.Sequential(_FunctionalAttention(dim), nn.Linear(dim, dim))
                                      for _ in range(depth)])
        self.head = nn.Linear(dim, 2)

    def forward(self, x):
        return torch.nn.functional.linear(self.layers(x), self.head.weight, self.head.bias)


@pytest.mark.parametrize("gran", ["block", "leaf"])
@pytest.mark.parametrize("backend", ["linear", "vmm"])
def test_a_parent_reading_a_childs_weights_functionally_acquires_them(gran, backend):
    m = _SwinLike()
    x = torch.randn(2, 8)
    ref = run(m, x)
    r = enable(m, backend, gran)
    assert torch.equal(run(m, x), ref)
    assert torch.equal(run(m, x), ref)
    closed_clean(r)


def test_an_unseen_functional_read_names_the_modules_that_did_not_run():
    class Hidden(nn.Module):  # reads through getattr: the enable-time check cannot see it
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return torch.nn.functional.linear(self.a(x), getattr(self, "b").weight)

    m = Hidden()
    r = enable(m)
    with pytest.raises(RuntimeError) as e:
        run(m, torch.randn(2, 8))
    told = str(e.value) + "".join(getattr(e.value, "__notes__", []))  # a note on 3.11+
    assert "forwards had not run, so their streamed weights were off the device: b;" in told
    closed_clean(r)


def test_zero_size_parameter_does_not_leak_the_session():
    m = chain(n=2, dim=8, seed=9)
    m[0].empty = nn.Parameter(torch.empty(0, 8))
    buried = len(_lease._GRAVEYARD)
    r = enable(m)
    run(m, torch.randn(2, 8))
    closed_clean(r)
    assert len(_lease._GRAVEYARD) == buried


# ---- 4. fork and lifetime ----

@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_a_forked_child_gets_one_clear_error_and_no_hang():
    m = chain(seed=10)
    x = torch.randn(2, 16)
    hosts = [p.detach().clone() for p in m.parameters()]
    r = enable(m)
    run(m, x)
    pid = os.fork()
    if pid == 0:  # the child: a clear error, then close() gives the host tensors back
        code = 1
        try:
            try:
                run(m, x)
            except ddo.DdoError as e:
                if "forked" in str(e):
                    code = 2
            r.close()
            if code == 2 and all(torch.equal(p, h) for p, h in zip(m.parameters(), hosts)):
                code = 3
                fresh = chain(seed=10)  # a session of its own in the child works
                r2 = enable(fresh)
                if torch.equal(run(fresh, x), run(chain(seed=10), x)):
                    code = 0
                r2.close()
        finally:
            os._exit(code)
    deadline = time.monotonic() + 20
    status = None
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert torch.equal(run(m, x), run(m, x))  # the parent's session is untouched
    closed_clean(r)


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_hundreds_of_cycles_with_views_held_and_dropped_leak_nothing():
    m = chain(n=3, dim=8, seed=11)
    x = torch.randn(2, 8)
    ref = run(m, x)
    gc.collect()
    _lease.sweep()
    threads, buried = _threads(), len(_lease._GRAVEYARD)
    held = []
    t0 = time.monotonic()
    for i in range(300):
        r = enable(m, "vmm" if i % 2 else "linear")
        h = m[i % 3].register_forward_hook(lambda mod, a, o: held.append(mod.weight.data))
        assert torch.equal(run(m, x), ref)
        h.remove()
        if i % 3 == 0:
            held.clear()  # dropped before close
        r.close()  # else still held: the session waits for them
        if i % 3 == 2:
            held.clear()
        if i % 50 == 0:  # a result dropped without close(), with its module
            m2 = chain(n=2, dim=8, seed=i)
            r2 = enable(m2)
            assert r2.module is m2
            run(m2, x)
            del r2, m2
            gc.collect()
    held.clear()
    gc.collect()
    _lease.sweep()
    assert len(_lease._GRAVEYARD) == buried
    assert _threads() <= threads
    assert time.monotonic() - t0 < 60


# ---- 5. state ----

def test_moves_and_load_state_dict_of_a_managed_module_are_refused():
    m = chain(seed=12)
    x = torch.randn(2, 16)
    ref = run(m, x)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    r = enable(m)
    for move in (lambda: m.double(), lambda: m.to(torch.float16), lambda: m[1].half(),
                 lambda: m.load_state_dict(sd), lambda: m[0].load_state_dict(
                     {"weight": sd["0.weight"], "bias": sd["0.bias"]})):
        with pytest.raises(ddo.DdoError, match="close\\(\\) the OffloadResult first"):
            move()
    m.to("cpu")  # a move to where it already is changes nothing: allowed
    m.float()
    assert torch.equal(run(m, x), ref)
    got = m.state_dict()
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    r.close()
    m.double()  # unmanaged again: allowed
    assert m[0].weight.dtype == torch.float64


def test_state_dict_of_a_module_streamed_from_files_is_the_real_values(tmp_path):
    from test_pipeline_loading import CPU_STREAM, TinyDiT, reference, write_safetensors
    ref = reference()
    path = tmp_path / "model.safetensors"
    write_safetensors(path, dict(ref.state_dict()))
    m = ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT).module
    r = ddo.enable_offload(m, component="transformer", environ={}, **CPU_STREAM)
    try:
        got, want = m.state_dict(), ref.state_dict()
        assert set(got) == set(want)
        assert all(torch.equal(got[k], want[k]) for k in want)
    finally:
        r.close()


def test_a_buffer_of_another_shape_in_the_files_is_refused(tmp_path):
    from test_pipeline_loading import TinyDiT, reference, write_safetensors
    sd = dict(reference().state_dict())
    sd["scale"] = torch.ones(7)  # the class declares 32
    path = tmp_path / "model.safetensors"
    write_safetensors(path, sd)
    with pytest.raises(ddo.DdoError, match="buffer scale is F32 \\[7\\]"):
        ddo.from_pretrained_with_dynamic_offload(path, model_loader=TinyDiT)


def test_a_failing_record_event_leaves_the_module_unmanaged():
    m = chain(seed=13)
    x = torch.randn(2, 16)
    ref = run(m, x)

    def rec(name, seconds, **payload):
        raise ValueError("the host's callback failed")

    with pytest.raises(ValueError, match="callback failed"):
        ddo.enable_offload(m, record_event=rec, environ={}, **ZERO_RESIDENT)
    assert not hasattr(m, "_ddo_offload")
    assert torch.equal(run(m, x), ref)
    closed_clean(enable(m))


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_dlpack_capsule_is_consumed_exactly_once(monkeypatch, when):
    """from_dlpack raising before it took the capsule (the binding deletes it) or after (torch
    owns it, the binding must not delete it again): either way the view count comes back."""
    from ddo import _native, _torch
    m = chain(n=2, dim=8, seed=17)
    r = enable(m, "vmm")  # a streamed tensor's address is the session's on VMM
    L = _native.lib()
    base = L.ddo_session_view_count(r._session)
    real = torch.utils.dlpack.from_dlpack

    def failing(cap):
        if when == "after":
            real(cap)  # taken, then dropped: torch's deleter runs once
        raise KeyboardInterrupt

    monkeypatch.setattr(torch.utils.dlpack, "from_dlpack", failing)
    t = r._unit_tensors[0][0]
    with pytest.raises(KeyboardInterrupt):
        _torch.view(r._session, t.index, t.dtype_name, t.torch_dtype, t.shape)
    monkeypatch.setattr(torch.utils.dlpack, "from_dlpack", real)
    gc.collect()
    assert L.ddo_session_view_count(r._session) == base
    assert torch.equal(run(m, torch.ones(1, 8)), run(m, torch.ones(1, 8)))
    closed_clean(r)
