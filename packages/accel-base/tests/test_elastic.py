"""The process group re-forms after torchrun restarts its workers.

Measured here (torch 2.13, gloo): a group started with plain `init_process_group("gloo")`
under `--max-restarts 1` cannot re-form once a worker was killed — the restarted ranks
read the dead round's addresses and fail with "Connection refused". accel scopes the
store keys to the restart round; these tests hold it to that.
"""

from __future__ import annotations

import json
import socket
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist
from accel.distributed.launch_env import LaunchInfo, read_launch_env
from accel.state import PartialState
from conftest import launch

SCRIPT = """
import json, os, signal, sys
from pathlib import Path
import torch
from accel import Accelerator

out = Path(sys.argv[1])
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
accelerator = Accelerator()
rank = accelerator.process_index
seen = accelerator.gather(torch.tensor([rank * 10 + restart])).tolist()
if restart == 0:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    accelerator.gather(torch.tensor([0]))  # fails once the peer is gone; torchrun restarts the group
(out / f"round{restart}_rank{rank}.json").write_text(json.dumps(seen))
"""


def test_group_reforms_after_sigkill(write_script, tmp_path: Path) -> None:
    script = write_script(SCRIPT)
    proc = launch(script, str(tmp_path), launch_args=("--max-restarts", "1"), timeout=200)
    assert "exitcode: -9) local_rank: 1" in proc.stderr, proc.stderr[-3000:]
    # Both ranks of the second round exchanged data in a fresh group.
    assert sorted(p.name for p in tmp_path.glob("round*.json")) == ["round1_rank0.json", "round1_rank1.json"]
    for rank in (0, 1):
        assert json.loads((tmp_path / f"round1_rank{rank}.json").read_text()) == [1, 11]


def test_restart_round_is_read_from_torchrun() -> None:
    env = {"WORLD_SIZE": "2", "RANK": "1", "TORCHELASTIC_RESTART_COUNT": "3", "TORCHELASTIC_USE_AGENT_STORE": "True"}
    info = read_launch_env(env)
    assert info.restart_count == 3
    assert info.use_agent_store is True
    assert read_launch_env({"WORLD_SIZE": "2", "RANK": "0"}).restart_count == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_store_keys_are_scoped_to_the_restart_round() -> None:
    port = _free_port()
    server = dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=10))
    launch_info = LaunchInfo(world_size=1, rank=0, master_port=port, restart_count=2, use_agent_store=True)
    holder = SimpleNamespace(timeout=timedelta(seconds=10))
    store = PartialState._make_store(holder, launch_info)  # type: ignore[arg-type]
    store.set("addr", "round-2")
    assert server.get("accel/restart_2/addr") == b"round-2"
    assert not server.check(["addr"])
