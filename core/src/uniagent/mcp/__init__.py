"""MCP servers as tools: a ``tools: [{mcp: {...}}]`` entry's server, listed at episode start.

A stdio server runs inside the episode's sandbox: a small client helper
(:mod:`uniagent.mcp.helper`, uploaded into the tools dir) starts it with the ``mcp`` SDK,
lists or calls one tool and prints the result. A streamable-HTTP server is reached from
the sandbox the same way. Needs ``pip install 'uniagent[mcp]'`` where the helper runs.
"""
