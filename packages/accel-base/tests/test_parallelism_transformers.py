"""Tensor parallelism of a transformers model (a small Llama built from a config, no download) on 2 gloo processes
against a one-process reference: from the model's own `tp_plan` (transformers 5's style names, such as
`embedding_rowwise` and `colwise_gather_output`), and from a model transformers already split
(`from_pretrained(tp_plan="auto", device_mesh=accelerator.torch_device_mesh)`), which prepare must not split again.
The style-name table is checked against transformers' own registry where transformers is installed.

Needs transformers (`nox -s compat` installs it); skipped without it, except the checks of the table itself."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from accel.strategies import tensor_parallel
from accel.strategies.tensor_parallel import REFUSED_STYLES, STYLE_NAMES, apply_tensor_parallel, parallel_style
from conftest import launch

WORKER = r"""
import os, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from torch.distributed.tensor import DTensor
from accel import Accelerator, set_seed
from accel.strategies.parallelism_config import ParallelismConfig
from accel.state import AcceleratorState, GradientState

CFG = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
           num_key_value_heads=2, tie_word_embeddings=False)
STEPS = 3

def build():
    set_seed(0)
    return LlamaForCausalLM(LlamaConfig(**CFG))

def batch(s):
    g = torch.Generator().manual_seed(1 + s)
    return torch.randint(0, 64, (4, 8), generator=g)

def reference(model):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for s in range(STEPS):
        ids = batch(s)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}

def train(acc, model, name):
    ref_losses, ref_state = reference(build())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = acc.prepare(model, opt)
    w = model.model.layers[0].self_attn.q_proj.weight
    assert isinstance(w, DTensor) and w.device_mesh.size() == 2, type(w)
    for s in range(STEPS):
        ids = batch(s)
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 1.0)
        opt.step(); opt.zero_grad()
        got = acc.reduce(loss.detach(), "mean").item()
        assert abs(got - ref_losses[s]) < 1e-5, (name, s, got, ref_losses[s])
    state = acc.get_state_dict(model)
    if acc.is_main_process:
        assert sorted(state) == sorted(ref_state), (sorted(set(state) ^ set(ref_state)))
        worst = max((state[k].float() - v.float()).abs().max().item() for k, v in ref_state.items())
        assert worst < 2e-5, (name, worst)
    acc.print(f"OK {name} losses {ref_losses}")

out = Path(sys.argv[1])
if "own_plan" in sys.argv:
    AcceleratorState._reset_state(); GradientState._reset_state()
    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    train(acc, build(), "own_plan")
if "pretp" in sys.argv:
    from transformers import AutoModelForCausalLM
    AcceleratorState._reset_state(); GradientState._reset_state()
    acc = Accelerator(parallelism_config=ParallelismConfig(tp_size=2))
    d = out / "tiny_llama"
    if acc.is_main_process:
        build().save_pretrained(d)
    acc.wait_for_everyone()
    model = AutoModelForCausalLM.from_pretrained(d, tp_plan="auto", device_mesh=acc.torch_device_mesh)
    train(acc, model, "pretp")
"""


def test_llama_tp_plan_and_pre_split_model_on_two_processes(write_script, tmp_path):
    pytest.importorskip("transformers", reason="needs transformers (installed by nox -s compat)")
    proc = launch(write_script(WORKER), str(tmp_path), "own_plan", "pretp", timeout=420)
    assert "OK own_plan" in proc.stdout and "OK pretp" in proc.stdout, proc.stdout


# ---- the style table ---------------------------------------------------------------------------------------
def _layouts(style):
    return tuple(style.input_layouts), tuple(style.output_layouts)


def test_style_names_map_to_torch_styles_with_the_transformers_layouts():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    r, s = (Replicate(),), (Shard(-1),)
    expected = {
        "colwise": (ColwiseParallel, (r, s)),
        "local_colwise": (ColwiseParallel, (r, s)),
        "colwise_rep": (ColwiseParallel, (r, r)),
        "colwise_gather_output": (ColwiseParallel, (r, r)),
        "embedding_colwise": (ColwiseParallel, (r, r)),
        "rowwise": (RowwiseParallel, (s, r)),
        "rowwise_rep": (RowwiseParallel, (r, r)),
        "rowwise_split_input": (RowwiseParallel, (r, r)),
        "embedding_rowwise": (RowwiseParallel, (r, r)),
    }
    for name, (cls, layouts) in expected.items():
        style = parallel_style(name)
        assert type(style) is cls and _layouts(style) == layouts, (name, style)
    assert type(parallel_style("sequence_parallel")) is SequenceParallel
    assert parallel_style("replicate") is None  # full weights on every rank: the entry is skipped
    custom = ColwiseParallel(use_local_output=False)
    assert parallel_style(custom) is custom


def test_refused_and_unknown_styles_are_named_with_the_supported_list():
    with pytest.raises(ValueError) as err:
        parallel_style("packed_colwise")
    message = str(err.value)
    assert (
        "'packed_colwise'" in message and "not supported by accel" in message and "'colwise_gather_output'" in message
    )
    with pytest.raises(ValueError, match=r"Unknown tensor-parallel style 'colwize'; accel applies \('colwise'"):
        parallel_style("colwize")


def test_a_model_split_already_is_checked_against_the_mesh_and_left_alone(monkeypatch):
    from torch import nn

    model = nn.Linear(2, 2)
    monkeypatch.setattr(tensor_parallel, "model_tp_size", lambda m: 4)
    with pytest.raises(ValueError, match=r"tp_size in the plugin 2 should be same as model's tp size 4"):
        apply_tensor_parallel(model, SimpleNamespace(size=lambda: 2), None)
    monkeypatch.setattr(tensor_parallel, "model_tp_size", lambda m: 2)
    weight = model.weight
    apply_tensor_parallel(model, SimpleNamespace(size=lambda: 2), {"nothing": "colwise"})  # no plan check, no split
    assert model.weight is weight


def test_every_transformers_style_is_applied_or_refused_by_name():
    pytest.importorskip("transformers", reason="needs transformers (installed by nox -s compat)")
    try:
        from transformers.distributed.tensor_parallel import ALL_PARALLEL_STYLES
    except ImportError:  # transformers 4.x
        from transformers.integrations.tensor_parallel import ALL_PARALLEL_STYLES
    theirs = set(ALL_PARALLEL_STYLES.keys()) if hasattr(ALL_PARALLEL_STYLES, "keys") else set(ALL_PARALLEL_STYLES)
    assert theirs - set(STYLE_NAMES) - set(REFUSED_STYLES) == set()
    # Where both have layouts, they are transformers' own.
    for name in set(STYLE_NAMES) & theirs:
        style, own = parallel_style(name), ALL_PARALLEL_STYLES[name]
        if style is not None and hasattr(own, "input_layouts") and hasattr(own, "output_layouts"):
            assert _layouts(style) == ((own.input_layouts,), (own.output_layouts,)), name
