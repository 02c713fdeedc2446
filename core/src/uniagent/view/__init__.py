"""``uniagent view``: a local, read-only web app over run folders (extra ``uniagent[view]``).

:func:`serve` runs it; :func:`uniagent.view.app.create_app` builds the ASGI app, and
:mod:`uniagent.view.rundir` is the one module that knows how a run folder is laid out.
"""

from __future__ import annotations

from uniagent.view.server import DEFAULT_PORT, serve

__all__ = ["DEFAULT_PORT", "serve"]
