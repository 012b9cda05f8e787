"""Render the paper's tables (BFCL V3, OOD, ablation) from evaluation directories, beside the paper's numbers.

Examples::

    seal-tables \
        --row "Qwen2.5-7B-Instruct+SEAL=runs/seal7b/eval/last" \
        --row "Qwen2.5-7B-Instruct+Vanilla RL=runs/vanilla7b/eval/last" \
        --ood "Qwen2.5-7B-Instruct+SEAL=runs/seal7b/eval/bfcl_v4" \
        --ood "Qwen2.5-7B-Instruct+SEAL=runs/seal7b/eval/tau2" --out tables.md

    seal-tables --map tables.yaml                 # {"held_in": {KEY: DIR}, "ood": {KEY: [DIR, ...]}}

A row key is ``<backbone>[+<training>]``: backbones Qwen2.5-3B-Instruct, Qwen2.5-7B-Instruct,
ToolACE-2-Llama-3.1-8B (or qwen3b / qwen7b / toolace8b); trainings Vanilla RL, SEAL, and the ablations
wo_env_adaptation, wo_reweighting, wo_closed_loop (case and punctuation ignored). A DIR is an evaluation
directory (summary.json or results.jsonl) or a run directory: its eval/last (the honest number; eval/best is
selected on the evaluation tasks and optimistic), else its only evaluation.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from seal.io_utils import write_text_or_stdout
from seal.report import tables


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="seal-tables", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--row",
        action="append",
        default=[],
        metavar="KEY=DIR",
        help="held-in (BFCL V3) evaluation of a table row; repeatable",
    )
    parser.add_argument(
        "--ood",
        action="append",
        default=[],
        metavar="KEY=DIR",
        help="OOD evaluation (BFCL V4 and/or tau2) of a row; repeatable, also per row",
    )
    parser.add_argument(
        "--map", type=Path, help="YAML/JSON mapping file {held_in: {KEY: DIR}, ood: {KEY: [DIR]}}"
    )
    parser.add_argument(
        "--tables",
        default=",".join(tables.TABLES),
        help=f"comma-separated subset of {','.join(tables.TABLES)} (default: all)",
    )
    parser.add_argument(
        "--allow-noncomparable-tau2",
        action="store_true",
        help="show tau2 runs that differ from the paper's protocol (code, task set, user simulator, ...), "
        "labelled with what differs and without a delta; refused otherwise",
    )
    parser.add_argument(
        "--allow-partial-bfcl-v4",
        action="store_true",
        help="show BFCL V4 keys that average only some of BFCL's sub-categories (e.g. memory from one backend), "
        "labelled and without a delta; refused otherwise",
    )
    parser.add_argument("--allow-mismatched", action="store_true", help="render held-in rows evaluated on other "
                        "tasks than the paper's column (another split, a task subset), labelled and without deltas "
                        "(refused otherwise)")
    parser.add_argument("--out", type=Path, help="write markdown here (default: stdout)")
    args = parser.parse_args(argv)
    if not args.row and not args.ood and args.map is None:
        print("seal-tables: error: no row given: name evaluations with --row KEY=DIR, --ood KEY=DIR or --map FILE "
              "(seal-tables --help)", file=sys.stderr)
        return 2

    try:
        held_in_pairs = [tables.parse_assignment(text) for text in args.row]
        ood_pairs = [tables.parse_assignment(text) for text in args.ood]
        if args.map is not None:
            document = yaml.safe_load(args.map.read_text(encoding="utf-8"))  # JSON is YAML too
            more_held_in, more_ood = tables.pairs_from_mapping_file(document, args.map.parent)
            held_in_pairs += more_held_in
            ood_pairs += more_ood
        held_in_dirs = tables.held_in_mapping(held_in_pairs)
        held_in = tables.load_held_in(held_in_dirs, allow_mismatched=args.allow_mismatched)
        ood_dirs = tables.ood_mapping(ood_pairs)
        ood = tables.load_ood(ood_dirs, allow_noncomparable_tau2=args.allow_noncomparable_tau2,
                              allow_partial_bfcl_v4=args.allow_partial_bfcl_v4)
        selected = [name.strip() for name in args.tables.split(",") if name.strip()]
        markdown = tables.render_tables(held_in, ood, selected, rules=tables.held_in_rules(held_in_dirs),
                                        held_in_labels=tables.held_in_mismatches(held_in_dirs),
                                        ood_caveats=tables.tau2_caveats(ood_dirs),
                                        bfcl_v4_caveats=tables.bfcl_v4_caveats(ood_dirs))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"make_tables: error: {exc}", file=sys.stderr)
        return 2
    write_text_or_stdout(args.out, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
