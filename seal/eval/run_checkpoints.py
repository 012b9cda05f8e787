"""``seal-eval --run <run>``: a run's last and best checkpoints, each evaluated held-in into
``<run>/eval/<last|best>[_<split or task subset>]`` (``docs/run_directory.md``)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from env_service.rules import DEFAULT_RULES
from seal.eval.held_in import EvalRequest, evaluate, task_set_note
from seal.eval.notes import print_summary
from seal.eval.policies import PolicyError
from seal.eval.results import claim_output_dir, default_eval_name
from seal.run_dir import RunDir, hf_weights_dir, select_checkpoints


def hf_model_dir(checkpoint: Path) -> Path:
    """The Hugging Face model folder of a checkpoint (`seal.run_dir.hf_weights_dir`), or a clear error."""
    found = hf_weights_dir(checkpoint)
    if found is not None:
        return found
    raise PolicyError(
        f"{checkpoint}: no Hugging Face weights (config.json + *.safetensors). For a verl checkpoint merge the "
        f"shards first: python -m verl.model_merger merge --backend fsdp --local_dir {checkpoint}/actor "
        f"--target_dir {checkpoint}/huggingface"
    )


def run_eval_name(checkpoint: str, base: EvalRequest) -> str:
    """`<run>/eval/<name>` of one checkpoint: `last` / `best` for the paper's evaluation (the eval split under the
    default rules, what `seal-tables` reads from a run directory), else subset-aware like `--policy`'s default
    names (`last_multi_turn_base_50`, `best_2tasks-<hash>`, `last_eval_official`)."""
    if not base.tasks and base.split == "eval" and base.rules == DEFAULT_RULES:
        return checkpoint
    return default_eval_name(checkpoint, base.split, base.tasks, base.rules, default_rules=DEFAULT_RULES)


def evaluate_run(run_dir: Path, backend: str, base: EvalRequest) -> dict[str, dict[str, Any]]:
    """Evaluate a run's last and best checkpoints into ``<run>/eval/<last|best>[_<split or task subset>]``
    (`run_eval_name`), under the rules of `--policy`: a non-empty directory is refused unless ``resume``
    (finish an interrupted evaluation) or ``overwrite``; every directory is checked before anything runs."""
    summaries: dict[str, dict[str, Any]] = {}
    done: dict[int, Path] = {}
    choices = select_checkpoints(run_dir)
    outs = {choice.name: RunDir(run_dir).eval_dir(run_eval_name(choice.name, base)) for choice in choices}
    for out in outs.values():
        if not base.overwrite and not base.resume and out.is_dir() and any(out.iterdir()):
            raise ValueError(f"{out} is not empty: refusing to overwrite an earlier result. Give --resume to finish "
                             "an interrupted evaluation with the same settings, or --overwrite to replace it "
                             "(--run writes <run>/eval/<last|best>[_<split or task subset>])")
    what = task_set_note(base.split, base.tasks).removeprefix("tasks: ")
    for choice in choices:
        out = outs[choice.name]
        caveat = (f"best is selected on the run's validation, which plays held-in eval tasks; evaluated here: {what}"
                  " (a number on validation tasks is optimistic: report `last`)" if choice.name == "best" else
                  f"last checkpoint: the honest number (no selection on the evaluation tasks); evaluated here: {what}")
        notes = (f"checkpoint {choice.name}: step {choice.step} ({choice.selection})", caveat)
        if choice.step in done:
            claim_output_dir(out, overwrite=base.overwrite or base.resume)  # a copy of a finished evaluation
            out.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(done[choice.step] / "results.jsonl", out / "results.jsonl")
            summary = json.loads((done[choice.step] / "summary.json").read_text(encoding="utf-8"))
            summary["notes"] = [n for n in summary["notes"] if not n.startswith("checkpoint ") and
                                "optimistic" not in n and "honest number" not in n] + list(notes)
            summary["notes"].append(f"same checkpoint as {done[choice.step].name}: results copied")
        else:
            request = EvalRequest(**{**base.__dict__, "policy": f"{backend}:{hf_model_dir(choice.path)}",
                                     "out": out, "extra_notes": base.extra_notes + notes})
            summary = evaluate(request)
            done[choice.step] = out
        summary["checkpoint"] = {"name": choice.name, "step": choice.step, "path": str(choice.path),
                                 "selection": choice.selection}
        (out / "summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n",
                                          encoding="utf-8")
        summaries[choice.name] = summary
        print_summary(summary, out)
    return summaries
