"""Offline Qwen2.5 tokenizer (seal.models.qwen25), its fast encoder (seal.rollout.codec) and tiny Qwen2 model
(seal.models.tiny)."""

from __future__ import annotations

import unicodedata

import pytest

from seal.models import qwen25 as qt
from seal.rollout.codec import fast_encoder_for

TEXTS = [
    "Hello world! The quick brown fox jumps over 13 lazy dogs.",
    "naïve café — Größe 你好，世界！ こんにちは 😀🚀 Ünïcödé",
    "Cafe\u0301 (decomposed é is NFC-normalised)",
    'def f(x: int) -> int:\n    """Square."""\n    return x ** 2  # done\n\n\n\tif x != 0:\r\n        pass\n',
    '{"name": "cd", "arguments": {"folder": "docs/../tmp", "n": [1, 2.5e-3, null, true]}}',
    "   leading and trailing spaces   \n\n  ",
    "I'm sure you'll see they've LL'D it; DON'T",
    "1234567890 3.14159 -0.5e10",
]


@pytest.fixture(scope="module")
def tok():
    return qt.build_qwen_tokenizer()


def test_merge_recovery_on_a_toy_vocabulary():
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"ab": 3, b"bc": 4, b"abc": 5, b"cab": 6}
    # "abc" ranks after "ab" (3) and "bc" (4): BPE merges a+b first, so abc = ab + c, not a + bc.
    assert qt.recover_merges(ranks) == [(b"a", b"b"), (b"b", b"c"), (b"ab", b"c"), (b"c", b"ab")]


def test_merge_recovery_rejects_a_token_without_a_two_part_history():
    # "abc" cannot be reached: no lower-ranked pair merges into it.
    with pytest.raises(ValueError, match="not the merge of two"):
        qt.recover_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_vocabulary_and_merge_count(tok):
    backend = tok.backend_tokenizer
    assert backend.get_vocab_size(with_added_tokens=False) == 151643
    assert len(tok) == 151665
    import json

    model = json.loads(backend.to_str())["model"]
    assert len(model["merges"]) == 151387  # = 151643 base tokens - 256 single bytes


@pytest.mark.parametrize("text", TEXTS)
def test_matches_tiktoken_on_the_same_ranks(tok, text):
    """Independent oracle: tiktoken's BPE over the package's ranks with Qwen's split pattern."""
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("qwen-ranks", pat_str=qt.QWEN2_SPLIT_PATTERN, mergeable_ranks=qt.load_qwen_ranks(),
                            special_tokens={})
    expected = enc.encode(unicodedata.normalize("NFC", text))
    assert tok.encode(text, add_special_tokens=False) == expected


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == unicodedata.normalize("NFC", text)


def test_fast_encoder_matches_the_hf_tokenizer(tok):
    fast = fast_encoder_for(tok)
    assert fast is not None
    chat = tok.apply_chat_template(
        [{"role": "system", "content": TEXTS[3]}, {"role": "user", "content": TEXTS[1]},
         {"role": "assistant", "content": '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>'}],
        tokenize=False, add_generation_prompt=True)
    for text in [*TEXTS, chat, "<|fim_prefix|><|repo_name|>x<|file_sep|>", ""]:
        if unicodedata.is_normalized("NFC", text):
            assert fast(text) == tok.encode(text, add_special_tokens=False), text
        else:
            assert fast(text) is None  # HF normalises; the fast path declines
    assert fast(TEXTS[2]) is None


def test_known_qwen_ids(tok):
    # Ids of common strings in Qwen2.5's vocabulary (rank = id in qwen.tiktoken).
    assert tok.encode("Hello world!", add_special_tokens=False) == [9707, 1879, 0]


def test_added_tokens_ids_and_specialness(tok):
    for offset, (content, special) in enumerate(qt.QWEN25_ADDED_TOKENS):
        assert tok.convert_tokens_to_ids(content) == 151643 + offset
        assert tok.encode(content, add_special_tokens=False) == [151643 + offset]
        assert (content in tok.all_special_tokens) == special
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 151645
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == 151643
    text = '<tool_call>\n{"name": "ls", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == qt.TOOL_CALL_ID and ids[-1] == qt.EOS_TOKEN_ID
    # Tool-call markup is not special: it survives the decoding used for text sent to the env.
    assert tok.decode(ids, skip_special_tokens=True) == text.removesuffix("<|im_end|>")


def test_chat_layout_four_messages(tok):
    msgs = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"},
    ]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nSYS<|im_end|>\n"
        "<|im_start|>user\nQ1<|im_end|>\n"
        "<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False) == text.removesuffix(
        "<|im_start|>assistant\n"
    )


def test_chat_default_system_when_absent(tok):
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == f"<|im_start|>system\n{qt.QWEN_DEFAULT_SYSTEM}<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"


def test_chat_with_tools_calls_and_responses(tok):
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
    msgs = [
        {"role": "system", "content": "SYS"},
        {"role": "user", "content": "list"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {"a": 1}}},
                        {"type": "function", "function": {"name": "pwd", "arguments": "{}"}}]},
        {"role": "tool", "content": "r1"},
        {"role": "tool", "content": "r2"},
        {"role": "assistant", "content": "done"},
    ]
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False)
    assert text == (
        "<|im_start|>system\nSYS\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        '{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}'
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nlist<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "ls", "arguments": {"a": 1}}\n</tool_call>'
        '\n<tool_call>\n{"name": "pwd", "arguments": {}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\nr1\n</tool_response>\n<tool_response>\nr2\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\ndone<|im_end|>\n"
    )


def test_cache_is_reused(tok, monkeypatch):
    def fail(*a, **k):
        raise AssertionError("rebuilt instead of loading the cache")

    monkeypatch.setattr(qt, "build_backend_tokenizer", fail)
    again = qt.build_qwen_tokenizer()
    assert again.encode(TEXTS[1], add_special_tokens=False) == tok.encode(TEXTS[1], add_special_tokens=False)


def test_tiny_model_loads_and_generates(tmp_path, tok):
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seal.models.tiny import build_tiny_qwen2

    out = build_tiny_qwen2(tmp_path / "tiny", hidden=64, layers=1, seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    loaded = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == qt.QWEN25_MODEL_VOCAB_SIZE
    assert model.config.eos_token_id == qt.EOS_TOKEN_ID
    # The saved tokenizer is the same tokenizer (whatever class AutoTokenizer picks for it).
    for text in TEXTS:
        assert loaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
    msgs = [{"role": "user", "content": "hi"}]
    assert loaded.apply_chat_template(msgs, tokenize=False) == tok.apply_chat_template(msgs, tokenize=False)
    prompt = torch.tensor([tok.encode(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))])
    torch.manual_seed(0)
    gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=6, do_sample=True)
    new = gen[0, prompt.shape[1]:]
    assert 1 <= new.numel() <= 6
    assert int(new.max()) < qt.QWEN25_MODEL_VOCAB_SIZE
    # Same seed and sizes -> identical weights.
    again = AutoModelForCausalLM.from_pretrained(build_tiny_qwen2(tmp_path / "tiny2", seed=0))
    assert torch.equal(again.model.embed_tokens.weight, model.model.embed_tokens.weight)
