#!/usr/bin/env bash
# Run accel's Gaudi checks on a real Gaudi machine, unemulated.
# Needs: a Python with habana_frameworks (Habana's installer); run from the repository root.
set -euo pipefail

python -m pip install -e packages/accel-base -e packages/accel-gaudi pytest

# The adapter must be detected through accel_gaudi/hpu.py, not emulated.
accel env | tee /tmp/accel-env.txt
grep -E '^  gaudi +available' /tmp/accel-env.txt

# The core self-test on 2 HPUs with hccl (no --emulate). Its compile check needs eager mode: compiling
# is refused under lazy mode, Gaudi's default ("Dynamo and lazy are mutually exclusive").
PT_HPU_LAZY_MODE=0 accel test --adapter gaudi --num-processes 2

# The package's unit tests (they exercise the adapter's decisions in emulation; the
# conformance kit decides from the adapter's capabilities what runs on hardware).
python -m pytest packages/accel-gaudi/tests -q -p no:cacheprovider
