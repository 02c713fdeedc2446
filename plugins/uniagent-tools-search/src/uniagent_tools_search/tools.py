"""The tool records: ``search``, ``search_arxiv`` and ``fetch_document``.

All three run one standard-library script (``scripts/search``, installed under the
three names) that asks the search service at ``$UNIAGENT_SEARCH_URL``. Optional
arguments default to empty values rather than ``null`` so the schemas stay plain.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from uniagent import ToolSpec

SCRIPTS_DIR = Path(__file__).parent / "scripts"
#: Each tool's script must exist in the sandbox with python3 (3.6+).
INSTALL_CHECK = (
    "command -v python3 >/dev/null || { echo 'the search tools need python3 in the sandbox' >&2;"
    " exit 1; }"
)
_DATE = r"^(\d{4}-\d{2}-\d{2})?$"


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchArguments(_Arguments):
    """Arguments of ``search``."""

    query: str = Field(
        min_length=1,
        description="What to look for, in a few specific words, e.g. `Mount Everest height` "
        "or `founder of Amazon`. Ask for one fact at a time.",
    )
    top_k: int = Field(5, ge=1, le=20, description="How many results to return (1-20).")


SEARCH_DESCRIPTION = (
    "Search the document collection and get the best matching documents.\n"
    "* Each result shows its title, its id and a snippet of the text that matches.\n"
    "* Results are ranked by keyword relevance (BM25): use the distinctive words of what you "
    "are looking for, and search again with other words if the results miss.\n"
    "* To read a whole document, call `fetch_document` with its id."
)


class SearchArxivArguments(_Arguments):
    """Arguments of ``search_arxiv``."""

    query: str = Field(
        min_length=1,
        description="Words to find in arXiv papers (all must occur), e.g. `graph neural "
        "networks molecules`; the arXiv syntax also works, e.g. `ti:transformer AND au:vaswani`.",
    )
    max_results: int = Field(5, ge=1, le=20, description="How many papers to return (1-20).")
    category: str = Field(
        "", description="Only papers of this arXiv category, e.g. `cs.LG`, `hep-th` (optional)."
    )
    date_from: str = Field(
        "", pattern=_DATE, description="Submitted on or after this date, YYYY-MM-DD (optional)."
    )
    date_to: str = Field(
        "", pattern=_DATE, description="Submitted on or before this date, YYYY-MM-DD (optional)."
    )


SEARCH_ARXIV_DESCRIPTION = (
    "Search arXiv for scientific papers.\n"
    "* Each result shows the title, the arXiv id, the submission date, the categories, the "
    "authors and the start of the abstract.\n"
    "* Narrow the search with `category` and a date range (`date_from`, `date_to`)."
)


class FetchDocumentArguments(_Arguments):
    """Arguments of ``fetch_document``."""

    id: str = Field(min_length=1, description="The id of a document, as shown by `search`.")
    offset: int = Field(
        0, ge=0, description="Where to start reading, in characters (for long documents)."
    )
    max_chars: int = Field(
        4000, ge=100, le=20000, description="How many characters to return (100-20000)."
    )


FETCH_DOCUMENT_DESCRIPTION = (
    "Read a document of the collection by its id (from `search` results).\n"
    "* Long documents come in parts: the output says which offset to ask for next."
)


def _tool(name: str, description: str, arguments: type[BaseModel]) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=description,
        arguments=arguments,
        scripts=(SCRIPTS_DIR / name,),
        install=INSTALL_CHECK,
    )


def make_search() -> ToolSpec:
    """The ``search`` tool (the service's default backend: the local corpus, or the web)."""
    return _tool("search", SEARCH_DESCRIPTION, SearchArguments)


def make_search_arxiv() -> ToolSpec:
    """The ``search_arxiv`` tool."""
    return _tool("search_arxiv", SEARCH_ARXIV_DESCRIPTION, SearchArxivArguments)


def make_fetch_document() -> ToolSpec:
    """The ``fetch_document`` tool (local corpus)."""
    return _tool("fetch_document", FETCH_DOCUMENT_DESCRIPTION, FetchDocumentArguments)


def make_tools() -> tuple[ToolSpec, ...]:
    """All three tools."""
    return (make_search(), make_search_arxiv(), make_fetch_document())
