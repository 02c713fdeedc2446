"""Grading an open sandbox the way an episode does, for reward plugins' tests.

::

    grader = await prepare_grader(env, "swe_bench", row, settings={"workdir": "/testbed"})
    ...  # act as the agent would: edit files in env
    grade = await grader.grade(env, messages=(), exit_reason=ExitReason.FINISHED, submission=None)

``prepare_grader`` takes the baseline (history scrub, snapshot, toolchain) as an
episode does before the agent's first turn; ``grade`` stops the session, restores
and screens, and runs the reward in a clean grading shell.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from uniagent.env import AgentEnv
from uniagent.exit import ExitReason
from uniagent.grading.grader import EpisodeGrader, Grade, GradingPlan
from uniagent.protect.settings import GradeIn, IntegritySettings
from uniagent.registry import get_registry


async def prepare_grader(
    env: AgentEnv,
    reward: str,
    task: Mapping[str, Any],
    *,
    settings: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    grade_in: GradeIn = "episode",
    integrity: Mapping[str, Any] | None = None,
    fresh_env: Callable[[], AgentEnv] | None = None,
) -> EpisodeGrader:
    """An :class:`EpisodeGrader` for reward ``reward`` with its baseline taken in ``env``.

    ``settings`` are the reward's raw settings, validated by its own model (``config`` is
    their deprecated name, until 0.4).
    """
    if config is not None:
        warnings.warn(
            "prepare_grader(config=...) is deprecated since uniagent 0.3 and goes in 0.4: "
            "pass settings=",
            DeprecationWarning,
            stacklevel=2,
        )
        settings = config if settings is None else settings
    spec = get_registry().rewards()[reward]
    plan = GradingPlan(
        spec=spec,
        settings=spec.settings.model_validate(dict(settings or {})) if spec.settings else None,
        task=task,
        grade_in=grade_in,
        integrity=IntegritySettings.model_validate(dict(integrity or {})),
        open_fresh=fresh_env,
        session_env=env.config.session_env(),
    )
    grader = EpisodeGrader(plan)
    await grader.prepare(env)
    return grader


async def grade(
    grader: EpisodeGrader,
    env: AgentEnv,
    *,
    submission: str | None = None,
    exit_reason: ExitReason = ExitReason.FINISHED,
    messages: Sequence[Mapping[str, Any]] = (),
) -> Grade:
    """Grade ``env`` as at the end of an episode (``messages``: its conversation)."""
    return await grader.grade(
        env, messages=messages, exit_reason=exit_reason, submission=submission
    )


#: A Python script that makes a relocated interpreter at ``sys.argv[1]``: an installation with
#: a prefix of its own, not a venv (as a conda env in a SWE-bench image), from the Python that
#: runs it. Its binary and standard library modules are copies (an attack may write to them),
#: the library's packages links; its own site-packages is empty. With ``--reach-base`` a
#: ``.pth`` there adds the running Python's site-packages (the test runner pytest, for one).
#: Prints the new installation's site-packages. Run it with the Python to copy: ``python3 -
#: DIR <<'EOF'`` in a sandbox, or ``[sys.executable, "-c", MAKE_PREFIX, DIR]``.
MAKE_PREFIX = """import os, shutil, site, subprocess, sys, sysconfig
env = os.path.abspath(sys.argv[1])
ver = "python%d.%d" % sys.version_info[:2]
lib = os.path.join(env, "lib", ver)
os.makedirs(os.path.join(env, "bin"))
os.makedirs(lib)
shutil.copy2(os.path.realpath(sys.executable), os.path.join(env, "bin", ver))
os.symlink(ver, os.path.join(env, "bin", "python"))
stdlib = sysconfig.get_paths()["stdlib"]
for name in os.listdir(stdlib):
    if name in ("site-packages", "dist-packages", "test", "__pycache__"):
        continue
    path = os.path.join(stdlib, name)
    if os.path.isdir(path):
        os.symlink(path, os.path.join(lib, name))
    else:
        shutil.copy2(path, lib)
asked = "import site; print(site.getsitepackages()[-1])"
own = subprocess.check_output([os.path.join(env, "bin", ver), "-c", asked], text=True).strip()
assert own.startswith(env + "/"), own
os.makedirs(own)
if "--reach-base" in sys.argv[2:]:
    reach = "; ".join("site.addsitedir(%r)" % p for p in site.getsitepackages())
    with open(os.path.join(own, "base.pth"), "w") as f:
        f.write("import site; " + reach + "\\n")
print(own)
"""


#: Grading commands whose outcome (output, status, truncation) must not depend on how the
#: grader runs them: in its resident shell or as a one-off, with or without the bounding
#: wrapper. Their output, stdin and exits cover what a wrapper could change: both streams,
#: an exit status, a read of an empty stdin, bytes that are not UTF-8, a cut at the output
#: limit, no final newline, the variables given, a shell that kills itself.
SAME_COMMANDS = (
    "echo out; echo err >&2; exit 3",
    'pwd; ls -d "$TMPDIR" "$HOME"',
    "cat; echo stdin-was-empty",
    "printf '\\377\\376 not utf-8\\n'",
    "head -c 5000 /dev/zero | tr '\\0' x",
    "printf 'no newline at the end'",
    "echo 'é ü 中' $ONLY_HERE",
    "kill -TERM $$",
)


def wait_ctime_after(started_ns: int, directory: Path) -> None:
    """Return once a change made in ``directory`` now carries a ctime after ``started_ns``
    (a file system's clock can be coarser than ``time.time_ns()``): synchronised on the file
    system's own timestamps, never on a sleep."""
    probe = directory / ".ctime-probe"  # (left there: its removal would be a change too)
    while True:
        probe.write_text("")
        if probe.stat().st_ctime_ns > started_ns:
            return
