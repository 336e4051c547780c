"""Megatron's datasets behind a torch DataLoader: `MegatronLMDummyDataLoader` (Accelerate's name).

`MegatronLMDummyDataLoader(micro_batch_size=..., ...)` is a DataLoader over a dataset that `prepare`
fills in: the first one prepared gets the train split, the second the validation split, the
third the test split, as in Accelerate. The splits come from the plugin's
`custom_megatron_datasets_provider_function(train_val_test_num_samples)`, or else from
megatron-core's GPT datasets (`data_path`: Megatron's indexed dataset prefixes; without it
megatron-core's mock GPT dataset). Each split starts after the plugin's `consumed_samples` for
it; the loader is then sharded over the data-parallel group like any other: data-parallel rank
r of step k gets samples [(k * dp + r) * b, (k * dp + r + 1) * b) past the consumed ones, the
order of Megatron-LM's pretraining sampler.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset

from .plugin import MegatronConfigError, MegatronPlugin

SPLITS = ("train", "valid", "test")


class _Pending(Dataset[Any]):
    """The dataset of a `MegatronLMDummyDataLoader` until `prepare` builds it: a view of one split from
    `offset` on."""

    def __init__(self) -> None:
        self.source: Any = None
        self.offset = 0

    def _built(self) -> Any:
        if self.source is None:
            raise RuntimeError(
                "A MegatronLMDummyDataLoader has no data until accelerator.prepare() builds Megatron's datasets."
            )
        return self.source

    def __len__(self) -> int:
        return max(len(self._built()) - self.offset, 0)

    def __getitem__(self, index: int) -> Any:
        return self._built()[self.offset + index]


class MegatronLMDummyDataLoader(DataLoader):  # type: ignore[type-arg]
    """Accelerate's placeholder for Megatron's datasets: pass it to `prepare` and get a loader over
    the next split (train, then valid, then test).

    Args:
        micro_batch_size: samples per data-parallel rank per micro-batch; each batch holds
            `micro_batch_size * num_micro_batches` samples (split again by `train_step`).
        seq_length: tokens per sample of megatron-core's GPT datasets (default: the plugin's
            `seq_length`).
        data_path: Megatron indexed-dataset prefixes (a `.bin`/`.idx` pair each), or None for
            megatron-core's mock GPT dataset.
        split: the train/valid/test proportions, Megatron's "969,30,1" form.
        vocab_size: vocabulary of the token ids (megatron-core's null tokenizer; its last id is EOD).
        **dataset_kwargs: further Megatron data arguments; names the GPT dataset does not have are refused.
    """

    def __init__(
        self,
        micro_batch_size: int,
        seq_length: int | None = None,
        data_path: str | list[str] | None = None,
        split: str = "969,30,1",
        vocab_size: int | None = None,
        **dataset_kwargs: Any,
    ) -> None:
        if not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise MegatronConfigError(f"micro_batch_size must be an integer >= 1, got {micro_batch_size!r}.")
        super().__init__(_Pending(), batch_size=micro_batch_size)
        self.micro_batch_size = micro_batch_size
        self.dataset_args: dict[str, Any] = {
            "seq_length": seq_length,
            "data_path": [data_path] if isinstance(data_path, str) else data_path,
            "split": split,
            "vocab_size": vocab_size,
            **dataset_kwargs,
        }


class DatasetsBuilder:
    """Builds the three splits once, for the first `MegatronLMDummyDataLoader` prepared, and hands them out in
    order."""

    def __init__(self, plugin: MegatronPlugin) -> None:
        self.plugin = plugin
        self.splits: tuple[Any, Any, Any] | None = None
        self.handed = 0

    def num_samples(self, micro_batch_size: int, data_parallel_size: int) -> list[int]:
        """Megatron-LM's `train_val_test_num_samples`: the samples each split must provide for the run."""
        plugin = self.plugin
        global_batch = micro_batch_size * plugin.num_micro_batches * data_parallel_size
        if plugin.train_samples is not None:
            iters, train = plugin.train_samples // global_batch, plugin.train_samples
        elif plugin.train_iters is not None:
            iters, train = plugin.train_iters, plugin.train_iters * global_batch
        else:
            raise MegatronConfigError(
                "Megatron's datasets are sized for the run: set MegatronPlugin(train_iters=...) (or train_samples) "
                "to use a MegatronLMDummyDataLoader."
            )
        evals = (iters // plugin.eval_interval + 1) * plugin.eval_iters
        return [train, evals * global_batch, plugin.eval_iters * global_batch]

    def fill(self, loader: MegatronLMDummyDataLoader, data_parallel_size: int, seed: int) -> None:
        """Give `loader` its split (train, valid, test in the order prepared), past the consumed samples, and
        the batch size of one step (micro-batch size x num_micro_batches)."""
        if self.handed >= len(SPLITS):
            raise MegatronConfigError("At most three MegatronLMDummyDataLoaders (train, valid, test) can be prepared.")
        if self.splits is None:
            counts = self.num_samples(loader.micro_batch_size, data_parallel_size)
            provider = self.plugin.custom_megatron_datasets_provider_function
            splits = provider(counts) if provider is not None else gpt_datasets(loader, self.plugin, counts, seed)
            if not isinstance(splits, (tuple, list)) or len(splits) != 3:
                raise MegatronConfigError(
                    "custom_megatron_datasets_provider_function must return (train, valid, test) datasets; got "
                    f"{type(splits).__name__}."
                )
            self.splits = (splits[0], splits[1], splits[2])
        index = self.handed
        self.handed += 1
        pending = loader.dataset
        assert isinstance(pending, _Pending)
        pending.source = self.splits[index]
        if pending.source is None:
            raise MegatronConfigError(f"The datasets provider returned no {SPLITS[index]} dataset.")
        consumed = self.plugin.consumed_samples or [0, 0, 0]
        pending.offset = int([*consumed, 0, 0, 0][index])
        # One step's batch per data-parallel rank: train_step splits it into num_micro_batches.
        size = loader.micro_batch_size * self.plugin.num_micro_batches
        loader._DataLoader__initialized = False  # type: ignore[attr-defined]  # DataLoader guards batch_size
        loader.batch_size = size
        loader.batch_sampler = BatchSampler(loader.sampler, size, drop_last=False)  # type: ignore[arg-type]
        loader._DataLoader__initialized = True  # type: ignore[attr-defined]


def gpt_datasets(loader: MegatronLMDummyDataLoader, plugin: MegatronPlugin, counts: list[int], seed: int) -> Any:
    """megatron-core's GPT train/valid/test datasets (mock without `data_path`), as Megatron-LM's
    `pretrain_gpt` provider builds them."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset
    from megatron.core.tokenizers.text.libraries.null_tokenizer import NullTokenizer

    args = dict(loader.dataset_args)
    seq_length = args.pop("seq_length") or plugin.seq_length
    data_path, split, vocab_size = args.pop("data_path"), args.pop("split"), args.pop("vocab_size")
    if seq_length is None:
        raise MegatronConfigError(
            "Give the sequence length: MegatronLMDummyDataLoader(seq_length=...) or the plugin's."
        )
    if vocab_size is None:
        raise MegatronConfigError("Give MegatronLMDummyDataLoader(vocab_size=...): the token ids' vocabulary.")
    try:
        config = GPTDatasetConfig(
            random_seed=seed,
            sequence_length=seq_length,
            blend=(data_path, None) if data_path else None,
            split=split,
            tokenizer=NullTokenizer(vocab_size=vocab_size - 1),  # its EOD is the id after the last
            reset_position_ids=False,
            reset_attention_mask=False,
            eod_mask_loss=plugin.eod_mask_loss,
            **args,
        )
    except TypeError as error:
        raise MegatronConfigError(f"MegatronLMDummyDataLoader: {error} (megatron-core's GPTDatasetConfig).") from None
    kind = GPTDataset if data_path else MockGPTDataset
    with torch.random.fork_rng():
        return BlendedMegatronDatasetBuilder(kind, counts, lambda: True, config).build()
