"""A local BM25 index over a JSONL corpus, built and queried with ``bm25s``.

``bm25s`` (sparse-matrix BM25, numpy only) is maintained, fast and saves its index as
plain ``.npy``/JSON files that load memory-mapped; PyStemmer gives it the Snowball
English stemmer. An index directory holds bm25s's files, ``documents.jsonl`` (the
documents in index order, for ``fetch_document``) and ``manifest.json`` (format
version, corpus checksum, settings), checked on load.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from uniagent_tools_search.corpus import Document, iter_corpus, parse_document
from uniagent_tools_search.errors import SearchIndexError

FORMAT = "uniagent-search-bm25/1"
MANIFEST = "manifest.json"
DOCUMENTS = "documents.jsonl"
_WORD = re.compile(r"(?u)\b\w\w+\b")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Hit:
    """One ranked document for a query."""

    document: Document
    score: float
    snippet: str


def _bm25s() -> Any:
    import bm25s  # imported lazily: numpy start-up is not needed for the CLI's --help

    return bm25s


_stemmers = threading.local()


def _stemmer(language: str | None) -> Any:
    # PyStemmer's stemmers keep internal state: one per thread.
    if language is None:
        return None
    cache = getattr(_stemmers, "by_language", None)
    if cache is None:
        cache = _stemmers.by_language = {}
    if language not in cache:
        import Stemmer

        cache[language] = Stemmer.Stemmer(language)
    return cache[language]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_index(
    corpus: str | Path,
    out: str | Path,
    *,
    k1: float = 1.5,
    b: float = 0.75,
    stemmer: str | None = "english",
    stopwords: str = "en",
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Index ``corpus`` (JSONL) into the directory ``out``; returns the manifest."""
    say = progress or (lambda _message: None)
    corpus, out = Path(corpus), Path(out)
    started = time.perf_counter()
    say(f"reading {corpus}")
    documents = list(iter_corpus(corpus))
    if not documents:
        raise SearchIndexError(f"corpus {corpus} holds no documents")
    say(f"tokenizing {len(documents)} documents")
    bm25s = _bm25s()
    texts = [f"{d.title}\n{d.text}" if d.title else d.text for d in documents]
    tokens = bm25s.tokenize(
        texts, stopwords=stopwords, stemmer=_stemmer(stemmer), show_progress=False
    )
    say(f"indexing {len(tokens.vocab)} distinct terms")
    retriever = bm25s.BM25(k1=k1, b=b)
    retriever.index(tokens, show_progress=False)
    out.mkdir(parents=True, exist_ok=True)
    say(f"saving to {out}")
    retriever.save(str(out), show_progress=False)
    with (out / DOCUMENTS).open("w", encoding="utf-8") as handle:
        for doc in documents:
            handle.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
    manifest = {
        "format": FORMAT,
        "documents": len(documents),
        "terms": len(tokens.vocab),
        "corpus": {"path": str(corpus), "sha256": _sha256(corpus)},
        "bm25": {"k1": k1, "b": b, "method": "lucene"},
        "stemmer": stemmer,
        "stopwords": stopwords,
        "bm25s_version": getattr(bm25s, "__version__", "unknown"),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    # The manifest last: a directory without one is an interrupted build.
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    say(f"indexed {len(documents)} documents in {time.perf_counter() - started:.1f} s")
    return manifest


class LocalIndex:
    """A loaded index: BM25 ranking plus the documents, safe to query from many threads."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        manifest_path = self.directory / MANIFEST
        if not manifest_path.is_file():
            raise SearchIndexError(
                f"{self.directory} is not a search index (no {MANIFEST}); build one with "
                "`uniagent-search index CORPUS.jsonl --out DIR`"
            )
        self.manifest: dict[str, Any] = json.loads(manifest_path.read_text(encoding="utf-8"))
        if self.manifest.get("format") != FORMAT:
            raise SearchIndexError(
                f"{self.directory} has index format {self.manifest.get('format')!r}, this "
                f"version reads {FORMAT!r}; rebuild it with `uniagent-search index`"
            )
        self.retriever = _bm25s().BM25.load(str(self.directory), mmap=True, show_progress=False)
        self.documents: list[Document] = []
        with (self.directory / DOCUMENTS).open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                self.documents.append(parse_document(json.loads(line), f"{DOCUMENTS}:{number}"))
        if len(self.documents) != self.manifest["documents"]:
            raise SearchIndexError(
                f"{self.directory}: {DOCUMENTS} holds {len(self.documents)} documents, the "
                f"manifest says {self.manifest['documents']}; rebuild the index"
            )
        self.by_id = {doc.id: doc for doc in self.documents}
        self.stemmer_language: str | None = self.manifest.get("stemmer")
        self.stopwords: str = self.manifest.get("stopwords", "en")

    def __len__(self) -> int:
        return len(self.documents)

    def query_terms(self, query: str) -> list[str]:
        """The query as index terms (lower case, stop words dropped, stemmed)."""
        tokens = _bm25s().tokenize(
            [query],
            stopwords=self.stopwords,
            stemmer=_stemmer(self.stemmer_language),
            return_ids=False,
            show_progress=False,
        )
        return list(tokens[0])

    def search(self, query: str, top_k: int, snippet_chars: int = 300) -> list[Hit]:
        """The best ``top_k`` documents with a positive score, best first."""
        terms = self.query_terms(query)
        if not terms:
            return []
        k = min(top_k, len(self.documents))
        ids, scores = self.retriever.retrieve([terms], k=k, show_progress=False, n_threads=0)
        hits = []
        for position, score in zip(ids[0].tolist(), scores[0].tolist()):
            if score <= 0:
                continue
            doc = self.documents[position]
            hits.append(Hit(doc, float(score), self.snippet(doc.text, terms, snippet_chars)))
        return hits

    def snippet(self, text: str, terms: list[str], limit: int) -> str:
        """The passage of ``text`` (whole sentences, about ``limit`` chars) richest in ``terms``."""
        sentences = [s for s in _SENTENCE_END.split(text.strip()) if s]
        if not sentences:
            return ""
        wanted = set(terms)
        stemmer = _stemmer(self.stemmer_language)

        def overlap(sentence: str) -> int:
            words = [w.lower() for w in _WORD.findall(sentence)]
            stems = stemmer.stemWords(words) if stemmer is not None else words
            return len(wanted.intersection(stems))

        best = max(range(len(sentences)), key=lambda i: overlap(sentences[i]))
        if overlap(sentences[best]) == 0:
            best = 0
        passage = sentences[best]
        for sentence in sentences[best + 1 :]:
            if len(passage) + 1 + len(sentence) > limit:
                break
            passage += " " + sentence
        if len(passage) > limit:
            passage = passage[:limit].rsplit(" ", 1)[0] + " …"
        return ("… " if best > 0 else "") + passage
