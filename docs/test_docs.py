"""The adapter guide shows the example adapter's files as they are on disk."""

from __future__ import annotations

import ast
import csv
import json
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
BLOCK = re.compile(r"<!-- file: (?P<path>\S+) -->\n```\w*\n(?P<body>.*?)```", re.S)


def test_every_file_shown_in_the_guide_is_the_file_on_disk() -> None:
    shown = {m["path"]: m["body"] for m in BLOCK.finditer((ROOT / "docs" / "adapters.md").read_text())}
    example = ROOT / "docs" / "examples" / "accel-example-adapter"
    on_disk = {str(p.relative_to(ROOT)) for p in example.rglob("*") if p.is_file() and p.suffix in (".py", ".toml")}
    assert set(shown) == on_disk, "the guide must show every file of the example, and only those"
    for path, body in shown.items():
        assert (ROOT / path).read_text() == body, f"{path} differs from what docs/adapters.md shows"


API = ROOT / "docs" / "api"
DIRECTIVE = re.compile(r"^::: (?P<name>[\w.]+)\s*$", re.M)


def documented() -> set[str]:
    """Every object the API reference renders (`::: name` lines of docs/api/*.md)."""
    return {m["name"] for page in API.glob("*.md") for m in DIRECTIVE.finditer(page.read_text())}


def static_all(path: Path) -> list[str]:
    """A module's `__all__`, read without importing it (adapter packages need their hardware's libraries)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return [name for name in ast.literal_eval(node.value) if not name.startswith("__")]
    raise AssertionError(f"{path} has no __all__")


def test_every_public_name_of_accel_has_an_api_reference_entry() -> None:
    import accel
    import accel.tracking

    shown = documented()
    missing = [f"accel.{name}" for name in accel.__all__ if f"accel.{name}" not in shown]
    missing += [f"accel.tracking.{name}" for name in accel.tracking.__all__ if f"accel.tracking.{name}" not in shown]
    assert not missing, f"add a `::: name` entry to a page of docs/api for {missing}"


def test_every_adapter_package_s_public_names_have_api_reference_entries() -> None:
    shown = documented()
    packages = sorted(ROOT.glob("packages/accel-*/src/accel_*/__init__.py"))
    assert len(packages) >= 5, "the adapter packages' __init__ files must be found"
    missing = [f"{p.parent.name}.{n}" for p in packages for n in static_all(p) if f"{p.parent.name}.{n}" not in shown]
    assert not missing, f"add a `::: name` entry to a page of docs/api for {missing}"
    nav = (ROOT / "mkdocs.yml").read_text()
    for path in packages:
        assert str(path.parents[1].relative_to(ROOT)) in nav, f"mkdocstrings `paths` must list {path.parents[1]}"


def test_the_api_check_sees_a_name_without_an_entry(tmp_path: Path) -> None:
    module = tmp_path / "__init__.py"
    module.write_text('__all__ = ["Documented", "__version__", "Forgotten"]\n')
    names = static_all(module)
    assert names == ["Documented", "Forgotten"]
    assert "accel.Accelerator" in documented() and "accel.Forgotten" not in documented()


BENCH = ROOT / "docs" / "assets" / "benchmarks"


def table_rows(page: str, header_start: str) -> list[list[str]]:
    """The body rows of the first markdown table whose header row starts with `header_start`."""
    lines = page.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header_start}"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_performance_page_quotes_the_committed_benchmark_data() -> None:
    page = (ROOT / "docs" / "performance.md").read_text()
    reference: dict[tuple[str, str], list[float]] = {}
    with (BENCH / "steps_reference.csv").open() as f:
        for row in csv.DictReader(f):
            reference[row["hidden"], row["ratio"]] = [float(v) for v in row["run_medians"].split(";")]
    for hidden, same, default in table_rows(page, "hidden"):
        for cell, ratio in ((same, "accel/raw_ddp_same_settings"), (default, "accel/raw_ddp_default")):
            runs = reference[hidden, ratio]
            assert cell == f"{min(runs):.2f}-{max(runs):.2f}", (hidden, ratio, cell, runs)

    memory = {
        row["strategy"]: float(row["per_rank_mb"])
        for row in csv.DictReader((BENCH / "memory.csv").read_text().splitlines())
    }
    names = {"DDP": "ddp", "FSDP2": "fsdp2", **{f"DeepSpeed ZeRO-{s}": f"deepspeed-zero{s}" for s in (1, 2, 3)}}
    shown = {names[row[0]]: float(row[1]) for row in table_rows(page, "strategy")}
    assert shown == {name: round(mb, 1) for name, mb in memory.items()}

    checkpoints = json.loads((BENCH / "checkpoint.json").read_text())["data"]
    for header, run in (("size", checkpoints), ("size, 2 processes", checkpoints["two_processes"])):
        quoted = [
            (f"{size['megabytes']:.0f} MB", f"{r['median']:.2f}", f"{r['min']:.2f}-{r['max']:.2f}")
            for size in run["sizes"].values()
            for r in size["ratios"].values()
        ]
        assert [(row[0], row[2], row[3]) for row in table_rows(page, f"{header} |")] == quoted, header
    loader = json.loads((BENCH / "loader.json").read_text())["data"]
    expected = [
        loader["accel"] / loader["plain_distributed_sampler"],
        loader["accel_dispatch"] / loader["plain_distributed_sampler"],
    ]
    assert [float(row[1]) for row in table_rows(page, "operation")] == [round(v, 2) for v in expected]

    launch = json.loads((BENCH / "launch.json").read_text())["data"]
    expected_launch = [
        [
            f"{label}, median",
            f"{launch[times]['torchrun']:.3f} s",
            f"{launch[times]['accel launch']:.3f} s",
            "{:.2f} ({:.2f}-{:.2f}; {:.2f}-{:.2f})".format(
                launch[f"{key}_accel_over_torchrun"],
                *launch[f"{spread}_accel_over_torchrun"],
                *launch[f"{interval}_accel_over_torchrun"],
            ),
        ]
        for label, times, key, spread, interval in (
            ("wall time", "median_seconds", "ratio", "interquartile", "median_95ci"),
            ("CPU time of every process", "median_cpu_seconds", "cpu_ratio", "cpu_interquartile", "cpu_median_95ci"),
        )
    ]
    assert table_rows(page, "measure") == expected_launch
    forked = launch["forked"]
    expected_forked = [
        [
            f"{label}, median",
            f"{forked[times]['torchrun']:.3f} s",
            f"{forked[times]['accel launch']:.3f} s",
            "{:.0f} ms ({:.0f} to {:.0f})".format(forked[key]["difference_ms"], *forked[key]["difference_ms_95ci"]),
            "{:.3f} ({:.3f}-{:.3f})".format(
                forked[key]["full_launch_ratio_from_difference"], *forked[key]["full_launch_ratio_from_difference_95ci"]
            ),
        ]
        for label, times, key in (
            ("CPU time of every process", "median_cpu_seconds", "cpu"),
            ("wall time", "median_seconds", "wall"),
        )
    ]
    assert table_rows(page, "forked launch") == expected_forked
    assert f"{forked['rounds']} paired rounds" in page
    own = launch["accel_launch_before_torchrun"]
    assert f"{own['wall_ms']:.0f} ms ({own['cpu_ms']:.0f} ms CPU)" in page
    assert f"{100 * own['share_of_torchrun_median']:.1f}% of\ntorchrun's median launch" in page

    calls = json.loads((BENCH / "steps.json").read_text())["data"]["64"]["python_calls_per_step"]
    assert f"raw DDP {calls['raw_ddp_same_settings']:.0f}, accel {calls['accel']:.0f}" in page


def test_the_development_log_is_not_in_the_site_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    nav = config[config.index("\nnav:") :]
    assert "benchmark-log" not in nav
    assert (ROOT / "docs" / "dev" / "benchmark-log.md").is_file()
    assert "(dev/" not in (ROOT / "docs" / "performance.md").read_text(), "the user page links no development log"
