"""transformers' Trainer, a peft LoRA model and trl's SFTTrainer, written for Accelerate and run unchanged.

    python hf_trainer.py OUT_DIR ddp|fsdp2

Nothing is downloaded: models come from small configs, data is synthetic, the tokenizer is built in
code. In one process, in turn:
1. `Trainer` trains a tiny BERT classifier for 2 epochs (evaluating and checkpointing every epoch);
2. a second `Trainer` resumes from the epoch-1 checkpoint (`train(resume_from_checkpoint=...)`; under FSDP
   through `accelerate.utils.load_fsdp_model`/`load_fsdp_optimizer`);
3. (ddp) `Trainer` trains a peft LoRA adapter on a tiny GPT-2, then trl's `SFTTrainer` fine-tunes
   another (both prepare through `Accelerator.prepare`).
Rank 0 writes what a comparison needs to OUT_DIR/result.pt: every logged loss and eval metric, the
checkpoint's weights and the final weights of each part. compat_tests/test_hf_trainer.py runs this under
the real Accelerate and under accel (`accel launch -m accel.as_accelerate`) and compares.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

out, mode = Path(sys.argv[1]), sys.argv[2]


class Synthetic(torch.utils.data.Dataset):
    """Token sequences whose label is whether token 1 appears more often than token 2."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, 40, (n, 12), generator=g)
        self.ids[:, :4] = torch.randint(1, 3, (n, 4), generator=g)
        self.labels = ((self.ids == 1).sum(1) > (self.ids == 2).sum(1)).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": self.labels[i]}


def accuracy(prediction) -> dict:
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def arguments(directory: Path, **extra) -> TrainingArguments:
    fsdp = (
        {"fsdp": "full_shard", "fsdp_config": {"version": 2, "reshard_after_forward": True}} if mode == "fsdp2" else {}
    )
    return TrainingArguments(
        output_dir=str(directory),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=2e-3,
        seed=0,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **fsdp,
        **extra,
    )


def bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=40,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
        num_labels=2,
    )
    return BertForSequenceClassification(config)


def final_weights(trainer: Trainer) -> dict:
    state = trainer.accelerator.get_state_dict(trainer.model)
    return {k: v.detach().float().cpu().clone() for k, v in (state or {}).items()}


def history(trainer: Trainer) -> list:
    keep = ("loss", "eval_loss", "eval_accuracy", "grad_norm", "epoch", "step")
    return [{k: v for k, v in entry.items() if k in keep} for entry in trainer.state.log_history]


result: dict = {}
train, evaluate = Synthetic(64, 1), Synthetic(24, 2)
# 1. Trainer, 2 epochs, evaluation and a checkpoint at each epoch's end. (Under FSDP, Trainer writes the
# model and optimizer through `accelerate.utils.save_fsdp_model`/`save_fsdp_optimizer`, next to its
# model.safetensors.)


def classifier_trainer(directory: Path) -> Trainer:
    epochs = {"num_train_epochs": 2, "eval_strategy": "epoch", "save_strategy": "epoch"}
    return Trainer(
        model=bert(),
        args=arguments(directory, **epochs),
        train_dataset=train,
        eval_dataset=evaluate,
        compute_metrics=accuracy,
    )


trainer = classifier_trainer(out / "run")
trainer.train()
result["sharded"] = any(type(p).__name__ == "DTensor" for p in trainer.model_wrapped.parameters())
result["history"] = history(trainer)
result["weights"] = final_weights(trainer)
first = out / "run" / f"checkpoint-{trainer.state.max_steps // 2}"
if trainer.is_world_process_zero():
    result["checkpoint"] = load_file(first / "model.safetensors")
    result["checkpoint_files"] = sorted(p.name for p in first.iterdir())

# 2. Trainer's own resume, from the first epoch's checkpoint (under FSDP: load_fsdp_model/load_fsdp_optimizer).
resumed = classifier_trainer(out / "resumed")
resumed.train(resume_from_checkpoint=str(first))
result["resumed_history"] = history(resumed)
result["resumed_weights"] = final_weights(resumed)

if mode == "ddp":
    # 3. A peft LoRA adapter on a tiny GPT-2, through Trainer, then trl's SFTTrainer.
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    def lora_gpt2():
        torch.manual_seed(0)
        base = GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=32, n_layer=2, n_head=2))
        return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0))

    class Tokens(Synthetic):
        def __getitem__(self, i: int) -> dict:
            return {"input_ids": self.ids[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": self.ids[i]}

    lora = Trainer(model=lora_gpt2(), args=arguments(out / "lora", max_steps=6), train_dataset=Tokens(48, 3))
    lora.train()
    result["lora_history"] = history(lora)
    result["lora_weights"] = {k: v for k, v in final_weights(lora).items() if "lora_" in k}

    from datasets import Dataset
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig, SFTTrainer

    words = ["[PAD]", "[EOS]", *[f"w{i}" for i in range(38)]]
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="[PAD]"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", eos_token="[EOS]")
    g = torch.Generator().manual_seed(4)
    texts = [" ".join(f"w{int(t)}" for t in torch.randint(0, 38, (10,), generator=g)) for _ in range(32)]
    sft = SFTTrainer(
        model=lora_gpt2(),
        args=SFTConfig(
            output_dir=str(out / "sft"),
            per_device_train_batch_size=4,
            learning_rate=2e-3,
            max_steps=4,
            seed=0,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
            max_length=16,
        ),
        train_dataset=Dataset.from_dict({"text": texts}),
        processing_class=tokenizer,
    )
    sft.train()
    result["sft_history"] = history(sft)
    result["sft_weights"] = {k: v for k, v in final_weights(sft).items() if "lora_" in k}

if trainer.is_world_process_zero():
    torch.save(result, out / "result.pt")
