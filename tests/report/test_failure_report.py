"""Failure-analysis reports from synthetic evaluation directories, checked against hand counts.

Synthetic tasks have two turns: a correct task is tagged [pass, pass], a failing one [pass, <tag>].
With k of n correct, a category has 2n turns: pass = 2k + (n - k), <tag> = n - k.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from env_service.vocab import CATEGORIES
from seal.report import failure_report as fr
from tests.synthetic_runs import eval_records, load_script, write_eval_dir

cli = load_script("failure_report")

BEFORE = {
    "multi_turn_base": 37,
    "multi_turn_miss_func": 50,
    "multi_turn_miss_param": 20,
    "multi_turn_long_context": 10,
}
AFTER = {
    "multi_turn_base": 50,
    "multi_turn_miss_func": 50,
    "multi_turn_miss_param": 30,
    "multi_turn_long_context": 10,
}


def row(markdown: str, heading: str, first_cell: str) -> dict[str, str]:
    section = markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    header = next(line for line in section.splitlines() if line.startswith("| "))
    names = [c.strip() for c in header.strip("| ").split("|")]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == first_cell:
            return dict(zip(names, cells, strict=True))
    raise AssertionError(f"no row {first_cell!r} under {heading!r}")


def test_distribution_counts_and_shares() -> None:
    records = eval_records(BEFORE, fail_tags={"multi_turn_miss_func": "spurious_tool_call"})
    dist = fr.tag_distribution(records, "failure_tags")
    # base: 37 correct of 100 -> pass 137 of 200 turns, state_mismatch 63
    assert dist.counts["multi_turn_base"] == {"pass": 137, "state_mismatch": 63}
    assert dist.turns["multi_turn_base"] == 200
    assert dist.share("multi_turn_base", "state_mismatch") == pytest.approx(0.315)
    assert dist.counts["multi_turn_miss_func"]["spurious_tool_call"] == 50
    # pooled: 800 turns; state_mismatch 63 + 80 + 90 = 233
    assert dist.turns[fr.ALL] == 800
    assert dist.counts[fr.ALL]["state_mismatch"] == 233
    assert dist.unknown == ()
    assert dist.share("web_search", "pass") is None


def test_report_tables(tmp_path: Path) -> None:
    records = eval_records(
        BEFORE,
        fail_tags={"multi_turn_miss_func": "spurious_tool_call"},
        fail_labels={"multi_turn_long_context": "made_up_label"},
    )
    markdown = fr.render_report(records, "synthetic")
    assert row(markdown, "Success per category", "multi_turn_base")["Success (%)"] == "37.00 ± 4.83"
    # average 29.25 ± 2.14 (see tests/report/test_tables.py for the arithmetic)
    assert row(markdown, "Success per category", "average")["Success (%)"] == "29.25 ± 2.14"
    tags = row(markdown, "Failure tags (progress vocabulary)", "state_mismatch")
    assert tags["multi_turn_base"] == "63 (31.50%)"
    assert tags["all"].split()[0] == "233"  # 63 + 80 + 90 (the share 29.125% sits on a rounding edge)
    spurious = row(markdown, "Failure tags (progress vocabulary)", "spurious_tool_call")
    assert spurious["multi_turn_base"] == "0 (0.00%)"
    assert spurious["multi_turn_miss_func"] == "50 (25.00%)"
    assert spurious["all"] == "50 (6.25%)"
    assert row(markdown, "Failure tags (progress vocabulary)", "turns")["all"] == "800"
    labels = row(markdown, "Paper labels", "made_up_label *")
    assert labels["multi_turn_long_context"] == "90 (45.00%)"
    assert "not in the vocabulary" in markdown


def test_comparison_deltas() -> None:
    before = eval_records(BEFORE)
    after = eval_records(AFTER, fail_tags={"multi_turn_base": "spurious_tool_call"})
    markdown = fr.render_comparison(before, after, "Vanilla RL", "SEAL")
    accuracy = row(markdown, "Success per category", "multi_turn_base")
    assert accuracy["Vanilla RL"] == "37.00 ± 4.83"
    assert accuracy["SEAL"] == "50.00 ± 5.00"
    assert accuracy["Δ (points)"] == "+13.00"
    assert row(markdown, "Success per category", "multi_turn_long_context")["Δ (points)"] == "0.00"
    # average: (37+50+20+10)/4 = 29.25 -> (50+50+30+10)/4 = 35.00
    assert row(markdown, "Success per category", "average")["Δ (points)"] == "+5.75"
    heading = "Failure tags (progress vocabulary): change"
    # base: pass 68.50% -> 75.00%, state_mismatch 31.50% -> 0%, spurious 0% -> 25.00%
    assert row(markdown, heading, "pass")["multi_turn_base"] == "+6.50 (68.50% → 75.00%)"
    assert row(markdown, heading, "state_mismatch")["multi_turn_base"] == "-31.50 (31.50% → 0.00%)"
    assert row(markdown, heading, "spurious_tool_call")["multi_turn_base"] == "+25.00 (0.00% → 25.00%)"
    # miss_param: state_mismatch 80/200 = 40% -> 70/200 = 35%
    assert row(markdown, heading, "state_mismatch")["multi_turn_miss_param"] == "-5.00 (40.00% → 35.00%)"
    assert fr.share_delta(
        fr.tag_distribution(before, "paper_labels"),
        fr.tag_distribution(after, "paper_labels"),
        "multi_turn_base",
        "pass",
    ) == pytest.approx(6.5)


def test_bad_records_are_refused() -> None:
    record = eval_records({"multi_turn_base": 1}, 1)[0]
    with pytest.raises(ValueError, match="accuracy must be 0 or 1"):
        fr.render_report([{**record, "accuracy": 0.5}], "x")
    with pytest.raises(ValueError, match="list of strings"):
        fr.tag_distribution([{**record, "failure_tags": "pass"}], "failure_tags")
    with pytest.raises(ValueError, match="unknown diagnosis field"):
        fr.tag_distribution([record], "tags")
    with pytest.raises(ValueError, match="no result records"):
        fr.render_report([], "x")


def test_cli_single_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_eval_dir(tmp_path / "a", BEFORE, summary=False)
    b = write_eval_dir(tmp_path / "run" / "eval" / "best", AFTER)
    out = tmp_path / "report.md"
    assert cli.main([str(a), str(tmp_path / "run"), "--labels", "Vanilla RL", "SEAL", "--out", str(out)]) == 0
    markdown = out.read_text()
    assert markdown.count("# Failure report:") == 2
    assert row(markdown, "Success per category", "multi_turn_base")["Success (%)"] == "37.00 ± 4.83"
    assert "# Change: SEAL vs Vanilla RL" in markdown
    assert cli.main([str(b)]) == 0
    assert "50.00 ± 5.00" in capsys.readouterr().out
    summary_only = write_eval_dir(tmp_path / "s", {c: 1 for c in CATEGORIES}, 10, results=False)
    assert cli.main([str(summary_only)]) == 2
    assert "no results.jsonl" in capsys.readouterr().err


def test_the_report_names_every_failed_task() -> None:
    records = [
        {"task_id": "multi_turn_miss_func_7", "category": "multi_turn_miss_func", "accuracy": 0,
         "failure_tags": ["state_mismatch"], "paper_labels": ["wrong_state"], "error": None},
        {"task_id": "multi_turn_base_3", "category": "multi_turn_base", "accuracy": 1,
         "failure_tags": ["pass"], "paper_labels": ["pass"], "error": None},
        {"task_id": "multi_turn_base_9", "category": "multi_turn_base", "accuracy": 0,
         "failure_tags": [], "paper_labels": [], "error": "PolicyError: a|b"},
    ]
    assert fr.failed_tasks(records) == [
        ["multi_turn_base_9", "multi_turn_base", "–", "–", "PolicyError: a/b"],
        ["multi_turn_miss_func_7", "multi_turn_miss_func", "wrong_state", "state_mismatch", "–"],
    ]
    report = fr.render_report(records, "t")
    assert "## Failed tasks" in report and "| multi_turn_miss_func_7 |" in report
    assert "| multi_turn_base_3 |" not in report  # passed tasks are not listed
