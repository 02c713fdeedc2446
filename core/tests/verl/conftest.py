"""Fixtures for the verl suite: real verl 0.9.1 on the CPU, the real Qwen3 tokenizer.

A "model" here is a folder with the Qwen3 tokenizer and a tiny ``Qwen3Config``
(``config.json``, no weights): enough for verl's ``AgentLoopWorker``, which never loads
weights on the agent-loop path. Generation comes from ``ScriptedTokenServer``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

# No hub is reachable here: without these, datasets/transformers wait on network timeouts.
for _name, _value in {
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}.items():
    os.environ.setdefault(_name, _value)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups (--dist loadgroup)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, a file's tests run in one worker (its module fixtures are made once),
    and every test on the Ray cluster in one worker too (one cluster, not one a worker)."""
    for item in items:
        group = "ray" if "ray_cluster" in getattr(item, "fixturenames", ()) else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture(scope="session")
def verl_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model folder: the real Qwen3 tokenizer plus a tiny Qwen3 ``config.json``."""
    from transformers import Qwen3Config

    from uniagent.testing.tokenizers import qwen3_tokenizer_path

    folder = tmp_path_factory.mktemp("qwen3-tiny")
    for item in qwen3_tokenizer_path().iterdir():
        if item.is_file():
            shutil.copy(item, folder / item.name)
    Qwen3Config(
        vocab_size=151936,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        architectures=["Qwen3ForCausalLM"],
    ).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One local Ray cluster for the suite's Ray tests (starting one costs seconds).

    Its session folder is a short one under /tmp: Ray's Unix sockets live there, and a
    socket path may not exceed 107 bytes (nox points TMPDIR deep into the checkout).
    """
    import tempfile

    import ray

    temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, _temp_dir=temp_dir)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
