"""`python -m seal.recipe [--write | --check]`: the recipe reference generated from the schema.

Without options it prints the key table of docs/config.md. `--write` regenerates that table and
exp/defaults.yaml; `--check` exits 1 when either is out of date.
"""

from __future__ import annotations

import argparse
import sys

from seal.recipe import reference


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m seal.recipe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite docs/config.md's table and exp/defaults.yaml")
    mode.add_argument("--check", action="store_true", help="exit 1 if a generated file is out of date")
    args = p.parse_args(argv)
    if args.write:
        for path in reference.write_files():
            print(f"updated {path}")
        return 0
    if args.check:
        stale = reference.stale_files()
        for path in stale:
            print(f"out of date: {path} (python -m seal.recipe --write)", file=sys.stderr)
        return 1 if stale else 0
    print(reference.key_table(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
