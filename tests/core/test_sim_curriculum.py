"""scripts/sim_curriculum.py prints the numbers docs/seal_core.md states beside its tables (a short run: the
numbers themselves come from the full run the docs quote): vanilla GRPO at SEAL's measured step ratio, the
curriculum's gain paired against SEAL, and the repairability adaptive ρ measured per type."""

from __future__ import annotations

import re

import pytest

from tests.synthetic_runs import load_script

pytest.importorskip("verl")  # the simulation builds verl DataProtos for the controller


def test_the_simulation_prints_the_numbers_the_docs_quote(capsys):
    sim = load_script("sim_curriculum")
    assert sim.main(["--seeds", "2", "--steps", "4", "--probe", "2", "--tasks", "32"]) == 0
    out = capsys.readouterr().out
    [ratio] = re.findall(r"\| vanilla GRPO, lr × SEAL's step ratio \((\d+\.\d+)\) \|", out)
    assert float(ratio) > 1.0  # A-Patch's paper weights average above 1: SEAL steps further at one learning rate
    assert re.search(r"Curriculum's own gain \(SEAL \+ curriculum - SEAL, paired\): at step 2 -?\d\.\d+ ± \d\.\d+, "
                     r"final -?\d\.\d+ ± \d\.\d+", out)
    line = next(x for x in out.splitlines() if x.startswith("Repairability measured by adaptive rho"))
    assert all(f"{skill} " in line for skill in sim.SKILLS)
