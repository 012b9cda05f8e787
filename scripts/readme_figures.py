"""The tiny run's figures in README.md and exp/README.md, from a real run instead of by hand.

    python scripts/readme_figures.py --write                # run exp/tiny_cpu.yaml once, rewrite both blocks
    python scripts/readme_figures.py --run runs/tiny_cpu --write   # from a finished tiny run
    python scripts/readme_figures.py --run runs/tiny_cpu --check   # exit 1 when a README disagrees with it

The figures (the training reward per step from `metrics.jsonl`; the warm start's supervised steps and
p(ground truth) from `warm_start.json` next to the warm-started model) go between the markers
`<!-- tiny-run figures -->` and `<!-- end tiny-run figures -->` of each README. The wall time of the run this
script started is written too, but `--check` compares the figures only: a time depends on the machine.
Without `--run` the recipe runs once (about 6.5 minutes on 2 quiet cores; `OMP_NUM_THREADS=1`).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
READMES = (REPO / "README.md", REPO / "exp" / "README.md")
BEGIN = "<!-- tiny-run figures -->"
END = "<!-- end tiny-run figures -->"
BLOCK = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.DOTALL)
TIME_PREFIX = "Wall time"


def read_run(run_dir: Path) -> dict[str, Any]:
    """The figures of a finished tiny run: rewards per step, and the warm start's steps and probabilities."""
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    rewards = {int(r["step"]): float(r["train/reward_mean"]) for r in rows if "train/reward_mean" in r}
    if not rewards:
        raise ValueError(f"{metrics}: no train/reward_mean line (not a finished training run)")
    config = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8"))
    warm = (config.get("model") or {}).get("warm_start") or {}
    info: dict[str, Any] = {}
    if warm.get("enable"):
        path = Path(warm["path"])
        path = path if path.is_absolute() else REPO / path  # model paths are taken from the cwd: the project's
        info_file = path / "warm_start.json"
        if not info_file.is_file():
            raise ValueError(f"{info_file}: the warm start's record is missing (model.warm_start.path of the run)")
        info = json.loads(info_file.read_text(encoding="utf-8"))
    return {"rewards": [rewards[s] for s in sorted(rewards)], "warm_start": info}


def figures_text(figures: Mapping[str, Any], wall_s: float | None = None) -> str:
    """The block between the markers: one line of figures, and the wall time when known."""
    rewards = ", ".join(f"{r:g}" for r in figures["rewards"])
    lines = [f"Training reward per step ({len(figures['rewards'])} steps): {rewards}."]
    warm = figures.get("warm_start") or {}
    if warm:
        lines.append(f"Warm start: {warm['steps']} supervised steps, p(ground truth) {_per_task(warm['prob'])}, "
                     f"p(failing twin) {_per_task(warm['twin_prob'])}.")
    if wall_s is not None:
        lines.append(f"{TIME_PREFIX}: {wall_s / 60:.1f} min (this run, `scripts/readme_figures.py`).")
    return "\n".join(lines) + "\n"


def _per_task(probs: Mapping[str, float]) -> str:
    """`warm_start.json` keeps one probability per training task: "0.39 / 0.46" in the recipe's task order."""
    return " / ".join(f"{p:.2f}" for p in probs.values())


def _figures_only(block: str) -> str:
    return "\n".join(line for line in block.splitlines() if not line.startswith(TIME_PREFIX))


def replace_block(text: str, block: str, where: str) -> str:
    if not BLOCK.search(text):
        raise ValueError(f"{where}: no {BEGIN} ... {END} block")
    return BLOCK.sub(lambda _: f"{BEGIN}\n{block}{END}", text)


def check_block(text: str, block: str, where: str) -> list[str]:
    """Problems of one README against the run's figures (empty when they agree)."""
    found = BLOCK.search(text)
    if not found:
        return [f"{where}: no {BEGIN} ... {END} block"]
    if _figures_only(found.group(1)) != _figures_only(block):
        return [f"{where}: the tiny-run figures differ from the run's:\n  README: {found.group(1).strip()}\n"
                f"  run:    {block.strip()}"]
    return []


def run_tiny(out_root: Path) -> tuple[Path, float]:
    """Run exp/tiny_cpu.yaml once (its own env service); returns its run directory and wall time."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "SEAL_NO_PROGRESS": "1"}
    start = time.monotonic()
    subprocess.run([sys.executable, str(REPO / "launcher.py"), "--conf", "exp/tiny_cpu.yaml",
                    f"run_root={out_root}", "experiment_name=readme_figures", "trainer.resume=disable"],
                   cwd=REPO, env=env, check=True)
    return out_root / "readme_figures", time.monotonic() - start


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", type=Path, help="a finished exp/tiny_cpu.yaml run directory (default: run it now)")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the blocks of README.md and exp/README.md")
    mode.add_argument("--check", action="store_true", help="exit 1 when a README's figures differ from the run")
    p.add_argument("--readme", type=Path, action="append", help="README files (default: README.md, exp/README.md)")
    args = p.parse_args(argv)
    readmes = args.readme or list(READMES)
    wall_s = None
    try:
        if args.run is None:
            run_dir, wall_s = run_tiny(Path(tempfile.mkdtemp(prefix="readme_figures_")))
        else:
            run_dir = args.run
        block = figures_text(read_run(run_dir), wall_s)
        if args.check:
            problems = [q for path in readmes for q in check_block(path.read_text(encoding="utf-8"), block, str(path))]
            for problem in problems:
                print(problem, file=sys.stderr)
            return 1 if problems else 0
        for path in readmes:
            path.write_text(replace_block(path.read_text(encoding="utf-8"), block, str(path)), encoding="utf-8")
            print(f"wrote {path}", file=sys.stderr)
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"readme_figures: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
