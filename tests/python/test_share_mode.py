"""Share mode on the cpu device (docs/multi-gpu.md, "One process per device"): two processes of
one torch.distributed group (gloo, a file store), each running enable_offload(module,
device_mode="split") on its own cpu device. Each process uploads only its share of every
streamed unit from its host memory, and the group's all-gather completes the unit, so the bytes
of the other half really cross processes. Outputs are bit-identical to the unmanaged module on
every rank, each rank took in about half of the streamed bytes, and both ran one plan."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ddo
from conftest import ZERO_RESIDENT

RANK = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    import ddo, models
    rank, world, store, out, route, budget = sys.argv[1:7]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world)
    zero = json.loads(sys.argv[7])
    mine = zero.pop("per_rank", {}).get(str(rank), {})
    dim = mine.pop("dim", 256)
    zero.update(mine)
    m = models.FluxLike(dim=dim, dtype=torch.bfloat16, seed=21)  # units of ~1 MB
    x = torch.randn(2, 8, dim, generator=torch.Generator().manual_seed(22 + rank)).to(
        torch.bfloat16)
    with torch.no_grad():
        ref = [m(x) for _ in range(3)]
    if budget:  # ranks plan differently: rank 0's plan is the one run
        zero["device_memory_limit_gb"] = float(budget) * (1 + rank)
    try:
        r = ddo.enable_offload(m, backend=route, device_mode="split", **zero)
    except ddo.DdoError as e:  # every rank refuses together
        json.dump(dict(error=e.code, message=str(e)), open(out, "w"))
        # (leaving with the group still up can abort at exit in gloo's threads, "terminate
        # called without an active exception": seen once in CI under load)
        dist.destroy_process_group()
        sys.exit(0)
    with torch.no_grad():
        got = [r.module(x) for _ in range(3)]
    snap = r.metrics_snapshot(collect_completed=True).as_dict()
    res = dict(same=all(torch.equal(a, b) for a, b in zip(got, ref)),
               route=r.plan["route"], streamed=r.plan["bytes_by_placement"]["streamed"],
               plan=r.plan, gathers=r._share.gathers, replaced=r._share.plan_replaced,
               replan=r.activation_replan["note"],
               uploaded=snap["devices"]["bytes_share_uploaded"],
               left=snap["devices"]["bytes_share_left"],
               count=snap["devices"]["share_count"])
    r.close()
    res["closed"] = r.device_bytes_after_close
    dist.destroy_process_group()
    json.dump(res, open(out, "w"))
""")

# A file-backed module (from_pretrained_with_dynamic_offload) with a retained store smaller than
# the model: the retained blocks are shared, the ones read from the file every step uploaded whole.
FILE_RANK = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    import ddo, test_pipeline_loading as T
    rank, world, store, out, ckpt = sys.argv[1:6]
    rank, world = int(rank), int(world)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank,
                            world_size=world)
    x = torch.randn(1, 4, 1024, generator=torch.Generator().manual_seed(rank)).to(
        torch.bfloat16)
    res = ddo.from_pretrained_with_dynamic_offload(ckpt, model_loader=lambda p: T.TinyDiT(
        1024, 24, torch.bfloat16))
    r = ddo.enable_offload(res.module, backend="vmm", device_mode="split",
                           execution_device="cpu", device_budget_gb=0.0625,
                           vmm_source_cache_gb=0.0625, environ={})
    with torch.no_grad():
        got = [r.module(x) for _ in range(2)]
    snap = r.metrics_snapshot(collect_completed=True).as_dict()
    info = dict(uploaded=snap["devices"]["bytes_share_uploaded"],
                left=snap["devices"]["bytes_share_left"],
                from_file=snap["bytes"]["bytes_staged_from_file"],
                gathers=r._share.gathers,
                store=r.plan["planner_decisions"].get("retained_store"))
    r.close()
    ref = ddo.loading.materialize(res.module, ckpt)
    with torch.no_grad():
        info["same"] = all(torch.equal(ref(x), o) for o in got)
    dist.destroy_process_group()
    json.dump(info, open(out, "w"))
""")


def run_ranks(tmp_path, route, budget="", world=2, zero=None, script=None, args=None):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs = []
    for rank in range(world):
        argv = [sys.executable, "-c", script or RANK, str(rank), str(world),
                str(tmp_path / "store"), str(tmp_path / f"rank{rank}.json")]
        argv += args if args is not None else [
            route, budget, json.dumps(zero if zero is not None else ZERO_RESIDENT)]
        procs.append(subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    for p, o in zip(procs, outs):
        assert p.returncode == 0, o[-3000:]
    return [json.load(open(tmp_path / f"rank{r}.json")) for r in range(world)]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
@pytest.mark.parametrize("route,name", [("linear", "one_shot_fast"), ("vmm", "vmm_fast_runtime")])
def test_two_ranks_bit_identical_half_the_bytes_each(tmp_path, route, name):
    res = run_ranks(tmp_path, route)
    for r in res:
        assert r["same"], r
        assert r["route"] == name
        assert r["count"] == 2
        assert r["streamed"] > 0
        # each rank moved about half of what streamed, the group's gather the rest
        moved = r["uploaded"] + r["left"]
        assert moved >= r["streamed"]  # three forwards, every unit at least once
        assert 0.4 < r["uploaded"] / moved < 0.6, r
        assert r["gathers"] > 0
        assert "rank 0's plan" in r["replan"]
        assert r["closed"] == 0
    assert res[0]["gathers"] == res[1]["gathers"]  # one collective per acquire, in step
    assert res[0]["plan"] == res[1]["plan"]
    assert not res[0]["replaced"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_ranks_with_different_plans_run_rank_0s(tmp_path):
    # rank 1 is told of a device twice the size: its own plan keeps more resident
    zero = dict(ZERO_RESIDENT)
    del zero["resident_module_budget_gb"]
    res = run_ranks(tmp_path, "vmm", budget="0.005", zero=zero)
    assert res[1]["replaced"] and not res[0]["replaced"]
    assert res[0]["plan"] == res[1]["plan"]
    assert res[0]["gathers"] == res[1]["gathers"] > 0
    for r in res:
        assert r["same"], r


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_a_rank_with_another_model_fails_every_rank(tmp_path):
    zero = dict(ZERO_RESIDENT, per_rank={"1": {"dim": 128}})
    res = run_ranks(tmp_path, "vmm", zero=zero)
    for r in res:
        assert r.get("error") == "DDO_E_INVALID_ARGUMENT", r
        assert "rank 1's module is not rank 0's" in r["message"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_a_rank_that_cannot_plan_fails_every_rank(tmp_path):
    # rank 1's budget is below its largest block: it refuses the plan, rank 0 learns of it
    zero = dict(ZERO_RESIDENT, per_rank={"1": {"device_memory_limit_gb": 0.001}})
    res = run_ranks(tmp_path, "vmm", zero=zero)
    assert res[1].get("error") == "DDO_E_BUDGET", res[1]
    assert res[0].get("error") == "DDO_E_STATE", res[0]
    assert "rank 1 failed planning" in res[0]["message"]
    assert "DDO_E_BUDGET" in res[0]["message"]


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed missing")
def test_file_backed_retained_blocks_shared_file_blocks_whole(tmp_path):
    import test_pipeline_loading as T
    ckpt = tmp_path / "big.safetensors"
    T.write_big_checkpoint(ckpt, depth=24, seed=7)
    res = run_ranks(tmp_path, "vmm", script=FILE_RANK, args=[str(ckpt)])
    for r in res:
        assert r["same"], r
        assert r["store"] == "partial"  # 64 MiB of the blocks retained, the rest re-read
        assert r["from_file"] > 0  # blocks read from the file: whole, on every rank
        assert r["uploaded"] > 0 and r["left"] > 0  # retained blocks: shared
        assert r["gathers"] > 0
    assert res[0]["gathers"] == res[1]["gathers"]


def test_split_without_torch_distributed_is_refused():
    import models
    m = models.FluxLike(dtype=torch.bfloat16, seed=24)
    with pytest.raises(ddo.DdoError) as e:
        ddo.enable_offload(m, backend="vmm", device_mode="split", **ZERO_RESIDENT)
    assert e.value.code == "DDO_E_INVALID_ARGUMENT"
    assert "torch.distributed" in str(e.value)
    # nothing is left managed: the module works as before
    ddo.enable_offload(m, backend="vmm", **ZERO_RESIDENT).close()
