"""Harbor task folders as ``uniagent`` tasks: ``task.toml`` (schema 1.4), ``instruction.md``,
``environment/``, ``tests/test.sh`` and an optional ``solution/solve.sh``.

:mod:`uniagent.harbor.schema` is the typed model of ``task.toml``;
:mod:`uniagent.harbor.folders` turns a folder (or a folder of them) into task rows;
:mod:`uniagent.harbor.images` builds a task's image for the ``local`` backend. The
``harbor`` reward (:mod:`uniagent.builtin.harbor_reward`) runs the verifier. See docs/tasks.md.
"""
