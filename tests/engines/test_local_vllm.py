"""The local engine's `rollout.backend`: vLLM in the training process (the real CPU build, no fakes), its weights
synced after every update and checked against the actor's log-probs; the engine learning with it (the embedded
default's warm start on a vLLM-capable tiny model); `auto`'s choice; the recipe rules."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from pathlib import Path

import pytest
import torch

from seal import recipe as C
from seal.engines import warm_start as W
from seal.engines.local import backend as B
from seal.engines.local import engine as E
from seal.rollout.types import SamplingParams
from tests.engines.test_local_engine import _resume_cfg
from tests.run_watch import SegmentWatch, shm_leftovers

REPO = Path(__file__).resolve().parents[2]
# The vLLM-capable tiny model (head_dim 32) of exp/tiny_verl_learn.yaml, on exp/tiny_cpu.yaml's task pair.
LEARN_MODEL = ("model.tiny.heads=2", "model.tiny.kv_heads=2", "model.warm_start.max_steps=140")
PROBE = [151644, 872, 198, 9707, 11, 1879, 0, 151645, 198, 151644, 77091, 198]  # a user turn + assistant header


def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def learn_model_cache(tmp_path_factory) -> Path:
    """One model cache for the warm-started vLLM-capable tiny model, shared by the pytest-xdist workers of a
    session (their base temporary directories' parent): the local engine's learning test and the verl one
    (tests/engines/test_verl_learn.py) build the same warm start (same inputs, same cache key), so whichever runs
    second loads it. In CI they run on different workers, the local one early and the verl one on the engines
    worker's longest path, which then skips the build. Builds are atomic (`seal.models.build_atomically`): two at
    once both end with one complete copy."""
    base = tmp_path_factory.getbasetemp()
    path = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "learn_models"
    path.mkdir(exist_ok=True)
    return path


def learn_paths(cache: Path) -> tuple[str, ...]:
    return (f"model.path={cache / 'tiny_qwen2_h2'}", f"model.warm_start.path={cache / 'tiny_qwen2_h2_warm'}")




@pytest.fixture(scope="module")
def peaked(tmp_path_factory):
    """A vLLM-capable tiny Qwen2 (head_dim 32) whose next-token distributions are peaked (sampled tokens have
    probabilities around 0.2, not the 1/150k of a random model), so that a change of weights shows in them."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.models.tiny import build_tiny_qwen2

    path = build_tiny_qwen2(tmp_path_factory.mktemp("peaked"), hidden=64, layers=2, heads=2, kv_heads=1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(10.0)  # logits x10
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(path).save_pretrained(path)
    return path


def _probe(run: E.LocalRun, ids: list[int] | None = None) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """vLLM's greedy tokens after PROBE with their log-probs, and the actor's log-probs of `ids` (default: those
    tokens) from a full forward."""
    gen = asyncio.run(run.episodes.generate(PROBE, SamplingParams(temperature=0.0, max_tokens=6)))
    ids = ids if ids is not None else gen.token_ids
    with torch.no_grad():
        logits = run.model(torch.tensor([PROBE + ids])).logits[0, len(PROBE) - 1:-1].float()
    actor = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
    return gen.token_ids, torch.tensor(gen.logprobs), actor


@pytest.mark.slow  # builds an in-process vLLM engine and trains two steps against the env service (~1-2 min)
@pytest.mark.xdist_group("engines")  # one engine at a time (tests/conftest.py)
def test_vllm_backend_samples_with_the_updated_weights(tmp_path, peaked, service_url):
    pytest.importorskip("vllm")
    import psutil

    shm_before, children_before = _shm(), set(psutil.Process().children(recursive=True))  # the env service's
    # An entropy bonus gives the random model's update a gradient (its rewards are all 0): the weights move.
    cfg = _resume_cfg(tmp_path, peaked, service_url, ("rollout.backend=vllm", "rollout.deterministic_generation=false",
                                                      "actor.entropy_coeff=0.01", "trainer.save_freq=0"))
    with SegmentWatch() as segments:  # the engine's segments: it runs in this process
        run = E.setup(cfg, C.run_dir(cfg))
        try:
            assert isinstance(run.vllm, E.ColocatedVLLM) and run.episodes.generate is run.vllm
            ids0, vllm0, actor0 = _probe(run)
            assert (vllm0.exp() - actor0.exp()).abs().max() < 1e-3
            metrics = [E.training_step(run, step) for step in (1, 2)]
            for m in metrics:
                assert m["actor/update_skipped"] == 0.0 and "timing/weight_sync" in m
                assert m["rollout/probs_diff_max"] < 1e-3, m
                assert 0 <= m["rollout/probs_diff_mean"] <= m["rollout/probs_diff_max"]
            # The updates moved the policy: vLLM's log-probs from before them are off by far more than the check
            # allows, so stale weights would have failed step 2's check; the synced engine agrees with the actor.
            _, _, actor_now = _probe(run, ids0)
            assert (vllm0.exp() - actor_now.exp()).abs().max() > 1e-2
            _, vllm_now, actor_now = _probe(run)
            assert (vllm_now.exp() - actor_now.exp()).abs().max() < 1e-3
        finally:
            E.close(run)
    assert not [t for t in threading.enumerate() if t.name == "vllm-generation"]  # the worker ended
    assert set(psutil.Process().children(recursive=True)) <= children_before  # in-process: no engine process
    assert not shm_leftovers(shm_before, segments.seen)


@pytest.mark.slow  # the warm start (~2 min, shared with the verl learning test) and 3 steps (~1 min each)
def test_the_local_engine_learns_with_vllm(tmp_path, tmp_path_factory, service_url, monkeypatch):
    """exp/tiny_cpu.yaml's warm start and task pair on the vLLM-capable tiny model, with `rollout.backend: vllm`:
    every step whose groups have a reward spread updates the actor, vLLM samples with the synced weights
    (`rollout/probs_diff_max`), and the exact probability of each task's ground truth rises."""
    pytest.importorskip("vllm")
    cache = learn_model_cache(tmp_path_factory)
    monkeypatch.setenv("SEAL_MODEL_CACHE", str(cache))  # model.build_tiny builds only inside the model cache
    cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", [
        *LEARN_MODEL, *learn_paths(cache), f"env.urls=[{service_url}]", f"run_root={tmp_path}",
        "rollout.backend=vllm", "rollout.deterministic_generation=false", "trainer.total_training_steps=3",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=0"])
    run = E.setup(cfg, C.run_dir(cfg))
    try:
        assert isinstance(run.vllm, E.ColocatedVLLM)
        episodes = W.probe_episodes(cfg.model.warm_start.path)
        gt = [i for i, e in enumerate(episodes) if e["kind"] == "ground_truth"]
        assert len(gt) == 2
        start = W.probe_episode_probs(run.model, episodes)
        info = json.loads((Path(cfg.model.warm_start.path) / W.INFO_FILE).read_text())
        for i in gt:  # the warm start's own measurement of the model the run starts from
            assert start[i] == pytest.approx(info["prob"][episodes[i]["task_id"]], rel=1e-4)
            assert 0.1 < start[i] < 0.9  # the decision is open: groups can mix
        metrics = []
        for step in (1, 2, 3):
            m = E.training_step(run, step)
            metrics.append(m)
            print(f"step {step}: reward {m['train/reward_mean']:.3f} skipped {m['actor/update_skipped']} "
                  f"probs_diff_max {m['rollout/probs_diff_max']:.2e} step {m.get('timing/step', float('nan')):.0f} s")
            assert m["rollout/probs_diff_max"] < 1e-3, m  # vLLM sampled with the weights of the last update
        end = W.probe_episode_probs(run.model, episodes)
    finally:
        E.close(run)
    assert any(m["actor/update_skipped"] == 0.0 for m in metrics)
    print("p(ground truth):", [round(start[i], 3) for i in gt], "->", [round(end[i], 3) for i in gt])
    assert sum(end[i] for i in gt) > sum(start[i] for i in gt) + 0.1, (start, end)


def test_auto_takes_hf_for_a_model_vllm_cannot_run(tmp_path):
    pytest.importorskip("vllm")
    from seal.models.tiny import build_tiny_qwen2

    small = build_tiny_qwen2(tmp_path / "tiny16")  # the default tiny model: 4 heads of 16
    cpu = torch.device("cpu")
    cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", [f"model.path={small}", "model.build_tiny=false",
                                                         "rollout.deterministic_generation=false"])
    backend, why = B.choose_backend(cfg.rollout, small, cpu)
    assert backend == "hf" and "head_dim 16" in why
    vllm_cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", [f"model.path={small}", "model.build_tiny=false",
                                                              "rollout.deterministic_generation=false",
                                                              "rollout.backend=vllm"])
    with pytest.raises(ValueError, match="head_dim 16"):
        B.choose_backend(vllm_cfg.rollout, small, cpu)
    # The README's recipe as it is: HF, one call at a time.
    assert B.choose_backend(C.load_config(REPO / "exp" / "tiny_cpu.yaml").rollout, small, cpu)[0] == "hf"
    # A model vLLM runs: on CPU, vLLM exactly where it was measured faster.
    capable = build_tiny_qwen2(tmp_path / "tiny32", hidden=64, layers=1, heads=2, kv_heads=1)
    faster = B.MEASURED_VLLM_SPEEDUP_CPU > 1.0
    assert B.choose_backend(cfg.rollout, capable, cpu)[0] == ("vllm" if faster else "hf")
    cuda_cfg = C.load_config(REPO / "exp" / "tiny_cpu.yaml", [f"model.path={capable}", "model.build_tiny=false",
                                                              "rollout.deterministic_generation=false",
                                                              "rollout.backend=vllm"])
    cuda = torch.device("cuda")
    backend, why = B.choose_backend(cfg.rollout, capable, cuda)
    assert backend == "hf" and "CPU build" in why  # this vLLM is the CPU build
    with pytest.raises(ValueError, match="CPU build"):
        B.choose_backend(cuda_cfg.rollout, capable, cuda)


def test_auto_takes_vllm_on_a_gpu_whenever_its_gpu_build_runs_the_model(monkeypatch, tmp_path):
    """No GPU here: `vllm_cannot_run` (which asks the installed vLLM whether its build matches the device) is
    replaced by a stand-in answering as a GPU build of vLLM would; the rule under test is choose_backend's."""
    cfg = C.load_config(REPO / "exp" / "local_1gpu.yaml")
    cuda = torch.device("cuda")
    asked = []
    monkeypatch.setattr(B, "vllm_cannot_run", lambda path, device_type: asked.append(device_type))
    backend, why = B.choose_backend(cfg.rollout, tmp_path, cuda)
    assert (backend, asked) == ("vllm", ["cuda"]) and "cuda build is installed" in why
    monkeypatch.setattr(B, "vllm_cannot_run", lambda path, device_type: "vLLM is not installed")
    assert B.choose_backend(cfg.rollout, tmp_path, cuda) == ("hf", "auto: vLLM is not installed")
    deterministic = C.load_config(REPO / "exp" / "local_1gpu.yaml", ["rollout.deterministic_generation=true"])
    assert B.choose_backend(deterministic.rollout, tmp_path, cuda)[0] == "hf"


def test_backend_rules_of_the_recipe():
    with pytest.raises(C.ConfigError, match="deterministic_generation"):
        C.load_config(REPO / "exp" / "tiny_cpu.yaml", ["rollout.backend=vllm"])
    with pytest.raises(C.ConfigError, match="rollout.backend is the local engine's"):
        C.load_config(REPO / "exp" / "SEAL.yaml", ["rollout.backend=hf"])
    assert C.load_config(REPO / "exp" / "tiny_cpu.yaml").rollout.backend == "auto"
