"""`accel.local_sgd.LocalSGD` (Accelerate's `accelerate.local_sgd.LocalSGD`): each process trains alone and
the weights are averaged every `local_sgd_steps` steps and when the block ends.

The 2-process run is compared with the same training simulated in one process (two replicas, their
own SGD steps on their own batches, averaged at the same steps); `compat_tests/test_local_sgd.py`
compares it with the real Accelerate.
"""

from __future__ import annotations

import pytest
import torch
from accel import Accelerator
from accel.local_sgd import UNSUPPORTED, LocalSGD

WORKER = """
import sys
import torch
from accel import Accelerator
from accel.local_sgd import UNSUPPORTED, LocalSGD
from accel.state import AcceleratorState, GradientState

STEPS, K = 5, 2
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
init = {k: v.detach().clone() for k, v in model.state_dict().items()}
g = torch.Generator().manual_seed(123)
data = [(torch.randn(2, 8, 4, generator=g), torch.randn(2, 8, 1, generator=g)) for _ in range(STEPS)]

# The reference: two replicas in this process, averaged after steps K, 2K, ... and at the end.
replicas = []
for _ in range(2):
    m = torch.nn.Linear(4, 1)
    m.load_state_dict(init)
    replicas.append((m, torch.optim.SGD(m.parameters(), lr=0.1)))
def average():
    with torch.no_grad():
        for params in zip(*(m.parameters() for m, _ in replicas)):
            mean = sum(p.detach().clone() for p in params) / 2
            for p in params:
                p.copy_(mean)
expected = []
for step, (x, y) in enumerate(data, 1):
    for rank, (m, opt) in enumerate(replicas):
        ((m(x[rank]) - y[rank]) ** 2).mean().backward()
        opt.step()
        opt.zero_grad()
    if step % K == 0:
        average()
    expected.append([p.detach().clone() for p in replicas[0][0].parameters()])
average()
final = [p.detach().clone() for p in replicas[0][0].parameters()]

acc = Accelerator(cpu=True)
model, opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
rank = acc.process_index
with LocalSGD(accelerator=acc, model=model, local_sgd_steps=K) as local_sgd:
    for step, (x, y) in enumerate(data, 1):
        with acc.accumulate(model):
            acc.backward(((model(x[rank]) - y[rank]) ** 2).mean())
            opt.step()
            opt.zero_grad()
            local_sgd.step()
        mine = [p.detach().clone() for p in model.parameters()]
        theirs = acc.gather(torch.cat([p.reshape(-1) for p in mine]).unsqueeze(0))
        # Not averaged between the averaging steps: the replicas differ; averaged: they agree.
        assert bool(torch.equal(theirs[0], theirs[1])) is (step % K == 0), (step, theirs)
        if step % K == 0:
            for got, want in zip(mine, expected[step - 1]):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
for got, want in zip(model.parameters(), final):
    torch.testing.assert_close(got.detach(), want, rtol=0, atol=1e-6)
print(f"rank {rank} OK local sgd")

AcceleratorState._reset_state(reset_partial_state=False)
GradientState._reset_state()
sharded = Accelerator(cpu=True, strategy="fsdp2")
try:
    LocalSGD(accelerator=sharded, model=torch.nn.Linear(2, 2), local_sgd_steps=2)
except NotImplementedError as e:
    assert str(e) == UNSUPPORTED, e
    print(f"rank {rank} OK refused")
"""


def test_local_sgd_averages_like_replicas_trained_apart(write_script, launch) -> None:
    proc = launch(write_script(WORKER))
    for rank in (0, 1):
        assert f"rank {rank} OK local sgd" in proc.stdout and f"rank {rank} OK refused" in proc.stdout, proc.stdout


def test_one_process_or_disabled_changes_nothing() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 2))
    before = [p.detach().clone() for p in model.parameters()]
    with LocalSGD(accelerator=acc, model=model, local_sgd_steps=1) as local_sgd:
        assert local_sgd.enabled is False
        local_sgd.step()
        local_sgd.step()
    assert local_sgd.num_steps == 2
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before))


@pytest.mark.parametrize("steps", [0, -1, 1.5, True, "2"])
def test_local_sgd_steps_must_be_a_positive_int(steps: object) -> None:
    acc = Accelerator(cpu=True)
    with pytest.raises(ValueError, match=r"local_sgd_steps must be an int >= 1 .* got"):
        LocalSGD(accelerator=acc, model=torch.nn.Linear(2, 2), local_sgd_steps=steps)  # type: ignore[arg-type]


def test_unsupported_message_is_accelerates() -> None:
    assert UNSUPPORTED == "LocalSGD is supported only for CPUs and GPUs (no DeepSpeed or MegatronLM)"
