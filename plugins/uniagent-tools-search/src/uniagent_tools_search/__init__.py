"""Search tools for uniagent: search, search_arxiv, fetch_document, and the search_qa reward."""
