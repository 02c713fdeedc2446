"""The document corpus: one JSON object per line with ``id``, ``text`` and optional fields.

A line looks like ``{"id": "Mount_Everest", "title": "Mount Everest", "text": "...",
"url": "https://...", "metadata": {...}}``; ``id`` and ``text`` are required (non-empty
strings), ids are unique, other keys are rejected so a misspelt ``titel`` is not lost.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from uniagent_tools_search.errors import CorpusError

_KEYS = {"id", "title", "text", "url", "metadata"}


@dataclass(frozen=True)
class Document:
    """One corpus document."""

    id: str
    text: str
    title: str = ""
    url: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The corpus-line form of the document."""
        data: dict[str, Any] = {"id": self.id, "title": self.title, "text": self.text}
        if self.url:
            data["url"] = self.url
        if self.metadata:
            data["metadata"] = dict(self.metadata)
        return data


def parse_document(data: Any, where: str) -> Document:
    """A :class:`Document` from one decoded line; ``where`` names it in errors."""
    if not isinstance(data, Mapping):
        raise CorpusError(f"{where}: a document must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise CorpusError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; a document has "
            f"{', '.join(sorted(_KEYS))} (put extra fields under 'metadata')"
        )
    for key in ("id", "text"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise CorpusError(f"{where}: {key!r} must be a non-empty string")
    for key in ("title", "url"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise CorpusError(f"{where}: {key!r} must be a string")
    metadata = data.get("metadata") or {}
    if not isinstance(metadata, Mapping):
        raise CorpusError(f"{where}: 'metadata' must be an object")
    return Document(
        id=data["id"],
        text=data["text"],
        title=data.get("title") or "",
        url=data.get("url") or None,
        metadata=dict(metadata),
    )


def iter_corpus(path: str | Path) -> Iterator[Document]:
    """The documents of a JSONL corpus, checked line by line (errors name the line)."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    seen: set[str] = set()
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CorpusError(f"{where}: not valid JSON: {exc.msg}") from None
            doc = parse_document(data, where)
            if doc.id in seen:
                raise CorpusError(f"{where}: duplicate document id {doc.id!r}")
            seen.add(doc.id)
            yield doc


def write_corpus(path: str | Path, documents: Iterator[Document] | list[Document]) -> int:
    """Write documents as JSONL; returns how many."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for doc in documents:
            handle.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")
            count += 1
    return count
