"""verl plugin (entry point `seal` of the `verl.plugins` group, see pyproject.toml).

`import verl` imports this module in every process, Ray workers included (also when named in
`VERL_USE_EXTERNAL_MODULES`). It registers with verl

- the agent loop `seal_bfcl` (`seal.engines.verl.agent_loop.SealBfclAgentLoop`), and
- the trainer mode `seal` (`seal.engines.verl.trainer.SealTrainer`, `trainer.v1.trainer_mode=seal`);

and, on every device, bounds the waits of verl's weight sync into vLLM (`seal.engines.verl.sync_bound`, once
verl's bucketed weight transfer is imported: in the FSDP workers, which send the weights).

It must be cheap and safe everywhere: it is loaded while `verl/__init__` is still running, in vLLM
and FSDP worker processes that never need our classes, and on machines without vLLM. So it imports
nothing from verl. Instead it installs a post-import hook: when verl's agent-loop package
(`verl.experimental.agent_loop`) or v1 trainer package (`verl.trainer.ppo.v1`) has finished
importing in a process, the module registering our class is imported right away, before the importer
continues. If a package is already imported when the plugin loads, registration happens at once.
Failures are logged as warnings (verl swallows plugin exceptions at debug level).

With `SEAL_VERL_DEVICE=cpu` (set for every Ray process of a `trainer.device: cpu` run; a `cuda` run sets it to
`cuda`, so a value left in the user's shell never reaches its workers) it also installs
`seal.engines.verl.cpu_patches.install_cpu_patches` at once: that path imports verl's packages, which is why
it is not the default; and it hooks `CPU_HOOKS` (the vLLM weight-sync patch of `cpu_patches`, run once verl's
vLLM utilities are imported, in vLLM's engine process too).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import threading
from types import ModuleType

log = logging.getLogger(__name__)

# verl package -> our module that registers with it when imported (`module:function`: then that function is
# called too).
HOOKS: dict[str, str] = {
    "verl.experimental.agent_loop": "seal.engines.verl.agent_loop",
    "verl.trainer.ppo.v1": "seal.engines.verl.trainer",
    # Not a registration: the sender's bounded waits, on every device (imports zmq and the module, nothing else).
    "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer": "seal.engines.verl.sync_bound:bound_weight_sync",
}

_lock = threading.RLock()
_done: set[str] = set()


def _register(target: str) -> None:
    """Import `HOOKS[target]` once (it registers itself); log instead of raising."""
    module, _, function = HOOKS[target].partition(":")
    with _lock:
        if target in _done:
            return
        _done.add(target)
    try:
        loaded = importlib.import_module(module)
        if function:
            getattr(loaded, function)()
    except Exception as exc:  # a broken registration must not break verl's own import
        log.warning("seal verl plugin: %s (after %s) failed: %r", HOOKS[target], target, exc)


class _AfterExec(importlib.abc.Loader):
    """Wraps a module's real loader and runs the registration once the module has executed."""

    def __init__(self, loader: importlib.abc.Loader, target: str):
        self._loader = loader
        self._target = target

    def create_module(self, spec):  # noqa: D401 - importlib protocol
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _register(self._target)

    def __getattr__(self, name: str):  # get_resource_reader, is_package, ... of the real loader
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds the hooked packages through the other finders and wraps their loaders."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in HOOKS or fullname in _done:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _AfterExec(spec.loader, fullname)
                return spec
        return None


_FINDER = _PostImportFinder()
# "cpu": this process runs verl's GPU workers on CPU (exp/tiny_verl_cpu.yaml); anything else (the launcher sets
# "cuda"): nothing more. `seal.engines.verl.launch.PLUGIN_DEVICE_ENV` names the same variable.
DEVICE_ENV = "SEAL_VERL_DEVICE"


# CPU path only: verl module -> the `cpu_patches` function that patches it once it is imported (it imports
# vLLM, which most verl processes never load).
CPU_PATCHES = "seal.engines.verl.cpu_patches"
CPU_HOOKS: dict[str, str] = {
    "verl.workers.rollout.vllm_rollout.utils": "patch_vllm_weight_sync",
}


def install_cpu_path() -> None:
    """On the CPU path only: our trainer module first (it pulls in the adapter, which `cpu_patches` imports,
    without an import cycle), then the CPU patches, before any verl worker asks for its device; `CPU_HOOKS`
    join `HOOKS`."""
    try:
        importlib.import_module("seal.engines.verl.trainer")
        importlib.import_module(CPU_PATCHES).install_cpu_patches()
    except Exception as exc:
        log.warning("seal verl plugin: the CPU patches failed: %r", exc)
        return
    for target, function in CPU_HOOKS.items():
        HOOKS[target] = f"{CPU_PATCHES}:{function}"
    install()


def install() -> None:
    """Register now for packages already imported; hook the others. Idempotent."""
    for target in HOOKS:
        module = sys.modules.get(target)
        # A package still being imported (spec._initializing) is handled by its wrapped loader.
        if module is not None and not getattr(getattr(module, "__spec__", None), "_initializing", False):
            _register(target)
    with _lock:
        if not any(f is _FINDER for f in sys.meta_path):
            sys.meta_path.insert(0, _FINDER)


install()
if os.environ.get(DEVICE_ENV) == "cpu":
    install_cpu_path()
