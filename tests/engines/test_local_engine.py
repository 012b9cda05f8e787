"""The local engine: data order, seeded HF generation, the PPO update, and exact resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from env_service.vocab import CATEGORIES
from seal import recipe as C
from seal.engines.batching import (
    SKIPPED_UPDATE_KEYS,
    compute_grpo_advantages,
    no_learning_signal,
    rollouts_to_dataproto,
    skipped_update_metrics,
)
from seal.engines.local import actor as A
from seal.engines.local import engine as E
from seal.engines.local import rollouts as R
from seal.models.qwen25 import EOS_TOKEN_ID, PAD_TOKEN_ID
from seal.rollout.types import Generation, Rollout, SamplingParams

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "data" / "bfcl_train.parquet"
# Two short training tasks (2 turns each) with different first questions, so a scripted policy can
# tell them apart from the prompt.
TASKS = ["multi_turn_base_100", "multi_turn_long_context_144"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random Qwen2 + the offline Qwen2.5 tokenizer on disk."""
    from seal.models.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "model")


def test_load_tasks_round_robin_and_epoch_order():
    tasks = E.load_tasks(TRAIN, limit=6)
    assert [t.category for t in tasks[:4]] == list(CATEGORIES) and tasks[4].category == CATEGORIES[0]
    assert len(E.load_tasks(TRAIN)) == 400
    first, again = R.epoch_order(400, 0, 1, True), R.epoch_order(400, 0, 1, True)
    second = R.epoch_order(400, 1, 1, True)
    assert first == again and first != second and sorted(first) == list(range(400))
    assert R.epoch_order(5, 3, 1, False) == [0, 1, 2, 3, 4]
    cfg = C.load_config(REPO / "exp" / "SEAL.yaml")
    all_tasks = E.load_tasks(TRAIN)
    epoch, index, batch = R.step_tasks(all_tasks, 13, cfg.data, cfg.seed)  # 12 steps per epoch: step 13 opens epoch 1
    assert (epoch, index, len(batch)) == (1, 0, 32)
    seen = {t.task_id for s in range(1, 13) for t in R.step_tasks(all_tasks, s, cfg.data, cfg.seed)[2]}
    assert len(seen) == 384  # one epoch = 12 disjoint batches (drop_last: 16 tasks wait)
    with pytest.raises(FileNotFoundError):
        E.load_tasks(REPO / "data" / "nope.parquet")


def test_failure_profile_sampler_draws_from_the_controllers_statistics_and_resumes_exactly():
    from seal.core.adaptive import RepairStats
    from seal.core.record import EpisodeRecord

    cfg = C.load_config(REPO / "exp" / "SEAL_curriculum.yaml")
    all_tasks = E.load_tasks(TRAIN)
    stats = RepairStats()
    for step in range(1, 4):
        batch = R.step_tasks(all_tasks, step, cfg.data, cfg.seed, stats)[2]
        assert len({t.task_id for t in batch}) == cfg.data.train_batch_size
        # the first task of each batch always succeeds, the others fail with a state mismatch
        stats.observe([EpisodeRecord(t.task_id, failure_tags=("pass",) if i == 0 else ("state_mismatch",),
                                     reward=float(i == 0), accuracy=float(i == 0))
                       for i, t in enumerate(batch) for _ in range(2)], step)
    restored = RepairStats()
    restored.load_state_dict(json.loads(json.dumps(stats.state_dict())))
    assert R.step_tasks(all_tasks, 4, cfg.data, cfg.seed, restored) == R.step_tasks(all_tasks, 4, cfg.data, cfg.seed,
                                                                                    stats)
    assert R.step_tasks(all_tasks, 4, cfg.data, cfg.seed, stats) != R.step_tasks(all_tasks, 5, cfg.data, cfg.seed,
                                                                                  stats)
    with pytest.raises(ValueError, match="repair statistics"):
        R.step_tasks(all_tasks, 1, cfg.data, cfg.seed)


def test_hf_generator_is_seeded_and_keeps_tokens(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.rollout.hf_generation import HFGenerator

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny).eval()
    gen = HFGenerator(model, tok, torch.device("cpu"))
    assert gen.stop_ids == sorted({EOS_TOKEN_ID, PAD_TOKEN_ID})
    prompt = tok.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    sample = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
    a, b = gen.generate_sync(prompt, sample), gen.generate_sync(prompt, sample)
    c = gen.generate_sync(prompt, SamplingParams(temperature=1.0, max_tokens=12, seed=6))
    assert a == b and a.token_ids != c.token_ids
    assert 0 < len(a.token_ids) <= 12
    assert a.finish_reason == ("stop" if a.token_ids[-1] in gen.stop_ids else "length")
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    g1, g2 = gen.generate_sync(prompt, greedy), gen.generate_sync(prompt, greedy)
    with torch.no_grad():  # greedy = argmax of the model's next-token logits
        first = model(torch.tensor([prompt])).logits[0, -1].argmax().item()
    assert g1 == g2 and g1.token_ids[0] == first


def _rollout(tok, reward: float, text: str) -> Rollout:
    prompt = tok.encode("<|im_start|>user\nadd two numbers<|im_end|>\n<|im_start|>assistant\n")
    response = tok.encode(text) + [EOS_TOKEN_ID]
    return Rollout(task_id="multi_turn_base_1", mode="train", prompt_ids=prompt, response_ids=response,
                   response_mask=[1] * len(response), reward=reward, accuracy=reward, category="multi_turn_base",
                   failure_tags=["pass"] if reward else ["state_mismatch"])


def _ppo_update(model, ref, opt, data, cfg) -> dict:
    """The engine's update call: the actor's sub-config, the sampling temperature, the batch size, on CPU."""
    return A.ppo_update(model, ref, opt, data, cfg.actor, temperature=cfg.rollout.temperature or 1.0,
                        train_batch_size=cfg.data.train_batch_size, device=torch.device("cpu"))


def _update_once(tiny, rewards: tuple[float, float]):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    ref = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval().requires_grad_(False)
    cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", ["actor.lr=0.01", "actor.weight_decay=0",
                                                           "data.train_batch_size=4", "actor.ppo_mini_batch_size=4"])
    first, second = _rollout(tok, rewards[0], "The sum is 5."), _rollout(tok, rewards[1], "I refuse.")
    data = rollouts_to_dataproto([first, second, first, second], PAD_TOKEN_ID)
    compute_grpo_advantages(data)
    before = A.batch_logprobs(model, data, 1, torch.device("cpu"), 1.0, None).sum(-1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.0)
    metrics = _ppo_update(model, ref, opt, data, cfg)
    after = A.batch_logprobs(model, data, 1, torch.device("cpu"), 1.0, None).sum(-1)
    adv, mask = data.batch["advantages"], data.batch["response_mask"]
    metrics["expected_pg_loss"] = float(-(adv * mask).sum() / mask.sum())  # ratio 1: token-mean of -A
    return (after[0] - after[1]) - (before[0] - before[1]), metrics


def test_ppo_update_moves_probability_towards_the_better_response(tiny):
    # The sequence with the positive advantage gains log-probability relative to the other one,
    # whichever of the two it is.
    gain, metrics = _update_once(tiny, (1.0, 0.0))
    flipped, _ = _update_once(tiny, (0.0, 1.0))
    assert gain > 0.5 and flipped < -0.5
    assert metrics["actor/grad_norm"] > 0 and metrics["actor/num_mini_batches"] == 1
    assert metrics["actor/pg_loss"] == pytest.approx(metrics["expected_pg_loss"], abs=1e-5)
    assert metrics["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)  # the policy equals the reference
    assert {"actor/pg_clipfrac", "actor/ppo_kl", "actor/lr", "actor/kl_coef"} <= set(metrics)


def test_response_logprobs_on_masked_tokens_equal_the_full_logits(tiny, monkeypatch):
    # The LM head runs on the sampled tokens only (the model's own head for unlisted families): same
    # log-probs and entropies as log-softmax over the model's full logits, zero on observation tokens.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 5000, (2, 40), generator=g)
    attn, pos = torch.ones_like(ids), torch.arange(40).expand(2, 40)
    mask = torch.zeros(2, 12, dtype=torch.long)
    mask[0, :5], mask[1, 3:9], mask[1, 11] = 1, 1, 1  # a reply, an observation, a reply
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, -13:-1].float() / 0.7
        full = torch.log_softmax(logits, -1).gather(-1, ids[:, -12:].unsqueeze(-1)).squeeze(-1)
        ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
        for plain in (True, False):
            if not plain:
                monkeypatch.setattr(A, "_PLAIN_LM_HEAD", frozenset())
            logp, h = A.response_logprobs(model, ids, attn, pos, mask, 0.7, with_entropy=True)
            torch.testing.assert_close(logp, full * mask, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(h, ent * mask, rtol=1e-4, atol=1e-4)
            assert (logp[mask == 0] == 0).all() and (logp[mask == 1] < 0).all()


# --------------------------------------------------------------------------- exact resume
class ScriptedPolicy:
    """Deterministic `generate`: replays the task's ground truth when the episode seed is even (the
    episode succeeds), answers in plain text when it is odd (it fails). Consecutive requests get
    consecutive seeds, so every GRPO group of 2 holds one success and one failure."""

    def __init__(self, tok):
        from env_service.tasks import ground_truth_replies

        frame = pd.read_parquet(TRAIN)
        ids = frame.extra_info.map(lambda e: e["task_id"])
        self.tok = tok
        self.questions = {t: frame[ids == t].iloc[0].prompt[0]["content"] for t in TASKS}
        assert len(set(self.questions.values())) == len(TASKS)
        self.scripts = {}
        for task in TASKS:
            self.scripts[task] = [tok.encode(t, add_special_tokens=False) + [EOS_TOKEN_ID]
                                  for t in ground_truth_replies(task)]
        self.fail = tok.encode("Sorry, I cannot do that.", add_special_tokens=False) + [EOS_TOKEN_ID]

    async def __call__(self, prompt_ids, params):
        text = self.tok.decode(prompt_ids)
        task = next(t for t, q in self.questions.items() if q in text)
        if params.seed % 2:
            return Generation(list(self.fail), "stop")
        k = text.count("<|im_start|>assistant") - 1  # model calls so far in this episode
        script = self.scripts[task]
        return Generation(list(script[min(k, len(script) - 1)]), "stop")


def _resume_cfg(tmp_path: Path, tiny: Path, url: str, extra: tuple[str, ...] = ()):
    rows = [{"data_source": t.rsplit("_", 1)[0], "extra_info": {"task_id": t, "category": t.rsplit("_", 1)[0]}}
            for t in TASKS]
    pd.DataFrame(rows).to_parquet(tmp_path / "tasks.parquet")
    return C.load_config(REPO / "exp" / "tiny_cpu.yaml", [
        f"model.path={tiny}", "model.build_tiny=false", "model.warm_start.enable=false", f"env.urls=[{url}]",
        f"run_root={tmp_path}", "data.train_task_ids=null", "data.val_task_ids=null", "rollout.n=2",
        f"data.train_files={tmp_path / 'tasks.parquet'}", f"data.val_files={tmp_path / 'tasks.parquet'}",
        "data.max_train_tasks=null", "data.max_val_tasks=null", "data.train_batch_size=2",
        "data.max_response_length=512", "actor.ppo_mini_batch_size=1", "actor.use_kl_loss=false",
        "actor.lr=1e-3", "trainer.total_training_steps=2", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=1",
        # thresholds low enough for this small batch, so cues and error feedback move
        "seal.interface.min_tag_count=1", "seal.interface.error_min_count=1", *extra,
    ])


def _state(run: Path, step: int) -> dict:
    return json.loads((run / "checkpoints" / f"step_{step}" / "seal_state.json").read_text())


# beyond the paper: the curriculum sampler, adaptive rho and the per-task weights, all resumed from seal_state.json
BEYOND = ("data.sampler=failure_profile", "seal.adaptive.rho=adaptive", "seal.adaptive.task_weights=slime",
          "seal.adaptive.task_min_attempts=1")


@pytest.mark.slow  # trains and resumes the tiny model
@pytest.mark.parametrize("extra", [(), BEYOND], ids=["seal", "adaptive_curriculum_task_weights"])
def test_resume_continues_exactly(tmp_path, tiny, service_url, extra):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    cfg = _resume_cfg(tmp_path, tiny, service_url, extra)
    factory = lambda model, tokenizer, device: ScriptedPolicy(tok)  # noqa: E731
    full = C.run_dir(cfg)
    E.train(cfg, full, generate_factory=factory)
    rows = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["train/accuracy_mean"] == 0.5 and rows[0]["apatch/scaled_count"] == 4
    assert rows[0]["actor/grad_norm"] > 0  # mixed groups: non-zero advantages reach the model
    assert rows[0]["actor/update_skipped"] == 0.0
    sample = [json.loads(line) for line in (full / "transcripts" / "step_1.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in sample) == sorted(TASKS)  # one transcript per task of the step
    assert all(r["prompt"].endswith("<|im_start|>assistant\n") and r["response"] for r in sample)

    # Crash after step 1's checkpoint: the resumed run must reproduce step 2 exactly.
    resumed = tmp_path / "resumed"
    shutil.copytree(full, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_2")
    (resumed / "checkpoints" / "latest.json").write_text(json.dumps({"step": 1, "path": "checkpoints/step_1"}))
    E.train(cfg, resumed, generate_factory=factory)

    a, b = _state(full, 2), _state(resumed, 2)
    assert a["capability"]["observe_count"] == 8 and a["last_step"] == 2
    assert b["capability"] == a["capability"]  # statistics, windows, dynamic weights, per-task records
    assert b["capability"]["dynamic_weights"] == a["capability"]["dynamic_weights"]
    assert b["omega"] == a["omega"] and b["run_id"] == a["run_id"]
    assert b["repair"] == a["repair"]
    assert a["capability"]["dynamic_weights"] != _state(full, 1)["capability"]["dynamic_weights"]
    from safetensors.torch import load_file

    wa = load_file(full / "checkpoints" / "step_2" / "model.safetensors")
    wb = load_file(resumed / "checkpoints" / "step_2" / "model.safetensors")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    rows_b = [json.loads(line) for line in (resumed / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows_b] == [1, 2]
    same = {k: v for k, v in rows[1].items() if not k.startswith("timing/")}
    assert {k: v for k, v in rows_b[1].items() if not k.startswith("timing/")} == same


def _counting_layer_forwards(model) -> list[int]:
    """Count decoder-layer computations: a pre-hook on each layer's first norm also sees checkpointing's
    recompute (which stops early, before the layer's own forward hook would fire)."""
    calls = [0]

    def hook(*_):
        calls[0] += 1

    for layer in model.model.layers:
        layer.input_layernorm.register_forward_pre_hook(hook)
    return calls


def test_a_step_without_any_advantage_skips_the_update(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2"])
    data = rollouts_to_dataproto([_rollout(tok, 0.0, "The sum is 5."), _rollout(tok, 0.0, "I refuse.")] * 2,
                                 PAD_TOKEN_ID)
    compute_grpo_advantages(data)  # every reward 0: every advantage 0
    calls = _counting_layer_forwards(model)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    metrics = _ppo_update(model, model, opt, data, cfg)
    assert calls[0] == 0 and not opt.state  # no forward, no optimizer step
    # the one skip record of both engines (the verl adapter's side: tests/engines/test_verl_trainer.py)
    assert metrics == skipped_update_metrics() and tuple(metrics) == SKIPPED_UPDATE_KEYS
    assert metrics["actor/update_skipped"] == 1.0 and metrics["actor/grad_norm"] == 0.0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    # an entropy bonus has a gradient of its own: that step is not skipped
    entropy = C.load_config(REPO / "exp" / "tiny_cpu.yaml", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2",
                                                             "actor.entropy_coeff=0.01"])
    adv, mask = data.batch["advantages"], data.batch["response_mask"]
    assert not no_learning_signal(adv, mask, entropy.actor.entropy_coeff)
    assert no_learning_signal(adv, mask, cfg.actor.entropy_coeff)
    # one nonzero advantage on a sampled token is a learning signal; on an unsampled one it is not
    adv = adv.clone()
    adv[0, int(mask[0].nonzero()[0])] = 0.5
    assert not no_learning_signal(adv, mask, 0.0)
    assert bool((mask == 0).any())  # observation tokens / padding
    adv = torch.where(mask == 0, 0.5, 0.0)
    assert no_learning_signal(adv, mask, 0.0)


def test_gradient_checkpointing_recomputes_layers_with_the_same_update(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny)
    cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", ["data.train_batch_size=2", "actor.ppo_mini_batch_size=2",
                                                         "actor.use_kl_loss=false"])
    data = rollouts_to_dataproto([_rollout(tok, 1.0, "The sum is 5."), _rollout(tok, 0.0, "I refuse.")] * 2,
                                 PAD_TOKEN_ID)
    compute_grpo_advantages(data)
    results = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
        if checkpointing:
            A.enable_gradient_checkpointing(model)
        calls = _counting_layer_forwards(model)
        metrics = _ppo_update(model, None, torch.optim.AdamW(model.parameters(), lr=0.01), data, cfg)
        results[checkpointing] = (calls[0], metrics, model.state_dict())
    (plain_calls, plain, plain_w), (ckpt_calls, ckpt, ckpt_w) = results[False], results[True]
    rows, layers = 4, len(AutoModelForCausalLM.from_pretrained(tiny).model.layers)
    # old log-probs (one forward per row) + the update's forward per row, and with checkpointing its recompute
    assert plain_calls == 2 * rows * layers and ckpt_calls == 3 * rows * layers
    assert ckpt["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-5)
    assert all(torch.allclose(ckpt_w[k], plain_w[k], atol=1e-6) for k in plain_w)


def test_transcript_sample_is_bounded_and_has_the_one_schema(tmp_path, tiny):
    # The local engine's transcript lines are `seal.run_dir.transcript_entry`s, field for field what the verl
    # engine writes (tests/engines/test_verl_trainer.py checks its side): the token sequences decoded.
    from transformers import AutoTokenizer

    from seal.run_dir import TRANSCRIPT_FIELDS, TRANSCRIPT_TEXT_CHARS, TRANSCRIPTS_PER_STEP, write_transcripts

    tok = AutoTokenizer.from_pretrained(tiny)
    prompt = tok.encode("<|im_start|>system\n" + "x" * TRANSCRIPT_TEXT_CHARS + "<|im_end|>\n<|im_start|>assistant\n")
    response = tok.encode("hi") + [EOS_TOKEN_ID]
    rollouts = [Rollout(task_id=f"multi_turn_base_{i // 2}", mode="train", reward=float(i % 2), prompt_ids=prompt,
                        response_ids=response, response_mask=[1] * len(response), category="multi_turn_base",
                        failure_tags=["state_mismatch"], excluded=i == 2, exclude_reason="infrastructure" if i == 2
                        else None)
                for i in range(2 * (TRANSCRIPTS_PER_STEP + 3))]
    path = tmp_path / "transcripts" / "step_3.jsonl"
    write_transcripts(path, R.transcript_entries(rollouts, tok))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert all(tuple(line) == TRANSCRIPT_FIELDS for line in lines)
    assert [r["task_id"] for r in lines] == [f"multi_turn_base_{i}" for i in range(TRANSCRIPTS_PER_STEP)]
    assert [r["reward"] for r in lines] == [0.0] * TRANSCRIPTS_PER_STEP  # the first rollout of each task
    assert [r["excluded"] for r in lines[:2]] == [False, True] and lines[1]["exclude_reason"] == "infrastructure"
    assert lines[0]["failure_tags"] == ["state_mismatch"] and lines[0]["category"] == "multi_turn_base"
    full_prompt = tok.decode(prompt)
    cut = len(full_prompt) - TRANSCRIPT_TEXT_CHARS
    assert cut > 0 and lines[0]["prompt"] == f"[... {cut} characters cut] {full_prompt[-TRANSCRIPT_TEXT_CHARS:]}"
    assert lines[0]["prompt"].endswith("<|im_start|>assistant\n")  # the chat template, as the model read it
    assert lines[0]["response"] == tok.decode(response) == "hi<|im_end|>"
