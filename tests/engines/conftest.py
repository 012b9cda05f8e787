"""Fixtures the engine tests share."""

import pytest


@pytest.fixture(scope="module")
def tiny_verl_model_dir(tmp_path_factory):
    """A tiny Qwen2 config (no weights) and the offline Qwen2.5 tokenizer: what verl's trainer is built from in the
    tests that construct `SealTrainer` without Ray."""
    pytest.importorskip("verl")
    from seal.models.qwen25 import build_qwen_tokenizer
    from seal.models.tiny import tiny_qwen2_config

    path = tmp_path_factory.mktemp("tiny_qwen2_cfg")
    cfg = tiny_qwen2_config()
    cfg.architectures = ["Qwen2ForCausalLM"]
    cfg.save_pretrained(str(path))
    build_qwen_tokenizer().save_pretrained(str(path))
    return path
