"""A finished script exits 0: a collective's last tensors are freed before the interpreter finalizes.

Without `PartialState._destroy_at_exit`'s drain, a script whose last call is a `gather` aborted
rank 0 with "terminate called without an active exception" in 5 of 14 two-rank launches here
(gloo's worker thread freeing the gathered tensors needs the GIL while CPython is finalizing).
Eight launches (four at a time) all exit 0 with the drain; without it the chance that all eight pass
is about 3%.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from accel.testing.launching import TEARDOWN_ABORT
from conftest import launch

WORKER = """
import torch
from accel import Accelerator

acc = Accelerator(cpu=True)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
model, opt = acc.prepare(model, opt)
acc.backward(model(torch.ones(2, 4)).sum())
opt.step()
seen = acc.gather(torch.tensor([acc.process_index])).tolist()
print(f"rank={acc.process_index} seen={seen}", flush=True)
"""

LAUNCHES = 8


def test_script_ending_in_a_gather_exits_cleanly_every_time(write_script) -> None:
    script = write_script(WORKER)
    # Four launches at a time (each its own port and process group): the same exits, in half the time.
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = list(pool.map(lambda _: launch(script, timeout=240, check=False), range(LAUNCHES)))
    for attempt, proc in enumerate(procs):
        assert TEARDOWN_ABORT not in proc.stderr, f"launch {attempt + 1} aborted at exit:\n{proc.stderr[-3000:]}"
        assert proc.returncode == 0, f"launch {attempt + 1} failed:\n{proc.stderr[-3000:]}"
        assert "rank=0 seen=[0, 1]" in proc.stdout and "rank=1 seen=[0, 1]" in proc.stdout
