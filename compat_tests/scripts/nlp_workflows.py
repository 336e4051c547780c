"""An Accelerate example-style NLP script for the workflows around training, run unchanged on accel.

    python nlp_workflows.py OUT_DIR

Written the way Accelerate's `examples/by_feature` scripts are (the tokenizer, the `datasets` data, the
tiny BERT and the evaluate-style metric of nlp_common.py, all built locally), with the features there
that nlp_features.py does not use:
- a DDP communication hook (`DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16)`):
  gradients are all-reduced in fp16 throughout,
- the profiler (`ProfileKwargs` with a trace directory, `accelerator.profile()`) around the first epoch,
- checkpointing mid-epoch: `save_state` after step 4 of the first epoch, then, after a second epoch,
  `load_state`, `skip_first_batches` and the same steps again: the resumed run repeats the
  uninterrupted one's losses and weights (the training loader keeps a fixed order: with a shuffled
  loader the resumed epoch draws a new order from the restored RNG, in Accelerate too),
- multi-process metrics: `gather_for_metrics` on 26 evaluation examples split over 2 processes in
  batches of 4 drops the samples the last batch repeats to even the processes out (tensors, and
  Python objects with `use_gather_object=True`),
- cross-validation: 3 folds of the training data, a fresh model per fold, the folds' test
  predictions averaged,
- a schedule-free optimizer (`schedulefree.AdamWScheduleFree`, no scheduler): `optimizer.train()`
  before training and `optimizer.eval()` before evaluating, through the prepared optimizer.
Rank 0 writes everything to OUT_DIR/result.pt; compat_tests/test_nlp_features.py runs it under the real
Accelerate and under accel and compares.
"""

import sys
from pathlib import Path

import schedulefree
import torch
from accelerate import Accelerator
from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs, ProfileKwargs, set_seed
from nlp_common import Accuracy, build_tokenizer, tiny_bert, tokenized
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

out = Path(sys.argv[1])
accelerator = Accelerator(
    kwargs_handlers=[
        DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.FP16),
        ProfileKwargs(activities=["cpu"], output_trace_dir=str(out / "trace")),
    ]
)
tokenizer = build_tokenizer()
collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
with accelerator.main_process_first():
    train_data, test_data = tokenized(tokenizer, 72, 1), tokenized(tokenizer, 26, 2)
result: dict = {}


def fit(model, optimizer, scheduler, batches, losses: list, on_step=None) -> None:
    model.train()
    for step, batch in enumerate(batches):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        losses.append(accelerator.gather(loss.detach()).mean().item())
        if on_step is not None:
            on_step(step)


def predict(model, loader) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of the whole `loader`, gathered from every process without duplicates."""
    model.eval()
    logits, labels = [], []
    for batch in loader:
        with torch.no_grad():
            batch_logits = model(**batch).logits
        batch_logits, batch_labels = accelerator.gather_for_metrics((batch_logits, batch["labels"]))
        logits.append(batch_logits)
        labels.append(batch_labels)
    return torch.cat(logits), torch.cat(labels)


def weights(model) -> dict:
    return {k: v.detach().float().cpu().clone() for k, v in accelerator.get_state_dict(model).items()}


# Training with the fp16 communication hook, the first epoch profiled, a checkpoint after its 4th step.
set_seed(42)
model = tiny_bert()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=18)
train_dl = DataLoader(train_data, shuffle=False, collate_fn=collate, batch_size=4)
test_dl = DataLoader(test_data, shuffle=False, collate_fn=collate, batch_size=4)
model, optimizer, train_dl, test_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, test_dl, scheduler)
checkpoint = out / "step_4"
losses: list = []


def save_after_step_4(step: int) -> None:
    if step == 3:
        accelerator.save_state(str(checkpoint))


with accelerator.profile() as profiler:
    fit(model, optimizer, scheduler, train_dl, losses, on_step=save_after_step_4)
result["profiled"] = sorted({event.key for event in profiler.key_averages()} & {"aten::addmm", "aten::mm"})
fit(model, optimizer, scheduler, train_dl, losses)
result["losses"], result["weights"] = losses, weights(model)

# Resume from the mid-epoch checkpoint: the rest of the first epoch, then the second.
accelerator.load_state(str(checkpoint))
resumed: list = []
fit(model, optimizer, scheduler, accelerator.skip_first_batches(train_dl, 4), resumed)
fit(model, optimizer, scheduler, train_dl, resumed)
result["resumed_losses"], result["resumed_weights"] = resumed, weights(model)

# Multi-process metrics: 26 examples, 2 processes, batches of 4; the last batch is evened out.
model.eval()
metric, names, padded = Accuracy(), [], 0
for batch in test_dl:
    with torch.no_grad():
        predictions = model(**batch).logits.argmax(dim=-1)
    padded += len(accelerator.gather(predictions))
    words = ["same" if p else "different" for p in predictions.tolist()]
    names += accelerator.gather_for_metrics(words, use_gather_object=True)
    predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
    metric.add_batch(predictions=predictions, references=references)
result["metric"], result["gathered_with_padding"] = metric.compute(), padded
result["objects"] = names

# Cross-validation: 3 folds, a fresh model for each, the test predictions averaged over the folds.
folds, fold_metrics, test_logits = 3, [], []
for fold in range(folds):
    accelerator.free_memory()
    held_out = list(range(fold, len(train_data), folds))
    kept = [i for i in range(len(train_data)) if i % folds != fold]
    set_seed(42 + fold)
    fold_train = DataLoader(train_data.select(kept), shuffle=True, collate_fn=collate, batch_size=4)
    fold_valid = DataLoader(train_data.select(held_out), shuffle=False, collate_fn=collate, batch_size=4)
    fold_test = DataLoader(test_data, shuffle=False, collate_fn=collate, batch_size=4)
    model = tiny_bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=1, num_training_steps=6)
    model, optimizer, fold_train, fold_valid, fold_test, scheduler = accelerator.prepare(
        model, optimizer, fold_train, fold_valid, fold_test, scheduler
    )
    fit(model, optimizer, scheduler, fold_train, [])
    logits, labels = predict(model, fold_valid)
    fold_metric = Accuracy()
    fold_metric.add_batch(predictions=logits.argmax(dim=-1), references=labels)
    fold_metrics.append(fold_metric.compute())
    logits, test_labels = predict(model, fold_test)
    test_logits.append(logits.cpu())
average = torch.stack(test_logits).mean(dim=0)
final = Accuracy()
final.add_batch(predictions=average.argmax(dim=-1), references=test_labels.cpu())
result["fold_metrics"], result["test_logits"], result["cv_metric"] = fold_metrics, average, final.compute()

# Schedule-free AdamW: its train/eval modes switch the weights the model sees, called on the prepared optimizer.
accelerator.free_memory()
set_seed(42)
model = tiny_bert()
optimizer = schedulefree.AdamWScheduleFree(model.parameters(), lr=3e-3, warmup_steps=2)
sf_train = DataLoader(train_data, shuffle=True, collate_fn=collate, batch_size=4)
sf_test = DataLoader(test_data, shuffle=False, collate_fn=collate, batch_size=4)
model, optimizer, sf_train, sf_test = accelerator.prepare(model, optimizer, sf_train, sf_test)
sf_losses: list = []
model.train()
optimizer.train()
for batch in sf_train:
    loss = model(**batch).loss
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    sf_losses.append(accelerator.gather(loss.detach()).mean().item())
optimizer.eval()
logits, labels = predict(model, sf_test)
sf_metric = Accuracy()
sf_metric.add_batch(predictions=logits.argmax(dim=-1), references=labels)
result["sf_losses"], result["sf_metric"], result["sf_weights"] = sf_losses, sf_metric.compute(), weights(model)

accelerator.wait_for_everyone()
if accelerator.is_main_process:
    result["traces"] = sorted(p.name for p in (out / "trace").glob("*.json"))
    torch.save(result, out / "result.pt")
accelerator.end_training()
