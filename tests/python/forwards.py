"""Test helper: a call made while another thread's forward is held inside the module."""

import threading

import torch


def during_a_forward(module, held_at, x, call):
    """Runs module(x) on a thread, holds it at held_at's forward pre-hook, makes call() on this
    thread meanwhile and lets the forward finish; returns what call() raised (None: nothing)."""
    inside, go, raised = threading.Event(), threading.Event(), []

    def hold(mod, args):
        inside.set()
        go.wait(10)

    def forward():
        with torch.no_grad():
            module(x)

    h = held_at.register_forward_pre_hook(hold)
    t = threading.Thread(target=forward)
    t.start()
    inside.wait(10)
    try:
        call()
    except Exception as e:  # noqa: BLE001 - the caller checks what it was
        raised.append(e)
    go.set()
    t.join()
    h.remove()
    return raised[0] if raised else None
