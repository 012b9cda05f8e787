"""Figure 3 and the failure-profile plot from synthetic run directories."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from env_service.vocab import CATEGORIES
from seal.report import plots
from tests.synthetic_runs import load_script, training_line, validation_line, write_run_dir

plot_curves = load_script("plot_curves")


def counts(base: int, miss_func: int, miss_param: int, long_context: int) -> dict[str, int]:
    return dict(zip(CATEGORIES, (base, miss_func, miss_param, long_context), strict=True))


def seal_lines() -> list[dict]:
    return [
        validation_line(0, counts(22, 14, 10, 10)),
        training_line(1, {"pass": 0.2, "state_mismatch": 0.5, "spurious_tool_call": 0.3}),
        training_line(2, {"pass": 0.4, "state_mismatch": 0.4, "spurious_tool_call": 0.2}),
        validation_line(2, counts(40, 30, 25, 20)),
        training_line(3, {"pass": 0.6, "state_mismatch": 0.4}),
        validation_line(3, counts(58, 36, 34, 33)),
    ]


def read_png(path: Path) -> np.ndarray:
    assert path.is_file() and path.stat().st_size > 0
    return mpimg.imread(path)


def test_validation_curve_values_and_binomial_errors() -> None:
    curve = plots.validation_curve(seal_lines(), "multi_turn_base")
    assert curve.steps == (0, 2, 3)
    assert curve.values == (0.22, 0.40, 0.58)
    # sqrt(.22*.78/100) = 0.041425
    assert curve.stderr[0] == pytest.approx(0.041425, abs=1e-6)
    average = plots.validation_curve(seal_lines(), "average")
    assert average.values[-1] == pytest.approx(0.4025)
    expected = math.sqrt(0.58 * 0.42 + 0.36 * 0.64 + 0.34 * 0.66 + 0.33 * 0.67) / 10 / 4
    assert average.stderr[-1] == pytest.approx(expected)
    # without counts there is no error band; without the average key it is the category mean
    line = {"step": 5, **{f"val/accuracy/{c}": 0.5 for c in CATEGORIES}}
    bare = plots.validation_curve([line], "average")
    assert bare.values == (0.5,) and bare.stderr == (None,)
    # a resumed run's later line for the same step wins
    again = plots.validation_curve([*seal_lines(), validation_line(3, counts(1, 1, 1, 1))], "multi_turn_base")
    assert again.values[-1] == 0.01


def test_tag_share_series_orders_and_fills() -> None:
    steps, shares = plots.tag_share_series(seal_lines())
    assert steps == (1, 2, 3)
    assert list(shares) == ["pass", "spurious_tool_call", "state_mismatch"]  # PROGRESS_TAGS order
    assert shares["spurious_tool_call"] == (0.3, 0.2, 0.0)


def test_figure3_png_has_expected_size(tmp_path: Path) -> None:
    seal = write_run_dir(tmp_path / "seal", seal_lines())
    vanilla = write_run_dir(
        tmp_path / "vanilla",
        [validation_line(0, counts(22, 14, 10, 10)), validation_line(3, counts(46, 27, 27, 23))],
    )
    runs = {"SEAL": plots.read_metrics(seal), "Vanilla RL": plots.read_metrics(vanilla / "metrics.jsonl")}
    out = plots.plot_validation_curves(runs, tmp_path / "fig" / "figure3.png", size_in=(6.0, 4.0), dpi=50)
    image = read_png(out)
    assert image.shape[:2] == (200, 300)
    assert image.std() > 0.01  # not a blank canvas


def test_figure3_has_a_training_reward_panel_and_no_axis_below_zero() -> None:
    rewards = [training_line(step, {"pass": 1.0}, reward) for step, reward in ((1, 0.375), (2, 0.625), (3, 0.5))]
    zero = [validation_line(0, counts(0, 0, 0, 0)), validation_line(3, counts(0, 0, 0, 0))]
    figure = plots.figure3({"tiny": [*zero, *rewards]})
    panels = {ax.get_title(): ax for ax in figure.axes}
    assert list(panels) == ["Base", "Miss Func", "Miss Param", "Long Context", "Average", "Training reward (mean)"]
    (line,) = panels["Training reward (mean)"].get_lines()
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [0.375, 0.625, 0.5]
    # all-zero validation: the axis starts at 0, not at -0.05
    assert all(panels[t].get_ylim()[0] == 0.0 for t in ("Base", "Average"))
    assert plots.training_curve([*rewards, training_line(2, {}, 0.75)]).values == (0.375, 0.75, 0.5)  # resumed
    # a short run with training rewards and no validation line still gets its figure
    assert plots.figure3({"short": rewards}).axes


def test_failure_profile_png_and_missing_tags(tmp_path: Path) -> None:
    runs = {"SEAL": seal_lines(), "Vanilla RL": [validation_line(0, counts(1, 1, 1, 1))]}
    out = plots.plot_failure_profile(runs, tmp_path / "profile.png", panel_size_in=(4.0, 3.0), dpi=50)
    image = read_png(out)
    # one panel (Vanilla logs no tags) + a half-panel legend: 4 * 1.5 * 50 = 300 wide, 150 high
    assert image.shape[:2] == (150, 300)
    assert image.std() > 0.01
    with pytest.raises(ValueError, match="tag_frac"):
        plots.plot_failure_profile({"Vanilla RL": runs["Vanilla RL"]}, tmp_path / "none.png")


def test_bad_metrics_are_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "metrics.jsonl").write_text('{"val/accuracy/average": 0.5}\n')
    with pytest.raises(ValueError, match="integer 'step'"):
        plots.read_metrics(bad)
    with pytest.raises(ValueError, match="not a fraction"):
        plots.validation_curve([{"step": 0, "val/accuracy/multi_turn_base": 37.0}], "multi_turn_base")
    with pytest.raises(ValueError, match="without validation"):
        plots.plot_validation_curves({"empty": [{"step": 1, "train/tag_frac/pass": 1.0}]}, tmp_path / "x.png")


def test_cli_writes_both_pngs(tmp_path: Path) -> None:
    seal = write_run_dir(tmp_path / "seal", seal_lines())
    vanilla = write_run_dir(tmp_path / "vanilla", [validation_line(0, counts(22, 14, 10, 10))])
    out_dir = tmp_path / "figures"
    code = plot_curves.main(
        ["--run", f"SEAL={seal}", "--run", f"Vanilla RL={vanilla}", "--out-dir", str(out_dir), "--dpi", "20"]
    )
    assert code == 0
    assert read_png(out_dir / plot_curves.FIGURE3).shape[:2] == (160, 300)  # 15 x 8 in at 20 dpi
    assert read_png(out_dir / plot_curves.FAILURE_PROFILE).shape[:2] == (90, 210)  # 7 * 1.5 x 4.5 in
    assert plot_curves.main(["--run", f"SEAL={tmp_path / 'missing'}", "--out-dir", str(out_dir)]) == 2
