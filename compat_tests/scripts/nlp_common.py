"""What the example-style NLP scripts share: a word-level tokenizer, MRPC-shaped sentence pairs made in
code as a `datasets.Dataset`, a tiny BERT classifier from a config and an evaluate-style accuracy metric.
Everything is built locally (no download)."""

import torch
from datasets import Dataset
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import BertConfig, BertForSequenceClassification, PreTrainedTokenizerFast

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", *[f"w{i}" for i in range(28)]]


class Accuracy:
    """An evaluate-style metric: add_batch per step, compute at the end."""

    def __init__(self) -> None:
        self.correct = self.total = 0

    def add_batch(self, predictions: torch.Tensor, references: torch.Tensor) -> None:
        self.correct += int((predictions == references).sum())
        self.total += len(references)

    def compute(self) -> dict:
        return {"accuracy": self.correct / self.total, "count": self.total}


def build_tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    backend.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]"
    )


def pairs(n: int, seed: int) -> Dataset:
    """Sentence pairs; label 1 when the second sentence repeats the first one's first word."""
    g = torch.Generator().manual_seed(seed)
    first, second, labels = [], [], []
    for _ in range(n):
        a = torch.randint(0, 28, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)
        b = torch.randint(0, 28, (int(torch.randint(3, 8, (1,), generator=g)),), generator=g)
        label = int(torch.randint(0, 2, (1,), generator=g))
        if label:
            b[0] = a[0]
        first.append(" ".join(f"w{int(t)}" for t in a))
        second.append(" ".join(f"w{int(t)}" for t in b))
        labels.append(int(b[0] == a[0]))
    return Dataset.from_dict({"sentence1": first, "sentence2": second, "label": labels})


def tokenized(tokenizer: PreTrainedTokenizerFast, n: int, seed: int) -> Dataset:
    """`pairs(n, seed)` tokenized, with the column names a transformers model takes."""

    def tokenize(examples):
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=24)

    dataset = pairs(n, seed).map(tokenize, batched=True, remove_columns=["sentence1", "sentence2"])
    return dataset.rename_column("label", "labels")


def tiny_bert(**overrides) -> BertForSequenceClassification:
    """A 2-layer BERT classifier from a config; `overrides` go to `BertConfig` (e.g. dropout off)."""
    config = BertConfig(
        vocab_size=len(WORDS),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        num_labels=2,
        **overrides,
    )
    return BertForSequenceClassification(config)
