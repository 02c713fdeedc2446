"""Hook implementations: the three tools, the search_qa reward and the search service."""

from __future__ import annotations

from collections.abc import Iterator

from uniagent import RewardSpec, RunningService, ServiceSpec, ToolSpec, hookimpl

from uniagent_tools_search.config import SearchServiceConfig
from uniagent_tools_search.reward import SearchQARewardConfig, search_qa_reward
from uniagent_tools_search.tools import make_tools


@hookimpl
def uniagent_tools() -> Iterator[ToolSpec]:
    """search, search_arxiv, fetch_document."""
    yield from make_tools()


@hookimpl
def uniagent_rewards() -> Iterator[RewardSpec]:
    """search_qa."""
    yield RewardSpec(
        name="search_qa",
        fn=search_qa_reward,
        settings=SearchQARewardConfig,
        uses_sandbox=False,  # it grades only the submission text
        description="normalised exact match / token F1 of the finish answer against the "
        "task's answers, optional LLM judge",
    )


async def start_search_service(settings: SearchServiceConfig) -> RunningService:
    """Start (or attach to) the service; aiohttp is imported only when one runs."""
    from uniagent_tools_search.service import start_search_service as start

    return await start(settings)


@hookimpl
def uniagent_services() -> Iterator[ServiceSpec]:
    """The retrieval service the tools call."""
    yield ServiceSpec(
        name="search",
        start=start_search_service,
        settings=SearchServiceConfig,
        description="the retrieval server (local BM25 index, web search, arXiv) on a Unix "
        "socket and/or 127.0.0.1",
    )
