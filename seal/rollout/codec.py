"""The chat codec the episode driver uses (`ChatCodec`), and a fast encoder for Qwen2.5's vocabulary.

The offline Qwen2.5 tokenizer itself, its token ids and chat template, is a model artefact: `seal.models.qwen25`.
"""

from __future__ import annotations

import unicodedata
import weakref
from typing import Any, ClassVar

from seal.models.qwen25 import (
    EOS_TOKEN,
    EOS_TOKEN_ID,
    FIRST_ADDED_ID,
    QWEN2_SPLIT_PATTERN,
    QWEN25_ADDED_TOKENS,
    load_qwen_ranks,
)


class FastQwenEncoder:
    """tiktoken-backed encoder giving the same ids as the Hugging Face Qwen2.5 tokenizer, ~15x faster.

    Why: the HF `tokenizers` BPE with Qwen's split regex takes ~12 ms for a 25k-character BFCL system
    prompt (tiktoken: ~0.8 ms), which alone exceeded the agent loop's per-call CPU budget. Equivalence:
    added tokens (all 22, special or not) are matched as literal strings in both; the text between
    them goes through the same split regex and the same BPE ranks. HF additionally NFC-normalises the
    text between added tokens, so this encoder answers only for text that is already NFC and returns
    None otherwise (callers then use the HF tokenizer). `tests/rollout/test_tokenizer.py` checks equality.
    """

    def __init__(self, ranks: dict[bytes, int] | None = None):
        import tiktoken

        specials = {content: FIRST_ADDED_ID + i for i, (content, _) in enumerate(QWEN25_ADDED_TOKENS)}
        self._enc = tiktoken.Encoding(
            "seal-qwen2.5",
            pat_str=QWEN2_SPLIT_PATTERN,
            mergeable_ranks=ranks if ranks is not None else load_qwen_ranks(),
            special_tokens=specials,
        )

    def __call__(self, text: str) -> list[int] | None:
        if not unicodedata.is_normalized("NFC", text):
            return None
        return self._enc.encode(text, allowed_special="all")


_FAST_PROBES = (
    "<|im_start|>system\nHi <tool_call>{\"a\": [1, 2.5]}</tool_call><|im_end|>\n<|im_start|>assistant\n",
    "naïve café 你好 😀  \n\n\tdef f(x):\r\n    return x ** 2  # I'm   ",
)
_fast_encoder: FastQwenEncoder | None = None


def fast_encoder_for(tokenizer) -> FastQwenEncoder | None:
    """A `FastQwenEncoder` if `tokenizer` has Qwen2.5's vocabulary (checked on probes), else None."""
    global _fast_encoder
    try:
        if len(tokenizer) != FIRST_ADDED_ID + len(QWEN25_ADDED_TOKENS):
            return None
        if tokenizer.convert_tokens_to_ids(EOS_TOKEN) != EOS_TOKEN_ID:
            return None
        if _fast_encoder is None:
            _fast_encoder = FastQwenEncoder()
    except (ImportError, TypeError, AttributeError, FileNotFoundError):
        return None
    for probe in _FAST_PROBES:
        if _fast_encoder(probe) != list(tokenizer.encode(probe, add_special_tokens=False)):
            return None
    return _fast_encoder


# --- the chat codec the episode driver uses ---------------------------------------------------------


class TemplateError(RuntimeError):
    """The chat template does not extend a conversation by appending text (token bookkeeping impossible)."""


class ChatCodec:
    """Tokenizer + chat template operations the agent loop needs, with per-tokenizer constants cached.

    `check_full_render=True` (tests/debugging) additionally renders the whole conversation at every
    step and checks that the increment equals the difference of full renders; it costs O(conversation)
    per step and is off in training.
    """

    def __init__(self, tokenizer: Any, check_full_render: bool = False, fast_encode: bool = True):
        self.tokenizer = tokenizer
        self.check_full_render = check_full_render
        eos_id = tokenizer.eos_token_id
        eos_text = tokenizer.eos_token
        if not isinstance(eos_id, int) or not eos_text:
            raise ValueError("tokenizer needs a single eos token (the chat template's end-of-turn token)")
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("tokenizer has no chat template")
        self.eos_id: int = eos_id
        self.eos_text: str = eos_text
        # The fast path: call the Rust tokenizer directly (the transformers wrapper adds ~50-100 us per
        # call). Equivalent for encode without special tokens; decode goes through the wrapper only when
        # it would clean up spaces.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        # Qwen2.5 vocabularies get a tiktoken encoder with identical ids (seal.rollout.codec.FastQwenEncoder):
        # HF's BPE needs ~12 ms for a long BFCL system prompt, tiktoken under 1 ms.
        self._fast = fast_encoder_for(tokenizer) if fast_encode else None
        self._wrapper_decode = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        sentinel = "\u2063probe\u2063"
        probe = self.render([{"role": "user", "content": "u"}, {"role": "assistant", "content": sentinel}], False)
        if eos_text not in probe.split(sentinel, 1)[-1]:
            raise ValueError(f"the chat template does not close assistant turns with the eos token {eos_text!r}")

    _cache: ClassVar[weakref.WeakKeyDictionary] = weakref.WeakKeyDictionary()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> ChatCodec:
        """The codec of `tokenizer`, built once per tokenizer object."""
        if isinstance(tokenizer, ChatCodec):
            return tokenizer
        try:
            codec = cls._cache.get(tokenizer)
        except TypeError:  # not weak-referenceable / not hashable
            return cls(tokenizer)
        if codec is None:
            codec = cls(tokenizer)
            cls._cache[tokenizer] = codec
        return codec

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        if self._fast is not None:
            ids = self._fast(text)
            if ids is not None:
                return ids
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        """Text of sampled tokens as sent to the env: special tokens (the eos) dropped."""
        if self._backend is not None and not self._wrapper_decode:
            return self._backend.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def increment_text(self, head: list[dict], head_text: str, assistant: str, sampled_eos: bool,
                       observation: dict) -> str:
        """Template text between the end of the sampled tokens and the next generation point.

        Rendered as template(head + [assistant, observation], generation prompt) minus
        template(head, generation prompt) (= `head_text`), minus the assistant content and, when the
        model sampled it, the eos. `head` is the episode's [system, user]; assuming (and checked by
        `check_full_render`) that a turn's rendering does not depend on earlier turns, this render has
        constant size whatever the conversation length.
        """
        full = self.render(head + [{"role": "assistant", "content": assistant}, observation], True)
        if not full.startswith(head_text):
            raise TemplateError("chat template is not prefix-stable: the head renders differently once "
                                "an assistant turn follows")
        rest = full[len(head_text):]
        if rest.startswith(assistant):
            rest = rest[len(assistant):]
        else:
            # The template rewrites assistant content in history (e.g. drops reasoning); the sampled
            # tokens stay what they were, and the increment starts at the turn's end token.
            cut = rest.find(self.eos_text)
            if cut < 0:
                raise TemplateError("cannot find the end of the assistant turn in the rendered template")
            rest = rest[cut:]
        if sampled_eos:
            if not rest.startswith(self.eos_text):
                raise TemplateError(f"assistant turn does not end with {self.eos_text!r} in the template")
            rest = rest[len(self.eos_text):]
        return rest
