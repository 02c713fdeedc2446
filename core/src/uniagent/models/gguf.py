"""GGUF files as ``transformers`` folders, converted once per machine.

``transformers`` loads a ``.gguf`` file by reading its metadata and de-quantizing every
tensor in Python, on every load: about 30 s for SmolLM2-135M on two cores, for the
tokenizer and the model each time a process starts. :func:`converted_gguf` does that once
and saves the result (the float32 weights as safetensors, the config, the tokenizer and
its chat template) in uniagent's cache, keyed by the file's content and the versions of
the libraries that convert it; later loads read the folder in well under a second. The
weights and the tokenizer are those the direct load gives (same ids, vocabulary, chat
template and logits: ``core/tests/hf/test_hf_model.py`` compares them).

``UNIAGENT_GGUF_CACHE=0`` turns the cache off (every load converts again, as
``transformers`` does on its own).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import logging
import os
from pathlib import Path

from uniagent.cache import build_once, cache_dir

log = logging.getLogger(__name__)

#: The environment variable that turns the cache off (``0``, ``off``, ``false``, ``no``).
GGUF_CACHE_ENV = "UNIAGENT_GGUF_CACHE"
#: Bumped when what a converted folder holds changes (old folders are then ignored).
LAYOUT = "1"
#: The files every converted folder holds (the tokenizer's come with it).
REQUIRED = ("config.json", "model.safetensors", "tokenizer_config.json")


def gguf_cache_enabled() -> bool:
    return os.environ.get(GGUF_CACHE_ENV, "1").strip().lower() not in {"0", "off", "false", "no"}


def _digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def _versions() -> str:
    """The libraries whose code turns GGUF bytes into tensors and a tokenizer."""
    found = []
    for name in ("transformers", "gguf", "tokenizers", "torch"):
        try:
            found.append(f"{name}={metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name}=none")
    return ",".join(found)


def converted_gguf(path: str | os.PathLike[str]) -> Path:
    """The folder holding ``path``'s model and tokenizer as ``transformers`` saves them,
    made on first use under ``$UNIAGENT_CACHE_DIR/gguf`` (safe when several processes ask
    at once: one converts, the others wait for it)."""
    file = Path(path).expanduser().resolve()
    key = hashlib.sha256(f"{_digest(file)}|{_versions()}|{LAYOUT}".encode()).hexdigest()[:16]
    target = cache_dir() / "gguf" / f"{file.stem}-{key}"

    def done(folder: Path) -> bool:
        return all((folder / name).is_file() for name in REQUIRED)

    def build(staging: Path) -> None:
        log.warning("converting %s for transformers, once (kept in %s)", file.name, target)
        convert_gguf(file, staging)

    return build_once(target, build, done=done)


def convert_gguf(file: Path, out: Path) -> None:
    """Load ``file`` as ``transformers`` does and save it, de-quantized, into ``out``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(file.parent), gguf_file=file.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(file.parent), gguf_file=file.name, dtype=torch.float32
    )
    config = model.config
    # The loaded weights are plain float32 tensors; only the marker of their origin says
    # "quantized", and it makes the model refuse to be saved. A model built from the
    # config without it takes the same tensors (no copy) and is saved as any other.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()
    plain.generation_config = model.generation_config
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
