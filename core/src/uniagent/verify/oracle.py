"""What a task's oracle is, and how it acts in the sandbox in the agent's place.

A Harbor task's oracle is its ``solution/`` folder, copied to ``/solution`` and run as
``bash /solution/solve.sh`` in the work dir, with ``[solution] env`` (Harbor's oracle
agent does the same). A SWE-bench row's is its gold ``patch`` (rows made with
``keep_gold_patch``), applied with ``git apply`` in the work dir and submitted as the
agent's diff. The baseline does nothing and submits nothing.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from uniagent.env.errors import EnvError
from uniagent.harbor.paths import SOLUTION
from uniagent.harbor.schema import expand_variables

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv

#: Seconds an oracle may run when the task does not say.
DEFAULT_TIMEOUT = 600.0


class OracleError(EnvError):
    """The oracle could not be put into the sandbox or run there (infrastructure)."""


@dataclass(frozen=True)
class Oracle:
    """A task's known solution: a script to run, or a patch to apply and submit."""

    kind: str
    script: Path | None = None
    patch: str | None = None
    env: Mapping[str, str] | None = None
    timeout: float = DEFAULT_TIMEOUT

    async def act(self, env: AgentEnv) -> tuple[str | None, dict[str, Any]]:
        """Solve the task in ``env`` as the agent would; the submission and what happened."""
        if self.script is not None:
            return None, await self._solve(env, self.script)
        assert self.patch is not None
        return self.patch, await self._apply(env, self.patch)

    async def _solve(self, env: AgentEnv, script: Path) -> dict[str, Any]:
        upload = "/tmp/uniagent-solution"  # the sandbox's /tmp: reachable by every backend
        await env.upload(str(script.parent), upload)
        staged = await env.run_action(
            f's=$(readlink -m {SOLUTION}) && mkdir -p "$s" && cp -R {upload}/. "$s"/ && '
            f"rm -rf {upload}",
            timeout=120,
        )
        if staged.exit_code != 0:
            raise OracleError(f"could not copy solution/ to {SOLUTION}: {staged.output[-300:]}")
        try:
            values = expand_variables(self.env or {}, "solution.env")
        except KeyError as exc:
            raise OracleError(str(exc.args[0])) from None
        exports = " ".join(shlex.quote(f"{k}={v}") for k, v in values.items())
        command = f"env {exports} bash {SOLUTION}/{script.name}"
        done = await env.run_action(command, timeout=self.timeout)
        return {"oracle_exit_code": done.exit_code, "oracle_output": done.output[-1000:]}

    async def _apply(self, env: AgentEnv, patch: str) -> dict[str, Any]:
        path = "/tmp/uniagent-gold.patch"
        await env.write_file(path, patch)
        done = await env.run_action(f"git apply --whitespace=nowarn {path}", timeout=self.timeout)
        if done.exit_code != 0:
            raise OracleError(f"the gold patch does not apply: {done.output[-500:]}")
        await env.run_action(f"rm -f {path}", timeout=60)
        return {"oracle_exit_code": done.exit_code}


def oracle_of(task: Mapping[str, Any]) -> Oracle | None:
    """The task's oracle, or ``None`` when it has none."""
    harbor = task.get("harbor")
    if isinstance(harbor, Mapping) and isinstance(harbor.get("dir"), str):
        script = Path(harbor["dir"]) / "solution" / "solve.sh"
        if not script.is_file():
            return None
        timeout = (harbor.get("agent") or {}).get("timeout_sec") or DEFAULT_TIMEOUT
        return Oracle("solve.sh", script=script, env=harbor.get("solution_env"), timeout=timeout)
    patch = task.get("patch")
    if isinstance(patch, str) and patch.strip():
        return Oracle("gold_patch", patch=patch)
    return None
