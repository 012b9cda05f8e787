"""seal/run_dir.py: the run directory's file names and formats (what existing runs hold), the
best-checkpoint rule, and checkpoint selection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seal import run_dir as R


def test_layout_names_match_existing_runs(tmp_path):
    run = R.RunDir(tmp_path / "SEAL")
    assert run.config_file == tmp_path / "SEAL" / "config.yaml"
    assert run.metrics_file == tmp_path / "SEAL" / "metrics.jsonl"
    assert run.env_service_log == tmp_path / "SEAL" / "env_service.log"
    assert run.verl_config_file == tmp_path / "SEAL" / "verl_config.yaml"
    assert run.validation_file(3) == tmp_path / "SEAL" / "validation" / "step_3.jsonl"
    assert run.subset_file("train") == tmp_path / "SEAL" / "data" / "train_subset.parquet"
    assert run.eval_dir("last") == tmp_path / "SEAL" / "eval" / "last"
    ckpts = run.checkpoints
    assert ckpts.root == tmp_path / "SEAL" / "checkpoints"
    assert ckpts.step_dir(7) == ckpts.root / "step_7" and ckpts.verl_step_dir(7) == ckpts.root / "global_step_7"
    assert ckpts.staging_dir(7) == ckpts.root / ".step_7.tmp"
    assert R.Checkpoints.ref(7) == "checkpoints/step_7"
    assert R.TRAINER_STATE_FILE == "trainer_state.pt" and R.BEST_METRIC == "val/accuracy/average"
    assert not run.root.exists()  # paths only: nothing is created


def test_seal_state_file_is_the_controllers():
    from seal.core.controller import STATE_FILE

    assert R.SEAL_STATE_FILE == STATE_FILE


def test_run_root_and_experiment_name(tmp_path):
    from seal import recipe as C

    assert R.RunDir.of("runs", "SEAL", "/x").root == Path("/x/runs/SEAL")
    assert R.RunDir.of(tmp_path, "SEAL", "/x").root == tmp_path / "SEAL"  # an absolute run_root ignores base
    assert R.RunDir.of("runs", "SEAL").root == Path("runs/SEAL")
    cfg = C.load_config("exp/SEAL.yaml")
    assert C.run_dir(cfg, "/x") == R.RunDir.of(cfg.run_root, cfg.experiment_name, "/x").root


def test_pointers_round_trip_in_todays_format(tmp_path):
    run = R.RunDir(tmp_path)
    ckpts = run.checkpoints
    assert run.latest_checkpoint() is None and ckpts.read_best() is None
    ckpts.step_dir(4).mkdir(parents=True)
    ckpts.write_latest(4)
    assert json.loads(ckpts.latest_file.read_text()) == {"step": 4, "path": "checkpoints/step_4"}
    assert run.latest_checkpoint() == ckpts.step_dir(4)
    ckpts.write_latest(5)  # a pointer to a folder that is gone, no complete checkpoint: fails naming the file
    with pytest.raises(FileNotFoundError, match="latest.json names .*step_5"):
        run.latest_checkpoint()
    (ckpts.step_dir(4) / R.SEAL_STATE_FILE).write_text("{}")  # step 4 is complete: resumed, with a warning
    assert run.latest_checkpoint() == ckpts.step_dir(4)
    ckpts.latest_file.write_text('{"step": ')  # a damaged pointer fails naming the file
    with pytest.raises(ValueError, match="latest.json"):
        run.latest_checkpoint()
    ckpts.latest_file.unlink()  # no pointer but checkpoints: the newest complete one, never a fresh run
    assert run.latest_checkpoint() == ckpts.step_dir(4)
    ckpts.write_latest(4)
    record = R.best_record(4, R.Checkpoints.ref(4), R.BEST_METRIC, 0.25)
    ckpts.write_best(record)
    assert json.loads(ckpts.best_file.read_text()) == {"step": 4, "path": "checkpoints/step_4",
                                                       "metric": "val/accuracy/average", "value": 0.25}
    assert ckpts.read_best() == record


def test_verl_step_link(tmp_path):
    ckpts = R.Checkpoints(tmp_path)
    ckpts.verl_step_dir(3).mkdir()
    (ckpts.verl_step_dir(3) / "marker").write_text("x")
    link = ckpts.link_verl_step(3)
    assert link.is_symlink() and Path(link.readlink()) == Path("global_step_3")  # relative: the run can move
    assert (ckpts.step_dir(3) / "marker").read_text() == "x"
    assert ckpts.link_verl_step(3) == link and link.is_symlink()  # relinking replaces the link
    assert ckpts.saved_steps() == {3: link}


def test_best_rule_is_strict_improvement():
    assert R.improves(0.1, None)
    assert R.improves(0.3, 0.2) and not R.improves(0.2, 0.2) and not R.improves(0.1, 0.2)
    assert not R.improves(None, None) and not R.improves(None, 0.2)
    # Earliest on ties, among saved checkpoints only.
    assert R.best_step({0: 0.1, 10: 0.4, 20: 0.4, 30: 0.5}, {10, 20}) == 10
    assert R.best_step({0: 0.1}, {5}) is None


def test_saved_steps_ignore_other_entries(tmp_path):
    ckpts = R.Checkpoints(tmp_path)
    for name in ("step_2", "step_10", ".step_11.tmp", "step_x", "global_step_2"):
        (tmp_path / name).mkdir()
    (tmp_path / "step_12").write_text("not a folder")
    assert ckpts.saved_steps() == {2: tmp_path / "step_2", 10: tmp_path / "step_10"}


def test_selection_refuses_a_broken_pointer(tmp_path):
    ckpts = R.RunDir(tmp_path).checkpoints
    ckpts.step_dir(1).mkdir(parents=True)
    ckpts.latest_file.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read"):
        R.select_checkpoints(tmp_path)
    ckpts.latest_file.write_text(json.dumps({"path": "checkpoints/step_1"}))
    with pytest.raises(ValueError, match="integer 'step'"):
        R.select_checkpoints(tmp_path)


def test_selection_on_a_verl_run(tmp_path):
    """verl checkpoints are `global_step_N` folders reached through `step_N` links."""
    run = R.RunDir(tmp_path)
    ckpts = run.checkpoints
    for step in (2, 4):
        ckpts.verl_step_dir(step).mkdir(parents=True)
        ckpts.link_verl_step(step)
    ckpts.write_latest(4)
    run.metrics_file.write_text("\n".join(json.dumps({"step": s, R.BEST_METRIC: v})
                                          for s, v in ((0, 0.1), (2, 0.3), (4, 0.2))) + "\n")
    last, best = R.select_checkpoints(tmp_path)  # no best.json: re-selected from metrics.jsonl
    assert (last.step, last.path) == (4, ckpts.step_dir(4))
    assert (best.step, best.path) == (2, ckpts.step_dir(2)) and "re-selected" in best.selection


def test_hf_weights_dir(tmp_path):
    assert R.hf_weights_dir(tmp_path) is None
    hf = tmp_path / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    assert R.hf_weights_dir(tmp_path) is None  # a config without weights is not a model
    (hf / "model.safetensors").write_bytes(b"")
    assert R.hf_weights_dir(tmp_path) == hf
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    assert R.hf_weights_dir(tmp_path) == tmp_path  # the local engine's layout comes first


def test_transcripts_have_one_schema(tmp_path):
    """`transcript_entry` builds every transcript line (both engines call it; their tests check their side), and
    `write_transcripts` refuses a line of any other shape before it writes anything."""
    from seal.core.record import EpisodeRecord

    class Decoder:  # the tokenizer's decode, on ids that are character codes
        def decode(self, ids):
            return "".join(map(chr, ids))

    record = EpisodeRecord("multi_turn_base_3", failure_tags=("pass", "state_mismatch"), reward=0.5, accuracy=0.0,
                           excluded=True, exclude_reason="infrastructure")
    entry = R.transcript_entry(record, Decoder(), [ord(c) for c in "x" * (R.TRANSCRIPT_TEXT_CHARS + 2) + "P"],
                               [ord(c) for c in "reply"])
    assert tuple(entry) == R.TRANSCRIPT_FIELDS
    assert entry == {"task_id": "multi_turn_base_3", "category": "multi_turn_base", "reward": 0.5, "accuracy": 0.0,
                     "failure_tags": ["pass", "state_mismatch"], "excluded": True, "exclude_reason": "infrastructure",
                     "prompt": "[... 3 characters cut] " + "x" * (R.TRANSCRIPT_TEXT_CHARS - 1) + "P",
                     "response": "reply"}
    path = tmp_path / "transcripts" / "step_1.jsonl"
    R.write_transcripts(path, [entry])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [entry]
    other = tmp_path / "transcripts" / "step_2.jsonl"
    for bad in ({**entry, "messages": []}, {k: v for k, v in entry.items() if k != "prompt"}):
        with pytest.raises(ValueError, match="transcript_entry"):
            R.write_transcripts(other, [entry, bad])
        assert not other.exists()


def test_a_failed_transcript_write_is_a_warning_and_the_step_goes_on(tmp_path, caplog):
    """Both engines' rule (`transcript_failures_logged`): a transcript that cannot be written is logged, naming the
    step and the error, and never stops the step; what runs after the failure inside the block is skipped."""
    (tmp_path / "transcripts").write_text("a file where the folder should be")
    reached = []
    with R.transcript_failures_logged(7):
        R.write_transcripts(tmp_path / "transcripts" / "step_7.jsonl", [])
        reached.append(True)
    assert reached == [] and "step 7: training transcripts not written" in caplog.text
    assert "the step goes on" in caplog.text and "Error" in caplog.text
