"""Does a verl run's greedy validation episode give the same tokens as `seal-eval --policy vllm:` on that step's
checkpoint? The check the verl learning test runs inside its launch (docs/verl_engine.md, "One sampler").

    result = same_tokens_as_vllm_policy(run_dir, env_url)            # the last validated step, its first episode
    assert result["same"], result["first_difference"]

The run's side is `<run>/validation/step_<N>.jsonl` (the verl engine keeps every validation episode's token ids
there: `seal.engines.verl.trainer.write_validation_tokens`). The other side plays the same task once with the
`vllm:` policy (`seal.eval.policies.parse_policy`: greedy, the evaluation's token-level episode loop) on the step's
Hugging Face export (`checkpoints/step_<N>`, `seal.eval.run_checkpoints.hf_model_dir`), with the run's episode limits
(`config.yaml`) and the run's vLLM settings (`verl_config.yaml`: context window, dtype, memory share), against the
env service at `env_url` (the run's, or one started with the same settings). Both are evaluation episodes on the
raw interface. The step must have a checkpoint (validate on a step that saves: the last step always does).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from seal.run_dir import STEP_PREFIX, VALIDATION_DIR, RunDir


def validation_steps(run_dir: str | Path) -> list[int]:
    """The steps of `<run>/validation/step_<N>.jsonl`, ascending."""
    folder = Path(run_dir) / VALIDATION_DIR
    return sorted(int(p.stem.removeprefix(STEP_PREFIX)) for p in folder.glob(f"{STEP_PREFIX}*.jsonl"))


def run_validation_episode(run_dir: str | Path, step: int | None = None, task_id: str | None = None) -> dict:
    """One validation episode of the run with its token ids: of `step` (default: the last validated step), for
    `task_id` (default: the first episode that ran). Raises when the run kept none (a run from before the
    verl engine kept validation tokens, or a step without validation)."""
    steps = validation_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"{Path(run_dir) / VALIDATION_DIR}: no validation records")
    step = steps[-1] if step is None else int(step)
    path = RunDir(run_dir).validation_file(step)
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    for line in lines:
        if line.get("response_ids") is not None and (task_id is None or line["task_id"] == task_id):
            return dict(line, step=step)
    raise LookupError(f"{path}: no validation episode with token ids" + (f" for {task_id}" if task_id else ""))


def run_vllm_settings(run_dir: str | Path) -> dict[str, Any]:
    """The run's vLLM rollout settings, from `<run>/verl_config.yaml` (what verl's server ran with)."""
    from omegaconf import OmegaConf

    rollout = OmegaConf.load(RunDir(run_dir).verl_config_file).actor_rollout_ref.rollout
    return {"max_model_len": int(rollout.max_model_len), "dtype": str(rollout.dtype),
            "gpu_memory_utilization": float(rollout.gpu_memory_utilization),
            "tensor_parallel_size": int(rollout.tensor_model_parallel_size)}


async def vllm_policy_episode(model_dir: str | Path, task_id: str, env_url: str, limits: Any,
                              settings: dict[str, Any], token_env: str | None = None) -> Any:
    """One greedy evaluation episode of `task_id` by `seal-eval --policy vllm:<model_dir>` (its policy and episode
    loop), with `limits` (`RolloutLimits`) and the vLLM `settings` (`run_vllm_settings`); the `Rollout`."""
    from seal.eval.policies import PolicyOptions, parse_policy
    from seal.rollout.client import EnvClient, export_token
    from seal.rollout.episode import play_episode

    if token_env:
        export_token(token_env)
    options = PolicyOptions(max_tokens_per_call=limits.max_tokens_per_call, **settings)
    policy = parse_policy(f"vllm:{model_dir}", options)
    client = EnvClient([env_url])
    try:
        return await play_episode(client, policy.episode_turns(task_id, limits), task_id, "eval",
                                  max_model_calls=limits.max_model_calls)
    finally:
        await client.aclose()
        await policy.aclose()


def compare_tokens(run: dict, rollout: Any) -> dict[str, Any]:
    """The two episodes' token ids side by side: `same`, and the first differing position of the response
    (`first_difference`, None when equal) or a prompt mismatch."""
    ours = {"prompt_ids": list(run["prompt_ids"]), "response_ids": list(run["response_ids"]),
            "response_mask": list(run["response_mask"])}
    theirs = {"prompt_ids": list(rollout.prompt_ids), "response_ids": list(rollout.response_ids),
              "response_mask": list(rollout.response_mask)}
    first = None
    if ours["prompt_ids"] != theirs["prompt_ids"]:
        first = "prompt"
    else:
        a, b = ours["response_ids"], theirs["response_ids"]
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        if first is None and ours["response_mask"] != theirs["response_mask"]:
            first = "response_mask"
    return {"task_id": run["task_id"], "step": run.get("step"), "same": first is None, "first_difference": first,
            "run": ours, "vllm_policy": theirs}


def same_tokens_as_vllm_policy(run_dir: str | Path, env_url: str, step: int | None = None,
                               task_id: str | None = None) -> dict[str, Any]:
    """The run's validation episode (`run_validation_episode`) against the `vllm:` policy's episode of the same
    task on the step's checkpoint export (`vllm_policy_episode`); `compare_tokens`'s result. Needs vLLM."""
    from seal.eval.run_checkpoints import hf_model_dir
    from seal.recipe import load_saved_config, rollout_limits

    run = RunDir(run_dir)
    episode = run_validation_episode(run_dir, step, task_id)
    cfg = load_saved_config(run.config_file)
    model = hf_model_dir(run.checkpoints.step_dir(int(episode["step"])))
    rollout = asyncio.run(vllm_policy_episode(model, episode["task_id"], env_url, rollout_limits(cfg),
                                              run_vllm_settings(run_dir), token_env=cfg.env.token_env))
    return compare_tokens(episode, rollout)
