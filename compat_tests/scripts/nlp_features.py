"""An Accelerate example-style NLP script (a tiny BERT on an MRPC-shaped task), run unchanged on accel.

    python nlp_features.py OUT_DIR

Written the way Accelerate's `examples/by_feature` scripts are, with everything built locally: a
word-level tokenizer, a `datasets` dataset made in code, a BERT classifier from a config, an
evaluate-style metric (add_batch/compute over `gather_for_metrics`). One run exercises several features:
- `find_executable_batch_size` around the training function (memory),
- gradient accumulation (`accumulate`) with a warmup scheduler and clipping,
- tracking (`log_with="tensorboard"`, `init_trackers`, `log`, `end_training`),
- early stopping across processes (`set_trigger`/`check_trigger`),
- checkpointing: `save_state` at each epoch's end,
- local SGD (`LocalSGD`) for a last epoch.
Rank 0 writes losses, metrics and final weights to OUT_DIR/result.pt; compat_tests/test_nlp_features.py
runs it under the real Accelerate and under accel and compares.
"""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.local_sgd import LocalSGD
from accelerate.utils import find_executable_batch_size, set_seed
from nlp_common import Accuracy, build_tokenizer, tiny_bert, tokenized
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, get_linear_schedule_with_warmup

out = Path(sys.argv[1])


def get_dataloaders(accelerator: Accelerator, tokenizer, batch_size: int):
    with accelerator.main_process_first():
        train, evaluation = tokenized(tokenizer, 72, 1), tokenized(tokenizer, 26, 2)
    collate = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    return (
        DataLoader(train, shuffle=True, collate_fn=collate, batch_size=batch_size),
        DataLoader(evaluation, shuffle=False, collate_fn=collate, batch_size=8),
    )


accelerator = Accelerator(gradient_accumulation_steps=2, log_with="tensorboard", project_dir=str(out / "logs"))
accelerator.init_trackers("nlp_features", config={"lr": 3e-3})
tokenizer = build_tokenizer()
result: dict = {"losses": [], "metrics": [], "batch_sizes": []}


@find_executable_batch_size(starting_batch_size=4)
def train(batch_size: int) -> None:
    accelerator.free_memory()
    result["batch_sizes"].append(batch_size)
    set_seed(42)
    train_dl, eval_dl = get_dataloaders(accelerator, tokenizer, batch_size)
    model = tiny_bert()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=2, num_training_steps=40)
    model, optimizer, train_dl, eval_dl, scheduler = accelerator.prepare(model, optimizer, train_dl, eval_dl, scheduler)

    def evaluate_once(epoch: int) -> None:
        model.eval()
        metric = Accuracy()
        for batch in eval_dl:
            with torch.no_grad():
                predictions = model(**batch).logits.argmax(dim=-1)
            predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
            metric.add_batch(predictions=predictions, references=references)
        scores = metric.compute()
        result["metrics"].append(scores)
        accelerator.log(scores, step=epoch)

    for epoch in range(3):
        model.train()
        for step, batch in enumerate(train_dl):
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
            result["losses"].append(accelerator.gather(loss.detach()).mean().item())
            # Early stopping, decided on any process: stop the epoch once the loss is tiny.
            if loss.item() < 1e-3:
                accelerator.set_trigger()
            if accelerator.check_trigger():
                break
            if epoch == 0 and step == 0 and batch_size == 4:
                # The memory feature: the first attempt "runs out of memory"; the decorator halves the size.
                raise RuntimeError("CUDA out of memory. (simulated by the example)")
        evaluate_once(epoch)
        accelerator.save_state(str(out / f"epoch_{epoch}"))

    # A last epoch with local SGD: parameters averaged every 2 steps, no gradient all-reduce in between.
    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=2, enabled=True) as local_sgd:
        model.train()
        for batch in train_dl:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
                local_sgd.step()
            result["losses"].append(accelerator.gather(loss.detach()).mean().item())
    evaluate_once(3)
    accelerator.wait_for_everyone()
    state = accelerator.get_state_dict(model)
    result["weights"] = {k: v.detach().float().cpu().clone() for k, v in state.items()}


train()
accelerator.end_training()
if accelerator.is_main_process:
    result["logged"] = sorted(p.name for p in (out / "logs").rglob("events.out.tfevents*"))[:1]
    torch.save(result, out / "result.pt")
