"""Building and querying the BM25 index of the real example corpus (Wikipedia lead sections)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from uniagent_tools_search.corpus import iter_corpus
from uniagent_tools_search.errors import CorpusError, SearchIndexError
from uniagent_tools_search.index import MANIFEST, LocalIndex, build_index


@pytest.fixture(scope="module")
def index(index_dir: Path) -> LocalIndex:
    return LocalIndex(index_dir)


def test_the_example_corpus_is_the_real_wikipedia_extracts(example: dict[str, Any]) -> None:
    docs = {d.id: d for d in iter_corpus(example["corpus"])}
    assert example["documents"] == len(docs) > 9000
    assert docs["Mount_Everest"].title == "Mount Everest"
    assert "highest mountain" in docs["Mount_Everest"].text
    assert docs["Mount_Everest"].url == "https://en.wikipedia.org/wiki/Mount_Everest"


@pytest.mark.parametrize(
    ("query", "best"),
    [
        ("Everest highest mountain above sea level", "Mount_Everest"),
        ("headquarters of Apple in Cupertino", "Apple_Inc."),
        ("English rock band formed in Liverpool in 1960", "The_Beatles"),
        ("theory of relativity physicist", "Albert_Einstein"),
        ("largest city and capital of Mongolia", "Ulaanbaatar"),
    ],
)
def test_known_queries_rank_the_right_article_first(index: LocalIndex, query: str, best: str):
    hits = index.search(query, 5)
    assert hits[0].document.id == best, [h.document.id for h in hits]
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_the_example_questions_mostly_find_their_gold_page(
    index: LocalIndex, example: dict[str, Any]
) -> None:
    tasks = [json.loads(line) for line in Path(example["tasks"]).read_text().splitlines()]
    assert len(tasks) >= 50
    found = sum(
        t["gold_doc"] in [h.document.id for h in index.search(t["question"], 5)] for t in tasks
    )
    # Plain BM25 on the raw question text: most, not all (the agent reformulates).
    assert found / len(tasks) >= 0.7, f"recall@5 {found}/{len(tasks)}"


def test_snippets_show_the_sentence_that_matches(index: LocalIndex) -> None:
    hit = index.search("Everest height measured 2020 Nepalese Chinese survey", 1)[0]
    assert "8,848.86" in hit.snippet
    assert len(hit.snippet) <= 320


def test_a_query_of_stop_words_or_unknown_words_finds_nothing(index: LocalIndex) -> None:
    assert index.search("the of and", 5) == []
    assert index.search("zzyzxqv qqqxj", 5) == []


def test_top_k_larger_than_the_corpus_returns_what_there_is(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        '{"id": "a", "title": "Cats", "text": "Cats purr."}\n'
        '{"id": "b", "title": "Dogs", "text": "Dogs bark at cats."}\n'
    )
    build_index(corpus, tmp_path / "idx")
    hits = LocalIndex(tmp_path / "idx").search("cats", 10)
    assert [h.document.id for h in hits] == ["a", "b"]


def test_building_reports_progress_and_writes_a_manifest(example, tmp_path: Path) -> None:
    said: list[str] = []
    manifest = build_index(example["corpus"], tmp_path / "idx", progress=said.append)
    assert manifest["documents"] == example["documents"]
    assert json.loads((tmp_path / "idx" / MANIFEST).read_text()) == manifest
    assert said[0].startswith("reading") and said[-1].startswith("indexed")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": "a"}', "'text' must be a non-empty string"),
        ('{"id": "a", "text": "x", "titel": "T"}', "unknown key(s) 'titel'"),
        ("[1, 2]", "must be a JSON object"),
        ('{"id": "a", "text": "x"', "not valid JSON"),
    ],
)
def test_a_bad_corpus_line_is_rejected_naming_the_line(tmp_path, line, message) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "ok", "text": "fine"}\n' + line + "\n")
    with pytest.raises(CorpusError, match=rf"c\.jsonl:2: .*{__import__('re').escape(message)}"):
        build_index(corpus, tmp_path / "idx")
    assert not (tmp_path / "idx" / MANIFEST).exists()


def test_duplicate_ids_are_rejected(tmp_path: Path) -> None:
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(CorpusError, match="duplicate document id 'a'"):
        build_index(corpus, tmp_path / "idx")


def test_loading_a_directory_that_is_not_an_index_says_how_to_build_one(tmp_path: Path) -> None:
    with pytest.raises(SearchIndexError, match="uniagent-search index"):
        LocalIndex(tmp_path)
