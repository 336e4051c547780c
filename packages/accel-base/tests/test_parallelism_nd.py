"""N-D parallelism (`ParallelismConfig`): TP, FSDP2, HSDP and FSDP2 x TP on gloo, each against a
one-process reference trained on the same global batches; exact resume under TP and 2-D."""

from __future__ import annotations

import pytest
from accel.adapter.base import Capabilities
from accel.state import AcceleratorState
from accel.strategies.parallelism_config import ParallelismConfig
from conftest import launch

WORKER = r"""
import copy, sys, warnings
from pathlib import Path
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor
from accel import Accelerator, FSDPConfig, set_seed
from accel.strategies.parallelism_config import ParallelismConfig
from accel.state import AcceleratorState, GradientState

D, H = 16, 4

class Attn(nn.Module):
    def __init__(self):
        super().__init__()
        # No key bias: softmax ignores it, so its gradient is rounding noise that Adam would amplify.
        self.q, self.k, self.v, self.o = (nn.Linear(D, D, bias=i != 1) for i in range(4))

    def forward(self, x):
        b, t, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds H / tp of them.
        q, k, v = (p(x).view(b, t, -1, D // H).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, t, -1))

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = Attn()
        self.up, self.down = nn.Linear(D, 2 * D), nn.Linear(2 * D, D)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.down(F.gelu(self.up(self.norm2(x))))

class Net(nn.Module):
    tp_plan = {
        "layers.*.attn.q": "colwise", "layers.*.attn.k": "colwise", "layers.*.attn.v": "colwise",
        "layers.*.attn.o": "rowwise", "layers.*.up": "colwise", "layers.*.down": "rowwise",
    }

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(6, D)
        self.layers = nn.ModuleList([Block() for _ in range(2)])
        self.head = nn.Linear(D, 3)

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)

def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(8, 4, 6, generator=g), torch.randint(0, 3, (8, 4), generator=g)

def loss_fn(out, y):
    return F.cross_entropy(out.reshape(-1, 3), y.reshape(-1))

def make_opt(params):
    return torch.optim.AdamW(params, lr=1e-2)

def reference(steps):
    set_seed(0)
    model = Net()
    opt = make_opt(model.parameters())
    losses, norms = [], []
    for s in range(steps):
        x, y = batch(s)
        loss = loss_fn(model(x), y)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5).item())
        opt.step(); opt.zero_grad()
        losses.append(loss.item())
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}

def run(name, pc, fsdp, out):
    AcceleratorState._reset_state(); GradientState._reset_state()
    steps = 3
    ref_losses, ref_norms, ref_state = reference(steps)
    set_seed(0)
    model = Net()
    # With FSDP options: the plugin; without: parallelism_config alone (FSDP2 underneath).
    acc = Accelerator(parallelism_config=pc, fsdp_plugin=FSDPConfig(**fsdp) if fsdp else None)
    assert acc.parallelism_config is pc
    # As Accelerate reports it: FSDP when FSDP shards (dp_shard, cp, or FSDP options), else the hardware's
    # data parallelism (tensor parallelism alone has no FSDP plugin in Accelerate either).
    sharded = pc.dp_shard_enabled or pc.cp_enabled or bool(fsdp)
    assert str(acc.distributed_type).endswith("FSDP" if sharded else "MULTI_CPU"), (name, acc.distributed_type)
    assert acc.is_fsdp2 is sharded and (acc.state.fsdp_plugin is not None) is sharded, name
    mesh = acc.torch_device_mesh
    assert mesh.device_type == acc.device.type
    opt = make_opt(model.parameters())
    model, opt = acc.prepare(model, opt)
    if pc.tp_enabled:
        w = model.layers[0].up.weight
        assert isinstance(w, DTensor) and "tp" in w.device_mesh.mesh_dim_names, w.device_mesh
        assert acc.tensor_parallel_rank == mesh.get_local_rank("tp")
    n_dp, dp_rank = acc._data_shards()
    assert n_dp == pc.data_parallel_size, (n_dp, pc.data_parallel_size)

    def step(s):
        x, y = batch(s)
        per = x.shape[0] // n_dp
        sl = slice(dp_rank * per, (dp_rank + 1) * per)
        loss = loss_fn(model(x[sl]), y[sl])
        acc.backward(loss)
        norm = acc.clip_grad_norm_(model.parameters(), 0.5)
        opt.step(); opt.zero_grad()
        return acc.reduce(loss.detach(), "mean").item(), float(norm)

    for s in range(steps - 1):
        loss, norm = step(s)
        assert abs(loss - ref_losses[s]) < 1e-5 and abs(norm - ref_norms[s]) < 1e-4, (name, s, loss, norm)
    acc.save_state(str(out / f"{name}_ckpt"))
    last = step(steps - 1)
    assert abs(last[0] - ref_losses[-1]) < 1e-5, (name, last, ref_losses[-1])
    state = acc.get_state_dict(model)
    if acc.is_main_process:
        assert sorted(state) == sorted(ref_state), (sorted(state), sorted(ref_state))
        for k, v in ref_state.items():
            assert torch.allclose(state[k], v, atol=2e-5), (name, k, (state[k] - v).abs().max())
    acc.save_model(model, str(out / f"{name}_model"))
    acc.wait_for_everyone()
    if acc.is_main_process:
        files = sorted(p.name for p in (out / f"{name}_model").iterdir())
        assert files == ["model.safetensors"], files
        saved = load_file(str(out / f"{name}_model" / "model.safetensors"))
        assert all(torch.equal(saved[k], state[k]) for k in ref_state)
    # Exact resume: back to the state after step 2, the third step again gives the same weights.
    acc.load_state(str(out / f"{name}_ckpt"))
    again = step(steps - 1)
    state2 = acc.get_state_dict(model)
    assert again == last, (name, again, last)
    if acc.is_main_process:
        for k in ref_state:
            assert torch.equal(state2[k], state[k]), (name, k)
    # Loaders are sharded over the data-parallel dimensions only: every sample once in gather_for_metrics.
    data = torch.arange(16.0)
    dl = acc.prepare(DataLoader(TensorDataset(data), batch_size=2))
    got = torch.cat([acc.gather_for_metrics(x) for (x,) in dl])
    assert sorted(got.tolist()) == data.tolist(), (name, got.tolist())
    acc.print(f"OK {name}")

def ram_efficient_loading(out):
    # Rank 1 builds different weights; with cpu_ram_efficient_loading every rank trains rank 0's.
    AcceleratorState._reset_state(); GradientState._reset_state()
    acc = Accelerator(fsdp_plugin=FSDPConfig(cpu_ram_efficient_loading=True))
    torch.manual_seed(acc.process_index)
    model = Net()
    expected = copy.deepcopy(model.state_dict())  # rank 0's weights on rank 0
    model, opt = acc.prepare(model, make_opt(model.parameters()))
    state = acc.get_state_dict(model)
    if acc.is_main_process:
        assert all(torch.equal(state[k], v) for k, v in expected.items())
    local = model.embed.weight.to_local()
    torch.manual_seed(0)
    assert torch.equal(local, Net().embed.weight[acc.process_index * 8 : (acc.process_index + 1) * 8])
    # Ranks > 0 build on the meta device (the memory-saving form): not placed, their shards filled from rank 0.
    AcceleratorState._reset_state(); GradientState._reset_state()
    acc = Accelerator(fsdp_plugin=FSDPConfig(cpu_ram_efficient_loading=True))
    torch.manual_seed(0)
    if acc.is_main_process:
        model = Net()
    else:
        with torch.device("meta"):
            model = Net()
    model, opt = acc.prepare(model, make_opt(model.parameters()))
    torch.manual_seed(0)
    full = Net()
    for name, p in model.named_parameters():
        assert not p.is_meta and torch.equal(p.full_tensor(), dict(full.named_parameters())[name]), name
    x, y = batch(0)
    acc.backward(loss_fn(model(x), y))
    opt.step()
    assert all(not s.is_meta for st in opt.state.values() for s in st.values() if torch.is_tensor(s))
    acc.print("OK ram")

def bf16(name, pc):
    # bf16 under N-D parallelism: computed in bf16 (seen in a hook), losses close to the fp32 reference.
    AcceleratorState._reset_state(); GradientState._reset_state()
    ref_losses, _, _ = reference(3)
    set_seed(0)
    model = Net()
    acc = Accelerator(parallelism_config=pc, mixed_precision="bf16")
    model, opt = acc.prepare(model, make_opt(model.parameters()))
    dtypes = []
    model.layers[0].up.register_forward_hook(lambda m, i, o: dtypes.append(o.dtype))
    n_dp, dp_rank = acc._data_shards()
    for s in range(3):
        x, y = batch(s)
        per = x.shape[0] // n_dp
        with acc.autocast():
            loss = loss_fn(model(x[dp_rank * per : (dp_rank + 1) * per]), y[dp_rank * per : (dp_rank + 1) * per])
        acc.backward(loss)
        acc.clip_grad_norm_(model.parameters(), 0.5)
        opt.step(); opt.zero_grad()
        got = acc.reduce(loss.detach().float(), "mean").item()
        assert abs(got - ref_losses[s]) < 3e-2 * abs(ref_losses[s]), (name, s, got, ref_losses[s])
    assert dtypes and all(d == torch.bfloat16 for d in dtypes), dtypes
    acc.print(f"OK {name}")

out = Path(sys.argv[1])
if "bf16" in sys.argv:
    bf16("tp2_bf16", ParallelismConfig(tp_size=2))
    sys.argv.remove("bf16")
if "ram" in sys.argv:
    ram_efficient_loading(out)
    sys.argv.remove("ram")
layouts = {
    "tp2": (ParallelismConfig(tp_size=2), {}),
    "fsdp2": (ParallelismConfig(dp_shard_size=2), {"reshard_after_forward": False}),
    "hsdp": (ParallelismConfig(dp_replicate_size=2, dp_shard_size=2), {}),
    "fsdp_tp": (ParallelismConfig(dp_shard_size=2, tp_size=2), {"state_dict_type": "SHARDED_STATE_DICT"}),
}
for name in sys.argv[2:]:
    run(name, *layouts[name], out)
"""


def test_tp_and_fsdp_on_two_processes(write_script, tmp_path):
    proc = launch(write_script(WORKER), str(tmp_path), "bf16", "ram", "tp2", "fsdp2", timeout=300)
    for name in ("tp2", "fsdp2", "ram", "tp2_bf16"):
        assert f"OK {name}" in proc.stdout, proc.stdout


def test_hsdp_and_fsdp_x_tp_on_four_processes(write_script, tmp_path):
    proc = launch(write_script(WORKER), str(tmp_path), "hsdp", "fsdp_tp", nproc=4, timeout=420)
    assert "OK hsdp" in proc.stdout and "OK fsdp_tp" in proc.stdout, proc.stdout


# ---- the config alone --------------------------------------------------------------------------
def test_config_defaults_env_and_names(monkeypatch):
    monkeypatch.setenv("ACCEL_PARALLELISM_TP_SIZE", "2")
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "3")
    pc = ParallelismConfig()
    assert (pc.dp_replicate_size, pc.dp_shard_size, pc.tp_size, pc.cp_size) == (1, 3, 2, 1)
    assert pc.total_size == 6 and pc.data_parallel_size == 3 and pc.non_data_parallel_size == 2
    assert pc.dp_dim_names == ["dp_shard"] and pc.non_dp_dim_names == ["tp"]
    assert pc.fsdp_dim_names == ["dp_shard_cp"] and pc._get_mesh() == (("dp_shard", "tp"), (3, 2))
    assert ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2, tp_size=1)._get_mesh()[0] == (
        "dp_replicate",
        "dp_shard",
        "cp",
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 0}, "tp_size must be at least 1, but got 0"),
        ({"dp_shard_size": -1}, "dp_shard_size must be at least 1, but got -1"),
        ({"cp_backend": "ring"}, "cp_backend must be one of ['torch'], but got ring"),
        ({"dp_replicate_size": 2, "tp_size": 2}, "cannot be used with pure data parallelism"),
        ({"cp_size": 2, "sp_size": 2}, "mutually exclusive"),
    ],
)
def test_config_validation_messages(kwargs, message):
    with pytest.raises(ValueError) as err:
        ParallelismConfig(**kwargs)
    assert message in str(err.value)


def test_total_size_and_adapter_claims_are_checked():
    with pytest.raises(ValueError, match=r"total_size \(4\) does not match num_processes \(2\)"):
        ParallelismConfig(tp_size=4).validate(2, Capabilities(parallelism=frozenset({"tp"})), "cpu")
    # Context parallelism on an adapter that does not claim it (the cpu adapter): refused, naming the fix.
    with pytest.raises(ValueError, match=r"does not support context parallelism \(cp\).*cp_size=1"):
        ParallelismConfig(cp_size=2).validate(2, _cpu_capabilities(), "cpu")
    ParallelismConfig(tp_size=2).validate(2, _cpu_capabilities(), "cpu")


def _cpu_capabilities() -> Capabilities:
    from accel.adapter.cpu import CPUAdapter

    caps = CPUAdapter.capabilities
    assert "cp" not in caps.parallelism and {"tp", "hsdp"} <= caps.parallelism
    return caps


# ---- Accelerate's FSDP plugin fields on FSDP2 ---------------------------------------------------
def test_fsdp_plugin_fields_are_mapped_or_refused():
    from accel import FullyShardedDataParallelPlugin as Plugin

    with pytest.warns(UserWarning, match="sharding_strategy is deprecated in favor of reshard_after_forward"):
        assert Plugin(sharding_strategy="SHARD_GRAD_OP").reshard_after_forward is False
        assert Plugin(sharding_strategy=1).reshard_after_forward is True
    assert Plugin(reshard_after_forward="false").reshard_after_forward is False
    assert Plugin(min_num_params=None).min_num_params == 0
    with pytest.warns(UserWarning, match="backward_prefetch is not supported in FSDP2"):
        assert Plugin(backward_prefetch="BACKWARD_PRE").backward_prefetch is None
    refusals = [
        ({"sharding_strategy": "HYBRID_SHARD"}, "dp_replicate_size"),
        ({"sharding_strategy": "NO_SHARD"}, "strategy='ddp'"),
        ({"reshard_after_forward": "FULL_SHARD"}, "please set to a `bool`"),
        ({"forward_prefetch": True}, "forward_prefetch is not yet implemented in FSDP2"),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, "FSDP2 does not support LOCAL_STATE_DICT"),
        ({"param_init_fn": lambda m: None}, "cpu_ram_efficient_loading=True"),
        ({"activation_checkpointing_offload": True}, "activation_checkpointing="),
    ]
    for kwargs, message in refusals:
        with pytest.raises(ValueError) as err:
            Plugin(**kwargs)
        assert message in str(err.value), (kwargs, str(err.value))


# ---- launcher settings: flags, config-file keys, environment ---------------------------------------
def test_launch_flags_and_config_keys_become_worker_environment(monkeypatch):
    import os

    from accel.cli import _launch_parser
    from accel.compat.config_file import _parallelism
    from accel.strategies.parallelism_config import launch_env

    for name in ("ACCEL_USE_PARALLELISM_CONFIG", "ACCEL_PARALLELISM_TP_SIZE", "ACCEL_PARALLELISM_DP_SHARD_SIZE"):
        monkeypatch.setenv(name, "")  # restored (unset) after the test, whatever the parser sets
        monkeypatch.delenv(name)
    argv = ["--use_parallelism_config", "--parallelism_config_tp_size", "2", "train.py"]
    ns = _launch_parser(argv).parse_args(argv)
    # Parsing changes no environment (the launcher's process, or a test's, keeps its own); the
    # workers get the flags through launch.worker_env.
    assert "ACCEL_PARALLELISM_TP_SIZE" not in os.environ and "ACCEL_USE_PARALLELISM_CONFIG" not in os.environ
    assert ns.parallelism_env == {"ACCEL_USE_PARALLELISM_CONFIG": "1", "ACCEL_PARALLELISM_TP_SIZE": "2"}
    # A config file's mapping (applied while the launcher resolves its settings) does not override a flag.
    _parallelism(
        "parallelism_config", {"parallelism_config_tp_size": 4, "parallelism_config_dp_shard_size": 2}, {}, {}, []
    )
    os.environ.update(ns.parallelism_env)  # what worker_env adds last
    assert os.environ["ACCEL_PARALLELISM_TP_SIZE"] == "2" and os.environ["ACCEL_PARALLELISM_DP_SHARD_SIZE"] == "2"
    pc = ParallelismConfig()
    assert (pc.tp_size, pc.dp_shard_size) == (2, 2)
    with pytest.raises(ValueError, match="Ulysses sequence parallelism is not supported"):
        launch_env({"parallelism_config_sp_size": 2})


def test_environment_parallelism_config_picks_the_strategy_from_its_sizes(monkeypatch):
    from accel import Accelerator, FSDPConfig

    monkeypatch.setenv("ACCEL_USE_PARALLELISM_CONFIG", "")  # restored (unset) afterwards: the
    monkeypatch.delenv("ACCEL_USE_PARALLELISM_CONFIG")  # Accelerator translates the variable below into it
    monkeypatch.setenv("ACCELERATE_USE_PARALLELISM_CONFIG", "true")
    # `--use_parallelism_config` without sizes is plain data parallelism: the adapter's DDP, as in Accelerate.
    acc = Accelerator()
    assert acc.strategy.name == "ddp" and isinstance(acc.parallelism_config, ParallelismConfig)
    assert acc.parallelism_config.total_size == 1 and acc.torch_device_mesh is None  # one process
    AcceleratorState._reset_state(reset_partial_state=True)
    # With an FSDP plugin it composes on FSDP2 (and on one process there is nothing to split).
    acc = Accelerator(fsdp_plugin=FSDPConfig())
    assert acc.strategy.name == "fsdp2" and isinstance(acc.parallelism_config, ParallelismConfig)
    assert acc.torch_device_mesh is None


def test_parallelism_config_composes_on_fsdp2_only():
    from types import SimpleNamespace

    from accel import FSDPConfig
    from accel.strategies.parallelism_config import with_parallelism

    plugin = FSDPConfig(reshard_after_forward=False)
    name, config = with_parallelism(ParallelismConfig(tp_size=2), "fsdp2", plugin)
    assert name == "fsdp2" and config is plugin and config.parallelism_config.tp_size == 2
    with pytest.raises(ValueError, match="composes data sharding, tensor and context parallelism on the fsdp2"):
        with_parallelism(ParallelismConfig(tp_size=2), "deepspeed", None)
    # Replicate-only configs are plain data parallelism: the strategy stays as chosen (None: the adapter's).
    assert with_parallelism(ParallelismConfig(), None, None) == (None, None)
    assert with_parallelism(ParallelismConfig(dp_replicate_size=2), "deepspeed", "cfg") == ("deepspeed", "cfg")
    # An object of Accelerate's class (same fields) is rebuilt as accel's, handlers included.
    foreign = SimpleNamespace(
        dp_replicate_size=1,
        dp_shard_size=2,
        tp_size=1,
        cp_size=2,
        cp_backend="torch",
        cp_handler=SimpleNamespace(cp_comm_strategy="alltoall"),
    )
    pc = with_parallelism(foreign, None, None)[1]
    assert pc.total_size == 4 and pc.cp_handler.cp_comm_strategy == "alltoall"
    with pytest.raises(TypeError, match=r"must be an accel\.ParallelismConfig, got int"):
        with_parallelism(3, None, None)
