"""The CI entry point: a script that does not parse fails CI in a second, after every test passed."""

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = ROOT / ".ci" / "run"


def test_the_ci_script_parses():
    result = subprocess.run(["bash", "-n", str(CI)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# Tiers outside CI by choice (docs/testing.md says why): SmolLM2's statistics and corpus scale.
OUTSIDE_CI = {"test-nightly", "test-scale"}


def test_the_ci_script_runs_every_test_tier_the_makefile_has_but_those_outside_ci():
    makefile = (ROOT / "Makefile").read_text()
    tiers = {
        line.split(":")[0]
        for line in makefile.splitlines()
        if line.startswith("test") and ":" in line and not line.startswith("\t")
    }
    commands = {line.strip() for line in CI.read_text().splitlines() if not line.startswith("#")}
    assert OUTSIDE_CI <= tiers, "a tier kept out of CI is gone from the Makefile"
    assert {f"make {tier}" for tier in tiers - OUTSIDE_CI} <= commands, tiers
