"""The checkpoint policy (seal/engines/checkpoint_policy.py): K full saves + the best, the rest pruned to their HF
export and re-signed; signing in a background thread; resume picks the newest signed full save and refuses a
pruned, unsigned, or copied one, naming the nearest usable; every reference of the run directory holds.

The verl trainer here is the real `SealTrainer` and its `_save_checkpoint` / `_load_checkpoint` overrides; only
verl's own save and load (Ray workers, FSDP) cannot run here, so they are replaced by stand-ins that write the
files verl 0.9.1 writes (`FSDPCheckpointManager.save_checkpoint` under `actor/`, `data.pt` and the tracker by
`PPOTrainer._save_checkpoint`) and record which folder verl was asked to load. No verl launch."""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import threading

import pytest
from omegaconf import OmegaConf

from seal.engines import checkpoint_policy as P
from seal.engines import checkpoint_trust as ct
from seal.run_dir import Checkpoints, RunDir

WORLD = 2  # the 2-rank CI run's world size
SHARDS = [f"actor/{kind}_world_size_{WORLD}_rank_{r}.pt" for kind in ("model", "optim", "extra_state")
          for r in range(WORLD)]
HF_FILES = ["actor/huggingface/config.json", "actor/huggingface/generation_config.json",
            "actor/huggingface/tokenizer.json", "actor/huggingface/tokenizer_config.json",
            "actor/huggingface/model.safetensors"]
RESUME_ONLY = {*SHARDS, "actor/fsdp_config.json", "data.pt"}  # what a pruned save drops


def write_verl_files(checkpoints: Checkpoints, step: int) -> None:
    """The files verl 0.9.1 writes for one save (names from its FSDP checkpoint manager and trainer)."""
    folder = checkpoints.verl_step_dir(step)
    for name in [*SHARDS, *HF_FILES, "actor/fsdp_config.json", "data.pt"]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(f"{name} of step {step}".encode() + os.urandom(64))
    (checkpoints.root / P.VERL_TRACKER).write_text(str(step))


def files_of(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def key(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # this test's signing key


# --------------------------------------------------------------------------- the verl trainer's hooks


@pytest.fixture
def verl_trainer(tiny_verl_model_dir, tmp_path, key, monkeypatch):
    model_dir = tiny_verl_model_dir
    from omegaconf import open_dict
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from seal.engines.verl.config import resume_settings, to_verl_config
    from seal.engines.verl.trainer import SealTrainer
    from seal.recipe import load_config

    loaded: list[str] = []

    def verl_save(self):  # stands in for verl's save (FSDP workers): the same files
        write_verl_files(self.checkpoints, self.global_steps)

    def verl_load(self):  # stands in for verl's load, which unpickles: records the folder it was given
        self.global_steps = 0
        if self.config.trainer.resume_mode == "resume_path":
            loaded.append(self.config.trainer.resume_from_path)
            self.global_steps = int(self.config.trainer.resume_from_path.rsplit("global_step_", 1)[1])
        else:
            assert self.config.trainer.resume_mode == "disable", "verl must never pick a folder by itself"

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", verl_save)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", verl_load)
    recipe = load_config("exp/SEAL.yaml", [f"model.path={model_dir}", "trainer.keep_full_checkpoints=1"])
    base = to_verl_config(recipe, tmp_path / "run")  # built once: a recipe's `trainer.resume` only sets these two

    def make(resume="auto"):
        cfg = copy.deepcopy(base)
        with open_dict(cfg):
            for key, value in resume_settings(resume).items():
                OmegaConf.update(cfg, key, value)
        return SealTrainer(cfg)

    make.loaded = loaded
    make.run = RunDir(tmp_path / "run")
    return make


def test_k1_saves_1_to_4_best_2_every_reference_holds_after_every_save(verl_trainer, caplog):
    trainer, run = verl_trainer(), verl_trainer.run
    ckpts = run.checkpoints
    for step, value in ((1, 0.1), (2, 0.5), (3, 0.3), (4, 0.2)):
        trainer.global_steps = step
        trainer.save_checkpoint()
        trainer.update_best({"val/accuracy/average": value})  # validation after the save: joins the signer
        trainer.saves.join()
        assert P.check_run_references(run.root, keep=1) == [], step
    trainer.saves.settle()  # the end of the run
    assert P.check_run_references(run.root, keep=1) == []
    assert json.loads(ckpts.latest_file.read_text()) == {"step": 4, "path": "checkpoints/step_4"}
    assert json.loads(ckpts.best_file.read_text())["step"] == 2
    # K=1: the newest (4) and the best (2) stay full; 1 and 3 keep only the HF export and seal_state.json,
    # re-signed as such.
    for step in (1, 3):
        folder = ckpts.verl_step_dir(step)
        assert files_of(folder) == {*HF_FILES, "seal_state.json", ct.MANIFEST_FILE}
        assert ct.verify_manifest(folder)["contents"] == ct.HF_EXPORT
    for step in (2, 4):
        folder = ckpts.verl_step_dir(step)
        assert files_of(folder) >= RESUME_ONLY and ct.verify_manifest(folder)["contents"] == ct.FULL
        assert (ckpts.step_dir(step)).resolve() == folder.resolve()

    # resume auto: the newest signed full save, and verl loads exactly that folder
    resumed = verl_trainer()
    resumed._load_checkpoint()
    assert resumed.global_steps == 4 and verl_trainer.loaded[-1] == str(ckpts.verl_step_dir(4))

    # a run that died while hashing step 5: its folder is complete but unsigned, latest.json still says 4
    write_verl_files(ckpts, 5)
    (ckpts.verl_step_dir(5) / "seal_state.json").write_text("{}")
    assert P.check_run_references(run.root, keep=1) == []  # nothing names the unsigned save
    caplog.set_level(logging.WARNING, logger=P.__name__)
    again = verl_trainer()
    again._load_checkpoint()
    assert again.global_steps == 4 and verl_trainer.loaded[-1] == str(ckpts.verl_step_dir(4))
    assert "skipping newer saves: step 5: unsigned" in caplog.text

    # named explicitly: a pruned step, and the unsigned one, are refused naming the nearest usable save
    with pytest.raises(ct.UntrustedCheckpoint, match=r"pruned by the checkpoint policy.*nearest usable save is "
                                                     r".*global_step_4 .*usable steps: \[2, 4\]"):
        verl_trainer(str(ckpts.step_dir(3)))._load_checkpoint()
    with pytest.raises(ct.UntrustedCheckpoint, match=r"unsigned.*nearest usable save is .*global_step_4"):
        verl_trainer(str(ckpts.verl_step_dir(5)))._load_checkpoint()
    n_loaded = len(verl_trainer.loaded)
    verl_trainer(str(ckpts.step_dir(2)))._load_checkpoint()  # the full best: resumes
    assert verl_trainer.loaded[n_loaded:] == [str(ckpts.verl_step_dir(2))]


def test_signing_runs_in_the_background_and_publishes_only_signed_saves(verl_trainer, monkeypatch):
    trainer, ckpts = verl_trainer(), verl_trainer.run.checkpoints
    trainer.global_steps = 1
    trainer.save_checkpoint()
    trainer.saves.join()
    release, hashing = threading.Event(), threading.Event()
    real_hashes = ct._file_hashes

    def slow_hashes(folder):  # a big save: hashing goes on while the trainer moves on
        hashing.set()
        assert release.wait(30), "the test never released the hashing"
        return real_hashes(folder)

    monkeypatch.setattr(ct, "_file_hashes", slow_hashes)
    trainer.global_steps = 2
    trainer.save_checkpoint()  # returns while step 2 is being hashed
    assert hashing.wait(30)
    assert not (ckpts.verl_step_dir(2) / ct.MANIFEST_FILE).exists()
    assert json.loads(ckpts.latest_file.read_text())["step"] == 1 and not ckpts.step_dir(2).exists()
    release.set()
    trainer.saves.join()
    assert json.loads(ckpts.latest_file.read_text())["step"] == 2 and ckpts.step_dir(2).is_symlink()
    assert P.check_run_references(verl_trainer.run.root, keep=1) == []
    assert trainer.saves.last_sign_s is not None


def test_a_signing_failure_stops_the_run_at_the_next_join(verl_trainer, monkeypatch):
    trainer = verl_trainer()

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(P, "write_manifest", broken)
    trainer.global_steps = 1
    trainer.save_checkpoint()
    with pytest.raises(RuntimeError, match=r"signing or publishing the save of step 1 .*disk full"):
        trainer.saves.join()


def test_check_env_makes_every_save_check_the_run(verl_trainer, monkeypatch):
    monkeypatch.setenv(P.CHECK_ENV, "1")
    trainer, ckpts = verl_trainer(), verl_trainer.run.checkpoints
    trainer.global_steps = 1
    trainer.save_checkpoint()  # joined and checked at once
    assert (ckpts.verl_step_dir(1) / ct.MANIFEST_FILE).is_file()
    (ckpts.root / "best.json").write_text(json.dumps({"step": 7, "path": "checkpoints/step_7", "metric": "m",
                                                      "value": 1.0}))
    trainer.global_steps = 2
    with pytest.raises(RuntimeError, match=r"after the save of step 2: best.json names .*step_7, which does not"):
        trainer.save_checkpoint()


# --------------------------------------------------------------------------- the manifest's place
def test_a_signed_save_copied_to_another_step_or_run_is_refused(tmp_path, key):
    ckpts = RunDir(tmp_path / "run").checkpoints
    write_verl_files(ckpts, 1)
    ct.write_manifest(ckpts.verl_step_dir(1), ckpts.root.parent, 1)
    assert "signed by run" in ct.check_checkpoint(ckpts.verl_step_dir(1), trust=False)
    # The reproduction: copied to global_step_5, it verified and resumed as step 5.
    shutil.copytree(ckpts.verl_step_dir(1), ckpts.verl_step_dir(5))
    with pytest.raises(ct.UntrustedCheckpoint, match="holds the save of step 1.*copied or renamed"):
        ct.check_checkpoint(ckpts.verl_step_dir(5), trust=False)
    with pytest.raises(ct.UntrustedCheckpoint, match="holds the save of step 1"):
        P.verl_resume_folder(ckpts, str(ckpts.verl_step_dir(5)), trust=False)
    assert P.verl_resume_folder(ckpts, "auto", trust=False) == ckpts.verl_step_dir(1)  # the copy is skipped
    other = RunDir(tmp_path / "other").checkpoints
    other.root.mkdir(parents=True)
    shutil.copytree(ckpts.verl_step_dir(1), other.verl_step_dir(1))
    with pytest.raises(ct.UntrustedCheckpoint, match="signed as a save of run .*run, not of .*other"):
        ct.check_checkpoint(other.verl_step_dir(1), trust=False)
    assert "without checking" in ct.check_checkpoint(other.verl_step_dir(1), trust=True)


def test_check_run_references_names_each_broken_reference(tmp_path, key):
    run = RunDir(tmp_path / "run")
    ckpts = run.checkpoints
    for step in (1, 2):
        write_verl_files(ckpts, step)
        ct.write_manifest(ckpts.verl_step_dir(step), run.root, step)
        ckpts.link_verl_step(step)
    ckpts.write_latest(2)
    ckpts.write_best({"step": 1, "path": "checkpoints/step_1", "metric": "m", "value": 1.0})
    assert P.check_run_references(run.root, keep=1) == []  # 2 is the newest, 1 the best
    ckpts.write_best({"step": 0, "path": "Qwen/base", "metric": "m", "value": 0.0})  # the base model was best
    assert P.check_run_references(run.root, keep=1) == [
        "the checkpoint policy (trainer.keep_full_checkpoints=1) keeps the newest 1 full saves and the best, "
        "but steps [1] are full too"]
    ckpts.write_best({"step": 1, "path": "checkpoints/step_1", "metric": "m", "value": 1.0})
    (ckpts.verl_step_dir(1) / "data.pt").write_bytes(b"changed")
    problems = P.check_run_references(run.root)
    assert any("best.json names" in p and "changed ['data.pt']" in p for p in problems)
    shutil.rmtree(ckpts.verl_step_dir(2))
    problems = P.check_run_references(run.root)
    assert any(p.startswith("latest.json names") and "does not exist" in p for p in problems)
    assert any(p.startswith("step_2 is a link") for p in problems)
    assert any(p.startswith(P.VERL_TRACKER) for p in problems)


# --------------------------------------------------------------------------- the local engine
def test_local_engine_prunes_the_optimizer_and_refuses_a_pruned_resume(tmp_path):
    from seal.engines.local.checkpoint import resume_point

    run = RunDir(tmp_path / "run")
    ckpts = run.checkpoints
    for step in (1, 2, 3, 4):  # the files `save_checkpoint` writes (HF model, tokenizer, states)
        folder = ckpts.step_dir(step)
        folder.mkdir(parents=True)
        for name in ("config.json", "model.safetensors", "tokenizer.json", "seal_state.json", "trainer_state.pt"):
            (folder / name).write_bytes(os.urandom(16))
        ckpts.write_latest(step)
        if step == 2:
            ckpts.write_best({"step": 2, "path": "checkpoints/step_2", "metric": "m", "value": 1.0})
        P.prune_local(ckpts, 1)
        assert P.check_run_references(run.root, keep=1) == [], step
    assert sorted(s for s, p in ckpts.saved_steps().items() if (p / "trainer_state.pt").is_file()) == [2, 4]
    assert (ckpts.step_dir(3) / "model.safetensors").is_file()
    assert resume_point("auto", run) == ckpts.step_dir(4)
    with pytest.raises(FileNotFoundError, match=r"no trainer_state.pt.*nearest usable one is .*step_4 .*\[2, 4\]"):
        resume_point(str(ckpts.step_dir(3)), run)
    assert resume_point(str(ckpts.step_dir(2)), run) == ckpts.step_dir(2)


def test_to_prune_keeps_the_newest_k_and_the_best():
    assert P.to_prune([1, 2, 3, 4], 1, 2) == [1, 3]
    assert P.to_prune([1, 2, 3, 4], 2, None) == [1, 2]
    assert P.to_prune([10, 20, 30], 2, 30) == [10]
    with pytest.raises(ValueError, match="at least 1"):
        P.to_prune([1], 0, None)


def test_disk_plan_of_the_7b_recipe_under_the_default_policy():
    """exp/SEAL.yaml: 72 steps, save_freq 10 -> saves at 10, 20, ..., 70 and the last step: 8. A full 7B save is
    107-122 GB (FSDP fp32 shards ~30, AdamW ~61, HF export 15 in bf16 to 30 in fp32). Default K = 2."""
    from seal.recipe import load_config

    cfg = load_config("exp/SEAL.yaml")
    steps = 72
    saves = len({*range(cfg.trainer.save_freq, steps + 1, cfg.trainer.save_freq), steps})
    assert saves == 8 and cfg.trainer.keep_full_checkpoints == 2
    low = P.disk_plan(saves, cfg.trainer.keep_full_checkpoints, 107e9, 15e9)
    high = P.disk_plan(saves, cfg.trainer.keep_full_checkpoints, 122e9, 30e9)
    assert (low["peak"], high["peak"]) == (488e9, 608e9)  # 4 full + 4 HF exports, during the last save
    assert (low["end"], high["end"]) == (396e9, 516e9)  # 3 full + 5 HF exports
    assert (saves * 107e9, saves * 122e9) == (856e9, 976e9)  # every save kept whole (before the policy)
    assert P.disk_plan(2, 1, 10.0, 1.0) == {"peak": 20.0, "end": 20.0, "full_saves_peak": 2.0, "full_saves_end": 2.0}


def test_verls_own_checkpoint_deletion_is_refused(tiny_verl_model_dir, tmp_path):
    model_dir = tiny_verl_model_dir
    from seal.engines.verl.config import to_verl_config
    from seal.recipe import load_config

    recipe = load_config("exp/SEAL.yaml", [f"model.path={model_dir}"])
    for item in ("trainer.max_actor_ckpt_to_keep=2", "actor_rollout_ref.actor.checkpoint.async_save=true"):
        with pytest.raises(ValueError, match="is not supported: trainer.keep_full_checkpoints"):
            to_verl_config(recipe, tmp_path / "run", [item])
