"""Harness agents: install a harness once, run it in an episode's sandbox through the gateway.

:mod:`~uniagent.agents.install` puts a pinned harness (pip, npm, a binary) into uniagent's
cache; :mod:`~uniagent.agents.gateways` serves one gateway per model in this process;
:mod:`~uniagent.agents.harness` runs one episode's harness and reads its tree back. The
episode around it is :func:`uniagent.episode.run_episode`, with
:class:`~uniagent.agents.harness.HarnessAgent` as its agent. See docs/agents.md.
"""
