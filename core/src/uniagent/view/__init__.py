"""``uniagent view``: a local, read-only web app over run folders (extra ``uniagent[view]``).

:func:`serve` runs it; :func:`uniagent.view.app.create_app` builds the ASGI app over a
:class:`~uniagent.view.catalog.Catalog` of runs, each indexed by
:mod:`uniagent.view.rundir`, whose episode files :mod:`uniagent.view.access` reads. The
layout of a run folder is :mod:`uniagent.run.layout`'s.
"""

from __future__ import annotations

from uniagent.view.server import DEFAULT_PORT, serve

__all__ = ["DEFAULT_PORT", "serve"]
