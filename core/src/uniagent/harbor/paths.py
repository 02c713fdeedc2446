"""Harbor's fixed paths inside a task's sandbox, named once for the loader, the reward and
``uniagent verify``'s oracle."""

from __future__ import annotations

#: The task's ``tests/``, copied in at grading time.
TESTS = "/tests"
#: Harbor's logs: the verifier's (its reward files) and the agent's.
LOGS = "/logs"
VERIFIER_LOGS = "/logs/verifier"
AGENT_LOGS = "/logs/agent"
#: Where the agent leaves files for a separate verifier.
ARTIFACTS = "/logs/artifacts"
#: The oracle's ``solution/``, copied in by ``uniagent verify``.
SOLUTION = "/solution"
#: The paths the sandbox keeps for Harbor: the tests, the logs, the oracle's solution.
SANDBOX_DIRS = (TESTS, LOGS, SOLUTION)
#: What a Harbor container has from the start: where the agent leaves its logs and a
#: separate verifier's artifacts (the verifier's own dirs are made at grading).
AGENT_DIRS = (LOGS, AGENT_LOGS, ARTIFACTS)
