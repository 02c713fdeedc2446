"""The arxiv and web backends through the service, against recorded upstream answers served
on 127.0.0.1 (the narrowest seam: only the remote API is replaced)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from upstream import WEB_KEY

from uniagent_tools_search.backends.arxiv import parse_feed, search_query
from uniagent_tools_search.client import SearchClient, ServiceError
from uniagent_tools_search.config import WebSearchSettings
from uniagent_tools_search.errors import BackendError, SearchError

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.mark.parametrize(
    ("text", "filters", "expected"),
    [
        ("attention", {}, "all:attention"),
        ("attention transformer", {}, "(all:attention AND all:transformer)"),
        ("ti:transformer AND au:vaswani", {}, "(ti:transformer AND au:vaswani)"),
        ("graph networks", {"category": "cs.LG"}, "(all:graph AND all:networks) AND cat:cs.LG"),
        (
            "qcd",
            {"date_from": dt.date(2023, 1, 1), "date_to": dt.date(2023, 12, 31)},
            "all:qcd AND submittedDate:[202301010000 TO 202312312359]",
        ),
        (
            "qcd",
            {"date_from": dt.date(2024, 5, 1)},
            "all:qcd AND submittedDate:[202405010000 TO 999912312359]",
        ),
    ],
)
def test_queries_and_filters_become_the_arxiv_query_syntax(text, filters, expected) -> None:
    assert search_query(text, **filters) == expected


def test_a_malformed_category_is_refused_before_asking_arxiv() -> None:
    with pytest.raises(BackendError, match="not an arXiv category"):
        search_query("x", category="cs.LG) OR (all:y")


def test_the_atom_feed_becomes_results_with_metadata() -> None:
    results = parse_feed((FIXTURES / "arxiv_attention.xml").read_bytes(), snippet_chars=120)
    assert [r.id for r in results] == ["1706.03762v7", "2010.11929v2", "1810.04805v2"]
    first = results[0]
    assert first.title == "Attention Is All You Need"
    assert first.url == "http://arxiv.org/abs/1706.03762v7"
    assert (
        first.snippet.startswith("The dominant sequence transduction models")
        and len(first.snippet) <= 122
    )
    assert first.metadata["authors"][:2] == ["Ashish Vaswani", "Noam Shazeer"]
    assert first.metadata["published"] == "2017-06-12"
    assert first.metadata["primary_category"] == "cs.CL"
    assert first.metadata["categories"] == ["cs.CL", "cs.LG"]
    assert first.metadata["pdf_url"] == "http://arxiv.org/pdf/1706.03762v7"
    assert (
        results[1].title == "An Image is Worth 16x16 Words: Transformers for Image "
        "Recognition at Scale"
    )
    assert results[1].metadata["journal_ref"] == "ICLR 2021"
    assert results[2].metadata["doi"] == "10.18653/v1/N19-1423"


def test_an_arxiv_error_entry_is_an_error_not_a_result() -> None:
    with pytest.raises(BackendError, match="incorrect id format for 1234.12345"):
        parse_feed((FIXTURES / "arxiv_error.xml").read_bytes(), 300)


async def test_search_arxiv_through_the_service(service, upstream) -> None:
    async with SearchClient(service.url) as client:
        answer = await client.search(
            "attention transformer", 3, backend="arxiv", category="cs.CL", date_from="2017-01-01"
        )
    assert answer["backend"] == "arxiv"
    assert [r["id"] for r in answer["results"]] == ["1706.03762v7", "2010.11929v2", "1810.04805v2"]
    sent = upstream.seen("/api/query")[-1].query
    expected = (
        "(all:attention AND all:transformer) AND cat:cs.CL AND "
        "submittedDate:[201701010000 TO 999912312359]"
    )
    assert sent["search_query"] == [expected]
    assert sent["max_results"] == ["3"] and sent["sortBy"] == ["relevance"]


async def test_no_arxiv_results_is_an_empty_list(service) -> None:
    async with SearchClient(service.url) as client:
        answer = await client.search("zzyzxqv", backend="arxiv")
    assert answer["results"] == []


@pytest.mark.parametrize(
    ("query", "status", "message"),
    [("badquery", 400, "arXiv rejected the query"), ("overload", 502, "HTTP 503 (rate limited")],
)
async def test_arxiv_failures_reach_the_tool_as_errors(service, query, status, message) -> None:
    async with SearchClient(service.url) as client:
        with pytest.raises(ServiceError) as err:
            await client.search(query, backend="arxiv")
    assert err.value.status == status and message in err.value.message


async def test_failed_upstream_answers_are_not_cached(service, upstream) -> None:
    before = len(upstream.seen("/api/query"))
    async with SearchClient(service.url) as client:
        for _ in range(2):
            with pytest.raises(ServiceError):
                await client.search("overload again", backend="arxiv")
    assert len(upstream.seen("/api/query")) == before + 2


async def test_web_search_sends_the_key_from_the_run_and_maps_the_results(service, upstream):
    async with SearchClient(service.url) as client:
        answer = await client.search("how tall is Mount Everest", 2, backend="web")
    request = upstream.seen("/v1/search/web")[-1]
    assert request.headers["authorization"] == f"Bearer {WEB_KEY}"
    assert request.body == {"query": "how tall is Mount Everest", "max_results": 2}
    first, second = answer["results"]
    assert first["id"] == first["url"] == "https://en.wikipedia.org/wiki/Mount_Everest"
    assert first["metadata"] == {"date": "2024-02-01", "last_updated": "2024-03-01"}
    assert second["snippet"].startswith("In 2020 China and Nepal")  # read from "content"


async def test_a_failing_web_api_is_a_502(service) -> None:
    async with SearchClient(service.url) as client:
        with pytest.raises(ServiceError) as err:
            await client.search("boom", backend="web")
    assert err.value.status == 502 and "HTTP 500" in err.value.message


def test_a_web_backend_without_its_key_refuses_to_start(monkeypatch) -> None:
    from uniagent_tools_search.backends.web import WebBackend

    monkeypatch.delenv("SEARCH_API_KEY", raising=False)
    with pytest.raises(SearchError, match=r"\$SEARCH_API_KEY .*not the sandbox"):
        WebBackend(WebSearchSettings(url="http://127.0.0.1:9/search"))
