"""The console commands (`[project.scripts]`): each works from any directory, and configuration, `--dry-run`,
`--help`, errors and the model-free evaluation policies never import torch (they start in a couple of seconds)."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]

# Runs an entry point the way its console script does, then says whether torch was imported.
RUNNER = """
import importlib, sys
module, function = sys.argv[1].split(":")
try:
    code = getattr(importlib.import_module(module), function)(sys.argv[2:])
except SystemExit as exc:
    code = exc.code
print("torch imported" if "torch" in sys.modules else "torch not imported")
sys.exit(code or 0)
"""


def command(cwd: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "BFCL_PROJECT_ROOT": str(cwd / "bfcl_root")}
    return subprocess.run([sys.executable, "-c", RUNNER, SCRIPTS[name], *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_four_commands_are_declared():
    assert set(SCRIPTS) == {"seal-train", "seal-eval", "seal-env", "seal-tables"}


@pytest.mark.parametrize("name", ["seal-train", "seal-eval", "seal-env", "seal-tables"])
def test_help_from_any_directory_without_torch(tmp_path, name):
    out = command(tmp_path, name, "--help")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: {name} ")  # the usage line names the console command
    assert out.stdout.rstrip().endswith("torch not imported")


def test_env_help_documents_every_flag_with_its_default(tmp_path):
    options = " ".join(command(tmp_path, "seal-env", "--help").stdout.split()).split("options:", 1)[1]
    for flag, default in (("--host", "127.0.0.1"), ("--port", "8082"), ("--max-steps", "20"), ("--ttl", "3600.0"),
                          ("--workers", "4"), ("--max-body-bytes", "1048576"), ("--log-level", "warning")):
        entry = options.split(f" {flag} {flag[2:].upper().replace('-', '_')} ", 1)[1]  # its entry: flag METAVAR
        assert entry.split("(default: ", 1)[1].startswith(f"{default})"), flag  # its own help and default


def test_tables_without_a_row_says_so(tmp_path):
    out = command(tmp_path, "seal-tables")
    assert out.returncode == 2 and "no row given" in out.stderr


def test_dry_run_and_config_errors_without_torch(tmp_path):
    dry = command(tmp_path, "seal-train", "--conf", "exp/tiny_cpu.yaml", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "experiment_name: tiny_cpu" in dry.stdout and dry.stdout.rstrip().endswith("torch not imported")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, from any directory
    bad = command(tmp_path, "seal-train", "--conf", "exp/tiny_cpu.yaml", "rollout.nn=3", "--dry-run")
    assert bad.returncode == 2 and "unknown key 'rollout.nn'" in bad.stderr
    assert bad.stdout.rstrip().endswith("torch not imported")
    policy = command(tmp_path, "seal-eval", "--policy", "hf_typo", "--tasks", "multi_turn_base_1")
    assert policy.returncode == 2 and "unknown policy" in policy.stderr
    assert policy.stdout.rstrip().endswith("torch not imported")


@pytest.mark.parametrize("policy", ["empty", "ground_truth"])
def test_model_free_evaluations_never_import_torch(tmp_path, service_url, policy):
    out = command(tmp_path, "seal-eval", "--policy", policy, "--tasks", "multi_turn_base_1", "--env-url",
                  service_url, "--no-progress")
    assert out.returncode == 0, out.stderr
    assert out.stdout.rstrip().endswith("torch not imported")
    assert (tmp_path / "evals" / f"{policy}_multi_turn_base_1" / "summary.json").is_file()
