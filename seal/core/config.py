"""`SealConfig`: the `seal.*` block of a recipe, everything the SEAL method reads (docs/config.md).

    seal:
      diagnosis:  {vocabulary}                  DiagnosisConfig
      reward:     {mode, cap, ...}              seal.core.reward.RewardConfig
      apatch:     {enable, min_scale, ...}      seal.core.apatch.APatchSettings
      capability: {enable, ema_beta, ...}       seal.core.capability.DynamicWeightConfig
      interface:  {enable, closed_loop, ...}    InterfaceConfig (the rest: seal.core.evolve.EvolveSettings)
      adaptive:   {rho, task_weights, ...}      seal.core.adaptive.AdaptiveConfig (beyond the paper; all off)

The vocabulary is one switch for all of SEAL: A-Patch and interface evolution take it from
`diagnosis.vocabulary` (`apatch_config`, `evolve_config`), so neither section has a vocabulary key of
its own. Building a `SealConfig` binds both and so checks their vocabulary-dependent knobs
(`tag_weights`, `error_tags`) at once, before any training.

Pure: nothing here knows about the recipe loader; `seal.recipe` builds this from YAML.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from env_service.vocab import VOCABULARIES
from seal.core.adaptive import AdaptiveConfig
from seal.core.apatch import APatchConfig, APatchSettings
from seal.core.capability import DynamicWeightConfig
from seal.core.evolve import EvolveConfig, EvolveSettings
from seal.core.reward import RewardConfig
from seal.core.section import Section, setting


class DiagnosisConfig(Section):
    vocabulary: Literal[tuple(VOCABULARIES)] = setting(
        "progress", source="release",
        help="progress (release tags) | paper (paper labels); one switch for all of seal.*")


class InterfaceConfig(EvolveSettings):
    """The train-only interface Ω_t: whether there is one, whether it evolves, and how (`EvolveSettings`)."""

    enable: bool = setting(True, source="ours", help="false = raw interface: training episodes get no interface at all")
    closed_loop: bool = setting(True, source="ours",
                                help="false = Omega_0 kept for the whole run (not evolved from C_t)")

    @model_validator(mode="after")
    def _check_interface(self) -> InterfaceConfig:
        # Adaptive φ_err is decided from C_t at every evolve; with Ω frozen at Ω_0 it would silently stay off,
        # removing φ_err instead of only the closed loop (the paper's φ_err(o_i, H_t) does not need C_t: "on").
        if self.enable and not self.closed_loop and self.error_feedback == "adaptive":
            raise ValueError("interface.error_feedback: adaptive needs interface.closed_loop: true "
                             "(use on, the paper's non-adaptive phi_err, or off)")
        return self


class SealConfig(Section):
    diagnosis: DiagnosisConfig = Field(default_factory=DiagnosisConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    apatch: APatchSettings = Field(default_factory=APatchSettings)
    capability: DynamicWeightConfig = Field(default_factory=DynamicWeightConfig)
    interface: InterfaceConfig = Field(default_factory=InterfaceConfig)
    adaptive: AdaptiveConfig = Field(default_factory=AdaptiveConfig)

    _apatch: APatchConfig = PrivateAttr()
    _evolve: EvolveConfig = PrivateAttr()

    @model_validator(mode="after")
    def _bind(self) -> SealConfig:
        # Bound once here, so a tag that the vocabulary lacks fails when the config is built.
        self._apatch = _bound("apatch", APatchConfig.bind, self.apatch, self.vocabulary)
        self._evolve = _bound("interface", EvolveConfig.bind, self.interface, self.vocabulary)
        return self

    @property
    def vocabulary(self) -> str:
        """The diagnosis vocabulary every SEAL component uses."""
        return self.diagnosis.vocabulary

    @property
    def apatch_config(self) -> APatchConfig:
        """`seal.apatch` with the run's vocabulary."""
        return self._apatch

    @property
    def evolve_config(self) -> EvolveConfig:
        """The evolution knobs of `seal.interface` with the run's vocabulary."""
        return self._evolve


def _bound(section: str, bind: Any, settings: Any, vocabulary: str) -> Any:
    # A pydantic ValidationError is a ValueError too: its first message names the rule that failed.
    try:
        return bind(settings, vocabulary)
    except ValueError as exc:
        errors = getattr(exc, "errors", None)
        text = errors()[0]["msg"].removeprefix("Value error, ") if errors else str(exc)
        raise ValueError(f"{section}: {text}") from exc
