"""A transformers model from a small config (no download) trained through accel on the processes launched.

    python hf_model.py OUT_DIR STRATEGY MIXED_PRECISION

A 2-layer GPT-2 learns a fixed token sequence. Checks on every rank: the forward returns a
transformers `ModelOutput` (also under mixed precision, with fp32 logits), the loss falls.
Rank 0 then saves with `save_model` plus the model's config, and writes the unwrapped
model's weights for the test to compare with what `from_pretrained` loads.
"""

import json
import sys
from pathlib import Path

import torch
from accel import Accelerator, set_seed
from torch.utils.data import DataLoader, TensorDataset
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import ModelOutput

out, strategy, precision = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
set_seed(0)
config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
tokens = torch.arange(16).repeat(16, 1) % 64
loader = DataLoader(TensorDataset(tokens), batch_size=4, shuffle=True)
accelerator = Accelerator(strategy=strategy, mixed_precision=precision)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

losses = []
for _epoch in range(4):
    for (batch,) in loader:
        output = model(input_ids=batch, labels=batch)
        assert isinstance(output, ModelOutput), type(output)
        assert output.logits.dtype == torch.float32, output.logits.dtype
        accelerator.backward(output.loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.gather(output.loss.detach()).mean().item())
assert losses[-1] < 0.5 * losses[0], losses

accelerator.wait_for_everyone()
accelerator.save_model(model, out / "saved")
state = accelerator.get_state_dict(model)
if accelerator.is_main_process:
    accelerator.unwrap_model(model).config.save_pretrained(out / "saved")
    torch.save({k: v.detach().float().cpu() for k, v in state.items()}, out / "reference.pt")
    (out / "losses.json").write_text(json.dumps(losses))
accelerator.end_training()
