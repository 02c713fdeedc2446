"""The tools run in a real host sandbox, installed the way an episode installs them, with
and without bubblewrap; under bubblewrap the sandbox reaches the service only through the
bind-mounted Unix socket and has no network."""

from __future__ import annotations

import shlex
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from uniagent import AgentEnv, Observation, open_env
from upstream import WEB_KEY, WEB_KEY_VARIABLE

from uniagent_tools_search.tools import make_tools

TOOLS = {spec.name: spec for spec in make_tools()}


class Sandbox:
    def __init__(self, env: AgentEnv) -> None:
        self.env = env

    async def call(self, name: str, **arguments: Any) -> Observation:
        """Validate like the loop does, render, run in the session."""
        spec = TOOLS[name]
        validated = spec.validate_arguments(arguments).model_dump(mode="json")
        return await self.env.run_action(spec.to_command(validated), timeout=60)


def deployment(isolation: str, socket_dir: Path) -> dict[str, Any]:
    if isolation == "none":
        return {"type": "host", "isolation": "none"}
    # The socket's directory, read-only: connecting to a socket needs no write access.
    return {"type": "host", "isolation": "bwrap", "ro_binds": [str(socket_dir)]}


@pytest_asyncio.fixture(params=["none", "bwrap"])
async def sandbox(request, service) -> AsyncIterator[Sandbox]:
    socket_dir = Path(service.url.removeprefix("unix://")).parent
    env = open_env(
        deployment(request.param, socket_dir), {"env": {"UNIAGENT_SEARCH_URL": service.url}}
    )
    async with env:
        await env.install_tools(list(TOOLS.values()))
        yield Sandbox(env)


async def test_search_prints_numbered_results_with_ids_and_snippets(sandbox: Sandbox) -> None:
    obs = await sandbox.call("search", query="English rock band formed in Liverpool", top_k=3)
    assert obs.exit_code == 0, obs.output
    lines = obs.output.splitlines()
    assert lines[0] == 'Found 3 results for "English rock band formed in Liverpool":'
    assert lines[2] == "[1] The Beatles" and lines[3] == "    id: The_Beatles"
    assert "[2] " in obs.output and "[3] " in obs.output and "[4] " not in obs.output
    assert "formed in Liverpool in 1960" in obs.output
    assert obs.output.rstrip().endswith("To read a whole document: fetch_document with its id.")


async def test_fetch_document_reads_a_result_in_parts(sandbox: Sandbox) -> None:
    first = await sandbox.call("fetch_document", id="Taj_Mahal", max_chars=150)
    assert first.exit_code == 0, first.output
    assert first.output.startswith("Taj Mahal (id: Taj_Mahal)\nhttps://en.wikipedia.org/wiki/")
    assert "[characters 0-150 of " in first.output
    assert 'fetch_document with id "Taj_Mahal" and offset 150.' in first.output
    rest = await sandbox.call("fetch_document", id="Taj_Mahal", offset=150)
    assert "[characters 150-" in rest.output and "offset" not in rest.output.splitlines()[-1]


async def test_search_arxiv_prints_papers_with_dates_categories_and_authors(sandbox) -> None:
    obs = await sandbox.call(
        "search_arxiv", query="attention transformer", max_results=2, category="cs.CL"
    )
    assert obs.exit_code == 0, obs.output
    assert obs.output.splitlines()[0] == 'Found 2 papers for "attention transformer":'
    assert "[1] Attention Is All You Need" in obs.output
    assert (
        "    id: 1706.03762v7 | 2017-06-12 | cs.CL, cs.LG | Ashish Vaswani, Noam Shazeer, "
        "Niki Parmar, et al."
    ) in obs.output


async def test_nothing_found_says_so(sandbox: Sandbox) -> None:
    obs = await sandbox.call("search", query="zzyzxqv qqqxj")
    assert (obs.exit_code, obs.output.strip()) == (
        0,
        'No results found for "zzyzxqv qqqxj". Try other or fewer words.',
    )


async def test_service_errors_reach_the_model_as_text(sandbox: Sandbox) -> None:
    obs = await sandbox.call("fetch_document", id="No_Such_Page")
    assert obs.exit_code == 1
    assert obs.output.startswith("fetch_document failed: no document with id 'No_Such_Page'")


async def test_the_api_key_of_the_run_never_enters_the_sandbox(sandbox: Sandbox) -> None:
    obs = await sandbox.env.run_action(f"env; echo ${WEB_KEY_VARIABLE}", timeout=30)
    assert WEB_KEY not in obs.output


async def test_a_missing_service_url_is_explained(service, socket_dir) -> None:
    async with open_env({"type": "host"}) as env:
        await env.install_tools([TOOLS["search"]])
        obs = await env.run_action("env -u UNIAGENT_SEARCH_URL search --query x", timeout=30)
    assert obs.exit_code == 1 and "UNIAGENT_SEARCH_URL is not set" in obs.output


async def test_under_bubblewrap_there_is_no_network_not_even_to_the_service_port(
    service,
) -> None:
    socket_dir = Path(service.url.removeprefix("unix://")).parent
    tcp_url = service.addresses["http_url"]
    env = open_env(deployment("bwrap", socket_dir), {"env": {"UNIAGENT_SEARCH_URL": tcp_url}})
    async with env:
        await env.install_tools([TOOLS["search"]])
        obs = await env.run_action("search --query Everest", timeout=60)
        assert obs.exit_code == 1 and "unreachable" in obs.output, obs.output
        port = tcp_url.rsplit(":", 1)[1]
        probe = await env.run_action(
            "python3 -c "
            + shlex.quote(
                "import socket; s = socket.socket(); s.settimeout(5); "
                f"print(s.connect_ex(('127.0.0.1', {port})))"
            ),
            timeout=60,
        )
        assert probe.output.strip() != "0", "the sandbox reached the host's loopback"
