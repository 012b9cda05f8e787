"""The package layout's rules, checked on the source (docs/layout.md).

* Layers: the env service and seal's subpackages stand in one order, `LAYERS`, lowest first; a module
  may import from its own layer and the layers below it, never from a layer above (no upward arrow).
* `seal.core` (the SEAL method) imports from seal nothing but itself and `seal.io_utils`: it is pure
  code both engines call.
* No import cycle between project modules. Every import counts — module level, inside functions and
  under `if TYPE_CHECKING:` — because a type-only cycle still couples two modules.
* At most 8 modules at `seal/`'s top level (the rest lives in packages named for their concepts).
* No `sys.path` edits outside the tests: scripts and entry points rely on the installed package.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("seal", "env_service")

# The allowed order, lowest first (docs/layout.md): each layer may import the layers before it, none after.
# Reporting reads what evaluation writes, so it stands above it; the engines train with the recipe, the
# rollout and the core; the env service knows nothing of the trainer.
LAYERS = ("env_service", "seal.core", "seal.models", "seal.rollout", "seal.recipe", "seal.engines", "seal.eval",
          "seal.report")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(module: str, path: Path, known: set[str]) -> set[str]:
    """Project modules that `module` imports anywhere in its source (including type-only imports)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()

    def add(name: str) -> None:
        # `from a.b import c` may name the module a.b.c or a name in a.b: take the longest known module.
        while name and name not in known:
            name = name.rpartition(".")[0]
        if name:
            out.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, path.name == "__init__.py", node)
            for alias in node.names:
                add(f"{base}.{alias.name}")
    out.discard(module)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = project_modules()
    known = set(mods)
    return {m: imports_of(m, p, known) for m, p in mods.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert cycles == [], f"import cycles between project modules: {cycles}"


def layer_of(module: str) -> int | None:
    """Index of `module`'s layer in LAYERS, None for modules outside every layer (seal's top-level modules)."""
    for i, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return i
    return None


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    out = []
    for module, deps in sorted(graph.items()):
        low = layer_of(module)
        if low is None:
            continue
        for dep in sorted(deps):
            high = layer_of(dep)
            if high is not None and high > low:
                out.append(f"{module} -> {dep} ({LAYERS[low]} may not import {LAYERS[high]})")
    return out


def test_no_upward_arrow_between_layers():
    arrows = upward_arrows(import_graph())
    assert arrows == [], "imports against the layer order " + " < ".join(LAYERS) + ":\n" + "\n".join(arrows)


def test_every_seal_subpackage_has_a_layer():
    # A new subpackage must be placed in the order, or the rule above would silently not see it.
    subpackages = sorted(f"seal.{p.parent.name}" for p in (REPO / "seal").glob("*/__init__.py"))
    assert [s for s in subpackages if s not in LAYERS] == []


def test_the_layer_check_finds_upward_arrows():
    # The rule is only as good as its check: an arrow down passes, one up is reported.
    graph = {"seal.eval.results": {"seal.rollout.types", "seal.report.stats"}, "seal.report.tables": {"seal.eval.x"}}
    assert upward_arrows(graph) == ["seal.eval.results -> seal.report.stats (seal.eval may not import seal.report)"]


def test_core_is_pure():
    allowed = ("seal.core", "seal.io_utils")
    bad = {m: sorted(d for d in deps if d.startswith("seal") and not d.startswith(allowed))
           for m, deps in import_graph().items() if m.startswith("seal.core")}
    bad = {m: d for m, d in bad.items() if d}
    assert bad == {}, f"seal.core may import from seal only itself and seal.io_utils: {bad}"


def test_at_most_eight_top_level_modules():
    top = sorted(p.name for p in (REPO / "seal").glob("*.py"))
    assert len(top) <= 8, f"seal/ has {len(top)} top-level modules: {top}"


def test_no_sys_path_edits_outside_tests():
    offenders = []
    sources = [*REPO.glob("*.py"), *(p for d in ("seal", "env_service", "scripts") for p in (REPO / d).rglob("*.py"))]
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                offenders.append(str(path.relative_to(REPO)))
                break
    # Reading sys.path is harmless, but nothing here needs to: any use is reported.
    assert offenders == [], f"sys.path used outside the tests: {offenders}"


def test_the_cycle_finder_finds_cycles():
    # The check above is only as good as its cycle finder.
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


# The SEAL core's entry points for episode data, and the parameter that carries it. Each takes
# `seal.core.record.EpisodeRecord`s only (docs/seal_core.md): the engines build them with `Rollout.record()`.
RECORD_ENTRY_POINTS = {
    ("seal/core/controller.py", "SealController.observe"): "records",
    ("seal/core/controller.py", "SealController.validation_metrics"): "records",
    ("seal/core/capability.py", "CapabilityState.observe"): "records",
    ("seal/core/record.py", "record_columns"): "records",
}


def _functions(path: Path) -> dict[str, ast.FunctionDef]:
    """Module-level functions and methods of top-level classes, by qualified name."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
        elif isinstance(node, ast.ClassDef):
            out |= {f"{node.name}.{f.name}": f for f in node.body if isinstance(f, ast.FunctionDef)}
    return out


def test_the_core_takes_only_the_typed_episode_record():
    problems = []
    for (rel, name), param in RECORD_ENTRY_POINTS.items():
        fn = _functions(REPO / rel).get(name)
        if fn is None:
            problems.append(f"{rel}: {name} is gone (update RECORD_ENTRY_POINTS)")
            continue
        arg = next((a for a in fn.args.args if a.arg == param), None)
        annotation = "" if arg is None or arg.annotation is None else ast.unparse(arg.annotation)
        # A union with Mapping / Any / a Rollout would let untyped rows back in.
        if "EpisodeRecord" not in annotation or any(w in annotation for w in ("Mapping", "Any", "dict", "Rollout")):
            problems.append(f"{rel}: {name}({param}: {annotation or '<none>'})")
        calls = {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
        if name != "record_columns" and "check_records" not in calls:
            problems.append(f"{rel}: {name} does not refuse other types (check_records)")
    assert problems == [], "core entry points must take EpisodeRecords only:\n" + "\n".join(problems)
