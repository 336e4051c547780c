"""An Accelerate example-style DeepSpeed script with a config file (`deepspeed_with_config_support`-style).

    accel launch --num-processes 2 --use_deepspeed --deepspeed_config_file nlp_deepspeed_config.json \\
        -m accel.as_accelerate nlp_deepspeed.py OUT_DIR

The DeepSpeed JSON config (ZeRO stage 2, an AdamW optimizer and a WarmupDecayLR scheduler) leaves its batch
sizes, accumulation steps, clipping, optimizer and scheduler params at "auto": the Accelerator fills them from
the data loader, `Accelerator(gradient_accumulation_steps=...)`, `DummyOptim` and `DummyScheduler`, as
Accelerate does. A tiny BERT (dropout off, so that the numbers do not depend on how a loader draws random
numbers) trains two epochs with `accumulate` and `backward`; `save_state` at the first epoch's end, then the
second epoch twice: once straight on, once after `load_state` of that checkpoint. Accuracy comes from
`gather_for_metrics`. Rank 0 writes losses, accuracies, the filled config and `get_state_dict`'s weights to
OUT_DIR/result.pt; packages/accel-base/tests/deepspeed/test_deepspeed_example_config.py compares them with
plain DeepSpeed (nlp_deepspeed_raw.py).
"""

import math
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import DummyOptim, DummyScheduler, set_seed
from nlp_common import Accuracy, build_tokenizer, tiny_bert, tokenized
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

LR, WEIGHT_DECAY, WARMUP_STEPS, EPOCHS, ACCUMULATION, BATCH_SIZE = 3e-3, 0.01, 2, 2, 2, 4
out = Path(sys.argv[1])


def get_dataloaders(accelerator: Accelerator, tokenizer):
    with accelerator.main_process_first():
        train, evaluation = tokenized(tokenizer, 64, 1), tokenized(tokenizer, 26, 2)
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    return (
        DataLoader(train, shuffle=False, collate_fn=collate, batch_size=BATCH_SIZE),
        DataLoader(evaluation, shuffle=False, collate_fn=collate, batch_size=8),
    )


def grouped_parameters(model):
    no_decay = ("bias", "LayerNorm.weight")
    return [
        {"params": [p for n, p in model.named_parameters() if not n.endswith(no_decay)], "weight_decay": WEIGHT_DECAY},
        {"params": [p for n, p in model.named_parameters() if n.endswith(no_decay)], "weight_decay": 0.0},
    ]


accelerator = Accelerator(gradient_accumulation_steps=ACCUMULATION)
set_seed(42)
tokenizer = build_tokenizer()
train_dl, eval_dl = get_dataloaders(accelerator, tokenizer)
model = tiny_bert(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)

# The config file names the optimizer and the scheduler: DummyOptim/DummyScheduler stand in for them.
ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
optimizer_cls = DummyOptim if "optimizer" in ds_config else torch.optim.AdamW
optimizer = optimizer_cls(grouped_parameters(model), lr=LR)
max_train_steps = EPOCHS * math.ceil(len(train_dl) / ACCUMULATION)
if "scheduler" in ds_config:
    lr_scheduler = DummyScheduler(optimizer, total_num_steps=max_train_steps, warmup_num_steps=WARMUP_STEPS)
else:
    lr_scheduler = get_linear_schedule_with_warmup(optimizer, WARMUP_STEPS, max_train_steps)
model, optimizer, train_dl, eval_dl, lr_scheduler = accelerator.prepare(
    model, optimizer, train_dl, eval_dl, lr_scheduler
)


def train_epoch() -> list[list[float]]:
    model.train()
    losses = []
    for batch in train_dl:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).tolist())
    return losses


def evaluate() -> float:
    model.eval()
    metric = Accuracy()
    for batch in eval_dl:
        with torch.no_grad():
            predictions = model(**batch).logits.argmax(dim=-1)
        metric.add_batch(*accelerator.gather_for_metrics((predictions, batch["labels"])))
    return metric.compute()["accuracy"]


result = {"losses": [train_epoch()], "accuracy": [evaluate()]}
accelerator.save_state(str(out / "epoch_0"))
result["losses"].append(train_epoch())
result["accuracy"].append(evaluate())
result["weights_straight"] = {k: v.clone() for k, v in accelerator.get_state_dict(model).items()}
accelerator.load_state(str(out / "epoch_0"))
result["resumed_losses"] = train_epoch()
result["resumed_accuracy"] = evaluate()
result["weights"] = accelerator.get_state_dict(model)
result["config"] = accelerator.deepspeed_config
if accelerator.is_main_process:
    torch.save(result, out / "result.pt")
accelerator.end_training()
