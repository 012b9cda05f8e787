"""The verl plugin: cheap to import, registers the `seal_bfcl` agent loop and the `seal` trainer mode
whenever verl's packages are imported (before or after the plugin), also inside a Ray worker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from seal.recipe import REPO_ROOT

pytest.importorskip("verl")

CHECK_REGISTERED = """
from verl.trainer.ppo.v1 import get_trainer_cls
from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
assert get_trainer_cls("seal").__name__ == "SealTrainer", get_trainer_cls("seal")
assert _agent_loop_registry["seal_bfcl"] == {"_target_": "seal.engines.verl.agent_loop.SealBfclAgentLoop"}
print("REGISTERED")
"""


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO_ROOT, env=full_env,
                          capture_output=True, text=True, timeout=300)


def test_plugin_import_is_cheap():
    """Loaded in every verl process: it must not pull in verl, torch or our heavy modules."""
    proc = run_python("""
        import sys
        import seal.engines.verl.plugin
        heavy = [m for m in sys.modules if m.split(".")[0] in ("verl", "torch", "ray", "vllm")
                 or m in ("seal.engines.verl.agent_loop", "seal.engines.verl.trainer")]
        assert not heavy, heavy
        print("CHEAP")
    """)
    assert proc.returncode == 0 and "CHEAP" in proc.stdout, proc.stderr[-2000:]


@pytest.mark.slow  # a fresh interpreter importing verl
def test_registers_through_verl_external_modules():
    """`import verl` loads the plugin named in VERL_USE_EXTERNAL_MODULES (what the engine sets for Ray)."""
    proc = run_python("import verl\n" + CHECK_REGISTERED, VERL_USE_EXTERNAL_PLUGINS="none",
                      VERL_USE_EXTERNAL_MODULES="seal.engines.verl.plugin")
    assert proc.returncode == 0 and "REGISTERED" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow  # a fresh interpreter importing verl
def test_registers_when_verl_was_imported_first():
    proc = run_python(textwrap.dedent("""
        import sys
        import verl.trainer.ppo.v1, verl.experimental.agent_loop
        assert "seal.engines.verl.trainer" not in sys.modules
        import seal.engines.verl.plugin
        import seal.engines.verl.adapter
        assert seal.engines.verl.adapter.registered() == {"agent_loop": True, "trainer_mode": True}
    """) + CHECK_REGISTERED, VERL_USE_EXTERNAL_PLUGINS="none")
    assert proc.returncode == 0 and "REGISTERED" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow  # a fresh interpreter importing verl
def test_entry_point_when_installed():
    from importlib.metadata import entry_points

    if not any(ep.value == "seal.engines.verl.plugin" for ep in entry_points(group="verl.plugins")):
        pytest.skip("project not pip-installed (pip install -e . registers the verl.plugins entry point)")
    proc = run_python("import verl\n" + CHECK_REGISTERED, VERL_USE_EXTERNAL_MODULES="")
    assert proc.returncode == 0 and "REGISTERED" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.slow  # starts Ray
def test_plugin_registers_inside_a_ray_worker():
    """A Ray worker started with the engine's runtime environment sees both registrations."""
    ray = pytest.importorskip("ray")
    from seal.engines.verl.launch import plugin_env_vars

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": plugin_env_vars()})
    try:
        @ray.remote
        def registered_in_worker():
            import os as _os

            import verl  # noqa: F401  - loads the plugin
            from verl.experimental.agent_loop.agent_loop import _agent_loop_registry
            from verl.trainer.ppo.v1 import get_trainer_cls

            return {"pid": _os.getpid(), "trainer": get_trainer_cls("seal").__name__,
                    "agent_loop": _agent_loop_registry.get("seal_bfcl")}

        got = ray.get(registered_in_worker.remote(), timeout=240)
    finally:
        ray.shutdown()
    assert got["pid"] != os.getpid()
    assert got["trainer"] == "SealTrainer"
    assert got["agent_loop"] == {"_target_": "seal.engines.verl.agent_loop.SealBfclAgentLoop"}
