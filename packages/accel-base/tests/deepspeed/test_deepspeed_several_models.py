"""Several DeepSpeed models in one Accelerator (`deepspeed_plugins={name: plugin}`, RLHF-style: an
actor that trains and a frozen reference model), and `engine.compile` when a dynamo backend is set.

DeepSpeed's real CPU accelerator, 2 gloo processes, against single-process plain-PyTorch references
computed in the worker from the same batches.
"""

from __future__ import annotations

from pathlib import Path

from conftest import launch
from test_deepspeed_training import COMMON

SEVERAL = (
    COMMON
    + """
import deepspeed
from accel.strategies.deepspeed import MULTIPLE_MODELS
from accel.utils import get_active_deepspeed_plugin

out = Path(sys.argv[1])
BETA = 0.5

def reference_net():
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))

def rlhf_loss(logits, y, ref_logits):
    # Task loss plus a pull towards the frozen reference's outputs (the role of the KL term in RLHF).
    return F.cross_entropy(logits, y) + BETA * F.mse_loss(logits, ref_logits)

def zero3_for_transformers():
    try:
        from transformers.integrations import is_deepspeed_zero3_enabled
    except ImportError:
        return None  # transformers not installed: nothing to check
    return is_deepspeed_zero3_enabled()

def setup():
    # The actor trains under ZeRO-2 (clipping off, so that plain SGD is the reference); the reference model
    # is inference only under ZeRO-3, its parameters sharded over the ranks.
    plugins = {
        "actor": DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.0),
        "reference": DeepSpeedPlugin(zero_stage=3, hf_ds_config={"zero_optimization": {}, "train_micro_batch_size_per_gpu": PER_RANK}),
    }
    acc = fresh(deepspeed_plugins=plugins)
    assert acc.deepspeed_plugin is plugins["actor"] is get_active_deepspeed_plugin(acc.state)
    assert plugins["actor"].selected and not plugins["reference"].selected
    assert acc.state.deepspeed_plugins == plugins and acc.state.get_deepspeed_plugin("reference") is plugins["reference"]
    actor = net()
    copies = copy.deepcopy(actor), reference_net()
    actor, opt, _ = acc.prepare(actor, torch.optim.SGD(actor.parameters(), lr=0.1), loader())
    # A second model with the same (active) plugin is refused with Accelerate's text first.
    try:
        acc.prepare(net())
        raise SystemExit("a second model with the active plugin was accepted")
    except AssertionError as exc:
        assert str(exc).startswith(MULTIPLE_MODELS) and "select_deepspeed_plugin" in str(exc), exc
    assert not zero3_for_transformers()
    acc.state.select_deepspeed_plugin("reference")
    assert acc.deepspeed_plugin is plugins["reference"] is get_active_deepspeed_plugin(acc.state)
    assert plugins["reference"].selected and not plugins["actor"].selected
    # transformers' ZeRO-3 hook follows the active plugin: models built now would be partitioned.
    assert zero3_for_transformers() is not False
    reference = reference_net().requires_grad_(False)
    reference = acc.prepare(reference)
    reference.eval()
    acc.state.select_deepspeed_plugin("actor")
    return acc, actor, opt, reference, copies

acc, actor, opt, reference, (ref_actor, ref_reference) = setup()
assert isinstance(actor, deepspeed.DeepSpeedEngine) and isinstance(reference, deepspeed.DeepSpeedEngine)
assert actor is not reference and acc.strategy.engine is actor
# Each engine runs its own config.
assert actor.zero_optimization_stage() == 2 and reference.zero_optimization_stage() == 3
assert acc.strategy.engine_config(actor)["zero_optimization"]["stage"] == 2
assert acc.strategy.engine_config(reference)["zero_optimization"]["stage"] == 3
assert acc.strategy.engine_config(reference)["train_micro_batch_size_per_gpu"] == PER_RANK
w = reference.module[0].weight
assert w.numel() == 0 and w.ds_tensor.numel() == 16 * 6 // 2, (w.shape, w.ds_tensor.shape)
assert acc.unwrap_model(reference) is reference.module

ref_opt = torch.optim.SGD(ref_actor.parameters(), lr=0.1)
worst_logits = 0.0

def step_both(step):
    global worst_logits
    x, y = batch(step)
    s = rank_slice(acc.process_index, 0, 1)
    with torch.no_grad():
        ref_logits = reference(x[s])
    # The sharded reference gives what the whole model gives in one process.
    worst_logits = max(worst_logits, (ref_logits - ref_reference(x[s])).abs().max().item())
    acc.backward(rlhf_loss(actor(x[s]), y[s], ref_logits))
    opt.step()
    opt.zero_grad()
    # One process: each rank's gradient, averaged.
    grads = []
    for r in range(RANKS):
        ref_actor.zero_grad()
        sr = rank_slice(r, 0, 1)
        with torch.no_grad():
            target = ref_reference(x[sr])
        rlhf_loss(ref_actor(x[sr]), y[sr], target).backward()
        grads.append([p.grad.clone() for p in ref_actor.parameters()])
    for p, *gs in zip(ref_actor.parameters(), *grads):
        p.grad = sum(gs) / RANKS
    ref_opt.step()

for step in range(3):
    step_both(step)
state = acc.get_state_dict(actor)
worst = max((state[k] - v).abs().max().item() for k, v in ref_actor.state_dict().items())
assert worst <= 1e-6 and worst_logits <= 1e-6, (worst, worst_logits)
frozen = acc.get_state_dict(reference)
for k, v in ref_reference.state_dict().items():
    assert torch.equal(frozen[k], v), k
acc.print(f"ACTOR_REFERENCE max|diff| actor={worst:.3g} reference-logits={worst_logits:.3g}")

# save_state / load_state: the actor's engine checkpoint; the ZeRO-3 inference engine (no optimizer, so no
# checkpoint engine in DeepSpeed) is left out and stays as built.
acc.save_state(out / "ckpt")
assert (out / "ckpt" / "pytorch_model").is_dir() and not (out / "ckpt" / "pytorch_model_1").exists()
for step in range(3, 5):
    step_both(step)
expected = acc.get_state_dict(actor)
acc, actor, opt, reference, _ = setup()
acc.load_state(out / "ckpt")
for step in range(3, 5):
    x, y = batch(step)
    s = rank_slice(acc.process_index, 0, 1)
    with torch.no_grad():
        ref_logits = reference(x[s])
    acc.backward(rlhf_loss(actor(x[s]), y[s], ref_logits))
    opt.step()
    opt.zero_grad()
resumed = acc.get_state_dict(actor)
for k, v in expected.items():
    assert torch.equal(resumed[k], v), k
acc.print("SEVERAL_RESUME exact")

# Selecting a name the Accelerator was not given: a KeyError naming the plugins; the selection is unchanged.
try:
    acc.state.select_deepspeed_plugin("critic")
    raise SystemExit("an unknown plugin name was accepted")
except KeyError as exc:
    assert "No DeepSpeed plugin named 'critic'" in str(exc) and "['actor', 'reference']" in str(exc), exc
assert acc.deepspeed_plugin is acc.state.get_deepspeed_plugin("actor")
acc.print("SEVERAL_ERRORS ok")
"""
)


def test_actor_trains_and_frozen_reference_matches_one_process_each_with_its_own_engine(write_script, tmp_path: Path):
    proc = launch(write_script(SEVERAL), str(tmp_path), timeout=900)
    out = proc.stdout
    for marker in ("ACTOR_REFERENCE max|diff| actor=", "SEVERAL_RESUME exact", "SEVERAL_ERRORS ok"):
        assert marker in out, out
    print("\n".join(line for line in out.splitlines() if line.startswith("ACTOR_REFERENCE")))  # shown with -s


COMPILE = (
    COMMON
    + """
import deepspeed
from torch._dynamo import register_backend

graphs = []

@register_backend
def counting_eager(gm, example_inputs):
    # An eager backend that counts the graphs dynamo hands it: proof the engine's module was compiled.
    graphs.append(gm)
    return gm.forward

for regional in (False, True):
    torch._dynamo.reset()
    graphs.clear()
    from accel.settings.kwargs import TorchDynamoPlugin

    plugin = TorchDynamoPlugin(backend="counting_eager", use_regional_compilation=regional)
    acc = fresh(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_clipping=0.0), dynamo_plugin=plugin)
    model = net()
    ref = copy.deepcopy(model)
    model, opt, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), loader())
    # The engine itself comes back (compiled in place, as Accelerate's `engine.compile`), not a
    # torch.compile wrapper around the model that DeepSpeed then wraps.
    assert isinstance(model, deepspeed.DeepSpeedEngine), type(model)
    assert not isinstance(model.module, torch._dynamo.eval_frame.OptimizedModule)
    assert model.is_compiled is (not regional), model.is_compiled
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(3):
        train(acc, model, opt, step, 1)
        reference_step(ref, ref_opt, step, 1)
    assert graphs, "nothing was compiled"
    state = acc.get_state_dict(model)
    worst = max((state[k] - v).abs().max().item() for k, v in ref.state_dict().items())
    assert worst <= 1e-6, worst
    acc.print(f"COMPILE regional={regional} graphs={len(graphs)} max|diff|={worst:.3g}")
"""
)


def test_engine_compile_when_a_dynamo_backend_is_set(write_script):
    proc = launch(write_script(COMPILE), timeout=900)
    for marker in ("COMPILE regional=False graphs=", "COMPILE regional=True graphs="):
        assert marker in proc.stdout, proc.stdout
