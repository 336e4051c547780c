"""A transformers model (2-layer GPT-2 from a config, no download) trains through accel on 2 processes.

DDP in fp32 and bf16, FSDP2 in bf16: the forward keeps returning a `ModelOutput` (fp32
logits under mixed precision), the loss falls, and `save_model`'s output (plus the model's
config) loads back with `from_pretrained` equal to the trained weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import SCRIPTS, check, torchrun

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(("strategy", "precision"), [("ddp", "no"), ("ddp", "bf16"), ("fsdp2", "bf16")])
def test_a_transformers_model_trains_and_round_trips(tmp_path: Path, strategy: str, precision: str) -> None:
    check(torchrun(str(SCRIPTS / "hf_model.py"), str(tmp_path), strategy, precision, accel=False))
    reference = torch.load(tmp_path / "reference.pt")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "saved")
    state = loaded.state_dict()
    assert set(reference) <= set(state)
    for name, value in reference.items():
        torch.testing.assert_close(state[name].float(), value, atol=0, rtol=0, msg=name)
    # Tied embeddings stay tied after loading.
    assert loaded.lm_head.weight.data_ptr() == loaded.transformer.wte.weight.data_ptr()
