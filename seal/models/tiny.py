"""A random tiny Qwen2 model with the real Qwen2.5 vocabulary, built offline.

Used by CPU tests and the embedded `local` engine: same tokenizer (the offline one, `seal.models.qwen25`), chat
template, eos/pad ids and vocabulary size as Qwen2.5 (so sequences, masks and lengths are realistic) but a few
million random parameters. Greedy output of a random model is degenerate; sample when varied rollouts are needed.
"""

from __future__ import annotations

import os
from pathlib import Path

from seal.models import build_atomically
from seal.models.qwen25 import (
    EOS_TOKEN_ID,
    PAD_TOKEN_ID,
    QWEN25_MODEL_VOCAB_SIZE,
    build_qwen_tokenizer,
)


def tiny_qwen2_config(hidden: int = 64, layers: int = 1, heads: int = 4, kv_heads: int = 2):
    """A `Qwen2Config` with Qwen2.5's vocabulary/special ids and a tiny body.

    `hidden` must be divisible by `heads`, and `heads` by `kv_heads` (grouped-query attention, as in
    Qwen2.5). Embeddings are tied (as in Qwen2.5-0.5B/1.5B), so the 151,936 x hidden embedding is the
    bulk of the parameters.
    """
    from transformers import Qwen2Config

    if hidden <= 0 or layers <= 0:
        raise ValueError(f"hidden and layers must be positive, got hidden={hidden}, layers={layers}")
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"hidden={hidden}, heads={heads}, kv_heads={kv_heads}: need hidden % heads == 0 "
                         "and heads % kv_heads == 0")
    return Qwen2Config(
        vocab_size=QWEN25_MODEL_VOCAB_SIZE,
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=32768,
        rope_theta=1000000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=PAD_TOKEN_ID,
        eos_token_id=EOS_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )


def build_tiny_qwen2(
    out_dir: str | os.PathLike,
    hidden: int = 64,
    layers: int = 1,
    seed: int = 0,
    tokenizer_cache_dir: str | os.PathLike | None = None,
    heads: int = 4,
    kv_heads: int = 2,
) -> Path:
    """Save a random `Qwen2ForCausalLM` plus the offline Qwen2.5 tokenizer into `out_dir`.

    The directory loads with `AutoModelForCausalLM.from_pretrained(out_dir)` and
    `AutoTokenizer.from_pretrained(out_dir)`. Same `seed` and sizes give identical weights. vLLM's CPU
    attention needs a head size (`hidden / heads`) of at least 32: e.g. hidden 64 with 2 heads, 1 KV head.
    Returns the directory path.
    """
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = tiny_qwen2_config(hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=PAD_TOKEN_ID,
        eos_token_id=[EOS_TOKEN_ID, PAD_TOKEN_ID],  # Qwen2.5-Instruct stops on either
        pad_token_id=PAD_TOKEN_ID,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
    )
    model.save_pretrained(str(out))
    build_qwen_tokenizer(tokenizer_cache_dir).save_pretrained(str(out))
    return out


def prepare_tiny_model(path: str | os.PathLike, hidden: int = 64, layers: int = 1, seed: int = 0, heads: int = 4,
                       kv_heads: int = 2) -> Path:
    """`model.build_tiny`: the model at `path`, built there first when it has no `config.json` yet.

    Builds only inside the project's model cache (`seal.models.model_cache_dir`, default `runs/_models`): a
    path elsewhere is the user's, and one without a model is an error (a typo must not train a random model,
    nor write one into a directory the user named). A model already in the cache must have the asked shape
    (`model.tiny.*`): a recipe that changes the heads must not silently train the model built for another."""
    import json

    from seal.models import model_cache_dir

    given = Path(path).expanduser()
    target = given.resolve()
    cache = model_cache_dir().resolve()
    if (target / "config.json").is_file():
        if target.is_relative_to(cache):
            found = json.loads((target / "config.json").read_text())
            want = {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
                    "num_key_value_heads": kv_heads}
            differ = {k: (found.get(k), v) for k, v in want.items() if found.get(k) != v}
            if differ:
                raise ValueError(f"model.path {given}: the tiny model built there has another shape than "
                                 f"model.tiny asks ({', '.join(f'{k} {a} != {b}' for k, (a, b) in differ.items())}); "
                                 "give model.path a directory of its own for this shape")
        return target
    if not target.is_relative_to(cache):
        raise ValueError(f"model.path {given}: no model there (no config.json), and model.build_tiny builds only "
                         f"inside the model cache {cache} (e.g. model.path={cache / 'tiny_qwen2'}; "
                         "SEAL_MODEL_CACHE moves the cache)")
    # Atomic: a test on another pytest worker, or a second run, may read the same cached model while this builds.
    build_atomically(target, lambda tmp: build_tiny_qwen2(tmp, hidden=hidden, layers=layers, seed=seed, heads=heads,
                                                          kv_heads=kv_heads),
                     lambda d: (d / "config.json").is_file() and (d / "model.safetensors").is_file())
    return target
