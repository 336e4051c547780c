"""accel's `accelerate.utils.save_fsdp_model`, `save_fsdp_optimizer`, `load_fsdp_model` and `load_fsdp_optimizer`
write and read Accelerate 1.15's files: `scripts/fsdp_checkpoint_files.py` saves one FSDP2 model and optimizer
with accel's and with Accelerate's functions (FULL and SHARDED state dicts, SHARDED also per process with `use_dcp=False`) on 2 CPU processes, checks that both
write the same names, and loads each one's files with the other's functions into a fresh model: the trained
weights and optimizer state come back exactly.
"""

from __future__ import annotations

from pathlib import Path

from conftest import SCRIPTS, check, torchrun


def test_fsdp_checkpoint_files_match_accelerates(real_accelerate: Path, tmp_path: Path) -> None:
    check(torchrun(str(SCRIPTS / "fsdp_checkpoint_files.py"), str(tmp_path), accel=False))
    assert (tmp_path / "ok").is_file()
    assert {p.name for p in (tmp_path / "FULL_STATE_DICT" / "accel").iterdir()} == {
        "pytorch_model_fsdp.bin",
        "optimizer.bin",
    }
    sharded = tmp_path / "SHARDED_STATE_DICT" / "accel"
    assert {p.name for p in sharded.iterdir()} == {"pytorch_model_fsdp_0", "optimizer_0"}
    per_rank = tmp_path / "SHARDED_STATE_DICT-per-rank" / "accel"
    assert {p.name for p in per_rank.iterdir()} == {
        f"{stem}_0_rank{r}.bin" for stem in ("pytorch_model_fsdp", "optimizer") for r in (0, 1)
    }
