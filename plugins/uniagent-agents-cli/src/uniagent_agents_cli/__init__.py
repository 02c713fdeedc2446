"""Agent harnesses for uniagent: mini-swe-agent (pip), Claude Code and Codex (npm).

Each is an :class:`uniagent.AgentSpec` (``agent: {name: mini-swe-agent}`` in a config):
installed pinned, run in the episode's sandbox with a gateway session as its model.
"""
