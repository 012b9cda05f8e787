"""`python launcher.py --conf exp/tiny_verl_learn.yaml`: verl's own trainer LEARNS on CPU, on two ranks, and resumes.

The run is the verl engine's whole path in the GPU recipe's layout (verl's `run_ppo` -> the `seal` trainer mode ->
two vLLM async server replicas on vLLM's CPU build -> the FSDP2 actor sharded over two gloo ranks, the KL loss and
so a reference pass -> verl's weight sync into both replicas after every update), on exp/tiny_cpu.yaml's task pair
with its warm start, here on the vLLM-capable tiny model (head_dim 32). Two launches, as a user who stops and
resumes: steps 1-2 with a save at each, then the same command resumes from step 2's save for step 3. Checked per
step, from the run's metrics.jsonl:

- every step whose groups have a reward spread takes a real update (`actor/update_skipped` 0), the others skip it;
  the KL term is in the loss (`actor/kl_loss`);
- vLLM sampled with the actor's weights (`training/rollout_probs_diff_max` < 1e-3);
- both replicas served the step's requests (vLLM's own counters), and both hold the same weights: the weight probe,
  read from every replica right after each sync, agrees between them, and changed on every replica after an update
  and on none after a skipped one;
- the resume continues the step count and the p(ground truth) curve (the resumed weights' probe equals the probe
  after step 2), every save holds the shards of a world of 2, and the exact probability of each task's ground truth
  rises from the warm start's; the final checkpoint's Hugging Face weights give the probability the vLLM servers
  reported (the warm start's own measurement).

One seed; each launch's every process is killed at a hard bound (a hang guard, not a speed bound); every listener
of the run is on loopback but torch's store (tests/engines/test_verl_cpu_run.py, `launch_verl`), and none of the
run's processes, /dev/shm segments or semaphores may be left.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from env_service.process import free_port
from tests.engines.test_local_vllm import learn_model_cache, learn_paths
from tests.engines.test_verl_cpu_run import by_step, launch_verl

pytest.importorskip("verl")
pytest.importorskip("vllm")

REPO = Path(__file__).resolve().parents[2]
CONF = "exp/tiny_verl_learn.yaml"
# Hang guards, not speed bounds; docs/verl_engine.md ("Learning on CPU") has the measured times.
FIRST_TIMEOUT_S = 2400
RESUME_TIMEOUT_S = 1500
STEPS = 3
RANKS = 2


def _group_spread(advantages_file: Path) -> dict[int, bool]:
    """Per step: does some GRPO group (the rollouts of one prompt, `uid`) hold different rewards? Only such a
    group has nonzero advantages, so only then is there a learning signal. (A spread across the batch is not
    one: a step whose one task scored 0 four times and the other 1 four times has none; measured.)"""
    from seal.engines.advantage_record import read_records

    out = {}
    for step, record in read_records(advantages_file).items():
        groups: dict[str, set[float]] = {}
        for row in record["rows"]:
            groups.setdefault(row["uid"], set()).add(row["reward"])
        out[step] = any(len(rewards) > 1 for rewards in groups.values())
    return out


def _step_checked(step: int, m: dict, spread: bool) -> bool:
    """One training step's checks (`spread`: some group has a reward spread); True when it took a real update."""
    print(f"step {step}: reward {m['train/reward_mean']:.3f} skipped {m['actor/update_skipped']} "
          f"kl_loss {m.get('actor/kl_loss', float('nan')):.2e} "
          f"probs_diff_max {m['training/rollout_probs_diff_max']:.2e} "
          f"probe change {[round(m[f'probe/replica_{r}/max_token_change'], 4) for r in range(RANKS)]} "
          f"replica diff {m['probe/replica_max_diff']:.1e} "
          f"requests {[m[f'rollout/server_requests/replica_{r}'] for r in range(RANKS)]} "
          f"step {m['timing_s/step']:.0f} s (gen {m['timing_s/gen']:.0f}, old {m['timing_s/old_log_prob']:.0f}, "
          f"ref {m.get('timing_s/ref', float('nan')):.0f}, update {m['timing_s/update_actor']:.0f}, "
          f"sync {m['timing_s/update_weights']:.1f}, probe {m['timing_s/weight_probe']:.1f})")
    assert m["actor/update_skipped"] == (0.0 if spread else 1.0), m
    if spread:
        assert "actor/kl_loss" in m, sorted(m)  # the KL term is in the loss (use_kl_loss on)
    # The rollouts were sampled with the weights of the previous update (fp32 on both sides).
    assert m["training/rollout_probs_diff_max"] < 1e-3, m
    # Both replicas served this step's episodes (vLLM's own finished-request counters, probes excluded) ...
    assert m["probe/replicas"] == RANKS
    for r in range(RANKS):
        assert m[f"rollout/server_requests/replica_{r}"] > 0, m
    # ... and hold the same weights, which changed on every replica after an update and on none after a skip.
    assert m["probe/replica_max_diff"] < 1e-4, m
    for r in range(RANKS):
        change = m[f"probe/replica_{r}/max_token_change"]
        assert change > 1e-4 if spread else change < 1e-6, (r, m)
    return spread


def _policy_checked(run: Path, full: set[int], pruned: set[int]) -> None:
    """The checkpoint policy at keep_full_checkpoints 1: every reference holds, the newest and the best saves are
    full (shards of both ranks, optimizer, export), older ones keep only their Hugging Face export."""
    from seal.engines.checkpoint_policy import check_run_references

    assert check_run_references(run, keep=1) == []
    for step in full | pruned:
        actor = run / "checkpoints" / f"global_step_{step}" / "actor"
        assert (actor / "huggingface" / "config.json").is_file(), step
        assert any(actor.glob("optim_world_size_*")) == (step in full), (step, sorted(p.name for p in actor.iterdir()))
        assert any(actor.glob("model_world_size_*")) == (step in full), step


@pytest.mark.slow
@pytest.mark.xdist_group("engines")  # one engine at a time (tests/conftest.py)
def test_verl_learns_on_two_ranks_and_resumes(tmp_path, tmp_path_factory, monkeypatch):
    import torch
    from transformers import AutoModelForCausalLM

    from seal.engines import warm_start as W

    cache = learn_model_cache(tmp_path_factory)
    port = free_port()
    # The run's checkpoint-signing key (launch_verl's XDG_CONFIG_HOME), for the reference checks made here.
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    # model.build_tiny builds only inside the model cache; the trainer checks every checkpoint reference after each
    # save and after the resume (`seal.engines.checkpoint_policy`, a CI-only switch: each save then waits for its
    # signing), under the recipe's tightest policy, keep_full_checkpoints 1.
    env = {"SEAL_MODEL_CACHE": str(cache), "SEAL_CHECK_RUN_REFERENCES": "1"}
    launch_verl(tmp_path, port, *learn_paths(cache), "trainer.total_training_steps=2", timeout=FIRST_TIMEOUT_S,
                conf=CONF, **env)
    run = tmp_path / "tiny_verl_learn"
    ck = run / "checkpoints"
    assert json.loads((ck / "latest.json").read_text())["step"] == 2
    # The actor is sharded over the two ranks: each full save holds the shards of a world of 2.
    shards = sorted(p.name for p in (ck / "global_step_2" / "actor").glob("model_world_size_*"))
    assert shards == [f"model_world_size_{RANKS}_rank_{r}.pt" for r in range(RANKS)], shards
    _policy_checked(run, full={2}, pruned={1})


    # The same command again, with the recipe's 3 steps: verl resumes from step 2's save, SEAL state included.
    log = launch_verl(tmp_path, port, *learn_paths(cache), timeout=RESUME_TIMEOUT_S, conf=CONF, **env)
    assert "Resuming from" in log and "global_step_2" in log, log[-4000:]
    assert "resumed SEAL state from" in log
    rows = by_step(run / "metrics.jsonl")
    assert sorted(rows) == [1, 2, 3], sorted(rows)  # the step count continues; metrics.jsonl holds each once

    warm = cache / "tiny_qwen2_h2_warm"
    episodes = W.probe_episodes(warm)
    tasks = [e["task_id"] for e in episodes if e["kind"] == "ground_truth"]
    assert len(tasks) == 2
    start = json.loads((warm / W.INFO_FILE).read_text())["prob"]  # the warm start's p(ground truth), from HF
    for task in tasks:  # vLLM's probe of the starting weights is the warm start's own measurement
        assert rows[1][f"probe/start/p_ground_truth/{task}"] == pytest.approx(start[task], rel=1e-3)
        # The resume continues the curve: the resumed weights are the ones step 2 ended with.
        assert rows[3][f"probe/start/p_ground_truth/{task}"] == pytest.approx(rows[2][f"probe/p_ground_truth/{task}"],
                                                                           rel=1e-4)
    spread = _group_spread(run / "advantages.jsonl")
    updated = [step for step in range(1, STEPS + 1) if _step_checked(step, rows[step], spread[step])]
    assert updated, "no step had a reward spread: the warm start should leave the decision open"

    _policy_checked(run, full={2, 3}, pruned={1})  # step 2 is the best (its validation came first), 3 the newest
    end = {t: rows[STEPS][f"probe/p_ground_truth/{t}"] for t in tasks}
    # The bar docs/verl_engine.md states: the two tasks' p(ground truth) rise by 0.1 in sum (0.05 each on average).
    assert sum(end.values()) > sum(start[t] for t in tasks) + 0.1, (start, end)
    # verl's update used A-Patch's advantages: the per-row record, recomputed (GRPO from the rewards x each row's
    # A-Patch scale from its tags), at every step of both launches.
    from seal.engines.advantage_record import check_advantage_record

    record = check_advantage_record(run / "advantages.jsonl", steps=list(range(1, STEPS + 1)))
    print("advantage record:", record)
    assert record["scaled"] > 0, record
    # One sampler for every engine: the last validation's greedy episode (step 3, verl's vLLM server) gives the same
    # token ids as `seal-eval --policy vllm:` on step 3's checkpoint export with the run's vLLM settings, against an
    # env service started with the run's settings.
    from env_service.process import running_service
    from seal import recipe as C
    from seal.eval.same_tokens import same_tokens_as_vllm_policy

    recipe = C.load_saved_config(run / "config.yaml")
    with running_service(C.env_service_args(recipe)) as (url, _proc):
        same = same_tokens_as_vllm_policy(run, url)
    print("same tokens:", {k: same[k] for k in ("task_id", "step", "same", "first_difference")})
    assert same["same"], same["first_difference"]
    # The final checkpoint's weights, measured as the warm start measures them, are the ones vLLM served.
    hf = ck / f"global_step_{STEPS}" / "actor" / "huggingface"
    model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    probs = W.probe_episode_probs(model, episodes)
    for e, p in zip(episodes, probs, strict=True):
        if e["kind"] == "ground_truth":
            assert p == pytest.approx(end[e["task_id"]], rel=1e-3)


# --------------------------------------------------------------------------- the pieces, fast
def test_weight_probe_reads_reply_probabilities_and_their_change():
    from seal.engines.verl.trainer import WeightProbe

    episodes = [{"task_id": "a", "kind": "ground_truth", "token_ids": [5, 6, 7, 8], "reply_positions": [2, 3]},
                {"task_id": "a", "kind": "twin", "token_ids": [5, 6, 9], "reply_positions": [2]}]
    table = {(5, 6, 7, 8): [-9.0, -0.5, -0.25], (5, 6, 9): [-9.0, -1.0]}  # log-probs of tokens 1..n-1
    replica_1 = dict(table)  # the second replica holds the same weights

    def both(ids):
        return [table[tuple(ids)], replica_1[tuple(ids)]]

    probe = WeightProbe(episodes)
    start = probe.measure(both)
    assert start["probe/start/p_ground_truth/a"] == pytest.approx(2.718281828 ** -0.75)
    assert start["probe/start/p_twin/a"] == pytest.approx(2.718281828 ** -1.0)
    assert start["probe/start/logprob"] == pytest.approx(-1.75)
    assert start["probe/start/replicas"] == 2 and start["probe/start/replica_max_diff"] == 0.0
    assert not any(k.startswith("probe/") and not k.startswith("probe/start/") for k in start)
    same = probe.measure(both)
    assert same["probe/logprob_change"] == 0.0 and same["probe/max_token_change"] == 0.0
    assert same["probe/replica_0/max_token_change"] == same["probe/replica_1/max_token_change"] == 0.0
    table[(5, 6, 7, 8)] = [-8.0, -0.25, -0.25]  # a prompt token's change counts too, not only the replies'
    moved = probe.measure(both)  # replica 1 missed the sync: its probe did not change, and the replicas differ
    assert moved["probe/logprob_change"] == pytest.approx(0.25)
    assert moved["probe/max_token_change"] == moved["probe/replica_0/max_token_change"] == pytest.approx(1.0)
    assert moved["probe/replica_1/max_token_change"] == 0.0
    assert moved["probe/replica_max_diff"] == pytest.approx(1.0)
    assert moved["probe/p_ground_truth/mean"] == pytest.approx(2.718281828 ** -0.5)
    with pytest.raises(RuntimeError, match="1 replicas, 2 at the sync before"):
        probe.measure(lambda ids: [table[tuple(ids)]])


def test_served_requests_are_read_from_each_vllm_server_counter():
    """`rollout/server_requests/replica_<r>`: vLLM's own finished-request counter of each replica, read over HTTP
    from a real server speaking Prometheus' text format (summed over finish reasons), as a difference between two
    readings; a server without the counter is an error naming it, never a 0."""
    from http.server import BaseHTTPRequestHandler

    from seal.engines.verl.trainer import ServedRequests, server_request_count
    from tests.helpers import BackgroundHTTPServer

    body = {"n": 3.0}

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self):
            text = ("# HELP vllm:request_success_total Count of successfully processed requests.\n"
                    "# TYPE vllm:request_success_total counter\n"
                    f'vllm:request_success_total{{engine="0",finished_reason="stop"}} {body["n"]}\n'
                    'vllm:request_success_total{engine="0",finished_reason="length"} 2.0\n'
                    'vllm:request_success_created{engine="0",finished_reason="stop"} 1.7e9\n').encode()
            if self.path != "/metrics":
                text = b"no"
            self.send_response(200)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args):
            pass

    with BackgroundHTTPServer(Metrics) as server:
        address = server.address.removeprefix("http://")
        assert server_request_count(address) == 5.0
        served = ServedRequests()
        assert served.since_last([5.0, 7.0]) == {"rollout/server_requests/replica_0": 5.0,
                                                  "rollout/server_requests/replica_1": 7.0}
        served.reset([6.0, 7.0])
        body["n"] = 10.0
        assert served.since_last([server_request_count(address), 9.0]) == {
            "rollout/server_requests/replica_0": 6.0, "rollout/server_requests/replica_1": 2.0}
        with pytest.raises(RuntimeError, match="2 did before"):
            served.since_last([1.0])

    class Empty(Metrics):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    with BackgroundHTTPServer(Empty) as server, pytest.raises(RuntimeError, match="no vllm:request_success_total"):
        server_request_count(server.address.removeprefix("http://"))


def test_node_settings_split_the_cores_and_keep_the_process_group_on_loopback(monkeypatch):
    from seal import recipe as C
    from seal.engines.verl.launch import node_env_vars

    for key in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3})
    two = node_env_vars(C.load_config(REPO / "exp" / "tiny_verl_learn.yaml"))
    assert two == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "2",
                   "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    one = node_env_vars(C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["trainer.n_gpus_per_node=1"]))
    assert one["OMP_NUM_THREADS"] == "4" and "VLLM_CPU_OMP_THREADS_BIND" not in one  # one replica: vLLM binds
    gpu = node_env_vars(C.load_config(REPO / "exp" / "SEAL.yaml"))
    assert gpu == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}  # no CPU settings on a GPU run
    assert "GLOO_SOCKET_IFNAME" not in node_env_vars(C.load_config(REPO / "exp" / "SEAL.yaml", ["trainer.nnodes=2"]))
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the user's choice wins
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    mine = node_env_vars(C.load_config(REPO / "exp" / "tiny_verl_learn.yaml"))
    assert mine["NCCL_SOCKET_IFNAME"] == "ib0" and mine["OMP_NUM_THREADS"] == "1"


def test_the_learning_recipe_and_its_knobs():
    from seal import recipe as C
    from seal.engines.verl.config import to_verl_config

    cfg = C.load_config(REPO / "exp" / "tiny_verl_learn.yaml")
    assert cfg.engine == "verl" and cfg.trainer.device == "cpu" and cfg.model.warm_start.enable
    tiny = cfg.model.tiny
    assert tiny.hidden // tiny.heads >= 32  # vLLM's CPU attention
    # The tiny model's heads must divide: checked with the recipe.
    with pytest.raises(C.ConfigError, match="multiple of heads"):
        C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["model.tiny.heads=3"])
    with pytest.raises(C.ConfigError, match="multiple of model.tiny.kv_heads"):
        C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["model.tiny.kv_heads=2", "model.tiny.heads=1"])
    # A warm start runs on the CPU before verl starts: not for a GPU run.
    with pytest.raises(C.ConfigError, match="warm_start.enable"):
        C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["trainer.device=cuda", "model.build_tiny=false"])
    # Rollout correction: off by default (verl's null), passed through when set, a threshold for rejection.
    corr = to_verl_config(cfg, "/tmp/x").algorithm.rollout_correction
    assert corr.rollout_is is None and corr.rollout_rs is None and corr.bypass_mode is False
    on = C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["algorithm.rollout_correction.rollout_is=token",
                                                               "algorithm.rollout_correction.rollout_is_threshold=3",
                                                               "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
                                                               "algorithm.rollout_correction.rollout_rs_threshold='0.01'"])
    corr = to_verl_config(on, "/tmp/x").algorithm.rollout_correction
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.rollout_rs, corr.rollout_rs_threshold) == (
        "token", 3.0, "seq_mean_k3", "0.01")
    with pytest.raises(C.ConfigError, match="rollout_rs_threshold"):
        C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["algorithm.rollout_correction.rollout_rs=token_k1"])
    with pytest.raises(C.ConfigError, match="rollout_is"):
        C.load_config(REPO / "exp" / "tiny_verl_learn.yaml", ["algorithm.rollout_correction.rollout_is=tokens"])
    with pytest.raises(C.ConfigError, match="engine: verl"):
        C.load_config(REPO / "exp" / "tiny_cpu.yaml", ["algorithm.rollout_correction.rollout_is=token"])


def test_a_cached_tiny_model_of_another_shape_is_refused(tmp_path, monkeypatch):
    from seal.models.tiny import prepare_tiny_model

    monkeypatch.setenv("SEAL_MODEL_CACHE", str(tmp_path))
    built = prepare_tiny_model(tmp_path / "tiny", hidden=64, heads=2, kv_heads=1)
    assert prepare_tiny_model(tmp_path / "tiny", hidden=64, heads=2, kv_heads=1) == built
    with pytest.raises(ValueError, match="num_attention_heads 2 != 4"):
        prepare_tiny_model(tmp_path / "tiny", hidden=64)  # the default shape: 4 heads, 2 KV heads


def test_the_weight_probe_waits_for_the_replicas_within_a_bound(monkeypatch):
    """A vLLM replica that never answers the probe is an error naming the wait, not a hang (real Ray actors)."""
    import time
    from types import SimpleNamespace

    import ray

    from seal.engines.verl import adapter

    ray.init(address="local", num_cpus=1, include_dashboard=False)
    try:
        @ray.remote
        class Silent:
            def generate(self, ids, params, request_id):
                time.sleep(30)

        monkeypatch.setattr(adapter, "PROBE_TIMEOUT_S", 1.0)
        trainer = SimpleNamespace(llm_server_manager=SimpleNamespace(server_handles=[Silent.remote()]))
        with pytest.raises(TimeoutError, match="1 vLLM replica.*3-token.*within 1 s"):
            adapter.TrainerAdapter.rollout_prompt_logprobs(trainer, [1, 2, 3])
    finally:
        ray.shutdown()
