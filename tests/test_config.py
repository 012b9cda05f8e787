"""Recipes: composition, validation, the paper's Table 4 values and the ablations' released semantics."""

from __future__ import annotations

import ast
import types
import typing
from pathlib import Path
from typing import Annotated, Literal

import pytest
from omegaconf import OmegaConf
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from seal import recipe as C
from seal.core.config import SealConfig
from seal.core.controller import SealController
from seal.recipe import __main__ as recipe_cli
from seal.recipe import reference

EXP = Path(__file__).resolve().parent.parent / "exp"
RECIPES = sorted(p for p in EXP.glob("*.yaml") if p.stem != "defaults")


def load(name: str, *overrides: str):
    return C.load_config(EXP / f"{name}.yaml", list(overrides))


def flat(cfg) -> dict:
    out: dict = {}

    def walk(node, prefix):
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, f"{prefix}.{k}" if prefix else k)
        else:
            out[prefix] = node

    walk(C.to_container(cfg), "")
    return out


def diff(a, b) -> dict:
    fa, fb = flat(a), flat(b)
    return {k: (fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}


def test_expected_recipes_exist():
    names = {p.stem for p in RECIPES}
    assert {"SEAL", "SEAL_release", "vanilla_rl", "wo_env_adaptation", "wo_reweighting", "wo_closed_loop",
            "SEAL_qwen3b", "vanilla_rl_qwen3b", "SEAL_toolace8b", "vanilla_rl_toolace8b", "tiny_cpu"} <= names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_recipe_composes_and_builds_its_configs(recipe):
    cfg = C.load_config(recipe)
    assert cfg.experiment_name == recipe.stem  # run directories never collide
    SealController(cfg.seal)  # the SEAL core dataclasses accept the seal.* block
    C.rollout_limits(cfg)
    assert set(flat(cfg)) == set(flat(load("SEAL")))  # every recipe has exactly the documented keys


def test_seal_recipe_has_paper_table4_values():
    # Paper Table 4 (docs/paper.md §7.3).
    cfg = load("SEAL")
    f = flat(cfg)
    expected = {
        "model.path": "Qwen/Qwen2.5-7B-Instruct",
        "data.train_batch_size": 32, "rollout.n": 8, "rollout.temperature": 1.0,
        "rollout.val_temperature": 0.0, "rollout.val_n": 1,
        "data.max_prompt_length": 8192, "data.max_response_length": 4096, "rollout.max_model_len": 16384,
        "algorithm.adv_estimator": "grpo", "algorithm.use_kl_in_reward": False,
        "actor.lr": 1e-6, "actor.use_kl_loss": True, "actor.kl_loss_type": "low_var_kl",
        "actor.kl_loss_coef": 0.001, "actor.entropy_coeff": 0.0,
        "actor.clip_ratio_low": 0.2, "actor.clip_ratio_high": 0.2, "actor.clip_ratio_c": 10.0,
        "actor.ppo_mini_batch_size": 8, "actor.ppo_micro_batch_size_per_gpu": 1,
        "actor.loss_agg_mode": "token-mean", "actor.grad_clip": 1.0,
        "env.step_limit.max_steps": 20, "trainer.n_gpus_per_node": 4, "trainer.nnodes": 1,
        "trainer.total_epochs": 6, "trainer.test_freq": 10, "trainer.val_before_train": True,
        "rollout.gpu_memory_utilization": 0.6, "engine": "verl",
        "seal.apatch.min_scale": 0.5, "seal.apatch.max_scale": 2.0, "seal.reward.mode": "binary",
    }
    wrong = {k: (f[k], v) for k, v in expected.items() if f[k] != v}
    assert not wrong, wrong
    # 400 training tasks / 32 -> 12 steps per epoch, x 6 epochs = 72 steps.
    assert C.total_training_steps(cfg, 400) == 72
    # The paper's method: closed-loop interface with phi_schema, phi_err(o_i, H_t) (not gated by C_t), phi_cap;
    # dynamic A-Patch.
    assert f["seal.interface.enable"] and f["seal.interface.closed_loop"] and f["seal.interface.cues"]
    assert f["seal.interface.error_feedback"] == "on"
    assert f["seal.interface.schema_required"] and f["seal.interface.schema_enum"]
    assert f["seal.apatch.enable"] and f["seal.capability.enable"]
    assert cfg.seal.apatch_config.static_weights()["spurious_tool_call"] == 2.0


ABLATIONS = {
    # recipe: (apatch.enable, capability.enable (dynamic), interface.enable, interface.closed_loop)
    "SEAL": (True, True, True, True),
    "vanilla_rl": (False, True, False, True),
    "wo_env_adaptation": (True, True, False, True),
    "wo_reweighting": (False, True, True, True),
    "wo_closed_loop": (True, False, True, False),
}


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_ablations_follow_the_released_semantics(name):
    cfg = load(name)
    apatch, dynamic, interface, closed = ABLATIONS[name]
    assert cfg.seal.apatch.enable is apatch
    assert cfg.seal.interface.enable is interface
    if apatch:  # the dynamic switch only matters when A-Patch runs
        assert cfg.seal.capability.enable is dynamic
    if interface:
        assert cfg.seal.interface.closed_loop is closed
    controller = SealController(cfg.seal)
    omega = controller.interface("train")
    assert (omega is None) is (not interface)
    assert controller.interface("val") is None
    # Same checkpoint, split, rollout budget, optimizer, decoding and reward as SEAL: only seal.apatch /
    # seal.capability / seal.interface switches and the run name differ.
    changed = diff(cfg, load("SEAL"))
    assert all(k == "experiment_name" or k.startswith(("seal.apatch.", "seal.capability.", "seal.interface."))
               for k in changed), changed


def test_release_recipe_is_the_released_setting():
    cfg = load("SEAL_release")
    assert cfg.seal.interface.enable and not cfg.seal.interface.cues
    assert cfg.seal.interface.error_feedback == "off"
    assert cfg.seal.interface.schema_required and cfg.seal.interface.schema_enum
    assert not cfg.seal.interface.schema_types and not cfg.seal.interface.schema_hide_optional
    assert cfg.seal.apatch.enable and cfg.seal.capability.enable
    assert cfg.rollout.gpu_memory_utilization == 0.4
    assert cfg.trainer.best_metric == "val/accuracy/multi_turn_base"
    omega = SealController(cfg.seal).interface("train")
    assert omega == {"version": 0, "schema": {"required": True, "enum": True, "types": False, "hide_optional": False,
                                              "release_wording": True, "skip_revealed": True},
                     "error_feedback": False, "cues": []}


@pytest.mark.parametrize("variant,base,model", [
    ("SEAL_qwen3b", "SEAL", "Qwen/Qwen2.5-3B-Instruct"),
    ("vanilla_rl_qwen3b", "vanilla_rl", "Qwen/Qwen2.5-3B-Instruct"),
    ("SEAL_toolace8b", "SEAL", "Team-ACE/ToolACE-2-Llama-3.1-8B"),
    ("vanilla_rl_toolace8b", "vanilla_rl", "Team-ACE/ToolACE-2-Llama-3.1-8B"),
])
def test_backbone_variants_change_only_the_model(variant, base, model):
    changed = diff(load(variant), load(base))
    assert set(changed) == {"experiment_name", "model.path"}
    assert changed["model.path"][0] == model


def test_tiny_cpu_is_the_embedded_default():
    cfg = C.load_config(None)
    assert cfg.experiment_name == "tiny_cpu" and cfg.engine == "local" and cfg.model.build_tiny
    assert cfg.model.warm_start.enable and cfg.model.warm_start.failing_twin
    assert cfg.rollout.n == 8 and cfg.data.max_val_tasks == 4
    assert cfg.data.train_task_ids == ("multi_turn_base_100", "multi_turn_miss_param_100")
    assert cfg.data.train_batch_size == 2 and cfg.rollout.deterministic_generation
    assert C.total_training_steps(cfg, 2) == 8 and cfg.trainer.val_before_train


def test_overrides_keep_explicit_zeros_and_parse_values():
    cfg = load("SEAL", "seal.capability.ema_beta=0", "seal.interface.min_tag_count=0", "actor.kl_loss_coef=0",
               "rollout.n=4", "env.urls=[http://127.0.0.1:1,http://127.0.0.1:2]", "trainer.total_training_steps=3")
    assert cfg.seal.capability.ema_beta == 0.0
    assert cfg.seal.evolve_config.min_tag_count == 0
    assert cfg.actor.kl_loss_coef == 0 and cfg.rollout.n == 4 and len(cfg.env.urls) == 2
    assert C.total_training_steps(cfg, 400) == 3
    weights = load("SEAL", "seal.apatch.tag_weights.pass=1.2")
    assert weights.seal.apatch_config.static_weights()["pass"] == 1.2


@pytest.mark.parametrize("override,message", [
    ("rollout.nn=4", "unknown key"),
    ("seal.apatch.vocabulary=paper", "unknown key"),  # one vocabulary switch: seal.diagnosis
    ("rollout.n=four", "rollout.n: expected int"),
    ("rollout.n=0", "rollout.n: must be >= 1"),
    ("actor.use_kl_loss=1", "expected bool"),
    ("engine=tpu", "engine: must be one of"),
    ("seal.diagnosis.vocabulary=mine", "seal.diagnosis.vocabulary"),
    ("actor.kl_loss_type=k9", "actor.kl_loss_type"),
    ("seal.interface.error_feedback=sometimes", "error_feedback"),
    ("seal.apatch.min_scale=0", "min_scale"),
    ("seal.apatch.tag_weights.not_a_tag=2", "tag_weights"),
    ("data.max_response_length=9000", "max_model_len"),
    ("actor.ppo_mini_batch_size=5", "multiple of actor.ppo_mini_batch_size"),
    ("actor.clip_ratio_c=1", "clip_ratio_c"),
    ("trainer.logger=[console,tensorboard]", r"trainer.logger\[1\]: must be one of console, jsonl, wandb"),
    ("model.build_tiny=true", "engine: local only"),
    ("noequals", "key=value"),
])
def test_bad_values_are_refused_with_a_clear_message(override, message):
    with pytest.raises(C.ConfigError, match=message):
        load("SEAL", override)


def test_recipe_errors(tmp_path):
    (tmp_path / "defaults.yaml").write_text((EXP / "defaults.yaml").read_text())
    (tmp_path / "a.yaml").write_text("defaults: [b, _self_]\n")
    (tmp_path / "b.yaml").write_text("defaults: [a, _self_]\n")
    with pytest.raises(C.ConfigError, match="cycle"):
        C.load_config(tmp_path / "a.yaml")
    (tmp_path / "typo.yaml").write_text("defaults: [defaults, _self_]\nrolout: {n: 2}\n")
    with pytest.raises(C.ConfigError, match="rolout"):
        C.load_config(tmp_path / "typo.yaml")
    with pytest.raises(C.ConfigError, match="not found"):
        C.load_config(tmp_path / "missing.yaml")
    # A recipe without a defaults list still gets the defaults underneath.
    (tmp_path / "short.yaml").write_text("experiment_name: short\nrollout: {n: 3}\n")
    cfg = C.load_config(tmp_path / "short.yaml")
    assert cfg.rollout.n == 3 and cfg.actor.lr == 1e-6


def test_typed_accessors():
    cfg = load("SEAL")
    limits = C.rollout_limits(cfg)
    assert (limits.max_prompt_length, limits.max_response_length, limits.max_model_len,
            limits.max_tokens_per_call, limits.max_observation_tokens) == (8192, 4096, 16384, 4096, 4096)
    train = C.sampling_params(cfg, "train")
    assert (train.temperature, train.top_p, train.top_k) == (1.0, 1.0, -1)
    val = C.sampling_params(cfg, "val")
    assert (val.temperature, val.top_p, val.top_k) == (0.0, 1.0, -1)
    assert C.env_service_args(cfg) == ["--step-limit-scope", "episode", "--max-steps", "20"]
    official = load("SEAL", "env.step_limit.scope=turn", "env.strict_availability=false")
    assert C.env_service_args(official) == ["--step-limit-scope", "turn", "--max-steps", "20",
                                            "--no-strict-availability"]
    assert C.run_dir(cfg, "/x") == Path("/x/runs/SEAL")
    assert load("SEAL", "seal.diagnosis.vocabulary=paper").seal.evolve_config.vocabulary == "paper"
    assert load("SEAL", "seal.diagnosis.vocabulary=paper").seal.apatch_config.tags_column == "paper_labels"
    with pytest.raises(C.ConfigError):
        C.total_training_steps(load("SEAL"), 10)  # fewer tasks than one batch


def test_saved_config_round_trips(tmp_path):
    cfg = load("wo_closed_loop")
    path = C.save_config(cfg, tmp_path / "config.yaml")
    again = OmegaConf.load(path)
    assert C.to_container(again) == C.to_container(cfg)
    C.validate(again)


# --------------------------------------------------------------------------- the typed schema
def test_load_config_returns_a_frozen_typed_recipe():
    cfg = load("SEAL", "rollout.temperature=1", "env.timeout_s=30")
    assert isinstance(cfg, C.Recipe) and isinstance(cfg.seal, SealConfig)
    # An int where a float is expected becomes a float; ints stay ints.
    assert type(cfg.rollout.temperature) is float and type(cfg.env.timeout_s) is float
    assert type(cfg.rollout.n) is int and type(cfg.trainer.logger) is tuple
    with pytest.raises(ValidationError, match="frozen"):
        cfg.rollout.n = 2  # type: ignore[misc]
    # A copy with changed values runs the same checks as loading a recipe, also one with a copied part that
    # pydantic's model_copy (which does not validate) made invalid.
    with pytest.raises(C.ConfigError, match="n: must be >= 1"):
        C.replaced(cfg.rollout, n=0)
    with pytest.raises(C.ConfigError, match="rollout.n: must be >= 1"):
        C.replaced(cfg, rollout=cfg.rollout.model_copy(update={"n": 0}))
    with pytest.raises(C.ConfigError, match="data.train_batch_size must be a multiple of actor.ppo_mini_batch_size"):
        C.replaced(cfg, actor=C.replaced(cfg.actor, ppo_mini_batch_size=5))
    assert C.replaced(cfg, rollout=C.replaced(cfg.rollout, n=4)).rollout.n == 4
    assert C.Recipe() == C.from_container(C.to_container(C.Recipe()))


def test_every_problem_of_a_load_is_listed_with_its_key():
    with pytest.raises(C.ConfigError) as info:
        load("SEAL", "rollout.nn=4", "rollout.n=four", "actor.use_kl_loss=1", "experiment_name=4",
             "env.urls=[1]", "data.max_train_tasks='4'", "actor.lr=-1", "seal.apatch.min_scale=0",
             "actor.ppo_mini_batch_size=5", "seal.diagnosis.vocabulary=mine")
    lines = info.value.problems
    expected = ["rollout.nn: unknown key", "rollout.n: expected int, got str ('four')",
                "actor.use_kl_loss: expected bool, got int (1)", "experiment_name: expected str, got int (4)",
                "env.urls[0]: expected str, got int (1)", "data.max_train_tasks: expected int | null, got str ('4')",
                "actor.lr: must be >= 0, got -1", "seal.apatch.min_scale: must lie in (0, 1], got 0",
                "seal.diagnosis.vocabulary: must be one of progress, paper, got 'mine'",
                # a rule across keys waits for the keys it reads, and says so
                "(rules across keys are checked once the problems above are fixed)"]
    missing = [e for e in expected if not any(line.startswith(e) for line in lines)]
    assert not missing, (missing, lines)
    assert len(lines) == len(expected)
    assert str(info.value).startswith("invalid config:\n  ")


@pytest.mark.parametrize("override,message", [
    ("seal.apatch.vocabulary=paper", "seal.apatch.vocabulary: unknown key .* by seal.diagnosis.vocabulary"),
    ("seal.apatch=5", "seal.apatch: expected a mapping, got int"),
    ("seal.apatch.tag_weights.pass=abc", "seal.apatch.tag_weights.pass: expected float, got str"),
    ("seal.interface.error_tags=[nope]", "seal.interface: .*'nope'.* not tags of the 'progress' vocabulary"),
    ("seal.interface.cue_texts.pass=hi", "seal.interface: .*cue_texts"),
    ("seal.reward.mode=x", "seal.reward.mode: must be one of"),
    ("rollout.top_p=0", r"rollout.top_p: must lie in \(0, 1\]"),
    ("env.timeout_s=.inf", "env.timeout_s: must be a finite number, got inf"),
    ("trainer.wandb_project=${nope}", "cannot resolve interpolations"),
])
def test_more_bad_values_name_their_key(override, message):
    with pytest.raises(C.ConfigError, match=message):
        load("SEAL", override)


def test_overrides_as_users_write_them():
    cfg = load("SEAL", "+rollout.n=3", "trainer.wandb_project=${experiment_name}",
               "seal.interface.error_tags=[empty_turn_model_response]",
               "seal.interface.cue_texts.spurious_tool_call=null")
    assert cfg.rollout.n == 3 and cfg.trainer.wandb_project == "SEAL"
    assert cfg.seal.evolve_config.feedback_tags() == ("empty_turn_model_response",)
    assert "spurious_tool_call" not in cfg.seal.evolve_config.texts()


def test_yaml_word_booleans_mean_the_word_for_string_keys_and_misspelt_keys_get_a_suggestion():
    # YAML reads `off` as false; the string key takes the word as written, a bool key still reads it as false.
    cfg = load("SEAL", "seal.interface.error_feedback=off", "seal.interface.enable=off")
    assert cfg.seal.interface.error_feedback == "off" and cfg.seal.interface.enable is False
    assert load("SEAL", "seal.interface.error_feedback=On").seal.interface.error_feedback == "on"
    with pytest.raises(C.ConfigError, match="must be one of"):  # still checked against the choices
        load("SEAL", "seal.interface.error_feedback=yes")
    with pytest.raises(C.ConfigError, match="did you mean 'seal.interface.error_feedback'"):
        load("SEAL", "seal.interface.error_feedbak=on")
    with pytest.raises(C.ConfigError, match="did you mean 'rollout.n'"):
        load("SEAL", "rollout.nn=3")


def test_the_vocabulary_is_one_switch():
    paper = load("SEAL", "seal.diagnosis.vocabulary=paper", "seal.apatch.tag_weights.argument_mismatch=1.4").seal
    assert paper.vocabulary == paper.apatch_config.vocabulary == paper.evolve_config.vocabulary == "paper"
    assert paper.apatch_config.static_weights()["argument_mismatch"] == 1.4
    with pytest.raises(C.ConfigError, match="argument_mismatch"):  # not a tag of the progress vocabulary
        load("SEAL", "seal.apatch.tag_weights.argument_mismatch=1.4")
    with pytest.raises(TypeError, match="SealConfig"):
        SealController(load("SEAL"))  # the controller takes the seal block, not the whole recipe


def test_the_recipe_inside_a_verl_config_round_trips():
    # The verl engine ships the recipe as plain containers and rebuilds it in every worker.
    cfg = load("wo_closed_loop", "seal.apatch.tag_weights.pass=1.3")
    again = C.from_container(OmegaConf.create(C.to_container(cfg)))
    assert again == cfg and again.seal.apatch_config.static_weights()["pass"] == 1.3
    with pytest.raises(C.ConfigError, match="rollout.n: must be >= 1"):
        C.from_container({**C.to_container(cfg), "rollout": {**C.to_container(cfg)["rollout"], "n": 0}})


def test_every_key_is_declared_once_with_source_and_help():
    rows = list(reference.knobs())
    keys = [r.key for r in rows]
    assert len(keys) == len(set(keys))
    # The table covers every key; the open mappings (empty by default) are one key each.
    assert set(keys) - set(flat(C.Recipe())) == {"seal.apatch.tag_weights", "seal.interface.cue_texts"}
    assert set(flat(C.Recipe())) <= set(keys)
    bad = [r.key for r in rows if r.source not in ("paper", "release", "ours") or not r.help.strip()]
    assert not bad, bad
    by_key = {r.key: r for r in rows}
    assert by_key["seal.apatch.min_scale"].source == "paper" and by_key["rollout.n"].default == 8
    assert by_key["seal.capability.ema_beta"].source == "release" and by_key["env.max_restarts"].source == "ours"
    assert "one of grpo" in by_key["algorithm.adv_estimator"].constraint


def test_generated_files_match_the_schema():
    assert reference.stale_files() == [], "run: python -m seal.recipe --write"
    defaults = C.to_container(OmegaConf.load(EXP / "defaults.yaml"))
    assert defaults == C.to_container(C.Recipe())
    table = (EXP.parent / "docs" / "config.md").read_text(encoding="utf-8")
    assert all(f"| `{key}` |" in table for key in flat(C.Recipe()))


def test_stale_generated_files_are_reported(tmp_path, monkeypatch):
    stale = tmp_path / "defaults.yaml"
    stale.write_text(reference.defaults_yaml().replace("  n: 8 ", "  n: 9 "), encoding="utf-8")
    page = tmp_path / "config.md"
    page.write_text(reference.DOCS_PAGE.read_text(encoding="utf-8"), encoding="utf-8")
    monkeypatch.setattr(reference, "DEFAULTS_FILE", stale)
    monkeypatch.setattr(reference, "DOCS_PAGE", page)
    assert reference.stale_files() == [stale]
    assert recipe_cli.main(["--check"]) == 1
    assert recipe_cli.main(["--write"]) == 0 and reference.stale_files() == []


# --------------------------------------------------------------------------- one declaration per range
def rules(info: FieldInfo) -> dict:
    """A field's declared rules, read from its pydantic declaration: `ge` / `gt` / `le` (on the field or its items),
    `min_length`, `choices` (a `Literal` type) and `off` (a one-value `Literal` beside a range, `top_k: -1`)."""
    out: dict = {}

    def visit(hint, metadata, member=False):
        out.update({k: getattr(m, k) for m in metadata for k in ("ge", "gt", "le", "min_length") if hasattr(m, k)})
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is Annotated:
            visit(args[0], [m for a in args[1:] for m in (a.metadata if isinstance(a, FieldInfo) else [a])])
        elif origin is Literal:
            out.update({"off": args[0]} if member and len(args) == 1 else {"choices": args})
        elif origin in (typing.Union, types.UnionType, list, tuple, dict):
            for a in args:
                visit(a, [], member=origin in (typing.Union, types.UnionType))

    visit(info.annotation, info.metadata)
    return out


def declared() -> list[tuple[reference.Knob, dict]]:
    """Every knob with its declared rules."""
    def meta(cls: type, prefix: str = "") -> dict[str, dict]:
        out: dict[str, dict] = {}
        for name, info in cls.model_fields.items():
            key = f"{prefix}.{name}" if prefix else name
            section = isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)
            out |= meta(info.annotation, key) if section else {key: rules(info)}
        return out

    by_key = meta(C.Recipe)
    return [(k, by_key[k.key]) for k in reference.knobs()]


def out_of_range(k: reference.Knob, meta: dict, side: str) -> str | None:
    """An override of `k` just outside its declared range on `side` (None when that side is open)."""
    if side == "low" and ("gt" in meta or "ge" in meta):
        value = meta["gt"] if "gt" in meta else meta["ge"] - 1
    elif side == "high" and "le" in meta:
        value = meta["le"] + 1
    else:
        return None
    if k.type.startswith("dict"):
        return f"{k.key}.pass={value}"
    return f"{k.key}=[{value}]" if k.type.startswith("list") else f"{k.key}={value}"


def test_every_declared_range_and_value_set_refuses_what_it_excludes():
    knobs = declared()
    ranged = [(k, m) for k, m in knobs if {"ge", "gt", "le"} & set(m)]
    assert len(ranged) >= 67 and any("off" in m for _, m in ranged)
    for side in ("low", "high"):
        overrides = [o for k, m in ranged if (o := out_of_range(k, m, side))]
        with pytest.raises(C.ConfigError) as info:
            load("SEAL", *overrides)
        for item in overrides:  # each one refused, under its own key (a mapping's item under its own)
            key = item.split("=")[0]
            assert any(line.startswith(f"{key}: must ") for line in info.value.problems), (item, info.value.problems)
    chosen = [(k, m) for k, m in knobs if "choices" in m]
    assert len(chosen) >= 19
    overrides = [f"{k.key}=[not_allowed]" if k.type.startswith("list") else f"{k.key}=not_allowed" for k, _ in chosen]
    with pytest.raises(C.ConfigError) as info:
        load("SEAL", *overrides)
    for k, _ in chosen:
        # a list's item is named by its index (`trainer.logger[0]`)
        assert any(line.split(": ")[0].split("[")[0] == k.key and "not_allowed" in line
                   for line in info.value.problems), k.key
    # The bounds themselves and the `off` value are allowed; an explicit zero stays a zero.
    edge = load("SEAL", "rollout.top_k=-1", "seal.apatch.min_scale=1", "seal.apatch.max_scale=1",
                "seal.interface.max_cues=8", "seal.apatch.tag_weights.pass=0", "rollout.temperature=0")
    assert edge.rollout.top_k == -1 and edge.seal.interface.max_cues == 8 and edge.rollout.temperature == 0
    assert edge.seal.apatch_config.static_weights()["pass"] == 0


def test_the_reference_shows_every_declared_range_and_value_set():
    table = (EXP.parent / "docs" / "config.md").read_text(encoding="utf-8")
    rows = {line.split(" | ")[0].strip("| `"): line for line in table.splitlines() if line.startswith("| `")}
    for k, meta in declared():
        constrained = bool({"choices", "ge", "gt", "le", "min_length"} & set(meta))
        assert bool(k.constraint) is constrained, k.key
        if constrained:
            assert f" | {k.constraint.replace('|', chr(92) + '|')} | " in rows[k.key], k.key
    by_key = {k.key: k.constraint for k, _ in declared()}
    assert by_key["seal.apatch.min_scale"] == "(0, 1]" and by_key["seal.apatch.max_scale"] == ">= 1"
    assert by_key["rollout.top_k"] == ">= 1 or -1 (off)" and by_key["seal.apatch.tag_weights"] == "each >= 0"
    assert by_key["seal.interface.max_cues"] == "[0, 8]" and by_key["seal.capability.ema_beta"] == "[0, 1]"
    assert by_key["trainer.logger"] == "each one of console, jsonl, wandb"


def test_no_private_omegaconf_attributes_in_seal():
    # Only OmegaConf's public API (pinned in pyproject.toml): no `x._name` on anything but self / cls in a
    # module that imports omegaconf.
    root = EXP.parent / "seal"
    uses = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "omegaconf" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and ast.unparse(node.value) not in ("self", "cls")):
                uses.append(f"{path.relative_to(root.parent)}:{node.lineno} {ast.unparse(node)}")
    assert uses == []
    pins = (EXP.parent / "pyproject.toml").read_text(encoding="utf-8")
    assert '"omegaconf==2.3.*"' in pins and '"hydra-core==1.3.*"' in pins
