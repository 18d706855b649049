"""bench/flux_pipeline.py without a GPU, Diffusers or transformers: its arguments, its case
table, the budget arithmetic (checked against the library's own planner on the real Flux.1-dev
layout, through `ddo plan` on a header-only sparse checkpoint), the targets computed from
results, and its ddo mode driving real ddo sessions on the cpu device."""

import json
import os
import struct
import subprocess

import pytest
import torch

import models
from conftest import ROOT, load_bench

GIB = 1 << 30
MIB = 1 << 20


@pytest.fixture(scope="module")
def fp():
    return load_bench("flux_pipeline")


def flux_tensors():
    with open(ROOT / "data" / "layouts" / "flux1-dev.json") as f:
        layout = json.load(f)
    out = []
    for t in layout["tensors"]:
        n = 2
        for d in t["shape"]:
            n *= d
        out.append((t["name"], t["shape"], n))
    return out, layout["total_bytes"]


def test_arguments_and_cases(fp):
    a = fp.parse_args(["--all"])
    assert (a.height, a.width, a.steps, a.guidance, a.text_tokens) == (1024, 1024, 8, 3.5, 512)
    assert (a.device_gib, a.torch_gib, a.bus_gib, a.ddo_resident_bytes) == (8.0, 3.5, 4.0, None)
    t = fp.parse_args(["--all", "--tiny"])
    assert (t.height, t.width, t.bus_gib, t.ddo_resident_bytes) == (256, 256, 1.0, 0)
    assert fp.parse_args(["--case", "ddo", "--ddo-resident-gib", "1.5"]).ddo_resident_bytes == \
        int(1.5 * GIB)
    for bad in (["--all", "--steps", "0"], ["--all", "--text-tokens", "513"],
                ["--all", "--height", "1000"], ["--case", "nope"], []):
        with pytest.raises(SystemExit):
            fp.parse_args(bad)
    # The resident reference first, then ddo, then the Diffusers modes; only resident uncapped.
    assert fp.ALL_CASES[:2] == ["resident", "ddo"] and set(fp.ALL_CASES) == set(fp.CASES)
    assert [n for n in fp.ALL_CASES if not fp.CASES[n]["capped"]] == ["resident"]
    # The one-line form right after the explicit phases it is measured against.
    assert fp.ALL_CASES[2] == "ddo_one_line" and fp.CASES["ddo_one_line"]["capped"]
    assert fp.CASES["ddo_one_line"]["kind"] == "ddo_pipeline" and "ddo_pipeline" in fp.DDO_KINDS
    assert {fp.CASES[n]["kind"] for n in fp.ALL_CASES[3:]} == set(fp.DIFFUSERS_KINDS)
    one = fp.case_command("ddo_one_line", t, "/tmp/r.json", 123.0)
    assert fp.parse_args(one[2:]).case == "ddo_one_line"
    cmd = fp.case_command("ddo", t, "/tmp/r.json", 123.0)
    assert cmd[cmd.index("--case") + 1] == "ddo" and "--tiny" in cmd
    assert cmd[cmd.index("--ddo-resident-gib") + 1] == "0.0"
    assert fp.parse_args(cmd[2:]).ddo_resident_bytes == 0
    assert fp.parse_args(["--all"]).module_loading == "default"
    assert fp.parse_args(["--all", "--module-loading", "eager"]).module_loading == "eager"
    assert fp.step_probes([(1.0, None), (1.25, None)]) == {"step_host_s": [0.25]}
    assert a.runs == 3  # one cold call, two warm ones
    cmd = fp.case_command("ddo", fp.parse_args(["--all", "--runs", "2"]), "/tmp/r.json", 1.0)
    assert fp.parse_args(cmd[2:]).runs == 2
    with pytest.raises(SystemExit):
        fp.parse_args(["--all", "--runs", "0"])


def test_configurations(fp):
    c = fp.configs(False)
    assert c["transformer"]["num_layers"] == 19 and c["transformer"]["num_single_layers"] == 38
    assert c["transformer"]["in_channels"] == 4 * c["vae"]["latent_channels"] == 64
    assert c["transformer"]["joint_attention_dim"] == c["text_encoder_2"]["d_model"] == 4096
    assert c["transformer"]["pooled_projection_dim"] == c["text_encoder"]["hidden_size"] == 768
    t = fp.configs(True)
    assert t["transformer"]["in_channels"] == 4 * t["vae"]["latent_channels"]
    assert t["transformer"]["joint_attention_dim"] == t["text_encoder_2"]["d_model"]
    assert t["transformer"]["pooled_projection_dim"] == t["text_encoder"]["hidden_size"]
    assert sum(t["transformer"]["axes_dims_rope"]) == t["transformer"]["attention_head_dim"]
    assert t["scheduler"] == c["scheduler"] and c["scheduler"]["shift"] == 3.0


def test_device_split(fp):
    s = fp.device_split(8, GIB // 2, 3.5, 0.25)
    assert s["torch_cap_bytes"] == int(3.5 * GIB)
    assert s["ddo_bytes"] == 8 * GIB - GIB // 2 - GIB // 4 - int(3.5 * GIB)
    assert s["baseline_bytes"] + s["margin_bytes"] + s["torch_cap_bytes"] + s["ddo_bytes"] == \
        s["target_bytes"] == 8 * GIB
    d = fp.device_split(8, GIB // 2, 3.5, 0.25, ddo=False)
    assert d["ddo_bytes"] == 0 and d["torch_cap_bytes"] == 8 * GIB - GIB // 2 - GIB // 4
    assert fp.gib_floor(GIB + 1) == "1.0000" and fp.gib_ceil(GIB + 1) == "1.0001"


def test_units_and_plan_arithmetic(fp):
    names = ["a.blocks.0.x.weight", "a.blocks.1.x.weight", "a.blocks.1.y.0.weight",
             "solo.0.w.weight", "head.weight"]
    g = fp.block_groups(names)
    assert fp.unit_of("a.blocks.1.y.0.weight", g) == ("a.blocks.1", True)
    assert fp.unit_of("solo.0.w.weight", g) == ("solo.0.w", False)  # a group of one: a leaf
    assert fp.unit_of("head.weight", g) == ("head", False)
    tensors = [("emb.weight", 3 * MIB), ("blocks.0.w1", 5 * MIB), ("blocks.0.w2", 5 * MIB + 1),
               ("blocks.1.w1", 5 * MIB), ("blocks.0.bias", 1000), ("proj_out.weight", 4 * MIB)]
    p = fp.component_plan(tensors, 64 * MIB, r"^proj_out$", True)
    assert p["fixed_bytes"] == 4 * MIB + 1024  # the always-resident leaf and the small bias
    # blocks.0 spans 5 MiB + 256-byte alignment + 5 MiB + 1: rounded to the 2 MiB page.
    assert p["slot_bytes"] == 12 * MIB and p["slots"] == 3 and p["largest_unit"] == "blocks.0"
    assert p["resident_budget_bytes"] == 64 * MIB - p["fixed_bytes"] - 36 * MIB - 16 * MIB
    assert p["peak_bound_bytes"] + 16 * MIB == 64 * MIB and p["fits"]
    assert not fp.component_plan(tensors, 40 * MIB, r"^proj_out$", True)["fits"]
    z = fp.component_plan(tensors, 64 * MIB, "^", False)
    assert z["slots"] == 0 and z["fixed_bytes"] == sum(fp.round_up(n, 256) for _, n in tensors)


def write_sparse(path, tensors):
    """A safetensors file whose data region is a hole: the planner reads only the header."""
    header, off = {}, 0
    for name, shape, n in tensors:
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.truncate(8 + len(h) + off)


def plan_flags(opts):
    flags = []
    for k, v in opts.items():
        if k == "execution_device":
            continue
        if k == "small_tensor_threshold_bytes":
            flags += ["--ddo-small-tensor-threshold-kb", str(v // 1024)]
        elif k == "always_resident_modules_pattern":
            flags += ["--ddo-always-resident-module-patterns", v]
        else:
            flags += ["--ddo-" + k.replace("_", "-"), "1" if v is True else str(v)]
    return flags


@pytest.mark.skipif(not os.environ.get("DDO_BIN"), reason="needs the ddo tool (DDO_BIN)")
@pytest.mark.parametrize("ddo_gib", [2.5, 3.6, 6.0])
def test_transformer_budget_matches_the_planner(fp, tmp_path, ddo_gib):
    tensors, total = flux_tensors()
    assert sum(n for _, _, n in tensors) == total
    ck = tmp_path / "flux.safetensors"
    write_sparse(ck, tensors)
    comp = {c: [("w.0.x", MIB), ("w.1.x", MIB)] for c in ("text_encoder", "text_encoder_2",
                                                          "vae")}
    comp["transformer"] = [(n, b) for n, _, b in tensors]
    budgets = fp.ddo_budgets(comp, int(ddo_gib * GIB))
    assert budgets["ok"], budgets["why"]
    c = budgets["components"]["transformer"]
    cmd = [os.environ["DDO_BIN"], "plan", str(ck), "--ddo-backend", "vmm", "--ddo-preset", "auto",
           "--ddo-execution-device", "cpu", "--device-memory-gb", "139", "--host-memory-gb", "120",
           "--json"] + plan_flags(c["options"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("DDO_")}  # flags alone
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    dw = json.loads(p.stdout)["budgets"]["device_weights"]
    plan = c["plan"]
    assert dw["slot_count"] == plan["slots"] == 3
    assert dw["slot_bytes"] == plan["slot_bytes"] == 648 * MIB  # a double block, 2 MiB pages
    assert dw["limit"] <= int(ddo_gib * GIB)
    assert dw["resident_bytes"] <= plan["fixed_bytes"] + plan["resident_budget_bytes"]
    assert dw["peak"] <= plan["peak_bound_bytes"] <= dw["limit"]
    # Whole blocks were made resident in what the three slots leave.
    assert dw["resident_bytes"] > plan["fixed_bytes"] + plan["resident_budget_bytes"] - 700 * MIB


def test_budgets_refuse_what_cannot_fit(fp):
    comp = {c: [("blocks.0.w", 64 * MIB), ("blocks.1.w", 64 * MIB)]
            for c in ("text_encoder", "text_encoder_2", "vae")}
    comp["transformer"] = [(f"blocks.{i}.w", 512 * MIB) for i in range(4)]
    ok = fp.ddo_budgets(comp, 2 * GIB)
    assert ok["ok"] and ok["phase_bytes"]["denoise"] == 2 * GIB
    assert ok["phase_bytes"]["encode"] <= 2 * GIB
    assert ok["components"]["text_encoder"]["plan"]["slots"] == 0  # wholly resident
    assert ok["components"]["text_encoder_2"]["plan"]["resident_budget_bytes"] == 0
    bad = fp.ddo_budgets(comp, GIB)
    assert not bad["ok"] and "transformer" in bad["why"]
    forced = fp.ddo_budgets(comp, 2 * GIB, resident_override=GIB)
    assert not forced["ok"]  # 1 GiB resident + 3 x 512 MiB slots exceed 2 GiB


def test_targets(fp):
    res = {
        "resident": {"kind": "resident", "denoise_s": 2.0, "total_s": 9.0},
        "ddo": {"kind": "ddo", "denoise_s": 3.3, "total_s": 10.0, "bus_gbps": 50.0,
                "denoise_copy_bytes": 160e9, "device_used_peak_bytes": 7 * GIB,
                "rss_hwm_bytes": 38 * GIB, "weights_bytes": 34 * GIB,
                "latents_identical": True, "latents_max_abs_diff": 0.0},
        "group_offload": {"kind": "group", "total_s": 30.0, "device_used_peak_bytes": 3 * GIB},
        "sequential_cpu_offload": {"kind": "sequential", "total_s": 25.0,
                                   "device_used_peak_bytes": 9 * GIB},  # over 8 GiB: not fitting
        "model_cpu_offload": {"kind": "model", "error": "OutOfMemoryError: ...", "total_s": None},
    }
    t = fp.targets(res, 8)
    # --runs 1: no warm call, the first call's figure stands in
    assert t["denoise"]["bound_s"] == pytest.approx(3.2) and t["denoise"]["met"]
    assert t["denoise"]["warm"] is False and t["denoise_first_call"]["run"] == 1
    assert t["total"]["fastest_diffusers"] == "group_offload" and t["total"]["ratio"] == \
        pytest.approx(1 / 3) and t["total"]["met"]
    assert t["device_peak"]["met"] and not t["host_rss"]["met"]  # 38 > 1.1 x 34 GiB
    assert t["latents_identical"]["met"]
    # --runs 3: the target is read on the warm calls (runs 2 and 3), every one must meet it;
    # the first call is reported apart
    res["ddo"]["denoise_s"] = 3.4
    res["resident"]["repeats"] = [{"denoise_s": 1.4}, {"denoise_s": 1.41}]
    res["ddo"]["repeats"] = [{"denoise_s": 3.25, "denoise_copy_bytes": 160e9},
                             {"denoise_s": 3.3, "denoise_copy_bytes": 160e9}]
    t = fp.targets(res, 8)
    w = t["denoise"]
    assert w["warm"] and w["met"] and [x["run"] for x in w["runs"]] == [2, 3]
    assert w["run"] == 3 and w["ratio"] == pytest.approx(3.3 / 3.2)  # the worst warm call
    assert w["bound_s"] == pytest.approx(3.2)
    f = t["denoise_first_call"]
    assert f["ratio"] == pytest.approx(3.4 / 3.2) and not f["met"]
    res["ddo"]["repeats"][0]["denoise_s"] = 3.4  # one warm call over: not met
    assert not fp.targets(res, 8)["denoise"]["met"]
    res["resident"]["repeats"] = [{"denoise_s": 3.5}]  # compute above the bus: compute bounds
    t = fp.targets(res, 8)["denoise"]
    assert [x["run"] for x in t["runs"]] == [2] and t["bound_s"] == pytest.approx(3.5)
    assert "total" not in fp.targets({"ddo": res["ddo"]}, 8)
    assert "one_line" not in fp.targets(res, 8)  # no one-line figures: no verdict


def test_one_line_target(fp):
    explicit = {"total_s": 10.0, "repeats": [{"phases_s": 6.0}, {"phases_s": 6.0}]}
    one = {"total_s": 10.4, "repeats": [{"phases_s": 6.2}, {"phases_s": 6.1}],
           "latents_identical": True, "device_used_peak_bytes": 7 * GIB}
    t = fp.targets({"ddo": explicit, "ddo_one_line": one}, 8)["one_line"]
    assert [c["run"] for c in t["calls"]] == [1, 2, 3]  # the first call and every warm call
    assert t["met"] and t["worst_ratio"] == pytest.approx(10.4 / 10.0)
    assert t["latents_identical"] and t["device_peak_met"]
    one["repeats"][1]["phases_s"] = 6.31  # one warm call over 1.05 x: not met
    t = fp.targets({"ddo": explicit, "ddo_one_line": one}, 8)["one_line"]
    assert not t["met"] and [c["met"] for c in t["calls"]] == [True, True, False]
    one["total_s"] = 10.6  # the first call over (setup included)
    assert not fp.one_line_target(explicit, dict(one, repeats=[]), 8)["met"]
    one["device_used_peak_bytes"] = 9 * GIB
    assert not fp.one_line_target(explicit, one, 8)["device_peak_met"]
    assert fp.one_line_target(explicit, {"total_s": None}, 8) is None
    m = fp.model_offload_arithmetic({"vae": 1, "text_encoder_2": 9 * GIB, "transformer": 22 * GIB},
                                    7 * GIB)
    assert m["largest_component"] == "transformer" and not m["fits"]


class StandIn:
    """The four components of a FluxPipeline at toy size (FluxLike stacks)."""

    def __init__(self):
        for i, name in enumerate(("text_encoder", "text_encoder_2", "transformer", "vae")):
            setattr(self, name, models.FluxLike(seed=i))


def test_ddo_mode_on_the_cpu_device(fp):
    import ddo
    pipe = StandIn()
    x = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        want = pipe.transformer(x)
    budgets = fp.ddo_budgets({n: fp.tensors_of(getattr(pipe, n)) for n in fp.COMPONENTS},
                             64 * MIB, resident_override=0, threshold=0)
    assert budgets["ok"], budgets["why"]
    args = fp.parse_args(["--case", "ddo", "--device", "cpu", "--tiny"])
    res = {"ddo_budgets": budgets}
    mode = fp.DdoMode(pipe, fp.CASES["ddo"], args, res)
    try:
        mode.setup()
        assert set(mode.handles) == set(fp.COMPONENTS)
        assert res["ddo_call"]["route"] == "dynamic_offload"
        for name, r in mode.handles.items():
            assert r.route == "dynamic_offload" and r.component == name
            assert res["ddo_plan_budgets"][name]["device_weights_peak"] <= \
                budgets["components"][name]["limit_bytes"]
        # Wholly resident components have no units; the transformer streams every block.
        assert mode.handles["vae"]._unit_count == 0
        assert mode.handles["transformer"]._unit_count == 7
        with pytest.raises(ddo.DdoError):
            pipe.transformer(x)  # unloaded after setup
        before = mode.copy_bytes(["transformer"])
        mode.enter(["transformer"])
        probes = [(0.0, mode.step_probe())]
        with torch.no_grad():
            got = pipe.transformer(x)
        probes.append((0.5, mode.step_probe()))
        mode.leave(["transformer"])
        assert torch.equal(got, want)
        assert mode.copy_bytes(["transformer"]) > before
        steps = fp.step_probes(probes)  # the per-step figures of the ddo case
        assert steps["step_host_s"] == [0.5]
        assert steps["step_ddo_copy_bytes"][0] == probes[1][1]["copy_bytes"] - \
            probes[0][1]["copy_bytes"] > 0
        # busy time is added when an upload's completion note runs (the device's callback
        # thread), which may come after the probe: zero is a valid reading (seen on the H200
        # machine's CPU with torch 2.11), negative is not
        assert steps["step_ddo_copy_busy_s"][0] >= 0 and steps["step_ddo_stall_s"][0] >= 0
        mode.enter(["vae"])
        with torch.no_grad():
            pipe.vae(x)
        mode.leave(["vae"])
    finally:
        mode.close()
    assert mode.handles == {} and set(res["ddo_metrics"]) == set(fp.COMPONENTS)
    assert getattr(pipe.transformer, "_ddo_offload", None) is None
    with torch.no_grad():
        assert torch.equal(pipe.transformer(x), want)


def test_one_line_mode_on_the_cpu_device(fp):
    """PipelineMode: enable_pipeline_offload with the ddo case's options; the components are
    called without enter/leave and the stager loads and unloads them within the budget."""
    pipe = StandIn()
    x = torch.randn(1, 8, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        want = {n: getattr(pipe, n)(x) for n in fp.COMPONENTS}
    budgets = fp.ddo_budgets({n: fp.tensors_of(getattr(pipe, n)) for n in fp.COMPONENTS},
                             64 * MIB, resident_override=0, threshold=0)
    args = fp.parse_args(["--case", "ddo_one_line", "--device", "cpu", "--tiny"])
    res = {"ddo_budgets": budgets}
    mode = fp.PipelineMode(pipe, fp.CASES["ddo_one_line"], args, res)
    try:
        mode.setup()
        assert res["ddo_call"]["call"] == "enable_pipeline_offload"
        assert res["ddo_call"]["stager_limit_bytes"] == \
            mode.handles["transformer"].budgets()["device_weights_limit"]
        for name, r in mode.handles.items():
            assert r.route == "dynamic_offload"
            # each component's own options (the ddo case's), not one set for all
            assert r.budgets()["device_weights_limit"] <= 64 * MIB
        for _ in range(2):
            for name in fp.COMPONENTS:
                mode.enter([name])  # nothing: the hooks do it
                with torch.no_grad():
                    assert torch.equal(getattr(pipe, name)(x), want[name])
                mode.leave([name])
        stager = mode.results.stager
        assert stager.in_use() <= stager.limit
        before = mode.copy_bytes(["transformer"])
        with torch.no_grad():
            pipe.transformer(x)
        assert mode.copy_bytes(["transformer"]) > before
    finally:
        mode.close()
    assert res["ddo_stager_events"][0] == ["load", "text_encoder"]
    assert getattr(pipe, "_ddo_pipeline_offload", None) is None
    assert getattr(pipe.transformer, "_ddo_offload", None) is None
    with torch.no_grad():
        assert torch.equal(pipe.transformer(x), want["transformer"])


def test_ddo_mode_retries_a_refused_resident_budget(fp, monkeypatch):
    import ddo
    pipe = StandIn()
    budgets = fp.ddo_budgets({n: fp.tensors_of(getattr(pipe, n)) for n in fp.COMPONENTS},
                             64 * MIB, resident_override=8 * MIB, threshold=0)
    real, calls = ddo.enable_offload, []

    def refuse_once(module, *a, **kw):
        calls.append((kw["component"], kw["resident_module_budget_gb"]))
        if kw["component"] == "transformer" and len([c for c in calls if c[0] ==
                                                      "transformer"]) == 1:
            raise ddo.DdoError("DDO_E_BUDGET", "device weights need more")
        return real(module, *a, **kw)

    monkeypatch.setattr(ddo, "enable_offload", refuse_once)
    args = fp.parse_args(["--case", "ddo", "--device", "cpu", "--tiny"])
    res = {"ddo_budgets": budgets}
    mode = fp.DdoMode(pipe, fp.CASES["ddo"], args, res)
    try:
        mode.setup()
    finally:
        mode.close()
    tries = [float(b) for c, b in calls if c == "transformer"]
    slot = budgets["components"]["transformer"]["plan"]["slot_bytes"]
    assert tries[0] == pytest.approx(8 / 1024, abs=1e-4) and len(tries) == 2
    assert tries[1] == pytest.approx(tries[0] - slot / GIB, abs=1e-4)
    assert res["ddo_budget_retries"][0]["component"] == "transformer"
    assert res["ddo_call"]["overrides"]["transformer"]["resident_module_budget_gb"] == \
        fp.gib_floor(8 * MIB - slot)
