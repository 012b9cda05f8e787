"""The package layout's rules, checked on the source (docs/layout.md).

* Layers: the env service and seal's subpackages stand in one order, `LAYERS`, lowest first; a module
  may import from its own layer and the layers below it, never from a layer above (no upward arrow).
* `seal.core` (the SEAL method) imports from seal nothing but itself and `seal.io_utils`: it is pure
  code both engines call.
* No import cycle between project modules. Every import counts — module level, inside functions and
  under `if TYPE_CHECKING:` — because a type-only cycle still couples two modules.
* At most 8 modules at `seal/`'s top level (the rest lives in packages named for their concepts).
* No `sys.path` edits outside the tests: scripts and entry points rely on the installed package.
* Sizes: no function over 80 lines (a literal table listed in `TABLE_FUNCTIONS` may be longer, and the check
  makes sure it is one); no module over 800 lines, none in `seal/engines/` over 450, none of `seal-eval`'s
  (`EVAL_COMMAND_MODULES`) over 450; the local engine's `ppo_update` at most 60 lines, and at most 6 of the
  local engine's functions take the whole recipe or a `LocalRun` (the others take the sub-config they use).
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


# --------------------------------------------------------------------------- sizes
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 800
MAX_ENGINE_MODULE_LINES = 450  # seal/engines/: the trainers are read most by newcomers and by upgrades
# `seal-eval`, split by job (the command line, the BFCL loop, the service it starts, `--run`, a summary's notes):
# each stays within the engines' bound, so that the command does not grow back into one 800-line module.
EVAL_COMMAND_MODULES = ("seal/eval/evaluate.py", "seal/eval/held_in.py", "seal/eval/service.py",
                        "seal/eval/run_checkpoints.py", "seal/eval/notes.py")
MAX_EVAL_COMMAND_MODULE_LINES = 450
# Functions allowed past MAX_FUNCTION_LINES because they are literal tables (checked: a docstring, then one
# `return` of a dict/list/tuple literal, or assignments of such literals). Empty while none is that long.
TABLE_FUNCTIONS: set[str] = set()
LOCAL_ENGINE = REPO / "seal" / "engines" / "local"
WHOLE_RECIPE_TYPES = ("Recipe", "LocalRun")


def _all_functions() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """Every function and method (nested ones too) of the project's modules, as "path:qualified.name"."""
    out = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[f"{prefix}{child.name}"] = child
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    for path in project_modules().values():
        visit(ast.parse(path.read_text(encoding="utf-8")), f"{path.relative_to(REPO)}:")
    return out


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def is_literal_table(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A docstring, then only a `return` of a literal container or assignments of literal containers (their
    elements may be any expression: the table's rows)."""
    body = fn.body[1:] if fn.body and isinstance(fn.body[0], ast.Expr) and isinstance(fn.body[0].value,
                                                                                       ast.Constant) else fn.body
    literal = (ast.Dict, ast.List, ast.Tuple, ast.Set)
    return bool(body) and all(
        (isinstance(stmt, ast.Return) and isinstance(stmt.value, literal))
        or (isinstance(stmt, (ast.Assign, ast.AnnAssign)) and isinstance(stmt.value, literal))
        for stmt in body)


def test_no_function_is_longer_than_a_screen():
    functions = _all_functions()
    long = {name: _lines(fn) for name, fn in functions.items()
            if _lines(fn) > MAX_FUNCTION_LINES and name not in TABLE_FUNCTIONS}
    assert long == {}, f"functions over {MAX_FUNCTION_LINES} lines (split them by job, or make a table): {long}"
    not_tables = sorted(name for name in TABLE_FUNCTIONS if name not in functions or not is_literal_table(
        functions[name]))
    assert not_tables == [], f"TABLE_FUNCTIONS holds what is not a literal table (or is gone): {not_tables}"


def test_module_sizes():
    sizes = {str(p.relative_to(REPO)): len(p.read_text(encoding="utf-8").splitlines())
             for p in project_modules().values()}
    big = {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES}
    assert big == {}, f"modules over {MAX_MODULE_LINES} lines: {big}"
    engines = {m: n for m, n in sizes.items() if m.startswith("seal/engines/") and n > MAX_ENGINE_MODULE_LINES}
    assert engines == {}, f"engine modules over {MAX_ENGINE_MODULE_LINES} lines: {engines}"
    missing = [m for m in EVAL_COMMAND_MODULES if m not in sizes]
    assert missing == [], f"EVAL_COMMAND_MODULES names modules that are gone: {missing}"
    command = {m: sizes[m] for m in EVAL_COMMAND_MODULES if sizes[m] > MAX_EVAL_COMMAND_MODULE_LINES}
    assert command == {}, f"seal-eval modules over {MAX_EVAL_COMMAND_MODULE_LINES} lines: {command}"


def test_the_local_engine_update_is_short_and_functions_take_their_sub_config():
    functions = {name: fn for name, fn in _all_functions().items() if name.startswith("seal/engines/local/")}
    update = [fn for name, fn in functions.items() if name.endswith(":ppo_update")]
    assert len(update) == 1 and _lines(update[0]) <= 60, [_lines(fn) for fn in update]
    whole = sorted(name for name, fn in functions.items()
                   if any(a.annotation is not None and any(t in ast.unparse(a.annotation) for t in WHOLE_RECIPE_TYPES)
                          for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]))
    assert len(whole) <= 6, f"{len(whole)} local-engine functions take the whole recipe or a LocalRun: {whole}"


def test_the_size_checks_see_tables_and_long_functions():
    table = ast.parse('def t():\n    """rows"""\n    return {"a": (1, 2),\n            "b": f(3)}\n').body[0]
    code = ast.parse("def f(x):\n    y = [x]\n    return y\n").body[0]
    assert is_literal_table(table) and not is_literal_table(code)
    assert _lines(table) == 4


# --------------------------------------------------------------------------- the recipe's one validation stack
MAX_COMPOSE_LINES = 200  # seal/recipe/compose.py: composition and overrides only; validation is the schema's


def test_the_recipe_has_one_validation_stack():
    # The recipe's rules are pydantic's (seal.core.section, seal.recipe.schema): no second knob checker beside it,
    # no typed merge retried key by key, and compose.py stays composition.
    compose = REPO / "seal" / "recipe" / "compose.py"
    assert len(compose.read_text(encoding="utf-8").splitlines()) <= MAX_COMPOSE_LINES
    assert not (REPO / "seal" / "core" / "config_parsing.py").exists(), "the knob machinery is back"
    defined = {node.name for path in project_modules().values()
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert not {"knob", "knob_problems", "field_problems", "range_bounds"} & defined
    loops = [ast.unparse(n.iter) for n in ast.walk(ast.parse(compose.read_text(encoding="utf-8")))
             if isinstance(n, ast.For) and "range" in ast.unparse(n.iter)]
    assert loops == [], f"a retry loop in compose.py: {loops}"
