"""The README's Python examples, executed as written (on the cpu device), and docs/python.md free
of words pointing at documents outside the repository.

The Diffusers example runs against STAND-INS: Diffusers is not installed in CI (and with it the
example would download Flux.1-dev), so a stand-in ``diffusers`` module whose
``FluxPipeline.from_pretrained`` returns a toy pipeline (text encoder -> transformer, several
steps -> VAE, with ``.images``) is put in sys.modules for the test. What is checked is ddo's
side: the README's lines run unchanged, the pipeline is staged and its output is bit-identical
to the unmanaged pipeline's.
"""

import re
import sys
import types

import torch
from torch import nn

import ddo
import models
from conftest import ROOT

README = (ROOT / "README.md").read_text()


def python_block(section):
    """The first ```python block after the heading `## {section}`."""
    body = README[README.index(f"## {section}\n"):]
    return re.search(r"```python\n(.*?)```", body, re.S).group(1)


def test_pytorch_example_runs(recwarn):
    code = python_block("Python (PyTorch)")
    assert len(code.strip().splitlines()) == 4  # the import and three lines
    ns = {}
    exec(compile(code, "README.md", "exec"), ns)
    model, out, r = ns["model"], ns["out"], ns["r"]
    assert out.shape == (1, 2048) and out.device == r.device
    assert getattr(model, "_ddo_offload", None) is None  # the with block closed it
    with torch.no_grad():
        assert torch.equal(model(torch.zeros(1, 2048)), model(torch.zeros(1, 2048)))


class _Output:
    def __init__(self, images):
        self.images = images


class StandInFluxPipeline:
    """STANDS IN FOR diffusers.FluxPipeline (not installed in CI): three components called in
    Flux's order by __call__."""

    def __init__(self, device="cpu"):
        self._device = torch.device(device)  # an unmanaged pipeline's device (pipe.to(...))
        torch.manual_seed(0)  # the same weights in every instance
        self.text_encoder = models.FluxLike(dim=128, double=2, single=0, seed=1)
        self.transformer = models.FluxLike(dim=128, seed=2)
        self.vae = nn.Sequential(nn.Linear(128, 128), nn.Tanh()).to(torch.bfloat16)
        for m in (self.text_encoder, self.transformer, self.vae):
            m.to(self._device)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    @property
    def components(self):
        return {"text_encoder": self.text_encoder, "transformer": self.transformer,
                "vae": self.vae}

    @property
    def _execution_device(self):
        """Where the components compute (Diffusers' pipelines ask their hooks the same)."""
        results = getattr(self, "_ddo_pipeline_offload", None)
        return results["transformer"].device if results else self._device

    def __call__(self, prompt, num_inference_steps=8):
        g = torch.Generator().manual_seed(len(prompt))
        dev = self._execution_device
        with torch.no_grad():
            noise = torch.randn(1, 8, 128, generator=g).to(torch.bfloat16)
            ctx = self.text_encoder(noise.to(dev))
            lat = torch.randn(1, 8, 128, generator=g).to(torch.bfloat16).to(dev)
            for _ in range(num_inference_steps):
                lat = lat - 0.1 * self.transformer(lat + ctx)
            return _Output([self.vae(lat).cpu()])


def test_diffusers_example_runs_against_a_stand_in(monkeypatch):
    code = python_block("Diffusers")
    assert len(code.strip().splitlines()) == 3
    fake = types.ModuleType("diffusers")
    fake.FluxPipeline = StandInFluxPipeline
    monkeypatch.setitem(sys.modules, "diffusers", fake)
    # the unmanaged reference computes where ddo will (cuda:0 on a GPU machine: bf16 products
    # differ between devices, not between ddo and torch)
    dev = "cuda:0" if torch.cuda.is_available() else "cpu"
    want = StandInFluxPipeline(dev)("a red fox in the snow", num_inference_steps=8).images[0]
    ns = {}
    exec(compile("import torch, ddo\nfrom diffusers import FluxPipeline\n" + code, "README.md",
                 "exec"), ns)
    pipe = ns["pipe"]
    try:
        assert torch.equal(ns["image"], want)
        results = pipe._ddo_pipeline_offload
        assert set(results) == {"text_encoder", "transformer", "vae"}
        assert results.stager is not None and results.stager.events
    finally:
        ddo.close_pipeline_offload(pipe)


def test_python_docs_stand_alone():
    text = (ROOT / "docs" / "python.md").read_text()
    # citations of documents outside the repository: tests/check_no_outside_refs.sh, every file
    assert "upstream" not in text  # parity notes name no earlier design in the task pages
    assert "ui.perfetto.dev" in text and "ui.perfetto.dev" in README
    # task-first: the tasks come before the reference
    heads = [h for h in re.findall(r"(?m)^## (.*)$", text)]
    assert heads[:5] == ["One module", "A small card", "A whole pipeline in one line",
                         "torch.compile", "Profiles: seeing what happened"]
    assert heads[-1].startswith("Appendix")
