"""DeepSpeed's AutoTP (`tensor_parallel.autotp_size` in the DeepSpeed config), as Accelerate runs it: the model's
Linear layers split over a `tp` mesh of every process, every process reading the same batches, `get_state_dict`
gathering the slices; training equals one process (2 gloo ranks, DeepSpeed's CPU accelerator)."""

from __future__ import annotations

import pytest
from conftest import launch

pytest.importorskip("transformers")

SCRIPT = """
import copy
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from accel import Accelerator
from accel.strategies.deepspeed import DeepSpeedPlugin

config = {"zero_optimization": {"stage": 0}, "tensor_parallel": {"autotp_size": 2}}
acc = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))
assert acc.torch_device_mesh.mesh_dim_names == ("tp",) and acc.torch_device_mesh.size() == 2
torch.manual_seed(0)
llama = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=4, vocab_size=64, max_position_embeddings=32)
model = LlamaForCausalLM(llama)
ref = copy.deepcopy(model)
ids = torch.randint(0, 64, (8, 8), generator=torch.Generator().manual_seed(1))
loader = torch.utils.data.DataLoader(ids, batch_size=2)
engine, opt, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader)
q = engine.module.model.layers[0].self_attn.q_proj.weight
assert q.shape == (16, 32), q.shape  # half of the 32 rows on each process
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
seen = []
for batch in loader:
    seen.append(batch.tolist())
    loss = engine(input_ids=batch, labels=batch).loss
    acc.backward(loss)
    opt.step()
    opt.zero_grad()
    ref_loss = ref(input_ids=batch, labels=batch).loss
    ref_loss.backward()
    torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)  # the engine clips at 1.0, Accelerate's default
    ref_opt.step()
    ref_opt.zero_grad()
    torch.testing.assert_close(loss.detach(), ref_loss.detach(), rtol=1e-5, atol=1e-5)
assert seen == ids.view(4, 2, 8).tolist(), "every process reads every batch"  # one data shard
state = acc.get_state_dict(engine)
if acc.is_main_process:
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(state[k].float(), v, rtol=1e-5, atol=1e-5, msg=k)
acc.print("AUTOTP trains as one process")
"""


def test_autotp_splits_linears_over_every_process_and_trains_as_one(write_script):
    proc = launch(write_script(SCRIPT), timeout=900)
    assert "AUTOTP trains as one process" in proc.stdout, proc.stdout
