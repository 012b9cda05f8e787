"""Plot Figure 3 (validation accuracy per category vs step, SEAL vs Vanilla RL) and the failure profile.

    python scripts/plot_curves.py --run "SEAL=runs/seal7b" --run "Vanilla RL=runs/vanilla7b" --out-dir figures

Each DIR is a run directory holding metrics.jsonl (or the metrics.jsonl file itself). Writes
<out-dir>/figure3_val_accuracy.png and, when some run logs train/tag_frac/<tag>,
<out-dir>/failure_profile.png.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from seal.report import plots
from seal.report.tables import parse_assignment

FIGURE3 = "figure3_val_accuracy.png"
FAILURE_PROFILE = "failure_profile.png"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        metavar="LABEL=DIR",
        help="a run to plot (legend label = run directory); repeatable",
    )
    parser.add_argument("--out-dir", type=Path, default=Path("figures"))
    parser.add_argument("--dpi", type=int, default=100, help="pixels per inch (Figure 3 is 15 x 8 inches)")
    args = parser.parse_args(argv)
    try:
        pairs = [parse_assignment(text) for text in args.run]
        labels = [label for label, _ in pairs]
        if len(set(labels)) != len(labels):
            raise ValueError(f"duplicate run labels in {labels}")
        runs = {label: plots.read_metrics(directory) for label, directory in pairs}
        written = [plots.plot_validation_curves(runs, args.out_dir / FIGURE3, dpi=args.dpi)]
        try:
            written.append(plots.plot_failure_profile(runs, args.out_dir / FAILURE_PROFILE, dpi=args.dpi))
        except ValueError as exc:  # e.g. only Vanilla RL runs, which log no tags
            print(f"plot_curves: no failure profile: {exc}", file=sys.stderr)
    except (OSError, ValueError) as exc:
        print(f"plot_curves: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
