"""Paper tables from synthetic evaluation directories, checked against hand-computed numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_service.vocab import CATEGORIES
from seal.eval import results, stats
from seal.report import paper_numbers as pn
from seal.report import tables
from seal.report.paper_numbers import Row
from tests.synthetic_runs import load_script, write_eval_dir

# 37/100, 50/100, 20/100, 10/100: hand-computed below.
COUNTS = {
    "multi_turn_base": 37,
    "multi_turn_miss_func": 50,
    "multi_turn_miss_param": 20,
    "multi_turn_long_context": 10,
}


make_tables = load_script("make_tables")


def table_line(markdown: str, title_start: str, label: str) -> list[str]:
    """The cells of the row whose first cell is ``label`` in the table whose title starts so."""
    section = markdown.split(f"### {title_start}", 1)[1].split("###", 1)[0]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells and cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in table {title_start!r}:\n{section}")


def cells_by_header(markdown: str, title_start: str, label: str) -> dict[str, str]:
    section = markdown.split(f"### {title_start}", 1)[1].split("###", 1)[0]
    header_line = next(line for line in section.splitlines() if line.startswith("| Model"))
    header = [cell.strip() for cell in header_line.strip().strip("|").split("|")]
    return dict(zip(header, table_line(markdown, title_start, label), strict=True))


def test_binomial_formatting_hand_computed() -> None:
    # sqrt(0.37 * 0.63 / 100) = 0.048280 -> 4.83
    assert stats.format_estimate(stats.binomial_estimate(0.37, 100)) == "37.00 ± 4.83"
    assert stats.format_estimate(stats.Estimate(0.5)) == "50.00"
    assert stats.format_estimate(None) == "–"
    assert tables.format_delta(tables.delta_points(stats.Estimate(0.37), 58.0)) == "-21.00"
    assert tables.format_delta(tables.delta_points(stats.Estimate(0.4025), 40.25)) == "0.00"
    assert tables.format_delta(None) == "–"


@pytest.mark.parametrize("source", ["summary", "results"])
def test_held_in_row_numbers_and_deltas(tmp_path: Path, source: str) -> None:
    eval_dir = write_eval_dir(
        tmp_path / "seal7b", COUNTS, results=source == "results", summary=source == "summary"
    )
    held_in = tables.load_held_in({"Qwen2.5-7B-Instruct+SEAL": eval_dir})
    markdown = tables.render_tables(held_in, {})
    cells = cells_by_header(markdown, "BFCL V3", "Qwen2.5-7B-Instruct + SEAL")
    # sqrt(.37*.63/100)=4.83, sqrt(.25/100)=5.00, sqrt(.16/100)=4.00, sqrt(.09/100)=3.00;
    # average 29.25, stderr sqrt(.002331+.0025+.0016+.0009)/4 = 0.021405 -> 2.14.
    assert cells["Base (ours)"] == "37.00 ± 4.83"
    assert cells["Miss Func (ours)"] == "50.00 ± 5.00"
    assert cells["Miss Param (ours)"] == "20.00 ± 4.00"
    assert cells["Long Context (ours)"] == "10.00 ± 3.00"
    assert cells["Average (ours)"] == "29.25 ± 2.14"
    assert cells["Average (paper)"] == "40.25"
    assert cells["Base (paper)"] == "58.00"
    assert [cells[f"{h} Δ"] for h in ("Average", "Base", "Miss Func", "Miss Param", "Long Context")] == [
        "-11.00",
        "-21.00",
        "+14.00",
        "-14.00",
        "-23.00",
    ]


def test_rows_without_data_show_dash_and_paper_numbers(tmp_path: Path) -> None:
    markdown = tables.render_tables({}, {})
    cells = cells_by_header(markdown, "BFCL V3", "ToolACE-2-Llama-3.1-8B")
    assert cells["Average (ours)"] == "–"
    assert cells["Average (paper)"] == "32.00"
    assert cells["Average Δ"] == "–"
    # every paper row is present, in order, in each table
    body = markdown.split("### BFCL V3", 1)[1].split("###", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ") and not line.startswith("| Model")]
    assert len(rows) == len(pn.HELD_IN) == 9
    assert "Reference points" in markdown and "| GLM-4.6 | 68.00 |" in markdown


def test_ablation_table_reuses_held_in_rows(tmp_path: Path) -> None:
    vanilla = write_eval_dir(tmp_path / "vanilla", {c: 30 for c in CATEGORIES})
    ablated = write_eval_dir(tmp_path / "worew", {c: 40 for c in CATEGORIES}, results=False)
    held_in = tables.load_held_in(
        {"qwen7b+vanilla_rl": vanilla, "Qwen2.5-7B-Instruct + w/o reweighting": ablated}
    )
    markdown = tables.render_tables(held_in, {}, ["ablation"])
    assert "### BFCL V3" not in markdown
    # 30/100: sqrt(.21/100)=4.58; average stderr sqrt(4*.0021)/4 = 0.022913 -> 2.29
    vanilla_cells = cells_by_header(markdown, "Ablation", "Qwen2.5-7B-Instruct + Vanilla RL")
    assert vanilla_cells["Average (ours)"] == "30.00 ± 2.29"
    assert vanilla_cells["Average Δ"] == "-0.75"
    ablated_cells = cells_by_header(
        markdown, "Ablation", "Qwen2.5-7B-Instruct + w/o diagnosis-guided reweighting"
    )
    assert ablated_cells["Base (ours)"] == "40.00 ± 4.90"
    assert ablated_cells["Base (paper)"] == "48.00"
    assert ablated_cells["Base Δ"] == "-8.00"
    assert cells_by_header(markdown, "Ablation", "Qwen2.5-7B-Instruct + SEAL")["Average (ours)"] == "–"


def test_ood_table_merges_suites_and_averages(tmp_path: Path) -> None:
    v4 = write_eval_dir(
        tmp_path / "v4",
        {"web_search": 20, "memory": 45},
        {"web_search": 200, "memory": 150},
        results=False,
        split="bfcl_v4",
    )
    tau = write_eval_dir(
        tmp_path / "tau",
        {"retail": 57, "airline": 10},
        {"retail": 114, "airline": 50},
        results=False,
        split="tau2",
    )
    # a hand-written τ² summary records no protocol: shown only when asked, labelled (tests/eval/test_tau2.py)
    ood = tables.load_ood({"Qwen2.5-7B-Instruct+SEAL": [v4, tau]}, allow_noncomparable_tau2=True)
    markdown = tables.render_tables({}, ood, ["ood"])
    cells = cells_by_header(markdown, "Out-of-distribution", "Qwen2.5-7B-Instruct + SEAL")
    # web 0.1, sqrt(.09/200)=2.12; memory 0.3, sqrt(.21/150)=3.74; mean 20.00, sqrt(.00045+.0014)/2=2.15
    assert cells["Web Search (ours)"] == "10.00 ± 2.12"
    assert cells["Memory (ours)"] == "30.00 ± 3.74"
    assert cells["BFCL V4 Avg (ours)"] == "20.00 ± 2.15"
    assert cells["BFCL V4 Avg Δ"] == "+7.29"
    assert cells["Web Search Δ"] == "+0.50"
    # retail 57/114 = 50.00, sqrt(.25/114) = 4.68; telecom missing -> no τ² average
    assert cells["Retail (ours)"] == "50.00 ± 4.68"
    assert cells["Retail Δ"] == "+23.68"  # no caveats passed to the renderer: a plain delta
    assert cells["Telecom (ours)"] == "–"
    assert cells["τ² Avg (ours)"] == "–"
    assert cells["τ² Avg (paper)"] == "20.79"


def test_ood_rows_beyond_the_paper_are_shown(tmp_path: Path) -> None:
    v4 = write_eval_dir(tmp_path / "v4", {"web_search": 1, "memory": 2}, 10, results=False)
    markdown = tables.render_tables({}, tables.load_ood({"toolace8b+seal": [v4]}), ["ood"])
    cells = cells_by_header(markdown, "Out-of-distribution", "ToolACE-2-Llama-3.1-8B + SEAL")
    assert cells["Web Search (ours)"].startswith("10.00 ± ")
    assert cells["Web Search (paper)"] == "–"


def test_parse_row_aliases_and_errors() -> None:
    assert pn.parse_row("Qwen2.5-7B-Instruct+SEAL") == Row(pn.QWEN_7B, pn.SEAL)
    assert pn.parse_row("qwen3b + Vanilla RL") == Row(pn.QWEN_3B, pn.VANILLA_RL)
    assert pn.parse_row("ToolACE-2-Llama-3.1-8B") == Row(pn.TOOLACE_8B, pn.BASE)
    assert pn.parse_row("qwen7b+w/o closed-loop update") == Row(pn.QWEN_7B, pn.WO_CLOSED_LOOP)
    assert Row(pn.QWEN_7B, pn.VANILLA_RL).key == "Qwen2.5-7B-Instruct+Vanilla RL"
    with pytest.raises(ValueError, match="unknown backbone"):
        pn.parse_row("Llama-70B+SEAL")
    with pytest.raises(ValueError, match="unknown training"):
        pn.parse_row("qwen7b+DPO")


def test_paper_averages_match_their_parts() -> None:
    """Transcription check: each printed average equals the mean of its printed parts (paper rounding)."""
    for row, scores in {**pn.HELD_IN, **pn.ABLATION}.items():
        metrics = scores.as_metrics()
        assert abs(metrics["average"] - sum(metrics[c] for c in CATEGORIES) / 4) < 0.006, row
    for row, scores in pn.OOD.items():
        metrics = scores.as_metrics()
        for suite, parts in pn.OOD_SUITES.items():
            consistent = abs(metrics[suite] - sum(metrics[p] for p in parts) / len(parts)) < 0.006
            assert consistent != ((row, suite) in pn.KNOWN_INCONSISTENT_AVERAGES), (row, suite)


def test_bad_inputs_give_clear_errors(tmp_path: Path) -> None:
    percent = tmp_path / "percent"
    percent.mkdir()
    (percent / "summary.json").write_text(json.dumps({"accuracy": {"multi_turn_base": 37.0}}))
    with pytest.raises(ValueError, match="not a fraction"):
        tables.load_held_in({"qwen7b+seal": percent})
    wrong_average = write_eval_dir(tmp_path / "avg", COUNTS, results=False)
    summary = json.loads((wrong_average / "summary.json").read_text())
    summary["accuracy"]["average"] = 0.5
    (wrong_average / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ValueError, match="differs from the mean"):
        tables.load_held_in({"qwen7b+seal": wrong_average})
    ood_as_held_in = write_eval_dir(tmp_path / "ood", {"web_search": 1}, 10, results=False)
    with pytest.raises(ValueError, match="not among the expected"):
        tables.load_held_in({"qwen7b+seal": ood_as_held_in})
    held_in_as_ood = write_eval_dir(tmp_path / "heldin", COUNTS, results=False)
    with pytest.raises(ValueError, match="not among the expected"):
        tables.load_ood({"qwen7b+seal": [held_in_as_ood]})
    with pytest.raises(ValueError, match="more than one"):
        tables.load_ood({"qwen7b+seal": [ood_as_held_in, ood_as_held_in]})
    with pytest.raises(ValueError, match="given twice"):
        tables.load_held_in({"qwen7b+seal": held_in_as_ood, "Qwen2.5-7B-Instruct+SEAL": held_in_as_ood})
    with pytest.raises(ValueError, match="not an evaluation directory"):
        tables.load_held_in({"qwen7b+seal": tmp_path / "nothing"})
    with pytest.raises(ValueError, match="KEY=DIR"):
        tables.parse_assignment("qwen7b+seal")


def test_run_directory_resolution(tmp_path: Path) -> None:
    run = tmp_path / "run"
    only = write_eval_dir(run / "eval" / "step_72", COUNTS, results=False)
    assert results.resolve_eval_dir(run) == only
    write_eval_dir(run / "eval" / "step_10", COUNTS, results=False)
    with pytest.raises(ValueError, match="name one"):
        results.resolve_eval_dir(run)
    write_eval_dir(run / "eval" / "best", COUNTS, results=False)
    with pytest.raises(ValueError, match="name one"):  # best alone is not chosen: it is selected on the test set
        results.resolve_eval_dir(run)
    last = write_eval_dir(run / "eval" / "last", COUNTS, results=False)
    assert results.resolve_eval_dir(run) == last


def test_a_run_directory_resolves_to_its_only_last_subset_evaluation(tmp_path: Path) -> None:
    # What `seal-eval --run --tasks ...` writes: best_<subset> and last_<subset>. The last one is taken (best is
    # selected on held-in tasks); several last_* or none is an error that names every candidate.
    run = tmp_path / "run"
    write_eval_dir(run / "eval" / "best_multi_turn_base_50", COUNTS, results=False)
    write_eval_dir(run / "eval" / "best_eval_official", COUNTS, results=False)
    with pytest.raises(ValueError, match=r"no last_\* evaluation\); name one") as refused:
        results.resolve_eval_dir(run)
    assert "best_eval_official" in str(refused.value) and "best_multi_turn_base_50" in str(refused.value)
    last = write_eval_dir(run / "eval" / "last_multi_turn_base_50", COUNTS, results=False)
    assert results.resolve_eval_dir(run) == last
    write_eval_dir(run / "eval" / "last_eval_official", COUNTS, results=False)
    with pytest.raises(ValueError, match=r"several last checkpoint evaluations \['last_eval_official', "
                                         r"'last_multi_turn_base_50'\]\); name one"):
        results.resolve_eval_dir(run)


def test_seal_tables_takes_a_runs_only_last_subset_evaluation(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # The command on a run directory holding best_<name> and last_<name> (`seal-eval --run` with a subset or other
    # rules): the row is last's numbers (29.25 on average), never best's (2 of 100 in each category).
    from seal.report.make_tables import main as seal_tables

    run = tmp_path / "runs" / "seal7b"
    write_eval_dir(run / "eval" / "best_multi_turn_base_50", {c: 2 for c in CATEGORIES})
    write_eval_dir(run / "eval" / "last_multi_turn_base_50", COUNTS)
    assert seal_tables(["--row", f"qwen7b+seal={run}", "--tables", "held_in"]) == 0, capsys.readouterr().err
    assert "| Qwen2.5-7B-Instruct + SEAL | 29.25 ± 2.14 |" in capsys.readouterr().out


def test_cli_with_mapping_file_and_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_eval_dir(tmp_path / "runs" / "seal7b" / "eval" / "last", COUNTS)
    vanilla = write_eval_dir(tmp_path / "vanilla3b", {c: 9 for c in CATEGORIES}, results=False)
    write_eval_dir(
        tmp_path / "runs" / "v4", {"web_search": 20, "memory": 45}, {"web_search": 200, "memory": 150}
    )
    mapping = tmp_path / "tables.yaml"
    mapping.write_text(
        "held_in:\n  Qwen2.5-7B-Instruct+SEAL: runs/seal7b\nood:\n  Qwen2.5-7B-Instruct+SEAL: [runs/v4]\n"
    )
    out = tmp_path / "out" / "tables.md"
    code = make_tables.main(
        ["--map", str(mapping), "--row", f"qwen3b+vanilla_rl={vanilla}", "--out", str(out)]
    )
    assert code == 0
    markdown = out.read_text()
    assert cells_by_header(markdown, "BFCL V3", "Qwen2.5-7B-Instruct + SEAL")["Base (ours)"] == "37.00 ± 4.83"
    # 9/100: sqrt(.09*.91/100) = 2.86
    vanilla_cells = cells_by_header(markdown, "BFCL V3", "Qwen2.5-3B-Instruct + Vanilla RL")
    assert vanilla_cells["Base (ours)"] == "9.00 ± 2.86"
    assert vanilla_cells["Base Δ"] == "-7.00"
    assert (
        cells_by_header(markdown, "Out-of-distribution", "Qwen2.5-7B-Instruct + SEAL")["BFCL V4 Avg (ours)"]
        == "20.00 ± 2.15"
    )

    code = make_tables.main(["--row", f"llama70b+seal={vanilla}"])
    assert code == 2
    assert "unknown backbone" in capsys.readouterr().err


def test_tables_name_the_rules_profile_and_refuse_mixed_profiles(tmp_path: Path) -> None:
    official = write_eval_dir(tmp_path / "official", COUNTS)
    summary_path = official / "summary.json"
    summary = json.loads(summary_path.read_text())
    summary["rules"] = "official"
    summary_path.write_text(json.dumps(summary))
    mapping = {"Qwen2.5-7B-Instruct+SEAL": official}
    rules = tables.held_in_rules(mapping)
    assert rules == "official"
    markdown = tables.render_tables(tables.load_held_in(mapping), {}, rules=rules)
    assert "Held-in evaluation rules: official (BFCL's multi-turn pipeline" in markdown
    # A summary written before the profiles existed was played under the release's rules.
    legacy = write_eval_dir(tmp_path / "legacy", COUNTS)
    assert tables.held_in_rules({"Qwen2.5-7B-Instruct": legacy}) == "release"
    with pytest.raises(ValueError, match="different rules profiles"):
        tables.held_in_rules({"Qwen2.5-7B-Instruct+SEAL": official, "Qwen2.5-7B-Instruct": legacy})


def test_rows_from_another_split_or_a_subset_are_refused_unless_labelled(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    all_split = write_eval_dir(tmp_path / "all", {c: 80 for c in CATEGORIES}, 200, split="all", results=False)
    two = write_eval_dir(tmp_path / "two", {"multi_turn_base": 1}, 2, split="tasks", results=False)
    for directory, what in ((all_split, "split 'all'.*800 tasks"), (two, "split 'tasks'.*2 tasks")):
        with pytest.raises(ValueError, match=f"row Qwen2.5-7B-Instruct\\+SEAL .*{what}.*--allow-mismatched"):
            tables.load_held_in({"qwen7b+seal": directory})
    assert make_tables.main(["--row", f"qwen7b+seal={all_split}"]) == 2
    assert "not the held-in column's evaluation" in capsys.readouterr().err
    # With the flag it is rendered, its label saying what it is, and no delta against the paper.
    assert make_tables.main(["--row", f"qwen7b+seal={all_split}", "--allow-mismatched", "--tables", "held_in"]) == 0
    markdown = capsys.readouterr().out
    label = "Qwen2.5-7B-Instruct + SEAL (not comparable: split 'all', not 'eval'; 800 tasks"
    (line,) = [line for line in markdown.splitlines() if line.startswith(f"| {label}")]
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert cells[1] == "40.00 ± 1.73" and cells[3] == "–"  # 80/200 per category; sqrt(4 × .4 × .6 / 200) / 4
    # The paper's own 400-task evaluation is accepted as before.
    ok = write_eval_dir(tmp_path / "ok", COUNTS, results=False)
    assert tables.held_in_mismatch(results.read_summary(ok)) is None


def test_a_partial_bfcl_v4_memory_row_is_refused_or_marked(tmp_path: Path) -> None:
    v4 = write_eval_dir(tmp_path / "v4", {"web_search": 20, "memory": 45}, {"web_search": 200, "memory": 150},
                        results=False, split="bfcl_v4")
    summary = json.loads((v4 / "summary.json").read_text())
    del summary["breakdown"]["memory_rec_sum"], summary["breakdown"]["memory_vector"]  # memory from kv alone
    (v4 / "summary.json").write_text(json.dumps(summary))
    mapping = {"Qwen2.5-7B-Instruct+SEAL": [v4]}
    with pytest.raises(ValueError, match="memory: the mean of memory_kv only"):
        tables.load_ood(mapping)
    ood = tables.load_ood(mapping, allow_partial_bfcl_v4=True)
    markdown = tables.render_tables({}, ood, ["ood"], bfcl_v4_caveats=tables.bfcl_v4_caveats(mapping))
    cells = cells_by_header(markdown, "Out-of-distribution", "Qwen2.5-7B-Instruct + SEAL †")
    assert cells["Memory (ours)"] == "30.00 ± 3.74" and cells["Memory Δ"] == "n/c"
    assert cells["BFCL V4 Avg Δ"] == "n/c"  # an average over a partial memory score is not the paper's either
    assert cells["Web Search Δ"] == "+0.50"  # web search covered both of its sub-categories: comparable
    assert "† Qwen2.5-7B-Instruct + SEAL: BFCL V4 not run under the paper's protocol" in markdown
    assert "memory_kv only" in markdown and "harness seal.eval.ood" in markdown


def _v4_records(per_sub: dict[str, int]) -> list[dict]:
    """Records as seal.eval.ood writes them: one per question, every third one right."""
    key = {"memory_kv": "memory", "memory_rec_sum": "memory", "memory_vector": "memory",
           "web_search_base": "web_search", "web_search_no_snippet": "web_search"}
    return [{"category": key[sub], "bfcl_category": sub, "accuracy": int(i % 3 == 0)}
            for sub, n in per_sub.items() for i in range(n)]


def _write_v4(path: Path, per_sub: dict[str, int]) -> Path:
    path.mkdir(parents=True)
    summary = results.ood_summary(_v4_records(per_sub), "bfcl_v4", "vllm:model", 1.0, [])
    (path / "summary.json").write_text(json.dumps(summary))
    return path


def test_a_bfcl_v4_task_subset_is_refused_or_marked_and_every_v4_row_names_its_harness(tmp_path: Path) -> None:
    """A `--tasks` subset has every sub-category but not BFCL's number of questions: refused beside the paper's
    row, or shown marked without a delta; a complete run is accepted and its harness named under the table."""
    full = dict(tables.BFCL_V4_QUESTIONS)
    subset = dict(full, web_search_base=10, web_search_no_snippet=10)
    mapping = {"Qwen2.5-7B-Instruct+SEAL": [_write_v4(tmp_path / "subset", subset)]}
    with pytest.raises(ValueError, match=r"web_search: a task subset: web_search_base 10 questions \(BFCL: 100\)"):
        tables.load_ood(mapping)
    ood = tables.load_ood(mapping, allow_partial_bfcl_v4=True)
    markdown = tables.render_tables({}, ood, ["ood"], bfcl_v4_caveats=tables.bfcl_v4_caveats(mapping))
    cells = cells_by_header(markdown, "Out-of-distribution", "Qwen2.5-7B-Instruct + SEAL †")
    assert cells["Web Search Δ"] == "n/c" and cells["BFCL V4 Avg Δ"] == "n/c" and cells["Memory Δ"] != "n/c"
    assert "a task subset" in markdown and "harness seal.eval.ood" in markdown

    complete = {"Qwen2.5-7B-Instruct+SEAL": [_write_v4(tmp_path / "full", full)]}
    assert tables.bfcl_v4_caveats(complete) == {}
    markdown = tables.render_tables({}, tables.load_ood(complete), ["ood"])
    assert cells_by_header(markdown, "Out-of-distribution", "Qwen2.5-7B-Instruct + SEAL")["Web Search Δ"] != "n/c"
    assert ("BFCL V4 harness of Qwen2.5-7B-Instruct + SEAL: seal.eval.ood (BFCL's FC-runner rules)"
            in markdown)


def test_a_v4_summary_without_counts_is_not_taken_as_complete(tmp_path: Path) -> None:
    path = _write_v4(tmp_path / "v4", dict(tables.BFCL_V4_QUESTIONS))
    summary = json.loads((path / "summary.json").read_text())
    del summary["breakdown"]["memory_kv"]["count"]
    assert tables.bfcl_v4_differences(summary) == [
        "memory: a task subset: memory_kv no count recorded (BFCL: 155) (harness seal.eval.ood (BFCL's FC-runner "
        "rules))"]


def test_bfcl_v4_question_counts_are_bfcls(tmp_path: Path) -> None:
    """The full counts, recounted from BFCL's own data through the harness's entry lists."""
    pytest.importorskip("bfcl_eval")
    from seal.eval.ood import MEMORY_BACKENDS, WEB_SEARCH_CATEGORIES, memory_entries, web_search_entries

    entries = [e for b in MEMORY_BACKENDS for e in memory_entries(b, tmp_path)]
    entries += [e for c in WEB_SEARCH_CATEGORIES for e in web_search_entries(c)]
    counted: dict[str, int] = {}
    for e in entries:
        if not e.is_prereq:
            counted[e.bfcl_category] = counted.get(e.bfcl_category, 0) + 1
    assert counted == dict(tables.BFCL_V4_QUESTIONS)
