"""Hugging Face models through megatron-core, as Accelerate's MegatronLMPlugin users train them: a tiny GPT-2 (tied
embeddings, under PP=2) and a tiny Llama (grouped-query attention, SwiGLU, RMSNorm, rotary, untied head, under TP=2)
built from `transformers` configs, prepared on 2 gloo processes, trained with `GPTTrainStep`, evaluated with
`eval_step`, saved with `save_model` and loaded back with `from_pretrained`, against the plain `transformers` models
trained on one process.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from conftest import WORKERS, run_launch
from safetensors.torch import load_file

pytest.importorskip("megatron.core")
transformers = pytest.importorskip("transformers")


def test_gpt2_under_pp2_and_llama_under_tp2_and_dp2_match_transformers_on_one_process(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("hf_worker", WORKERS / "hf.py")
    assert spec is not None and spec.loader is not None
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    worker.reference(tmp_path)  # the plain transformers models, here on one process
    run_launch(WORKERS / "hf.py", "mp", str(tmp_path))
    ref = json.loads((tmp_path / "hf_ref_0.json").read_text())
    ranks = [json.loads((tmp_path / f"hf_mp_{r}.json").read_text()) for r in (0, 1)]
    # Data parallelism 2 (each replica half of every batch): GPTTrainStep's loss is averaged over the replicas.
    for got in ranks:
        assert got["llama_dp"]["losses"] == pytest.approx(ref["llama"]["losses"], rel=1e-5)
        assert got["llama_dp"]["lrs"] == pytest.approx(ref["llama"]["lrs"], rel=1e-6)
        # Accelerate's train-step protocol (custom_train_step_class with its kwargs) under PP=2: the same numbers.
        assert got["gpt2_custom"]["losses"] == pytest.approx(ref["gpt2"]["losses"], rel=1e-5)
        assert got["gpt2_custom"]["lrs"] == pytest.approx(ref["gpt2"]["lrs"], rel=1e-6)
        assert got["gpt2_custom"]["eval"] == pytest.approx(ref["gpt2"]["eval"], rel=1e-5)
        assert got["custom_args"] == [1, 2, 2, 2, "gpt"]
        assert got["llama_dp"]["eval"] == pytest.approx(ref["llama"]["eval"], rel=1e-5)
    for family in ("gpt2", "llama"):
        for got in ranks:  # every process returns the step's loss (PP: broadcast from the last stage)
            assert got[family]["losses"] == pytest.approx(ref[family]["losses"], rel=1e-5), family
            # model(**batch) stepped the scheduler once per step; the loop's own scheduler.step() did nothing.
            assert got[family]["lrs"] == pytest.approx(ref[family]["lrs"], rel=1e-6), family
            assert got[family]["eval"] == pytest.approx(ref[family]["eval"], rel=1e-5), family
            assert got[family]["shard_params"] < 0.6 * got[family]["hf_params"], "each process holds a part"
        # eval_step's logits (last pipeline stage): the whole batch over the full vocabulary, gathered over TP.
        logits = torch.tensor(ranks[1][family]["logits"])
        torch.testing.assert_close(logits, torch.tensor(ref[family]["logits"]), rtol=0, atol=1e-4, msg=family)

        # save_model: Hugging Face names and layouts (Conv1D, separate q/k/v, gate/up), loadable by transformers.
        plain = load_file(str(tmp_path / f"{family}_ref.safetensors"))
        merged = load_file(str(tmp_path / f"{family}_mp" / "model.safetensors"))
        assert set(merged) == set(plain), family
        for name, value in plain.items():
            assert merged[name].shape == value.shape, name
            torch.testing.assert_close(merged[name], value, rtol=0, atol=2e-4, msg=name)
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            tmp_path / f"{family}_mp", attn_implementation="eager"
        )
        assert loaded.config.vocab_size == logits.shape[-1]
        with torch.no_grad():
            reloaded = loaded(input_ids=torch.tensor(ref["eval_ids"])).logits
        torch.testing.assert_close(reloaded, torch.tensor(ref[family]["logits"]), rtol=0, atol=1e-4, msg=family)


def test_model_parsers_give_accelerates_megatron_arguments() -> None:
    from accel_megatron import MegatronPlugin
    from accel_megatron.hf import megatron_args

    gpt2 = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    args = megatron_args(gpt2, MegatronPlugin(return_logits=True))
    assert args["num_layers"] == 2 and args["hidden_size"] == 32 and args["num_attention_heads"] == 4
    assert (args["max_position_embeddings"], args["orig_vocab_size"], args["seq_length"]) == (16, 64, 16)
    assert (args["model_type_name"], args["tokenizer_type"], args["return_logits"]) == ("gpt", "GPT2BPETokenizer", True)
    llama = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=32,
    )
    batch = {"input_ids": torch.zeros(2, 8, dtype=torch.long)}
    args = megatron_args(llama, MegatronPlugin(), batch_data=batch)
    assert (args["num_layers"], args["seq_length"], args["tokenizer_type"]) == (3, 8, "Llama2Tokenizer")
    assert megatron_args(llama, MegatronPlugin(seq_length=12))["seq_length"] == 12


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ("BertConfig", "'bert' is not supported: megatron-core's BertModel is a pre-LayerNorm transformer"),
        ("T5Config", "'t5' is not supported: its conversion is not implemented"),
        ("OPTConfig", "'opt' has no megatron-core conversion here (GPT-2 and Llama do)"),
    ],
)
def test_prepare_refuses_other_hugging_face_models_by_name(megatron_world: None, config: str, reason: str) -> None:
    from accel import Accelerator
    from accel_megatron import MegatronConfigError, MegatronPlugin

    accelerator = Accelerator(megatron_lm_plugin=MegatronPlugin())
    kwargs = {"vocab_size": 64, "d_model": 32, "num_layers": 1, "num_heads": 2, "d_ff": 32, "d_kv": 16}
    if config != "T5Config":
        kwargs = {"vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
        kwargs |= {"intermediate_size": 32} if config == "BertConfig" else {"ffn_dim": 32}
    model = transformers.AutoModel.from_config(getattr(transformers, config)(**kwargs))
    with pytest.raises(MegatronConfigError, match=re.escape(reason)):
        accelerator.prepare(model)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"vocab_size": 63}, r"vocab_size 63 is not divisible by tp_degree 2.*resize_token_embeddings"),
        ({"embd_pdrop": 0.0}, r"embd_pdrop \(0.0\) differs from resid_pdrop \(0.1\).*set them equal"),
        ({"scale_attn_by_inverse_layer_idx": True}, r"scale_attn_by_inverse_layer_idx=True.*use the defaults"),
    ],
)
def test_gpt2_options_without_a_megatron_counterpart_are_refused(options: dict, message: str) -> None:
    from accel_megatron import MegatronConfigError, MegatronPlugin
    from accel_megatron.hf import model_kwargs

    config = transformers.GPT2Config(**{"vocab_size": 64, "n_embd": 32, "n_layer": 1, "n_head": 4, **options})
    with pytest.raises(MegatronConfigError, match=message):
        model_kwargs(config, MegatronPlugin(tp_degree=2))


def test_gpt_train_step_refuses_left_padding() -> None:
    """Its attention is causal only: right padding (labelled -100) gives the Hugging Face loss, left padding would not."""
    from accel_megatron import GPTTrainStep, MegatronConfigError

    batch = {
        "input_ids": torch.ones(2, 4, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]),
    }
    with pytest.raises(MegatronConfigError, match="pad on the right"):
        GPTTrainStep.forward_fn(torch.nn.Identity(), batch)


def _tiny_gpt2() -> torch.nn.Module:
    config = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def test_model_call_runs_the_step_and_refuses_what_it_would_drop(megatron_world: None) -> None:
    """Accelerate's loop on one process: what `model(**batch)` cannot honour is refused by name."""
    from accel import Accelerator
    from accel_megatron import GPTTrainStep, MegatronConfigError, MegatronPlugin

    batch = {"input_ids": torch.randint(0, 64, (2, 8)), "labels": torch.randint(0, 64, (2, 8))}
    accelerator = Accelerator(megatron_lm_plugin=MegatronPlugin())
    model = accelerator.prepare(_tiny_gpt2())
    with pytest.raises(MegatronConfigError, match="prepare the optimizer before calling the model"):
        model(**batch)
    optimizer = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(MegatronConfigError, match=r"got \['input_ids', 'token_type_ids'\]. Leave out \['token_type"):
        model(input_ids=batch["input_ids"], token_type_ids=batch["input_ids"])
    before = [p.detach().clone() for p in model.parameters()]
    outputs = model(**batch)
    after = [p.detach().clone() for p in model.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(after, before)), "model(**batch) stepped the optimizer"
    accelerator.backward(outputs.loss)  # nothing to do, as in Accelerate
    optimizer.step()
    optimizer.zero_grad()
    assert all(torch.equal(a, p) for a, p in zip(after, model.parameters())), "the loop's own step did nothing"
    with pytest.raises(MegatronConfigError, match="gradients of another loss would be dropped"):
        accelerator.backward(sum(p.sum() for p in model.parameters()))
    with pytest.raises(MegatronConfigError, match=r"MegatronPlugin\(gradient_clipping=...\)"):
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
    with pytest.raises(MegatronConfigError, match="not both"):
        GPTTrainStep(accelerator)(model, batch)


def test_model_call_refuses_gradient_accumulation(megatron_world: None) -> None:
    from accel import Accelerator
    from accel_megatron import MegatronConfigError, MegatronPlugin

    accelerator = Accelerator(megatron_lm_plugin=MegatronPlugin(), gradient_accumulation_steps=2)
    model = accelerator.prepare(_tiny_gpt2())
    accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(MegatronConfigError, match=r"gradient_accumulation_steps=2.*num_micro_batches"):
        model(input_ids=torch.randint(0, 64, (2, 8)))


def test_custom_batch_and_loss_functions_run_in_accelerates_gpt_step(megatron_world: None) -> None:
    """`custom_get_batch_function` / `custom_loss_function` (no class): Accelerate's GPT step runs them per
    micro-batch; the loss and the SGD step equal the plain transformers model's."""
    import copy

    from accel import Accelerator
    from accel_megatron import MegatronPlugin

    seen: list[tuple[int, ...]] = []

    def get_batch(data_iterator):
        micro = next(data_iterator)
        tokens = micro["input_ids"]
        seen.append(tuple(tokens.shape))
        mask = torch.ones(tokens.shape)
        mask[:, -1] = 0  # the last position has no next token
        positions = torch.arange(tokens.shape[1]).expand(tokens.shape[0], -1)
        return tokens, torch.roll(tokens, -1, dims=1), mask, None, positions

    def loss_function(loss_mask, per_token):
        loss = (per_token * loss_mask).sum() / loss_mask.sum()
        return loss, {"lm loss": loss.detach()}

    plugin = MegatronPlugin(
        custom_get_batch_function=get_batch, custom_loss_function=loss_function, num_micro_batches=2
    )
    accelerator = Accelerator(megatron_lm_plugin=plugin)
    hf_model = _tiny_gpt2()
    reference = copy.deepcopy(hf_model)
    model = accelerator.prepare(hf_model)
    accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.5))
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    loss = model(input_ids=ids)  # no model_output_class: the loss itself, as in Accelerate
    assert seen == [(1, 8), (1, 8)], "one call per micro-batch"
    expected = reference(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=0)
    expected.backward()
    with torch.no_grad():
        for p in reference.parameters():
            p -= 0.5 * p.grad
    trained = accelerator.get_state_dict(model)
    assert len(set(trained) & set(reference.state_dict())) >= 10, "Hugging Face names"
    for name, value in reference.state_dict().items():
        if name in trained:
            torch.testing.assert_close(trained[name], value, rtol=0, atol=1e-5, msg=name)


def test_evaluation_losses_are_logged_when_the_model_trains_again(megatron_world: None, tmp_path: Path, capsys) -> None:
    """Accelerate's engine: `model.eval()` calls are averaged, and `model.train()` writes them to TensorBoard
    ("lm loss validation" and its ppl at the current step) and prints Megatron-LM's line."""
    import math

    from accel import Accelerator
    from accel_megatron import MegatronPlugin
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accelerator = Accelerator(megatron_lm_plugin=MegatronPlugin(tensorboard_dir=str(tmp_path / "tb")))
    model = accelerator.prepare(_tiny_gpt2())
    accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(5))
    model.train()
    model(input_ids=ids[:2])
    model.eval()
    losses = [model(input_ids=ids[:2]).loss.item(), model(input_ids=ids[2:]).loss.item()]
    assert losses[0] != losses[1]
    model.train()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    logged = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    mean = sum(losses) / 2
    assert logged["lm loss validation"] == [(1, pytest.approx(mean, rel=1e-6))]
    assert logged["lm loss validation ppl"] == [(1, pytest.approx(math.exp(mean), rel=1e-6))]
    assert f"validation loss at iteration 1 | lm loss value: {mean}" in capsys.readouterr().out
    model.train()  # nothing new to log
    events.Reload()
    assert len(events.Scalars("lm loss validation")) == 1
