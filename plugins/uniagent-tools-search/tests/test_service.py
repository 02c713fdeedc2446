"""The service over its real HTTP API: answers, errors, the cache, 100 concurrent clients,
start-up, attaching, stopping and dying with the run."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from uniagent_tools_search.client import SearchClient, ServiceError
from uniagent_tools_search.config import SearchServiceConfig
from uniagent_tools_search.errors import SearchError
from uniagent_tools_search.service import start_search_service

QUERIES = [
    "Mount Everest height",
    "Apple headquarters",
    "Beatles Liverpool",
    "capital of Mongolia",
    "Eiffel Tower architect",
    "Toyota founded",
    "Harvard University founded",
    "Nile river",
    "Isaac Newton gravity",
    "Great Wall of China",
    "Amazon founder Bezos",
    "Michael Jordan MVP",
]


async def test_search_returns_ranked_results_with_ids_titles_and_snippets(service) -> None:
    async with SearchClient(service.url) as client:
        answer = await client.search("Eiffel Tower Paris wrought-iron", top_k=3)
    assert answer["backend"] == "local"
    first = answer["results"][0]
    assert first["id"] == "Eiffel_Tower"
    assert first["title"] == "Eiffel Tower" and "Paris" in first["snippet"]
    assert len(answer["results"]) == 3


async def test_fetch_returns_a_document_in_slices(service) -> None:
    async with SearchClient(service.url) as client:
        whole = await client.fetch("Mount_Everest")
        head = await client.fetch("Mount_Everest", max_chars=100)
        tail = await client.fetch("Mount_Everest", offset=head["next_offset"])
    assert whole["title"] == "Mount Everest" and whole["next_offset"] is None
    assert head["text"] + tail["text"] == whole["text"]
    assert head["total_chars"] == len(whole["text"])


async def test_the_http_and_unix_addresses_serve_the_same_answers(service) -> None:
    async with SearchClient(service.addresses["http_url"]) as tcp, SearchClient(service.url) as ux:
        by_tcp, by_socket = await tcp.search("Nile river"), await ux.search("Nile river")
    assert by_tcp["results"] == by_socket["results"]
    assert by_socket["cached"]  # one service behind both addresses


@pytest.mark.parametrize(
    ("body", "status", "kind", "message"),
    [
        ({"query": ""}, 400, "bad_request", "query"),
        ({"query": "x", "top_k": 500}, 400, "bad_request", "top_k"),
        ({"query": "x", "topk": 3}, 400, "bad_request", "topk: unknown key"),
        ({"query": "x", "backend": "bing"}, 400, "bad_request", "backend"),
        ({"query": "x", "category": "cs.LG"}, 400, "bad_request", "no categories"),
    ],
)
async def test_bad_requests_are_rejected_with_what_was_wrong(service, body, status, kind, message):
    async with SearchClient(service.url) as client:
        with pytest.raises(ServiceError) as err:
            await client._call("POST", "/search", body)
    assert (err.value.status, err.value.kind) == (status, kind)
    assert message in err.value.message


async def test_fetching_an_unknown_id_is_a_404_that_says_where_ids_come_from(service) -> None:
    async with SearchClient(service.url) as client:
        with pytest.raises(ServiceError) as err:
            await client.fetch("No_Such_Page")
    assert err.value.status == 404 and "search results" in err.value.message


async def test_100_concurrent_queries_all_succeed_and_match_the_sequential_answers(service):
    queries = [QUERIES[i % len(QUERIES)] + f" {i // len(QUERIES)}" for i in range(100)]
    async with SearchClient(service.url) as client:
        expected = {q: await client.search(q) for q in queries[:12]}
        before = (await client.health())["cache"]
        answers = await asyncio.gather(*(client.search(q) for q in queries))
        after = (await client.health())["cache"]
    assert len(answers) == 100 and all(a["results"] for a in answers)
    for query, answer in zip(queries[:12], answers[:12]):
        assert answer["results"] == expected[query]["results"]
    served = (after["hits"] + after["shared"] + after["misses"]) - (
        before["hits"] + before["shared"] + before["misses"]
    )
    assert served == 100


async def test_identical_requests_hit_the_cache(service) -> None:
    async with SearchClient(service.url) as client:
        first = await client.search("Ada Lovelace Analytical Engine")
        again = await client.search("  Ada Lovelace   Analytical Engine ")
    assert first["cached"] is False and again["cached"] is True
    assert again["results"] == first["results"]


async def test_a_second_run_on_the_same_socket_attaches_instead_of_starting_another(
    service, service_config
) -> None:
    other = await start_search_service(service_config)
    assert not other.owned and other.url == service.url
    await other.stop()  # an attached service is left running for its owner
    async with SearchClient(service.url) as client:
        assert (await client.health())["pid"] == service.addresses["pid"]


async def test_a_service_that_cannot_start_says_why(socket_dir: Path, tmp_path: Path) -> None:
    config = SearchServiceConfig(index=str(tmp_path), unix_socket=str(socket_dir / "s.sock"))
    with pytest.raises(
        SearchError, match=r"(?s)exited \(status 2\) before it was ready.*no manifest"
    ):
        await start_search_service(config)


async def test_stop_ends_the_child_and_removes_its_socket(index_dir, socket_dir) -> None:
    config = SearchServiceConfig(index=str(index_dir), unix_socket=str(socket_dir / "s.sock"))
    handle = await start_search_service(config)
    proc = handle.proc
    assert proc is not None and (socket_dir / "s.sock").exists()
    await handle.stop()
    assert proc.returncode == 0  # a clean SIGTERM shutdown
    assert not (socket_dir / "s.sock").exists()


#: A group to hand the socket to: any as root, else one of ours.
OTHER_GROUP = 4242 if os.geteuid() == 0 else os.getgid()


@pytest.mark.parametrize("group", [None, OTHER_GROUP])
async def test_only_the_owner_and_the_socket_group_may_connect(index_dir, socket_dir, group):
    config = SearchServiceConfig(
        index=str(index_dir), unix_socket=str(socket_dir / "s.sock"), socket_group=group
    )
    handle = await start_search_service(config)
    try:
        sock, folder = (socket_dir / "s.sock").stat(), socket_dir.stat()
        if group is None:
            assert (oct(sock.st_mode & 0o777), oct(folder.st_mode & 0o777)) == ("0o600", "0o700")
        else:
            assert (oct(sock.st_mode & 0o777), oct(folder.st_mode & 0o777)) == ("0o660", "0o710")
            assert sock.st_gid == folder.st_gid == group
    finally:
        await handle.stop()


def test_as_root_the_socket_group_defaults_to_the_sandboxes_group() -> None:
    config = SearchServiceConfig(index="/nonexistent", unix_socket="/var/tmp/x/s.sock")
    assert config.socket_group == (65534 if os.geteuid() == 0 else None)


def test_the_service_dies_with_the_process_that_started_it(index_dir, socket_dir) -> None:
    starter = textwrap.dedent(
        f"""
        import asyncio, sys
        from uniagent_tools_search.config import SearchServiceConfig
        from uniagent_tools_search.service import start_search_service
        config = SearchServiceConfig(index={str(index_dir)!r},
                                     unix_socket={str(socket_dir / "s.sock")!r})
        handle = asyncio.run(start_search_service(config))
        print(handle.proc.pid, flush=True)
        sys.stdin.read()  # wait to be killed
        """
    )
    run = subprocess.Popen(
        [sys.executable, "-c", starter], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    child = int(run.stdout.readline())
    pidfd = os.pidfd_open(child)
    try:
        run.send_signal(signal.SIGKILL)  # a crash: no clean-up code runs in the starter
        run.wait()
        readable, _, _ = select.select([pidfd], [], [], 60)  # readable once the child exited
        assert readable, "the service outlived the run that started it"
    finally:
        os.close(pidfd)


def test_the_cli_serves_and_answers_queries(index_dir: Path, socket_dir: Path) -> None:
    sock = socket_dir / "cli.sock"
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uniagent_tools_search.cli",
            "serve",
            "--index",
            str(index_dir),
            "--unix-socket",
            str(sock),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = json.loads(serve.stdout.readline())
        assert ready == {
            "event": "ready",
            "pid": serve.pid,
            "unix_socket": str(sock),
            "url": f"unix://{sock}",
        }
        query = subprocess.run(
            [
                sys.executable,
                "-m",
                "uniagent_tools_search.cli",
                "query",
                "Taj Mahal Agra",
                "--url",
                ready["url"],
                "--top-k",
                "2",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        assert query.stdout.startswith("[1] Taj Mahal  (id: Taj_Mahal")
    finally:
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0


async def test_a_service_with_other_settings_on_the_socket_is_not_attached_to(
    service, service_config
) -> None:
    other = service_config.model_copy(update={"cache_size": 7})
    with pytest.raises(SearchError, match="with other settings .* already listens"):
        await start_search_service(other)
