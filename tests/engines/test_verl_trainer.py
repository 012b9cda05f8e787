"""The `seal` trainer mode on CPU: advantage step (hand-computed GRPO + A-Patch) through the real
TransferQueue glue against an in-memory store, episode feeds, checkpoints/resume, validation metrics,
metrics.jsonl, and the recipe -> verl config mapping (every paper Table 4 value)."""

from __future__ import annotations

import json
import math
import os
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import open_dict

pytest.importorskip("verl")

from tensordict import TensorDict  # noqa: E402
from verl.trainer.ppo.v1.trainer_base import PPOTrainer  # noqa: E402
from verl.utils.tensordict_utils import assign_non_tensor_data, list_of_dict_to_tensordict  # noqa: E402

import seal.engines.verl.adapter as VA  # noqa: E402
import seal.engines.verl.trainer as VT  # noqa: E402
from seal.core.record import EpisodeRecord  # noqa: E402
from seal.engines.batching import SKIPPED_UPDATE_KEYS, skipped_update_metrics  # noqa: E402
from seal.engines.checkpoint_trust import MANIFEST_FILE, UntrustedCheckpoint  # noqa: E402
from seal.engines.verl.agent_loop import FEED_KEY, EpisodeFeed, rollout_to_output  # noqa: E402
from seal.engines.verl.config import TRAINER_MODE, to_verl_config  # noqa: E402
from seal.logging_utils import trim_metrics  # noqa: E402
from seal.models.qwen25 import EOS_TOKEN_ID  # noqa: E402
from seal.recipe import REPO_ROOT, load_config  # noqa: E402
from seal.rollout.types import Rollout  # noqa: E402
from seal.run_dir import TRANSCRIPT_FIELDS, cut_text  # noqa: E402

# Static A-Patch weights chosen for the hand computation (capability.enable=false -> no dynamics).
WEIGHTS = {"pass": 1.0, "state_mismatch": 1.8, "empty_turn_model_response": 0.3, "response_mismatch": 2.5}
STATIC = ["seal.capability.enable=false", "seal.apatch.tag_weights=" + json.dumps(WEIGHTS).replace(" ", "")]


@pytest.fixture(scope="module")
def model_dir(tiny_verl_model_dir):
    return tiny_verl_model_dir


def make_trainer(model_dir, run_dir, overrides=()):
    recipe = load_config("exp/SEAL.yaml", [f"model.path={model_dir}", *overrides])
    return VT.SealTrainer(to_verl_config(recipe, run_dir))


# --------------------------------------------------------------------------- recipe -> verl config
def test_seal_recipe_carries_every_table4_value_into_verl(tmp_path):
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    recipe = load_config("exp/SEAL.yaml")
    v = to_verl_config(recipe, tmp_path / "run")
    arr, actor, rollout = v.actor_rollout_ref, v.actor_rollout_ref.actor, v.actor_rollout_ref.rollout
    assert arr.model.path == "Qwen/Qwen2.5-7B-Instruct"
    assert v.data.train_batch_size == 32 and rollout.n == 8 and rollout.temperature == 1.0
    assert rollout.val_kwargs.temperature == 0.0 and rollout.val_kwargs.n == 1 and not rollout.val_kwargs.do_sample
    assert v.data.max_prompt_length == 8192 and v.data.max_response_length == 4096
    assert rollout.prompt_length == 8192 and rollout.response_length == 4096 and rollout.max_model_len == 16384
    assert v.algorithm.adv_estimator == "grpo" and v.algorithm.use_kl_in_reward is False
    assert actor.optim.lr == 1e-6
    assert actor.use_kl_loss is True and actor.kl_loss_type == "low_var_kl" and actor.kl_loss_coef == 0.001
    assert actor.entropy_coeff == 0.0 and actor.loss_agg_mode == "token-mean"
    assert actor.clip_ratio_low == 0.2 and actor.clip_ratio_high == 0.2 and actor.clip_ratio_c == 10.0
    assert actor.policy_loss.loss_mode == "vanilla"
    assert actor.ppo_mini_batch_size == 8 and actor.ppo_micro_batch_size_per_gpu == 1
    assert actor.optim.clip_grad == 1.0 and actor.grad_clip == 1.0
    assert v.trainer.n_gpus_per_node == 4 and v.trainer.nnodes == 1 and v.trainer.total_epochs == 6
    assert v.trainer.test_freq == 10 and v.trainer.val_before_train is True
    assert rollout.gpu_memory_utilization == 0.6 and rollout.tensor_model_parallel_size == 1
    # Engine wiring.
    assert rollout.name == "vllm" and rollout.mode == "async" and rollout.calculate_log_probs is True
    assert rollout.agent.default_agent_loop == "seal_bfcl" and v.trainer.v1.trainer_mode == TRAINER_MODE
    assert v.trainer.default_local_dir == str((tmp_path / "run" / "checkpoints").resolve())
    assert v.trainer.logger == ["console"] and v.trainer.resume_mode == "auto"
    assert v.data.train_files.endswith("data/bfcl_train.parquet") and v.data.val_files.endswith("bfcl_eval_400.parquet")
    assert v.seal.recipe.seal.apatch.enable is True and v.seal.run_dir == str((tmp_path / "run").resolve())
    # verl's own validation accepts it (batch divisibility, micro-batch settings, ...).
    validate_config(v, use_reference_policy=need_reference_policy(v), use_critic=need_critic(v))


def test_verl_config_overrides_and_resume(tmp_path):
    recipe = load_config("exp/SEAL.yaml", ["trainer.save_freq=0", "trainer.logger=[console,jsonl,wandb]"])
    v = to_verl_config(recipe, tmp_path, overrides=["actor_rollout_ref.rollout.agent.num_workers=16"])
    assert v.actor_rollout_ref.rollout.agent.num_workers == 16
    assert v.trainer.save_freq == -1 and v.trainer.logger == ["console", "wandb"]
    with pytest.raises(KeyError, match="no_such_key"):
        to_verl_config(recipe, tmp_path, overrides=["trainer.no_such_key=1"])
    ckpt = tmp_path / "checkpoints" / "global_step_20"
    ckpt.mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_20").symlink_to("global_step_20")
    r = load_config("exp/SEAL.yaml", [f"trainer.resume={tmp_path / 'checkpoints' / 'step_20'}"])
    v = to_verl_config(r, tmp_path)
    assert v.trainer.resume_mode == "resume_path" and v.trainer.resume_from_path == str(ckpt)
    with pytest.raises(ValueError, match="checkpoint directory"):
        to_verl_config(load_config("exp/SEAL.yaml", [f"trainer.resume={tmp_path}"]), tmp_path)
    with pytest.raises(ValueError, match="engine: verl"):
        to_verl_config(load_config("exp/SEAL.yaml", ["engine=local"]), tmp_path)


# --------------------------------------------------------------------------- the advantage step
class FakeTQ:
    """In-memory stand-in for TransferQueue's kv API (fields per key; missing fields are skipped)."""

    def __init__(self):
        self.rows: dict[str, dict] = {}

    def kv_batch_put(self, keys, partition_id, fields=None, tags=None):
        for i, key in enumerate(keys):
            row = self.rows.setdefault(key, {})
            if fields is not None:
                for name in fields.keys():  # noqa: SIM118 - iterating a TensorDict walks its rows
                    value = fields[name][i]
                    row[name] = value
        return SimpleNamespace(keys=list(keys), partition_id=partition_id, tags=tags)

    def kv_batch_get(self, keys, partition_id, select_fields=None):
        names = [n for n in select_fields if all(n in self.rows[k] for k in keys)]
        return list_of_dict_to_tensordict([{n: self.rows[k][n] for n in names} for k in keys])


def output_fields(rollout: Rollout, uid: str) -> dict:
    """A row as verl's TransferQueue agent-loop worker stores it (AgentLoopOutput.as_dict + row kwargs)."""
    out = rollout_to_output(rollout, eos_id=EOS_TOKEN_ID, fallback_prompt_ids=[7, 7],
                            global_steps={"min_global_steps": 1, "max_global_steps": 1}, need_logprobs=True)
    field = out.as_dict()
    field["uid"] = uid
    # The actor's recomputed log-probs (here equal to the rollout's: the policy has not moved).
    field["old_log_probs"] = field["rollout_log_probs"].clone()
    return field


def rollout(task, reward, tags, n_resp, mask):
    return Rollout(task_id=task, mode="train", prompt_ids=[1, 2, 3], response_ids=list(range(10, 10 + n_resp)),
                   response_mask=mask, response_logprobs=[-0.1] * n_resp, reward=reward, accuracy=reward,
                   failure_tags=tags, paper_labels=["pass"] * len(tags), category=task.rsplit("_", 1)[0])


def test_advantage_step_grpo_then_apatch_hand_computed(model_dir, tmp_path, monkeypatch):
    """Two GRPO groups + an excluded row + a verl padding row, through `SealTrainer._compute_advantage`.

    Group A rewards [1, 0] (+ excluded): mean 1/2, unbiased std 1/sqrt(2) -> +-0.70711.
    Group B rewards [1, 0, 0]: mean 1/3, std 1/sqrt(3) -> +1.15470, -0.57735, -0.57735.
    A-Patch w = clip(mean rho(tags), 0.5, 2) with rho = WEIGHTS, checker_error dropped:
    A0 [pass, pass] 1.0; A1 [pass, state_mismatch] 1.4; B0 [pass] 1.0; B1 [empty_turn] 0.3 -> 0.5;
    B2 [response_mismatch, checker_error] 2.5 -> 2.0.

    The transcripts are decoded with verl's tokenizer: after verl's own load (`_init_tokenizer`, what
    `PPOTrainer.init` runs), neither the trainer's construction nor the step loads another one.
    """
    from transformers import PreTrainedTokenizerBase

    loads: list[str] = []
    real_load = PreTrainedTokenizerBase.from_pretrained.__func__  # AutoTokenizer's loads end here too

    def counted_load(cls, *args, **kwargs):
        loads.append(cls.__name__)
        return real_load(cls, *args, **kwargs)

    monkeypatch.setattr(PreTrainedTokenizerBase, "from_pretrained", classmethod(counted_load))
    trainer = make_trainer(model_dir, tmp_path, STATIC)
    assert loads == []
    trainer._init_tokenizer()  # verl's: the run's tokenizer, at `trainer.tokenizer`
    assert loads, "verl's tokenizer load was not counted: the count below could not fail"
    verl_loads = len(loads)
    trainer.global_steps = 1
    fake = FakeTQ()
    monkeypatch.setattr(VA, "tq", fake)
    rows = {
        "A_0_0": (rollout("multi_turn_base_1", 1.0, ["pass", "pass"], 5, [1, 1, 0, 1, 1]), "A"),
        "A_1_0": (rollout("multi_turn_base_1", 0.0, ["pass", "state_mismatch"], 4, [1, 0, 0, 1]), "A"),
        "A_2_0": (Rollout(task_id="multi_turn_base_1", mode="train", excluded=True, exclude_reason="infrastructure",
                          category="multi_turn_base"), "A"),
        "B_0_0": (rollout("multi_turn_miss_func_2", 1.0, ["pass"], 3, [1, 1, 1]), "B"),
        "B_1_0": (rollout("multi_turn_miss_func_2", 0.0, ["empty_turn_model_response"], 6, [1, 1, 0, 0, 1, 1]), "B"),
        "B_2_0": (rollout("multi_turn_miss_func_2", 0.0, ["response_mismatch", "checker_error"], 2, [1, 1]), "B"),
    }
    keys = list(rows) + ["padXYZ_0_0"]
    fields = [output_fields(r, uid) for r, uid in rows.values()]
    pad = dict(fields[0], uid="padXYZ")  # verl's padding copies the first row's fields (extras included)
    pad.update(response_mask=torch.zeros(1, dtype=torch.int64), rm_scores=torch.zeros(1),
               rollout_log_probs=torch.zeros(1), old_log_probs=torch.zeros(1), responses=torch.tensor([EOS_TOKEN_ID]))
    fields.append(pad)
    fake.kv_batch_put(keys, "train", fields=list_of_dict_to_tensordict(fields))
    tags = [{"status": "success"}] * len(rows) + [{"status": "success", "is_padding": True}]
    metrics: dict = {}
    trainer._compute_advantage(SimpleNamespace(keys=keys, partition_id="train", tags=tags), metrics)

    s2, s3 = 1 / math.sqrt(2), 1 / math.sqrt(3)
    a_hi, b_hi, b_lo = 0.5 / (s2 + 1e-6), (2 / 3) / (s3 + 1e-6), -(1 / 3) / (s3 + 1e-6)
    expected = {"A_0_0": a_hi * 1.0, "A_1_0": -a_hi * 1.4, "A_2_0": 0.0, "B_0_0": b_hi * 1.0,
                "B_1_0": b_lo * 0.5, "B_2_0": b_lo * 2.0, "padXYZ_0_0": 0.0}
    for key, value in expected.items():
        adv = fake.rows[key]["advantages"]
        mask = fake.rows[key]["response_mask"].bool()
        assert adv.shape == mask.shape, key
        assert torch.allclose(adv[mask], torch.full_like(adv[mask], value), atol=1e-5), (key, adv, value)
        assert torch.all(adv[~mask] == 0), key
    # the step's transcript sample: the first row of each task (verl's padding row is no episode)
    kept = [json.loads(line) for line in (tmp_path / "transcripts" / "step_1.jsonl").read_text().splitlines()]
    assert [(k["task_id"], k["reward"]) for k in kept] == [("multi_turn_base_1", 1.0), ("multi_turn_miss_func_2", 1.0)]
    # one schema for both engines (the local engine's side: tests/engines/test_local_engine.py)
    assert all(tuple(k) == TRANSCRIPT_FIELDS for k in kept)
    assert kept[0]["prompt"] and kept[0]["response"] and kept[0]["failure_tags"] == ["pass", "pass"]
    assert kept[0]["prompt"] == cut_text(trainer.tokenizer.decode([1, 2, 3]), keep_end=True)
    assert len(loads) == verl_loads, f"a second tokenizer was loaded for the transcripts: {loads}"
    assert metrics["seal/excluded_rows"] == 2.0  # the excluded episode and verl's padding row
    assert metrics["train/num_rollouts"] == 6.0 and metrics["train/excluded"] == 1.0
    assert metrics["train/reward_mean"] == pytest.approx(2 / 5) and metrics["apatch/scaled_count"] == 5.0
    assert trainer.controller.state.observe_count == 5  # padding rows are never observed


@pytest.mark.parametrize("rewards, entropy_coeff, skipped", [((0.0, 0.0), 0.0, True), ((1.0, 0.0), 0.0, False),
                                                               ((0.0, 0.0), 0.01, False)])
def test_update_actor_is_skipped_without_a_learning_signal(model_dir, tmp_path, monkeypatch, rewards, entropy_coeff,
                                                           skipped):
    """A group whose rewards are all equal has zero advantages: with no entropy bonus verl's actor update (a
    forward, a backward and an optimizer step on a zero policy gradient) is skipped and logged as such."""
    trainer = make_trainer(model_dir, tmp_path, STATIC)
    trainer.config.actor_rollout_ref.actor.entropy_coeff = entropy_coeff
    trainer.global_steps = 1
    fake = FakeTQ()
    monkeypatch.setattr(VA, "tq", fake)
    keys = ["A_0_0", "A_1_0"]
    # rows of different lengths, as verl stores them (nested tensors)
    fields = [output_fields(rollout("multi_turn_base_1", r, ["state_mismatch"], n, [1] * n), "A")
              for r, n in zip(rewards, (3, 4), strict=True)]
    fake.kv_batch_put(keys, "train", fields=list_of_dict_to_tensordict(fields))
    batch = SimpleNamespace(keys=keys, partition_id="train", tags=[{"status": "success"}] * 2, extra_info={})
    calls = []
    monkeypatch.setattr(VA.PPOTrainerSync, "_update_actor", lambda self, b, m: calls.append(b) or b)
    metrics: dict = {}
    trainer._compute_advantage(batch, metrics)
    assert trainer._update_actor(batch, metrics) is batch
    assert metrics["actor/update_skipped"] == float(skipped)
    assert calls == ([] if skipped else [batch])
    # an update that runs keeps the recipe's micro-batch: verl's actor engine reads the switch from the batch
    # first (its dynamic batches are for the forward-only passes; tests/engines/test_verl_cpu_engine.py)
    assert batch.extra_info == ({} if skipped else {"use_dynamic_bsz": False})
    if skipped:  # the one skip record of both engines (the local engine's: tests/engines/test_local_engine.py)
        actor = {k: v for k, v in metrics.items() if k.startswith("actor/")}
        assert actor == skipped_update_metrics() and set(actor) == set(SKIPPED_UPDATE_KEYS)
    # the decision belongs to one step: the next update without an advantage step runs verl's
    trainer._update_actor(batch, {})
    assert len(calls) == (1 if skipped else 2)


def test_seal_advantages_plain_path_matches(model_dir, tmp_path):
    """Without TransferQueue keys (verl's plain compute_advantage) the same batch gives the same numbers."""
    from verl import DataProto

    trainer = make_trainer(model_dir, tmp_path, STATIC)
    rewards = [1.0, 0.0, 0.0]
    records = [EpisodeRecord("multi_turn_base_1", failure_tags=t, paper_labels=t, reward=r, accuracy=r)
               for t, r in zip([["pass"], ["state_mismatch"], ["pass", "state_mismatch"]], rewards, strict=True)]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])
    scores = torch.zeros(3, 3)
    scores[0, 1] = 1.0
    data = DataProto.from_dict(tensors={"token_level_rewards": scores, "response_mask": mask},
                               non_tensors={"uid": np.array(["g", "g", "g"], dtype=object)})
    trainer.controller.observe(records, step=1)
    VT.seal_advantages(data, records, trainer.controller, 1, algorithm=trainer.config.algorithm, num_repeat=3)
    s3 = 1 / math.sqrt(3) + 1e-6
    want = [(2 / 3) / s3, -(1 / 3) / s3 * 1.8, -(1 / 3) / s3 * 1.4]
    for i, w in enumerate(want):
        on = mask[i].bool()
        assert torch.allclose(data.batch["advantages"][i][on], torch.full((int(on.sum()),), w), atol=1e-5)


# --------------------------------------------------------------------------- episodes, metrics, checkpoints
def test_trainer_mode_is_synchronous_and_feeds_batches(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    assert trainer.trainer_mode == "sync" and trainer.registered_mode == TRAINER_MODE
    assert type(trainer.replay_buffer).__name__ == "ReplayBuffer"  # verl's synchronous buffer
    sent = []
    manager = VA.FeedingManager(SimpleNamespace(generate_sequences=sent.append, workers=3), trainer)
    train_batch = TensorDict({"x": torch.zeros(2, 1)}, batch_size=[2])
    manager.generate_sequences(train_batch)
    val_batch = TensorDict({"x": torch.zeros(2, 1)}, batch_size=[2])
    assign_non_tensor_data(val_batch, "validate", True)  # as verl's _validate marks its batches
    manager.generate_sequences(val_batch)
    train_feed = EpisodeFeed.from_value(sent[0][FEED_KEY])
    val_feed = EpisodeFeed.from_value(sent[1][FEED_KEY])
    assert train_feed.mode == "train" and train_feed.interface == trainer.controller.interface("train")
    assert train_feed.interface["schema"]["required"] is True
    assert val_feed.mode == "eval" and val_feed.interface is None
    assert manager.workers == 3  # everything else is the wrapped manager's


def test_step_evolves_and_ends_epochs(model_dir, tmp_path, monkeypatch):
    trainer = make_trainer(model_dir, tmp_path)
    monkeypatch.setattr(PPOTrainer, "step", lambda self, metrics, timing: "batch")
    trainer.steps_per_epoch, trainer.total_training_steps = 2, 4
    calls = []
    monkeypatch.setattr(trainer.controller, "end_epoch", lambda: calls.append(trainer.global_steps))
    for step in (1, 2, 3):
        trainer.global_steps = step
        metrics: dict = {}
        assert trainer.step(metrics, {}) == "batch"
        assert metrics["interface/enabled"] == 1.0 and "interface/closed_loop" in metrics
        # the step sets the progress its episodes are rewarded with: steps done before it / total
        assert trainer.controller.training_progress == pytest.approx((step - 1) / 4)
    assert calls == [2]


def fake_verl_save(self):
    folder = self.checkpoints.verl_step_dir(self.global_steps)
    (folder / "actor").mkdir(parents=True, exist_ok=True)
    (self.checkpoints.root / "latest_checkpointed_iteration.txt").write_text(str(self.global_steps))


def fake_verl_load(self):
    latest = self.checkpoints.root / "latest_checkpointed_iteration.txt"
    self.global_steps = int(latest.read_text()) if latest.is_file() else 0


def test_checkpoint_holds_seal_state_and_resume_restores_it(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))  # the signing key (checkpoint_trust)
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", fake_verl_save)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", fake_verl_load)
    trainer = make_trainer(model_dir, tmp_path)
    records = [EpisodeRecord("multi_turn_base_1", failure_tags=("pass", "state_mismatch"), accuracy=0.0)] * 12
    trainer.controller.observe(records, step=3)
    trainer.controller.evolve(3)
    trainer.global_steps = 3
    trainer._save_checkpoint()
    trainer.saves.join()  # signed in the background; the link and latest.json follow the signing
    ckpt = tmp_path / "checkpoints"
    assert (ckpt / "global_step_3" / "seal_state.json").is_file()
    assert (ckpt / "step_3").is_symlink() and (ckpt / "step_3" / "seal_state.json").is_file()
    assert json.loads((ckpt / "latest.json").read_text()) == {"step": 3, "path": "checkpoints/step_3"}

    trainer.update_best({"val/accuracy/average": 0.25})
    best = json.loads((ckpt / "best.json").read_text())
    assert best == {"step": 3, "path": "checkpoints/step_3", "metric": "val/accuracy/average", "value": 0.25}
    trainer.update_best({"val/accuracy/average": 0.20})  # worse: best stays
    assert json.loads((ckpt / "best.json").read_text())["value"] == 0.25

    resumed = make_trainer(model_dir, tmp_path)
    resumed._load_checkpoint()
    assert resumed.global_steps == 3
    assert resumed.controller.state_dict() == trainer.controller.state_dict()
    assert resumed.controller.interface("train") == trainer.controller.interface("train")
    assert resumed.best == best

    (ckpt / "global_step_3" / "seal_state.json").unlink()
    with pytest.raises(UntrustedCheckpoint, match=r"missing \['seal_state.json'\]"):
        make_trainer(model_dir, tmp_path)._load_checkpoint()
    with pytest.raises(FileNotFoundError, match="seal_state.json"):
        make_trainer(model_dir, tmp_path, ["trainer.trust_checkpoint=true"])._load_checkpoint()


def test_resume_refuses_an_unsigned_checkpoint_before_verl_reads_it(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    loaded = []

    def verl_load(self):  # verl's loader, which unpickles: recorded, loads nothing
        loaded.append(self)
        self.global_steps = 0

    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", fake_verl_save)
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", verl_load)
    trainer = make_trainer(model_dir, tmp_path / "run")
    trainer.global_steps = 2
    trainer._save_checkpoint()
    trainer.saves.join()
    signed = tmp_path / "run" / "checkpoints" / "global_step_2"
    assert json.loads((signed / MANIFEST_FILE).read_text())["files"].keys() == {"seal_state.json"}
    # A folder from elsewhere (here: the same files without the manifest), named by trainer.resume.
    foreign = tmp_path / "downloaded" / "global_step_2"
    shutil.copytree(signed, foreign)
    (foreign / MANIFEST_FILE).unlink()
    (foreign / "data.pt").write_bytes(b"a pickle verl would load")
    with pytest.raises(UntrustedCheckpoint, match="refusing to resume"):
        make_trainer(model_dir, tmp_path / "run", [f"trainer.resume={foreign}"])._load_checkpoint()
    assert loaded == []  # verl's loader never ran
    make_trainer(model_dir, tmp_path / "run", [f"trainer.resume={signed}"])._load_checkpoint()
    make_trainer(model_dir, tmp_path / "run", [f"trainer.resume={foreign}", "trainer.trust_checkpoint=true"]
                 )._load_checkpoint()
    assert len(loaded) == 2


def test_best_at_step_zero_points_at_the_base_model(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    trainer.global_steps = 0
    trainer.update_best({"val/accuracy/average": 0.1})
    best = json.loads((tmp_path / "checkpoints" / "best.json").read_text())
    assert best["step"] == 0 and best["path"] == str(model_dir)


def test_validation_metrics_count_missing_sessions_as_failures(model_dir, tmp_path):
    trainer = make_trainer(model_dir, tmp_path)
    trainer.global_steps = 4  # verl's fit sets it before any validation
    sources = ["multi_turn_base", "multi_turn_base", "multi_turn_miss_func"]
    uids = ["u1", "u2", "u3"]
    infos = {"reward": [1.0, 0.0, 1.0], "acc": [1.0, 0.0, 1.0],
             "category": ["multi_turn_base", "multi_turn_base", "multi_turn_miss_func"],
             "task_id": ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_1"],
             "excluded": [0.0, 0.0, 0.0]}
    expected = {("multi_turn_base", "u1"): 1, ("multi_turn_base", "u2"): 1, ("multi_turn_miss_func", "u3"): 1,
                ("multi_turn_miss_func", "u4"): 1}  # u4's agent loop failed: no sample came back
    metrics = trainer._val_metrics_update(sources, uids, infos, [3, 3, 3], expected_acc_counts=expected)
    assert metrics["val/accuracy/multi_turn_base"] == 0.5
    assert metrics["val/accuracy/multi_turn_miss_func"] == 0.5 and metrics["val/count/multi_turn_miss_func"] == 2
    assert metrics["val/accuracy/average"] == 0.5 and metrics["val/excluded"] == 1.0
    assert "val-core/multi_turn_base/acc/mean@1" in metrics  # verl's own table is kept
    assert trainer.last_validation["val/accuracy/average"] == 0.5
    # every validation episode in <run>/validation/step_4.jsonl, the lost session too (no tokens in these infos)
    lines = [json.loads(x) for x in (tmp_path / "validation" / "step_4.jsonl").read_text().splitlines()]
    assert [x["task_id"] for x in lines] == ["multi_turn_base_1", "multi_turn_base_2", "multi_turn_miss_func_1", ""]
    assert lines[3]["excluded"] is True and all(x["response_ids"] is None for x in lines)


def test_metrics_jsonl_is_flat_and_appends(tmp_path):
    logged = []
    log = VA.MetricsLog(SimpleNamespace(log=lambda data, step, backend=None: logged.append(step),
                                        finish=lambda exit_code=0: None), tmp_path / "metrics.jsonl")
    log.log({"val/accuracy/average": np.float32(0.5), "actor/pg_loss": torch.tensor(1.5), "bad": float("nan"),
             "counts": {"a": 1}}, step=0)
    log.log({"train/reward_mean": 0.25}, step=1)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 0, "val/accuracy/average": 0.5, "actor/pg_loss": 1.5, "bad": None},
                     {"step": 1, "train/reward_mean": 0.25}]
    assert logged == [0, 1]
    log.log({"train/reward_mean": 0.5}, step=2)
    trim_metrics(tmp_path / "metrics.jsonl", keep_through=1)  # resumed from step 1
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    trim_metrics(tmp_path / "metrics.jsonl", keep_through=None)  # a fresh run
    assert (tmp_path / "metrics.jsonl").read_text() == ""


def test_trainer_refuses_a_config_without_the_recipe(model_dir, tmp_path):
    recipe = load_config("exp/SEAL.yaml", [f"model.path={model_dir}"])
    v = to_verl_config(recipe, tmp_path)
    with open_dict(v):
        del v["seal"]
    with pytest.raises(ValueError, match="seal.recipe"):
        VT.SealTrainer(v)


# --------------------------------------------------------------------------- the engine entry
def test_engine_refuses_at_once_without_gpus(tmp_path):
    import torch as _torch

    from seal.engines.verl.launch import EngineUnavailable, train

    if _torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    recipe = load_config("exp/SEAL.yaml")
    with pytest.raises(EngineUnavailable, match="exp/tiny_cpu.yaml"):
        train(recipe, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_the_env_service_check_is_the_one_health_check(caplog):
    """`check_env_services` asks `env_service.process.healthy`: a replica that answers is enough (a dead one is
    warned about, naming its URL); none answering stops the run, naming what it waited for and where."""
    import http.server
    import threading

    from env_service.process import free_port
    from seal.engines.verl.launch import EngineUnavailable, check_env_services

    class Healthz(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            self.send_response(200 if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    alive, dead = f"http://127.0.0.1:{server.server_address[1]}", f"http://127.0.0.1:{free_port()}"
    try:
        check_env_services([alive, dead], timeout=2.0)
        assert f"env replica {dead} does not answer GET /healthz within 2 s" in caplog.text
        with pytest.raises(EngineUnavailable, match=r"GET /healthz answered no 200 within 2 s at \['http"):
            check_env_services([dead], timeout=2.0)
    finally:
        server.shutdown()
        server.server_close()


def test_build_verl_config_writes_round_robin_subsets_and_ray_env(tmp_path):
    import pandas as pd

    from env_service.vocab import CATEGORIES
    from seal.engines.verl.launch import build_verl_config

    recipe = load_config("exp/SEAL.yaml", ["data.max_train_tasks=6", "data.max_val_tasks=3", "trainer.nnodes=2",
                                           "env.urls=[http://10.0.0.2:8082,http://10.0.0.3:8082]"])
    v = build_verl_config(recipe, tmp_path)
    train = pd.read_parquet(v.data.train_files)
    assert v.data.train_files == str(tmp_path.resolve() / "data" / "train_subset.parquet")
    assert list(train.data_source) == [*CATEGORIES, *CATEGORIES[:2]]  # the local engine's order
    full = pd.read_parquet("data/bfcl_train.parquet")
    firsts = [full[full.data_source == c].iloc[0].extra_info["task_id"] for c in CATEGORIES]
    assert [e["task_id"] for e in train.extra_info[:4]] == firsts
    from seal.engines.local.engine import load_tasks

    assert [e["task_id"] for e in train.extra_info] == [t.task_id for t in load_tasks("data/bfcl_train.parquet", 6)]
    assert len(pd.read_parquet(v.data.val_files)) == 3
    env = v.ray_kwargs.ray_init.runtime_env.env_vars
    assert "seal.engines.verl.plugin" in env.VERL_USE_EXTERNAL_MODULES.split(",")
    assert env.PYTHONPATH.split(os.pathsep)[0] == str(REPO_ROOT)
    assert v.ray_kwargs.ray_init.address == "auto"  # two nodes: join the running Ray cluster
    assert list(v.seal.recipe.env.urls) == ["http://10.0.0.2:8082", "http://10.0.0.3:8082"]


def test_a_one_node_verl_run_starts_its_own_ray_cluster(tmp_path, monkeypatch):
    """Two verl runs side by side never join each other's Ray cluster (`address="local"`); RAY_ADDRESS wins."""
    from seal.engines.verl.launch import build_verl_config

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    recipe = load_config("exp/SEAL.yaml", ["env.urls=[http://127.0.0.1:1]"])
    assert build_verl_config(recipe, tmp_path / "a").ray_kwargs.ray_init.address == "local"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert build_verl_config(recipe, tmp_path / "b").ray_kwargs.ray_init.get("address") is None


def test_verl_processes_do_not_warn_about_engines_we_never_use():
    import subprocess
    import sys

    from seal.engines.verl.launch import plugin_env_vars

    code = "import warnings; warnings.simplefilter('default'); import verl.workers.engine"
    # Both imports at once (each is seconds of single-threaded import work).
    procs = [subprocess.Popen([sys.executable, "-c", c], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=e)
             for c, e in ((code, {**os.environ, "PYTHONWARNINGS": ""}),
                          ("import verl.workers.engine", {**os.environ, **plugin_env_vars("cpu")}))]
    outputs = [p.communicate(timeout=300) for p in procs]
    loud, quiet = (subprocess.CompletedProcess(p.args, p.returncode, *out)
                   for p, out in zip(procs, outputs, strict=True))
    assert quiet.returncode == 0, quiet.stderr
    assert "engine is not available" not in quiet.stderr
    if "engine is not available" not in loud.stderr:
        pytest.skip("this verl build has every optional engine: nothing to quiet")
