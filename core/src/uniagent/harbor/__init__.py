"""Harbor task folders as ``uniagent`` tasks: ``task.toml`` (schema 1.4), ``instruction.md``,
``environment/``, ``tests/test.sh`` and an optional ``solution/solve.sh``.

:mod:`uniagent.harbor.schema` is the typed model of ``task.toml``;
:mod:`uniagent.harbor.folders` turns a folder (or a folder of them) into task rows;
:mod:`uniagent.harbor.images` builds a task's image for the ``local`` backend;
:mod:`uniagent.harbor.reward` is the ``harbor`` reward, which runs the verifier (registered
by the built-in plugin); :mod:`uniagent.harbor.paths` names Harbor's paths in the sandbox.
The package uses the grader and the task rows (:mod:`uniagent.tasks`), never the runner.
See docs/tasks.md.
"""
