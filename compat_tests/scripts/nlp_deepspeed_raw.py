"""nlp_deepspeed.py's training written against DeepSpeed alone (no accel, no Accelerate): the reference.

    python -m torch.distributed.run --nproc-per-node 2 nlp_deepspeed_raw.py OUT_DIR

Same model, data, seed and JSON config, with every "auto" filled here by hand the way Accelerate documents
it; each rank takes every second batch of the unsharded loader (what a prepared loader gives it), and
`engine.backward`/`engine.step` accumulate over micro-batches. Rank 0 writes OUT_DIR/raw.pt.
"""

import json
import math
import sys
from pathlib import Path

import deepspeed
import torch
import torch.distributed as dist
from nlp_common import build_tokenizer, tiny_bert, tokenized
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding
from transformers.trainer_utils import set_seed

LR, WEIGHT_DECAY, WARMUP_STEPS, EPOCHS, ACCUMULATION, BATCH_SIZE = 3e-3, 0.01, 2, 2, 2, 4
out = Path(sys.argv[1])
deepspeed.init_distributed(dist_backend="gloo")
rank, world = dist.get_rank(), dist.get_world_size()

set_seed(42)
tokenizer = build_tokenizer()
model = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # first: loaders draw seeds
collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
train_batches = list(DataLoader(tokenized(tokenizer, 64, 1), shuffle=False, collate_fn=collate, batch_size=4))
eval_batches = list(DataLoader(tokenized(tokenizer, 26, 2), shuffle=False, collate_fn=collate, batch_size=8))
no_decay = ("bias", "LayerNorm.weight")
groups = [
    {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)], "weight_decay": WEIGHT_DECAY},
    {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
]

config = json.loads((Path(__file__).parent / "nlp_deepspeed_config.json").read_text())
config["bf16"]["enabled"] = False  # mixed_precision "no"
config["train_micro_batch_size_per_gpu"] = BATCH_SIZE  # the prepared loader's per-process batch size
config["gradient_accumulation_steps"] = ACCUMULATION  # Accelerator(gradient_accumulation_steps=...)
config["train_batch_size"] = BATCH_SIZE * ACCUMULATION * world
config["gradient_clipping"] = 1.0  # Accelerate's value for an "auto" clipping
config["optimizer"]["params"].update(lr=LR, weight_decay=0.0)  # DummyOptim's lr and (default) weight_decay
config["scheduler"]["params"].update(
    warmup_min_lr=0,
    warmup_max_lr=LR,
    warmup_num_steps=WARMUP_STEPS,
    # DummyScheduler's total_num_steps counts the unsharded loader's steps: divided by the processes.
    total_num_steps=math.ceil(EPOCHS * math.ceil(len(train_batches) / ACCUMULATION) / world),
)
config["zero_optimization"]["reduce_bucket_size"] = 32 * 32  # hidden_size squared
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=groups, config=config)


def gathered(loss):
    parts = [torch.zeros_like(loss) for _ in range(world)]
    dist.all_gather(parts, loss.detach())
    return torch.stack(parts).tolist()


def train_epoch():
    engine.train()
    losses = []
    for batch in train_batches[rank::world]:
        loss = engine(**batch).loss
        engine.backward(loss)
        engine.step()
        losses.append(gathered(loss))
    return losses


def evaluate():
    engine.eval()
    with torch.no_grad():
        correct = sum(int((engine(**b).logits.argmax(-1) == b["labels"]).sum()) for b in eval_batches)
    return correct / sum(len(b["labels"]) for b in eval_batches)


result = {"losses": [], "accuracy": [], "config": config}
for _ in range(EPOCHS):
    result["losses"].append(train_epoch())
    result["accuracy"].append(evaluate())
result["weights"] = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
if rank == 0:
    torch.save(result, out / "raw.pt")
dist.barrier()
