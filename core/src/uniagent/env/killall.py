"""Ending every process in a container except the runtime serving it (before grading).

A container sandbox (``local``, Modal) runs ``swerex-remote`` and whatever the
agent started, ``setsid`` daemons included. Closing the agent's session ends
only its shell; this one-off script, run through the runtime's ``execute``,
stops and kills every process of the container's PID namespace except PID 1
and its own ancestors (which include the server answering the call), a few
rounds over, so a fork bomb's children are caught too.
"""

from __future__ import annotations

from typing import Any

from uniagent.env.runtime import Command

#: POSIX sh: parse each ancestor's /proc stat (``comm`` may hold spaces: split after ") ").
KILL_ALL_SCRIPT = r"""
keep=" 1 "
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ]; do
  keep="$keep$p "
  stat=$(cat "/proc/$p/stat" 2>/dev/null) || break
  rest=${stat##*) }
  set -- $rest
  p=$2
done
round=0
while [ $round -lt 8 ]; do
  round=$((round + 1))
  victims=""
  for d in /proc/[0-9]*; do
    pid=${d#/proc/}
    case "$keep" in *" $pid "*) continue ;; esac
    state=$(cut -d')' -f2 "$d/stat" 2>/dev/null | cut -d' ' -f2)
    [ "$state" = Z ] && continue
    victims="$victims $pid"
  done
  [ -z "$victims" ] && exit 0
  kill -STOP $victims 2>/dev/null
  kill -KILL $victims 2>/dev/null
done
exit 0
"""

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


async def kill_all_but_ancestors(runtime: Any, timeout: float = 60.0) -> None:
    """Run :data:`KILL_ALL_SCRIPT` in the sandbox through ``runtime.execute``."""
    await runtime.execute(
        Command(
            command=["/bin/sh", "-c", KILL_ALL_SCRIPT],
            env={"PATH": SYSTEM_PATH, "LC_ALL": "C"},
            timeout=timeout,
        )
    )
