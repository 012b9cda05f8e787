"""Print the project's import graph: modules, import edges, cycles, and the engines' cross imports.

The graph is the one tests/test_layout.py checks (every import counts: module level, inside functions,
under `if TYPE_CHECKING:`), loaded from that file so that there is one definition of what an import edge is.

    python scripts/import_graph.py            # counts, cycles, verl -> local edges
    python scripts/import_graph.py --edges    # and every edge, one per line
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _layout():
    # Loaded by path: `tests` is not an installed package, and this script must not edit sys.path.
    spec = importlib.util.spec_from_file_location("seal_layout_rules", REPO / "tests" / "test_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--edges", action="store_true", help="print every import edge")
    args = parser.parse_args(argv)
    layout = _layout()
    graph = layout.import_graph()
    edges = sorted((m, d) for m, deps in graph.items() for d in deps)
    for pkg in layout.PACKAGES:
        mods = [m for m in graph if m == pkg or m.startswith(pkg + ".")]
        print(f"{pkg}: {len(mods)} modules")
    print(f"modules: {len(graph)}, import edges: {len(edges)}")
    cycles = layout.find_cycles(graph)
    print(f"cycles: {len(cycles)}")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))
    verl_to_local = [(m, d) for m, d in edges
                     if m.startswith("seal.engines.verl") and d.startswith("seal.engines.local")]
    print(f"seal.engines.verl -> seal.engines.local edges: {len(verl_to_local)}")
    for m, d in verl_to_local:
        print(f"  {m} -> {d}")
    arrows = layout.upward_arrows(graph)
    print(f"upward arrows between layers: {len(arrows)}")
    for arrow in arrows:
        print("  " + arrow)
    if args.edges:
        for m, d in edges:
            print(f"{m} -> {d}")


if __name__ == "__main__":
    main()
