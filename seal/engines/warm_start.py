"""Warm start of the embedded default: a short supervised phase on the training tasks' ground-truth replies.

A random tiny model never solves a BFCL task, so every GRPO group is all zeros and nothing of SEAL moves.
`build_warm_start` (`model.warm_start.enable`) gives the local engine a starting policy that sometimes
succeeds:

1. Each training task is played against the env service, in training mode on the initial interface Ω_0, by
   a policy that replays the task's ground truth, which the service serves for training tasks
   (`GET /tasks/{task_id}/replay`, docs/protocol.md: one `<tool_call>` per step, a plain reply ends each
   turn). With `failing_twin` it is played a second time as its failing twin: the same replies, but the
   last turn that calls a tool is answered with the plain reply alone (its calls left out), which BFCL
   grades a failure. Each rollout holds the exact token sequence a training episode would have (prompt,
   replies, observations), here without the `max_response_length` cut: the reward grades the whole
   episode, so the replies past the cut must be learnt too.
2. Supervised steps (AdamW, every episode every step, no gradient through the long prompts but their last
   `GRAD_PROMPT_TOKENS`) raise the log-likelihood of the reply tokens only (observation tokens are
   context). Before every update it measures the probability that sampling at temperature 1 reproduces
   each learnt episode, p = exp(sum of its reply-token log-probs), and stops once the tasks' mean learnt
   mass (p of the ground truth, plus p of its twin) reaches `target_prob` (or after `max_steps`).
3. The model is saved to `model.warm_start.path` with `warm_start.json` (the inputs it was built from and
   the per-task p) and `warm_start_episodes.json` (the learnt episodes' token ids and reply positions: the
   verl engine's weight probe reads p(ground truth) from its vLLM server with them); a later run with the
   same inputs loads it instead of rebuilding.

Why the twin. Without it the policy is the ground truth, imperfectly memorised: it succeeds with p ≈ 0.3
and its failures are the ground truth's tokens sampled in the wrong places. GRPO's negative advantages on
such tokens move a one-layer model about as much as the positive ones and in no useful direction
(measured: p(ground truth) 0.30 -> 0.34 after 10 steps at actor lr 2e-4, and down at 1e-3). With the twin
the policy is sharp everywhere but at one decision, "call the tools of the last calling turn, or end the
turn", which it takes about half of the time each way (the two episodes share the context up to there).
Its failures are the coherent, BFCL-graded kind (an empty turn, a state mismatch), every advantage points
at that decision, and GRPO learns it within a few steps (measured on exp/tiny_cpu.yaml: p(ground truth)
0.39 / 0.46 -> 0.59 / 0.63 after one step at lr 1e-4, ~0.78 after five; docs/engines.md). p(ground truth) is
a lower bound of the success rate (other replies can pass too).

It memorises these tasks; it does not teach tool use in general (validation tasks stay at zero).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from seal import recipe as C
from seal.core.config import InterfaceConfig
from seal.core.controller import initial_training_interface
from seal.engines.data import Task
from seal.models import build_atomically
from seal.rollout.client import EnvClient
from seal.rollout.episode import EpisodeRequest, run_batch
from seal.rollout.types import Generation, Rollout, RolloutLimits, SamplingParams

log = logging.getLogger("seal.engines.warm_start")

INFO_FILE = "warm_start.json"
EPISODES_FILE = "warm_start_episodes.json"  # the learnt episodes as tokens (`probe_episodes`)
GRAD_PROMPT_TOKENS = 256  # the prompt's tail that the supervised phase backpropagates through (_Example)


def build_warm_start(cfg: C.Recipe, base_path: Path, tasks: Sequence[Task]) -> Path:
    """The warm-started model directory for `cfg` (built from `base_path` on `tasks`, or the cached one)."""
    ws = cfg.model.warm_start
    out = Path(ws.path)
    limits = C.rollout_limits(cfg)
    key = cache_key(base_path, tasks, cfg.model, cfg.seal.interface, limits, cfg.seed)
    if _built_for(out, key):
        log.info("warm start: using %s", out)
        return out
    if out.is_dir() and any(out.iterdir()) and not (out / INFO_FILE).is_file():  # replaced below: ours only
        raise ValueError(f"model.warm_start.path {out}: the directory holds files that are not a warm start; "
                         "give the warm start a directory of its own")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(base_path))
    model = AutoModelForCausalLM.from_pretrained(str(base_path), dtype=torch.float32)
    # Ω_0, as the first training step's episodes see it; no response cut: the whole episode is learnt
    rollouts = warm_start_episodes(tokenizer, tasks, initial_training_interface(cfg.seal), cfg.env,
                                   full_episode_limits(limits), cfg.rollout.concurrency, ws.failing_twin)
    log.info("warm start: supervised phase on %d episodes (%d ground truths, %d reply tokens)", len(rollouts),
             sum(r.accuracy == 1.0 for r in rollouts), sum(sum(r.response_mask) for r in rollouts))
    summary = supervised_phase(model, rollouts, steps=ws.max_steps, lr=ws.lr, target_prob=ws.target_prob,
                               seed=cfg.seed, schedule=ws.lr_schedule)
    summary |= {"key": key, "base": str(base_path), "tasks": list(dict.fromkeys(r.task_id for r in rollouts)),
                "seconds": round(time.perf_counter() - t0, 1)}

    def write(tmp: Path) -> None:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        (tmp / EPISODES_FILE).write_text(json.dumps([probe_episode(r) for r in rollouts]) + "\n")
        (tmp / INFO_FILE).write_text(json.dumps(summary, indent=1) + "\n")

    # Atomic (seal.models.build_atomically): a run or a test on another pytest worker may be reading the same
    # cached warm start, or building it at the same time.
    build_atomically(out, write, lambda d: _built_for(d, key))
    log.info("warm start: %d steps, mean learnt mass %.3f, p(ground truth) %s, %.0f s -> %s", summary["steps"],
             summary["mean_mass"], {t: round(p, 3) for t, p in summary["prob"].items()}, summary["seconds"], out)
    return out


def _built_for(path: Path, key: str) -> bool:
    """`path` holds a complete warm start for `key` (its info file is written last)."""
    info_file = path / INFO_FILE
    return (info_file.is_file() and (path / EPISODES_FILE).is_file()
            and json.loads(info_file.read_text()).get("key") == key)


def cache_key(base_path: Path, tasks: Sequence[Task], model: C.ModelConfig, interface: InterfaceConfig,
              limits: RolloutLimits, seed: int) -> str:
    """What the warm start depends on: the base model, the tasks, the knobs, the episode's limits and Ω_0's
    settings (`seal.interface`). The same key as the whole recipe's sections gave, so cached models stay valid."""
    base_cfg = (base_path / "config.json").read_text() if (base_path / "config.json").is_file() else str(base_path)
    model_dict = C.to_container(model)
    parts = {"base": base_cfg, "tiny": model_dict["tiny"] if model.build_tiny else None,
             "tasks": [t.task_id for t in tasks], "warm_start": model_dict["warm_start"],
             "limits": repr(limits), "interface": C.to_container(interface), "seed": seed}
    parts["warm_start"].pop("path", None)
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def probe_episode(rollout: Rollout) -> dict[str, Any]:
    """One learnt episode as plain tokens: `token_ids` (prompt + response) and `reply_positions`, the indices
    of its reply tokens in them; p(episode) = exp(sum of the log-probs of the tokens at those positions)."""
    start = len(rollout.prompt_ids)
    return {"task_id": rollout.task_id, "kind": "ground_truth" if rollout.accuracy == 1.0 else "twin",
            "token_ids": list(rollout.prompt_ids) + list(rollout.response_ids), "prompt_length": start,
            "reply_positions": [start + j for j, m in enumerate(rollout.response_mask) if m]}


def probe_episodes(model_dir: str | Path) -> list[dict[str, Any]] | None:
    """The learnt episodes saved with a warm-started model (`probe_episode`), or None for another model."""
    path = Path(model_dir) / EPISODES_FILE
    return json.loads(path.read_text()) if path.is_file() else None


# --------------------------------------------------------------------------- the ground-truth episodes
class GroundTruthReplay:
    """`GenerateFn` replaying fixed reply texts; the episode is `params.seed` (its request index).

    The reply index is the number of assistant turns already in the prompt, so an episode restarted by the
    driver replays from the start again.
    """

    def __init__(self, tokenizer: Any, scripts: Sequence[Sequence[str]]):
        self.eos = int(tokenizer.eos_token_id)
        self.marker = tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self.scripts = [[tokenizer.encode(t, add_special_tokens=False) + [self.eos] for t in texts]
                        for texts in scripts]

    async def __call__(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        m = self.marker
        calls = sum(prompt_ids[i:i + len(m)] == m for i in range(len(prompt_ids) - len(m) + 1)) - 1
        script = self.scripts[int(params.seed)]
        ids = script[min(calls, len(script) - 1)][: int(params.max_tokens)]
        return Generation(list(ids), "stop" if ids[-1] == self.eos else "length")


def full_episode_limits(limits: RolloutLimits) -> RolloutLimits:
    """The recipe's limits without the response cut: a success needs every reply, also those past the cut."""
    return replace(limits, max_response_length=limits.max_model_len)  # the context limit still ends it


def warm_start_episodes(tokenizer: Any, tasks: Sequence[Task], omega: dict[str, Any] | None, env: C.EnvConfig,
                        limits: RolloutLimits, concurrency: int, failing_twin: bool) -> list[Rollout]:
    """The episodes the warm start learns, as training plays them (mode train, Ω_0 = `omega`, `limits`): each
    task's ground truth, if it passes, and with `failing_twin` its twin, if that fails. Ground truths have
    accuracy 1, twins 0."""

    async def play() -> tuple[list[tuple[str, str, list[str]]], list[Rollout]]:
        async with EnvClient(list(env.urls), timeout=env.timeout_s, max_retries=env.max_retries) as c:
            plays: list[tuple[str, str, list[str]]] = []  # (task id, "ground truth" | "twin", replies)
            for t in tasks:  # the service serves the replays (training tasks only)
                replay = await c.replay(t.task_id)
                plays.append((t.task_id, "ground truth", replay.ground_truth))
                if failing_twin and replay.failing_twin is not None:
                    plays.append((t.task_id, "twin", replay.failing_twin))
            requests = [EpisodeRequest(task_id, "train", omega, SamplingParams(temperature=1.0, seed=i))
                        for i, (task_id, _, _) in enumerate(plays)]
            return plays, await run_batch(c, GroundTruthReplay(tokenizer, [p[2] for p in plays]), tokenizer,
                                          requests, limits=limits, concurrency=concurrency,
                                          max_restarts=env.max_restarts)

    plays, rollouts = asyncio.run(play())
    passing = {r.task_id for r, (_, kind, _) in zip(rollouts, plays, strict=True)
               if kind == "ground truth" and not r.excluded and r.accuracy == 1.0 and sum(r.response_mask)}
    kept = []
    for r, (task_id, kind, _) in zip(rollouts, plays, strict=True):
        wanted = 1.0 if kind == "ground truth" else 0.0
        if task_id in passing and not r.excluded and r.accuracy == wanted and sum(r.response_mask):
            kept.append(r)
        elif kind == "ground truth" or task_id in passing:
            log.warning("warm start: the %s of %s does not %s here (accuracy %s, excluded %s); left out", kind,
                        task_id, "pass" if wanted else "fail", r.accuracy, r.exclude_reason)
    if not kept:
        raise RuntimeError("warm start: no training task's ground truth passes; nothing to learn from")
    return kept


# --------------------------------------------------------------------------- the supervised phase
class _Example:
    """One ground-truth episode for the supervised phase: the prompt's KV cache and the response, whose reply
    tokens are the targets.

    Why most of the prompt runs without grad: BFCL prompts are ~3-6k tokens of tool documentation, the replies
    a few hundred tokens; backpropagating through the prompt at every step would cost several times more. Its
    keys and values are recomputed with the current weights every step (exact forward), only the gradient does
    not flow back through them. Its last `GRAD_PROMPT_TOKENS` (the user's request and the assistant header)
    run with grad: without them the first reply token's hidden state is a constant of the training step, and
    whether a task starts with a call or a plain reply could only be learnt by the LM head (measured: that
    first token stayed at ~3-4 nats while the rest went under 0.5).
    """

    def __init__(self, rollout: Rollout, grad_prompt_tokens: int = GRAD_PROMPT_TOKENS):
        self.rollout = rollout
        cut = max(1, len(rollout.prompt_ids) - grad_prompt_tokens)
        self.prompt = torch.as_tensor([rollout.prompt_ids[:cut]], dtype=torch.long)
        # the prompt's tail (the user's request, "<|im_start|>assistant") runs with grad, in front of the response
        self.tail = len(rollout.prompt_ids) - cut
        self.response = torch.as_tensor([rollout.prompt_ids[cut:] + list(rollout.response_ids)], dtype=torch.long)
        # positions j of self.response whose token is a reply token; its logits come from position j - 1
        self.targets = torch.as_tensor([self.tail + j for j, m in enumerate(rollout.response_mask) if m],
                                       dtype=torch.long)
        self.prompt_key = tuple(rollout.prompt_ids[:cut])  # a ground truth and its twin share the prompt
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.last_hidden: torch.Tensor | None = None

    def refresh(self, model: Any, done: dict[tuple[int, ...], _Example] | None = None) -> None:
        """The prompt's keys and values under the current weights (taken from `done`, an example of this
        step with the same prompt, when there is one)."""
        from transformers import DynamicCache

        if done is not None and self.prompt_key in done:
            twin = done[self.prompt_key]
            self.kv, self.last_hidden = twin.kv, twin.last_hidden  # read-only: each forward copies them
            return
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            out = model.get_decoder()(input_ids=self.prompt, past_key_values=cache, use_cache=True)
        self.kv = [(layer.keys, layer.values) for layer in cache.layers]
        self.last_hidden = out.last_hidden_state[0, -1:]
        if done is not None:
            done[self.prompt_key] = self

    def reply_logprobs(self, model: Any) -> torch.Tensor:
        """Log-probs of the reply tokens, with grad (the LM head only on reply positions: with a 151,936-token
        vocabulary it costs more than the rest of a tiny model)."""
        from transformers import DynamicCache

        cache = DynamicCache(ddp_cache_data=self.kv, config=model.config)
        hidden = model.get_decoder()(input_ids=self.response, past_key_values=cache, use_cache=True)
        hidden = torch.cat([self.last_hidden, hidden.last_hidden_state[0]])  # hidden[j] predicts response[j]
        logits = model.get_output_embeddings()(hidden[self.targets]).float()
        return torch.log_softmax(logits, dim=-1).gather(-1, self.response[0, self.targets].unsqueeze(-1)).squeeze(-1)


def episode_probs(model: Any, rollouts: Sequence[Rollout]) -> list[float]:
    """p = exp(sum of reply-token log-probs) of each rollout under `model`: the probability that sampling at
    temperature 1 reproduces its replies, given its observations."""
    examples, done = [_Example(r) for r in rollouts], {}
    with torch.no_grad():
        out = []
        for e in examples:
            e.refresh(model, done)
            out.append(math.exp(float(e.reply_logprobs(model).sum())))
    return out


def probe_episode_probs(model: Any, episodes: Sequence[dict[str, Any]]) -> list[float]:
    """`episode_probs` of saved learnt episodes (`probe_episodes`) under `model`: p(ground truth) and p(twin) of a
    model trained from the warm start, measured as the warm start measures them."""
    from types import SimpleNamespace

    rollouts = []
    for e in episodes:
        cut, ids = int(e["prompt_length"]), list(e["token_ids"])
        replies = set(e["reply_positions"])
        rollouts.append(SimpleNamespace(prompt_ids=ids[:cut], response_ids=ids[cut:],
                                        response_mask=[int(cut + j in replies) for j in range(len(ids) - cut)]))
    return episode_probs(model, rollouts)  # reads only the three token fields


def supervised_phase(model: Any, rollouts: Sequence[Rollout], steps: int, lr: float, target_prob: float,
                     seed: int = 0, schedule: str = "cosine") -> dict[str, Any]:
    """AdamW (lr cosine-decayed over `steps`, or constant) on the reply tokens' mean negative log-likelihood
    until the tasks' mean learnt mass >= target_prob.

    p per episode = exp(sum of its reply-token log-probs), measured on the model before each update; a
    task's learnt mass is the sum of p over its episodes (the ground truth, and its twin when there is one).
    Returns the updates taken, the loss, the mean mass and, per task, p(ground truth) and p(twin) of the
    model as returned.
    """
    torch.manual_seed(seed)
    examples = [_Example(r) for r in rollouts]
    task_ids = list(dict.fromkeys(r.task_id for r in rollouts))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)

    def factor(k: int) -> float:  # cosine: large steps first, small ones to settle on the exact tokens
        return 0.5 * (1.0 + math.cos(math.pi * min(k, steps) / steps)) if schedule == "cosine" else 1.0

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    total = sum(len(e.targets) for e in examples)
    model.train()
    for step in range(steps + 1):
        opt.zero_grad(set_to_none=True)
        probs, loss_value, done = [], 0.0, {}
        for e in examples:
            e.refresh(model, done)
            logp = e.reply_logprobs(model)
            probs.append(math.exp(float(logp.sum().detach())))
            loss = -logp.sum() / total
            loss_value += float(loss.detach())
            if step < steps:
                loss.backward()
        mass = {t: sum(p for r, p in zip(rollouts, probs, strict=True) if r.task_id == t) for t in task_ids}
        mean_mass = sum(mass.values()) / len(mass)
        if step % 10 == 0 or mean_mass >= target_prob or step == steps:
            log.info("warm start step %d: loss %.3f, mean learnt mass %.3f", step, loss_value, mean_mass)
        if mean_mass >= target_prob or step == steps:
            break
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
    model.eval()

    def p_of(accuracy: float) -> dict[str, float]:
        return {r.task_id: p for r, p in zip(rollouts, probs, strict=True) if r.accuracy == accuracy}

    return {"steps": step, "loss": loss_value, "mean_mass": mean_mass, "prob": p_of(1.0), "twin_prob": p_of(0.0)}
