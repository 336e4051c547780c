"""Checks the CI definitions: every vendor folder has a runner and a script, every runner
definition and every workflow under .github/workflows is a GitHub Actions workflow whose
jobs name a runner and run steps, and the release workflow publishes every package from one
tag through trusted publishing after `nox -s build` has checked them.

    python hardware_ci/validate.py        # exits 1 and says what is wrong
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
WORKFLOWS = HERE.parent / ".github" / "workflows"
RELEASE = WORKFLOWS / "release.yml"
ADAPTER_KIT = WORKFLOWS / "adapter-kit.yml"
PUBLISH_ACTION = "pypa/gh-action-pypi-publish@"


def workflow_problems(path: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The parsed workflow (None when unusable) and what is wrong with it."""
    try:
        workflow = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        return None, [f"{path}: not valid YAML: {exc}"]
    jobs = workflow.get("jobs") if isinstance(workflow, dict) else None
    if not isinstance(jobs, dict) or not jobs:
        return None, [f"{path}: no `jobs`"]
    found = []
    # YAML reads the key `on` as True: a workflow without triggers never runs.
    if "on" not in workflow and True not in workflow:
        found.append(f"{path}: no `on` triggers")
    for job_name, job in jobs.items():
        if not isinstance(job, dict) or "runs-on" not in job or not job.get("steps"):
            found.append(f"{path}: job {job_name!r} needs `runs-on` and `steps`")
    return workflow, found


def release_problems(workflow: dict[str, Any]) -> list[str]:
    """One pushed `v*` tag builds and checks everything, then publishes it with an OIDC token."""
    found = []
    triggers = workflow.get("on", workflow.get(True))
    tags = triggers.get("push", {}).get("tags", []) if isinstance(triggers, dict) else []
    if not any(str(t).startswith("v") for t in tags or []):
        found.append(f"{RELEASE}: must run on a pushed `v*` tag (on: push: tags)")
    jobs = workflow["jobs"]

    def runs(job: dict[str, Any]) -> str:
        return "\n".join(str(step.get("run", "")) for step in job.get("steps", []) if isinstance(step, dict))

    def uses(job: dict[str, Any]) -> list[str]:
        return [str(step.get("uses", "")) for step in job.get("steps", []) if isinstance(step, dict)]

    builders = [name for name, job in jobs.items() if "nox -s build" in runs(job)]
    if not builders:
        found.append(f"{RELEASE}: no job runs `nox -s build` (build, twine check, install and test the wheels)")
    if not any("check_dists.py" in runs(jobs[n]) and "GITHUB_REF_NAME" in runs(jobs[n]) for n in builders):
        found.append(f"{RELEASE}: the build job must run .github/scripts/check_dists.py --tag on the pushed tag")
    publishers = [name for name, job in jobs.items() if any(u.startswith(PUBLISH_ACTION) for u in uses(job))]
    if len(publishers) != 1:
        found.append(f"{RELEASE}: exactly one job must publish with {PUBLISH_ACTION}..., found {publishers}")
    for name in publishers:
        job = jobs[name]
        if (job.get("permissions") or {}).get("id-token") != "write":
            found.append(f"{RELEASE}: job {name!r} needs `permissions: id-token: write` (trusted publishing)")
        needs = job.get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        if not set(builders) & set(needs):
            found.append(f"{RELEASE}: job {name!r} must `needs:` the job that runs `nox -s build`")
        for step in job.get("steps", []):
            given = (step.get("with") or {}) if isinstance(step, dict) else {}
            if "password" in given:
                found.append(f"{RELEASE}: job {name!r} passes a token; trusted publishing needs none")
    top = workflow.get("permissions") or {}
    if top.get("id-token") == "write":
        found.append(f"{RELEASE}: grant `id-token: write` to the publishing job only, not the whole workflow")
    return found


def adapter_kit_problems(workflow: dict[str, Any]) -> list[str]:
    """The reusable workflow for out-of-tree adapters: called with the package, adapter, tests and
    runner; runs the kit unemulated and uploads a report."""
    found = []
    triggers = workflow.get("on", workflow.get(True))
    call = triggers.get("workflow_call") if isinstance(triggers, dict) else None
    inputs = (call or {}).get("inputs") or {}
    for name in ("package", "adapter", "tests", "runs-on"):
        if name not in inputs:
            found.append(f"{ADAPTER_KIT}: on.workflow_call.inputs needs {name!r}")
    for job_name, job in workflow["jobs"].items():
        env = {**(workflow.get("env") or {}), **(job.get("env") or {})}
        if str(env.get("ACCEL_KIT_REQUIRE_HARDWARE")) != "1":
            found.append(f"{ADAPTER_KIT}: job {job_name!r} must set ACCEL_KIT_REQUIRE_HARDWARE=1")
        steps = [s for s in job.get("steps", []) if isinstance(s, dict)]
        if not any("pytest" in str(s.get("run", "")) for s in steps):
            found.append(f"{ADAPTER_KIT}: job {job_name!r} runs no pytest")
        if not any(str(s.get("uses", "")).startswith("actions/upload-artifact@") for s in steps):
            found.append(f"{ADAPTER_KIT}: job {job_name!r} uploads no report (actions/upload-artifact)")
    return found


def problems() -> list[str]:
    found = []
    vendors = sorted(p for p in HERE.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    for vendor in vendors:
        for name in ("runner.yml", "run.sh"):
            if not (vendor / name).is_file():
                found.append(f"{vendor.name}: {name} is missing")
    for path in definitions():
        workflow, wrong = workflow_problems(path)
        found += wrong
        if path == RELEASE and workflow is not None:
            found += release_problems(workflow)
        if path == ADAPTER_KIT and workflow is not None:
            found += adapter_kit_problems(workflow)
    if not RELEASE.is_file():
        found.append(f"{RELEASE} is missing")
    return found


def definitions() -> list[Path]:
    return sorted(HERE.glob("*/*.yml")) + sorted(WORKFLOWS.glob("*.yml"))


if __name__ == "__main__":
    errors = problems()
    print("\n".join(errors) or f"{len(definitions())} workflow definitions are valid")
    sys.exit(1 if errors else 0)
