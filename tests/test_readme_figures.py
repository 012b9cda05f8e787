"""The README's tiny-run figures come from a run (scripts/readme_figures.py): written from a run directory in
the format the engines write, and checked against it (synthetic run here; the script itself runs the recipe)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.synthetic_runs import load_script

figures = load_script("readme_figures")
REPO = Path(__file__).resolve().parent.parent
REWARDS = [0.375, 0.625, 0.625, 0.625, 0.875, 0.5625, 0.9375, 0.75]


def tiny_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "tiny_cpu"
    run.mkdir(parents=True)
    warm = tmp_path / "warm"
    warm.mkdir()
    # warm_start.json's own shape: one probability per training task
    (warm / "warm_start.json").write_text(json.dumps({
        "steps": 110, "loss": 1.0, "prob": {"multi_turn_base_100": 0.389, "multi_turn_miss_param_100": 0.463},
        "twin_prob": {"multi_turn_base_100": 0.512, "multi_turn_miss_param_100": 0.439}}))
    (run / "config.yaml").write_text(f"model:\n  warm_start:\n    enable: true\n    path: {warm}\n")
    lines = [{"step": 0, "val/accuracy/average": 0.0}]
    lines += [{"step": s + 1, "train/reward_mean": r, "train/accuracy_mean": r} for s, r in enumerate(REWARDS)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run


def test_both_readmes_carry_the_generated_block():
    for readme in figures.READMES:
        text = readme.read_text(encoding="utf-8")
        assert figures.BEGIN in text and figures.END in text, readme


def test_figures_are_written_from_a_run_and_checked_against_it(tmp_path):
    run = tiny_run(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{figures.BEGIN}\nhand-typed 0.8125\n{figures.END}\nrest\n")
    assert figures.main(["--run", str(run), "--readme", str(readme), "--check"]) == 1  # the hand-typed figures
    assert figures.main(["--run", str(run), "--readme", str(readme), "--write"]) == 0
    text = readme.read_text()
    assert "0.375, 0.625, 0.625, 0.625, 0.875, 0.5625, 0.9375, 0.75." in text
    assert "110 supervised steps, p(ground truth) 0.39 / 0.46, p(failing twin) 0.51 / 0.44." in text
    assert text.startswith("intro\n") and text.endswith("rest\n")
    assert figures.main(["--run", str(run), "--readme", str(readme), "--check"]) == 0
    # a wall time is written when the script ran the recipe, and never compared
    timed = figures.figures_text(figures.read_run(run), wall_s=390.0)
    assert "6.5 min" in timed and figures.check_block(text, timed, "README") == []
    # another run's rewards fail the check, naming the README
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/reward_mean": 0.5}) + "\n")
    assert figures.main(["--run", str(run), "--readme", str(readme), "--check"]) == 1


def test_a_run_without_training_lines_is_refused(tmp_path, capsys):
    run = tiny_run(tmp_path)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "val/accuracy/average": 0.0}) + "\n")
    assert figures.main(["--run", str(run), "--readme", str(tmp_path / "x.md"), "--check"]) == 2
    assert "no train/reward_mean" in capsys.readouterr().err
