"""Failure-analysis report of an evaluation directory, or of the change between two.

    python scripts/failure_report.py runs/seal7b/eval/last                      # one evaluation
    python scripts/failure_report.py runs/vanilla7b/eval/last runs/seal7b/eval/last \
        --labels "Vanilla RL" "SEAL" --out reports/seal_vs_vanilla.md           # change: second vs first

A directory is an evaluation directory with results.jsonl, or a run directory: its eval/last (the honest number;
eval/best is selected on the evaluation tasks and optimistic), else its only evaluation. With two directories
the output holds both reports and the change (second − first).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seal.io_utils import write_text_or_stdout
from seal.report import failure_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "eval_dirs", nargs="+", type=Path, metavar="EVAL_DIR", help="one or two evaluation directories"
    )
    parser.add_argument("--labels", nargs="+", help="names for the evaluations (default: their paths)")
    parser.add_argument("--out", type=Path, help="write markdown here (default: stdout)")
    args = parser.parse_args(argv)
    if len(args.eval_dirs) > 2:
        parser.error("give one evaluation directory, or two to compare")
    labels = args.labels or [str(d) for d in args.eval_dirs]
    if len(labels) != len(args.eval_dirs):
        parser.error("--labels needs one name per evaluation directory")
    try:
        records = [failure_report.load_results(d) for d in args.eval_dirs]
        parts = [failure_report.render_report(r, label) for r, label in zip(records, labels, strict=True)]
        if len(records) == 2:
            parts.append(failure_report.render_comparison(records[0], records[1], labels[0], labels[1]))
    except (OSError, ValueError) as exc:
        print(f"failure_report: error: {exc}", file=sys.stderr)
        return 2
    markdown = "\n".join(parts)
    write_text_or_stdout(args.out, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
