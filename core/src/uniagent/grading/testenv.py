"""The test environment as part of the baseline: the interpreter the tests really run, and all
it loads.

The toolchain check (:mod:`uniagent.grading.integrity`) covers the tools on the
grading ``PATH``. The tests, though, run after the eval script's own activation
(a conda env, a venv) with whatever interpreter its command names. So the
baseline also resolves the test environment exactly so: the reward's
:class:`~uniagent.protect.settings.TestEnv` (the activation lines, the words its
test command starts with) is run in a clean shell, each word looked up and
followed to its interpreter (a ``pytest`` script to its ``#!`` line), and that
interpreter, started as the tests start it (``.pth`` files and all, before the
agent's first turn), reports its roots: its prefixes, site-packages, stdlib
and every entry of its ``sys.path`` outside the repository, including those that do
not exist yet (``pythonXY.zip`` before the standard library, a ``PYTHONPATH`` directory,
a ``pyvenv.cfg`` beside or above the interpreter: made later, each would be read before
what the baseline saw); a conda activation adds ``$CONDA_PREFIX`` (its ``etc/conda/activate.d``)
and the conda installation itself. Each root is recorded as a digest of the names
under it (bytecode caches aside). A ``site-packages`` or ``dist-packages`` directory right
under a root is a root of its own where the interpreter's path has it, and is not walked
otherwise: the base installation's, under the standard library, when the tests run in a venv
(no module can be imported from it by that interpreter, and a name with a hyphen is no
package; a ``.pth`` or ``pyvenv.cfg`` that would put it on the path is itself checked).

Before grading in the episode's sandbox the same is checked: the words must
resolve to the same interpreters, every root's names must be the same, no file
under a root may have changed since the baseline (its ctime is after the
sandbox's clock then: ctime cannot be set back without setting the clock), and
bytecode written under a root since then is deleted (``__pycache__`` files are
loaded instead of the sources they claim to match). A change is toolchain
tampering (rule ``test-env``).

Without isolation the interpreter's own answer to the discovery is kept and given again to a
later baseline while every path it depends on is unchanged (:class:`_KeptAnswers`): its start
with ``site`` is most of the discovery's cost. Without an activation, the discovery with kept
answers (:func:`_discover_output`) and the check before grading (:func:`_verify_output`) are
then answered from the grader's process, line for line as the script prints them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from uniagent.grading import hosttools, walks
from uniagent.grading.integrity import (
    Baseline,
    GradingSetupError,
    Tamper,
    all_read_only,
    file_digests,
    first_of_a_wave,
    fixed_path,
    run_script,
    stat_keys,
)
from uniagent.grading.sandbox import GradingSandbox, off_loop
from uniagent.grading.scripts import FIND_WORD, STAT_FILES
from uniagent.protect.settings import TestEnv

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv

#: How many changed files a root reports at most.
MAX_CHANGED = 50

_ROOTS_PY = r"""
import importlib.util, os, site, sys, sysconfig
roots = set()
try:
    roots.update(site.getsitepackages())
except Exception:
    pass
for key in ("stdlib", "platstdlib", "purelib", "platlib"):
    try:
        roots.add(sysconfig.get_paths()[key])
    except Exception:
        pass
roots.update(os.path.abspath(p) for p in sys.path if p)
roots.add(sys.executable)
# where the interpreter looks for a venv's configuration at start-up (beside it, above it)
roots.add(os.path.join(os.path.dirname(sys.executable), "pyvenv.cfg"))
roots.add(os.path.join(sys.prefix, "pyvenv.cfg"))
files = set()
walked = set()
for d in sys.path:
    if d and os.path.isdir(d):
        for name in os.listdir(d):
            path = os.path.join(d, name)
            if name.endswith(".pth") or name in ("sitecustomize.py", "usercustomize.py"):
                files.add(path)
            elif name.endswith((".dist-info", ".egg-info")):
                files.add(os.path.join(path, "entry_points.txt"))
for name in ("sitecustomize", "usercustomize", "pytest", "_pytest", "pluggy"):
    try:
        spec = importlib.util.find_spec(name)
    except Exception:
        continue
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        continue
    for root in spec.submodule_search_locations or ():
        for here, _, names in os.walk(root):
            walked.add(here)
            files.update(os.path.join(here, f) for f in names if f.endswith(".py"))
    files.add(spec.origin)
# Every one, whether there or not: a path on sys.path (pythonXY.zip before the standard
# library), a site directory or a pyvenv.cfg made after the baseline is read first next time.
for root in sorted(roots):
    print("root", os.path.realpath(root))
for path in sorted(files):
    if os.path.isfile(path):
        print("file", os.path.realpath(path))
# What the answer depends on (a later sandbox takes it while none of them changed:
# _KeptAnswers): the directories whose names it read, the files run at start-up.
deps = {os.path.abspath(p) for p in sys.path if p} | roots | files | walked
for module in list(sys.modules.values()):
    origin = getattr(module, "__file__", None)
    if isinstance(origin, str):
        deps.add(os.path.abspath(origin))
for path in sorted(deps):
    print("dep", path)
"""

#: ``env-bin WORD PATH`` for each word of $INTERPRETERS after $ACTIVATE (in the repository,
#: in a subshell, its output discarded); with $MODE ``discover`` the roots its interpreters
#: and the activation report (``root PATH``, into $ROOTS) and the files they load at start-up
#: or as the runner (into $FILES, printed as ``file PATH``). Then ``stat KEY FILE`` for each
#: file of $FILES (hashed by :func:`~uniagent.grading.integrity.file_digests` where the key is
#: new), and for each root of $ROOTS ``digest ROOT SHA`` of the names under it; with $SINCE,
#: the files changed since then (``changed PATH``) and the bytecode written since, deleted
#: (``purged ROOT N``), all from one walk of the root, and ``digest ROOT =`` (the baseline's
#: names) where no directory under it changed: a name added, removed or renamed changes its
#: directory's ctime. With $SHARED, ``digest ROOT shared`` instead for each root that does
#: not hold the repository: the grader walks those itself (:mod:`uniagent.grading.walks`).
TEST_ENV = (
    STAT_FILES
    + FIND_WORD
    + r"""
activated() (
  exec 3>&1 >/dev/null 2>&1 </dev/null
  set +eu
  eval "$ACTIVATE" 4>&-
  exec 1>&3
  asked=
  for word in $INTERPRETERS; do
    find_word "$word" || continue
    printf 'env-bin %s %s\n' "$word" "$real"
    [ "$MODE" = discover ] || continue
    printf 'root %s\n' "$real"
    if [ -n "$shim" ]; then  # and pyenv's own code, which picked it
      r=${pyenv_root:-${shim%/shims/*}}
      printf 'root %s\n' "$shim" "$r/version" "$r/libexec"
    fi
    py=$p  # as found, not the link's target: a venv's python finds its pyvenv.cfg so
    first=  # (its first line: read by the shell, no process)
    IFS= read -r -N 256 first 2>/dev/null < "$real"
    first=${first%%$'\n'*}
    case "$first" in
      '#!'*) set -- ${first#??}; py=${1:-}
             case "${py##*/}" in env) py=$(command -v "${2:-}" 2>/dev/null) ;; esac ;;
    esac
    [ -n "$py" ] || continue
    # python and python3 of one bin directory are one interpreter: asked once
    if [ "$py" = "$p" ]; then target=$real; else target=$(readlink -f "$py"); fi
    key="|${py%/*} $target|"
    case "$asked" in *"$key"*) continue ;; esac
    asked=$asked$key
    # An answer the grader kept for this interpreter ($KEPT: PY TAB TARGET TAB FILE lines),
    # else its own; with $KEEP, a new one is also printed for the grader to keep
    # (_KeptAnswers), on the script's output (fd 4: no file another sandbox could write).
    kept=
    while IFS=$'\t' read -r kept_py kept_target kept_file; do
      [ "$kept_py" = "$py" ] && [ "$kept_target" = "$target" ] && kept=$kept_file
    done <<< "$KEPT"
    if [ -n "$kept" ]; then
      cat -- "$kept"; echo
    else
      answer=$("$py" -c "$ROOTS_PY" 2>/dev/null 4>&-)  # (fd 4: for this shell alone)
      status=$?
      printf '%s\n' "$answer"
      [ -z "$KEEP" ] || printf 'answer\t%s\t%s\t%s\n\t%s\n' \
        "$py" "$target" "$status" "${answer//$'\n'/$'\n\t'}" >&4
    fi
  done
  if [ "$MODE" = discover ]; then
    # conda's activation: the env's activate.d scripts, the installation's shell hooks and
    # the conda package that writes the activation.
    [ -n "${CONDA_PREFIX:-}" ] && printf 'root %s\n' "$CONDA_PREFIX/etc/conda"
    if [ -n "${CONDA_EXE:-}" ]; then
      base=${CONDA_EXE%/bin/conda}
      printf 'root %s\n' "$CONDA_EXE" "$base/etc" "$base/condabin" "$base/bin/activate" \
        "$base"/lib/python*/site-packages/conda
    fi
    # a venv's activation: its scripts (activate, the console scripts) and its config
    [ -n "${VIRTUAL_ENV:-}" ] && printf 'root %s\n' "$VIRTUAL_ENV/bin" "$VIRTUAL_ENV/pyvenv.cfg"
  fi
  true
)
cd "$REPO" 2>/dev/null || cd / || exit 3  # where the eval script activates
# What the interpreters and the activation said, held by this shell (not in a file that
# another sandbox without isolation could rewrite before it is read).
exec 4>&1
said=$(activated; printf x)
said=${said%x}
grep '^env-bin ' <<< "$said"
if [ "$MODE" = discover ]; then
  # One sort, one awk: the roots kept (into $ROOTS and printed), then the files.
  : > "$ROOTS"; : > "$FILES"
  LC_ALL=C sort -u <<< "$said" \
    | awk -v repo="$REPO" -v scratch="${TMPDIR%/tmp}" -v roots="$ROOTS" -v files="$FILES" '
    /^file / { found[++m] = substr($0, 6); next }
    !/^root / { next }
    { p = substr($0, 6) }
    p == "/" || p == repo || index(p, repo "/") == 1 || index(p, scratch "/") == 1 { next }
    p ~ "^/(proc|sys|dev)(/|$)" { next }
    {
      for (i = 1; i <= n; i++)
        if (index(p, kept[i] "/") == 1 &&
            substr(p, length(kept[i]) + 2) !~ /^((envs|pkgs)\/|(site|dist)-packages(\/|$))/) next
      kept[++n] = p
      print p > roots
      print "root " p
    }
    END {
      for (i = 1; i <= m; i++) { print found[i] > files; print "file " found[i] }
    }'
fi
tr '\n' '\0' < "$FILES" > "$FILES.nul"
stat_files "$FILES.nul"
while IFS= read -r root; do
  case $'\n'"$KNOWN"$'\n' in  # read-only in every sandbox: its digest is known
    *$'\n'"$root"$'\n'*) printf 'digest %s known\n' "$root"; continue ;;
  esac
  if [ -n "$SHARED" ]; then  # walked by the grader on the host, shared between episodes
    case "$REPO/" in "$root"/*) ;; *) printf 'digest %s shared\n' "$root"; continue ;; esac
  fi
  [ -e "$root" ] || { printf 'digest %s missing\n' "$root"; continue; }
  skip=( \( -path "$root/pkgs" -o -path "$root/envs" -o -path "$root/site-packages" \
          -o -path "$root/dist-packages" -o -path "$REPO" \) -prune -o )
  names=1
  if [ -n "$SINCE" ]; then
    # One walk: what changed since the baseline's clock. Bytecode is deleted; another
    # changed file is reported; a changed directory (not a __pycache__) may have other
    # names now, so only then are the names listed again.
    names= changed=0 purged=0
    : > "$TMPDIR/purge"
    while IFS= read -r -d '' entry; do
      kind=${entry%% *} path=${entry#* }
      case "$path/" in
        */__pycache__/*)
          case "$path" in */__pycache__) [ "$kind" = d ] && continue ;; esac
          printf '%s\0' "$path" >> "$TMPDIR/purge"
          purged=$((purged + 1))
          continue ;;
      esac
      if [ "$kind" = d ]; then names=1
      elif [ "$changed" -lt "$MAX" ]; then printf 'changed %s\n' "$path"; changed=$((changed + 1))
      fi
    done < <(find "$root" -xdev "${skip[@]}" -newerct "@$SINCE" -printf '%y %p\0' 2>/dev/null)
    xargs -0 -r rm -f -- < "$TMPDIR/purge" 2>/dev/null
    printf 'purged %s %s\n' "$root" "$purged"
    [ -d "$root" ] || names=1  # a file: its one name costs nothing (and it may be new)
  fi
  if [ -n "$names" ]; then
    sum=$(find "$root" -xdev "${skip[@]}" -name __pycache__ -prune -o -printf '%P\0' 2>/dev/null \
          | LC_ALL=C sort -z | sha256sum)
    printf 'digest %s %s\n' "$root" "${sum%% *}"
  else
    printf 'digest %s =\n' "$root"  # the names are the baseline's
  fi
done < "$ROOTS"
exit 0
"""
)


def _variables(
    baseline: Baseline,
    spec: TestEnv,
    scratch: str,
    mode: str,
    since: str,
    repo: str | None = None,
    known: tuple[str, ...] = (),
    shared: bool = False,
    kept: str = "",
    keep: bool = False,
) -> dict[str, str]:
    return {
        "ACTIVATE": spec.activate,
        "INTERPRETERS": " ".join(spec.interpreters),
        "ROOTS_PY": _ROOTS_PY,
        "MODE": mode,
        "ROOTS": f"{scratch}/roots",
        "FILES": f"{scratch}/files",
        "REPO": repo or baseline.repo or "/nonexistent",
        "SINCE": since,
        "MAX": str(MAX_CHANGED),
        "KNOWN": "\n".join(known),
        "SHARED": "1" if shared else "",
        "KEPT": kept,
        "KEEP": "1" if keep else "",
    }


def _record(output: str) -> tuple[dict[str, str], list[str], dict[str, int]]:
    """``bin:WORD`` -> path and ``root:PATH`` -> digest; the changed files; purged counts."""
    record: dict[str, str] = {}
    changed: list[str] = []
    purged: dict[str, int] = {}
    for line in output.splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "env-bin":
            word, _, path = rest.partition(" ")
            record[f"bin:{word}"] = path
        elif kind == "digest":
            root, _, digest = rest.rpartition(" ")
            record[f"root:{root}"] = digest
        elif kind == "changed":
            changed.append(rest)
        elif kind == "purged":
            root, _, count = rest.rpartition(" ")
            purged[root] = int(count) if count.isdigit() else 0
    return record, changed, purged


async def discover(sandbox: GradingSandbox, baseline: Baseline, spec: TestEnv) -> None:
    """Record the test environment in ``baseline`` (before the agent's first turn).

    Where nothing the record depends on can differ between the sandboxes of this process
    (:func:`_fixed_key`, :func:`_fixed_sources`), the first sandbox's record is every later
    one's, and no command runs.
    """
    key = await off_loop(_fixed_key, sandbox, baseline, spec)
    if key is None or key in _UNFIXED_RECORDS:
        await _discover(sandbox, baseline, spec)
        return
    if await _known(sandbox, baseline, spec, key):
        return
    async with first_of_a_wave(("test-env", key)):  # the others take its record
        if await _known(sandbox, baseline, spec, key):
            return
        await _discover(sandbox, baseline, spec)
        record = dict(baseline.test_env or {})
        found = await off_loop(_fixed_sources, sandbox.env, record)
        if found is not None and baseline.test_env is not None:
            if len(_FIXED_RECORDS) > _FIXED_RECORDS_MAX:
                _FIXED_RECORDS.clear()
            _FIXED_RECORDS[key] = (record, found)
        else:  # (later sandboxes of this key discover it themselves, none waits for another)
            if len(_UNFIXED_RECORDS) > _FIXED_RECORDS_MAX:
                _UNFIXED_RECORDS.clear()
            _UNFIXED_RECORDS.add(key)


async def _known(
    sandbox: GradingSandbox, baseline: Baseline, spec: TestEnv, key: tuple[object, ...]
) -> bool:
    """Take the known record of ``key`` where its paths still show the same sources."""
    known = _FIXED_RECORDS.get(key)
    if known is None:
        return False
    record, sources = known
    if await off_loop(_fixed_sources, sandbox.env, record) != sources:
        return False
    baseline.test_env = dict(record)
    baseline.test_env_spec = spec
    return True


async def _discover(sandbox: GradingSandbox, baseline: Baseline, spec: TestEnv) -> None:
    env = sandbox.env
    sources = {r: env.read_only_source(r) for r, _ in list(_READ_ONLY)}
    known = {r: _READ_ONLY[(r, s)] for r, s in sources.items() if (r, s) in _READ_ONLY}
    cache = _kept_key(sandbox, baseline, spec)
    if cache is not None and cache not in _KEPT.tried:
        # A run's first wave: one sandbox's interpreters answer, the others take the answer.
        async with first_of_a_wave(("test-env-answers", cache)):
            if cache not in _KEPT.tried:
                try:
                    output = await _discovery(sandbox, baseline, spec, tuple(known), cache)
                finally:
                    _KEPT.tried_once(cache)
            else:
                output = await _discovery(sandbox, baseline, spec, tuple(known), cache)
    else:
        output = await _discovery(sandbox, baseline, spec, tuple(known), cache)
    record, _, _ = _record(output)
    walked = [key.removeprefix("root:") for key, digest in record.items() if digest == "shared"]
    for found in await asyncio.gather(*map(walks.current_names, walked)):
        if found.too_many:
            raise GradingSetupError(
                f"the test environment's {found.root} holds more than {walks.MAX_ENTRIES} "
                "names, more than the grader walks: the task cannot be graded without isolation"
            )
        record[f"root:{found.root}"] = (
            await off_loop(found.names_digest) if found.exists else "missing"
        )
    missing = [w for w in spec.required if f"bin:{w}" not in record]
    if missing:
        raise GradingSetupError(
            f"the test command's interpreter {' '.join(missing)} cannot be resolved in the "
            "sandbox (after the eval script's activation, where its tests run): the task "
            "cannot be graded"
        )
    for key, digest in record.items():
        if not key.startswith("root:"):
            continue
        root = key.removeprefix("root:")
        if digest == "known":
            record[key] = known[root]
        elif digest != "missing" and (source := env.read_only_source(root)) is not None:
            if len(_READ_ONLY) > _READ_ONLY_MAX:
                _READ_ONLY.clear()
            _READ_ONLY[(root, source)] = digest
    files = [line[5:] for line in output.splitlines() if line.startswith("file ")]
    record.update(await _hashes(sandbox, output, files))
    baseline.test_env = record
    baseline.test_env_spec = spec


#: The modules the discovery's interpreter looks up by name (:data:`_ROOTS_PY`): it runs in the
#: repository, where a top-level file or directory of such a name is found before any other
#: (and so below it, where a directory of the repository is on ``sys.path``).
_LOOKED_UP = frozenset({"sitecustomize", "usercustomize", "pytest", "_pytest", "pluggy"})


def _repository_enters(listing: Mapping[str, str]) -> bool:
    """Whether a file of the repository could be part of the discovery's record, found as
    one of :data:`_LOOKED_UP` (at any depth: a directory of it may be on ``sys.path``, or
    an editable install's finder may lead there) or read as a start-up file of a
    ``sys.path`` directory (a ``.pth``, a distribution's ``entry_points.txt``)."""
    for path in listing:
        folder, _, name = path.rpartition("/")
        if name.partition(".")[0] in _LOOKED_UP or name.endswith(".pth"):
            return True
        if name == "entry_points.txt" and folder.endswith((".dist-info", ".egg-info")):
            return True
    return False


def _fixed_key(
    sandbox: GradingSandbox, baseline: Baseline, spec: TestEnv
) -> tuple[object, ...] | None:
    """What the discovery's answer depends on besides the files it reads, where that is all:
    no activation (its scripts may read what the sandbox can write), the grading ``PATH``
    wholly read-only (:func:`~uniagent.grading.integrity.fixed_path`), each interpreter word
    a name or an absolute path (a relative one is the repository's), and no file of the
    repository that the record could hold (:func:`_repository_enters`): the same key in
    another task's repository then gives the same record.
    The key is then that ``PATH`` with its sources, the whole grading environment, the
    interpreter words and the repository's path (a relative ``PYTHONPATH`` entry is read
    from there), the sandbox's own scratch dir aside. ``None``: discovered as usual."""
    path = fixed_path(sandbox)
    if path is None or spec.activate.strip():
        return None
    if any("/" in word and not posixpath.isabs(word) for word in spec.interpreters):
        return None
    if _repository_enters(baseline.listing):
        return None
    # (HOME and TMPDIR are in each grading sandbox's own scratch dir, which the record leaves
    # out: a root there is not recorded, and a start-up file there is not read-only)
    scratch = {f"{sandbox.scratch}/{name}": f"SCRATCH/{name}" for name in ("home", "tmp")}
    environment = tuple(sorted((k, scratch.get(v, v)) for k, v in sandbox.environment.items()))
    return (path, environment, spec.interpreters, spec.required, baseline.repo)


#: How long before an interpreter answered a change of one of its paths still makes the answer
#: doubtful (a file system's clock is coarser than this process's: :data:`walks.CTIME_SLACK_NS`).
KEPT_SLACK_NS = walks.CTIME_SLACK_NS

#: Environment variables whose relative paths Python would read from where it starts (the
#: repository): an answer that used one is the repository's, not kept.
_CWD_VARIABLES = (
    "PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "PYTHONPYCACHEPREFIX",
    "PYTHONEXECUTABLE",
)  # fmt: skip


async def _discovery(
    sandbox: GradingSandbox,
    baseline: Baseline,
    spec: TestEnv,
    known: tuple[str, ...],
    cache: tuple[object, ...] | None,
) -> str:
    """The discovery script's output, with the interpreters' kept answers of ``cache`` that
    still hold (:class:`_KeptAnswers`), keeping the new ones; answered from here where they
    are all it needs (:func:`_discover_output`)."""
    answers: dict[tuple[str, str], str] = {}
    if cache is not None:
        answers = await off_loop(_KEPT.holding, cache)
        if answers:
            here = await off_loop(
                _discover_output, sandbox.environment, baseline.repo or "/nonexistent",
                sandbox.scratch, spec.interpreters, answers, known,
            )  # fmt: skip
            if here is not None:
                _KEPT.gave(len(answers))
                return here
    kept = await off_loop(_KEPT.offer, answers, sandbox.scratch) if answers else ""
    shared = sandbox.env.sees_host_files()
    started = time.time_ns()
    keep = cache is not None
    output = await run_script(
        sandbox, TEST_ENV,
        _variables(baseline, spec, sandbox.scratch, "discover", "", None, known, shared, kept,
                   keep),
        what="resolving the test environment",
        resident=True,  # it starts the interpreters, but before the agent's first turn
    )  # fmt: skip
    if cache is not None:
        await off_loop(_KEPT.keep, cache, output, sandbox.scratch, baseline.repo, started)
    return output


def _kept_key(
    sandbox: GradingSandbox, baseline: Baseline, spec: TestEnv
) -> tuple[object, ...] | None:
    """The key of the interpreters' answers that the discovery in ``sandbox`` may take from an
    earlier one (:class:`_KeptAnswers`), where the sandbox sees the host's files (no
    isolation: nothing is read-only, so each answer is checked before it is taken), there is
    no activation (its scripts may read what any sandbox can write), each interpreter word is
    a name or an absolute path, no environment variable names a path relative to the
    repository, and no file of the repository could be part of the answer
    (:func:`_repository_enters`). The key is the whole grading environment, the sandbox's
    own scratch dir aside (as :func:`_fixed_key`'s). ``None``: the interpreters answer."""
    if not sandbox.env.sees_host_files() or spec.activate.strip():
        return None
    if any("/" in word and not posixpath.isabs(word) for word in spec.interpreters):
        return None
    environment = sandbox.environment
    for name in _CWD_VARIABLES:
        value = environment.get(name)
        if value is not None and not all(posixpath.isabs(p) for p in value.split(":")):
            return None
    if _repository_enters(baseline.listing):
        return None
    scratch = {f"{sandbox.scratch}/{name}": f"SCRATCH/{name}" for name in ("home", "tmp")}
    return tuple(sorted((k, scratch.get(v, v)) for k, v in environment.items()))


@dataclass
class _Answer:
    """An interpreter's answer (its ``root`` and ``file`` lines) and what it depends on: the
    paths it named as such (:data:`_ROOTS_PY`'s ``dep`` lines, the interpreter) and their
    targets, each with its (device, inode), or ``None`` where it was missing."""

    text: str
    deps: list[tuple[str, tuple[int, int] | None]]
    started_ns: int

    def holds(self) -> bool:
        """Whether the interpreter would answer the same now (blocking): each of its paths is
        the same file, unchanged since shortly before it answered, or still missing."""
        return walks.paths_unchanged(self.deps, self.started_ns - KEPT_SLACK_NS)


class _KeptAnswers:
    """The interpreters' answers to the discovery (:data:`_ROOTS_PY`) in sandboxes that see
    the host's files, kept by :func:`_kept_key` and interpreter: starting an interpreter with
    its ``site`` (every ``.pth`` file and what it imports) costs tens of milliseconds to a
    tenth of a second, per episode. An answer is given again only while :meth:`_Answer.holds`;
    it is kept only where it names neither the sandbox's scratch dir nor its repository, and
    none of its paths changed while the interpreter ran."""

    MAX_KEYS = 64

    def __init__(self) -> None:
        #: (Its methods run on worker threads, several at once.)
        self._lock = threading.Lock()
        self._answers: dict[tuple[object, ...], dict[tuple[str, str], _Answer]] = {}
        #: The keys whose interpreters have answered once (a later wave of sandboxes runs
        #: at once, without waiting for another's answer).
        self.tried: set[tuple[object, ...]] = set()
        #: How many answers were given again (for tests and the bench).
        self.given = 0

    def gave(self, count: int) -> None:
        """Count ``count`` answers given again."""
        with self._lock:
            self.given += count

    def tried_once(self, key: tuple[object, ...]) -> None:
        """Note that the interpreters of ``key`` answered once, kept or not."""
        if len(self.tried) >= self.MAX_KEYS:
            self.tried.clear()
        self.tried.add(key)

    def holding(self, key: tuple[object, ...]) -> dict[tuple[str, str], str]:
        """The answers of ``key`` that still hold, by interpreter and target (blocking); the
        others are let go."""
        with self._lock:
            answers = list(self._answers.get(key, {}).items())
        holding: dict[tuple[str, str], str] = {}
        for found, answer in answers:
            if answer.holds():
                holding[found] = answer.text
            else:
                with self._lock:
                    kept = self._answers.get(key, {})
                    if kept.get(found) is answer:
                        del kept[found]
        return holding

    def offer(self, answers: Mapping[tuple[str, str], str], scratch: str) -> str:
        """Write ``answers`` (:meth:`holding`'s) into ``scratch`` (blocking): the script's
        ``KEPT`` lines."""
        lines: list[str] = []
        for (py, target), text in answers.items():
            path = f"{scratch}/kept-{len(lines)}"
            try:
                with open(path, "x", encoding="utf-8", errors="surrogateescape") as out:
                    out.write(text)
            except OSError:
                continue  # (the interpreter answers)
            lines.append(f"{py}\t{target}\t{path}")
        self.gave(len(lines))
        return "\n".join(lines)

    def keep(
        self, key: tuple[object, ...], output: str, scratch: str, repo: str | None, started: int
    ) -> None:
        """Keep the answers the interpreters gave in the discovery just run in ``scratch``:
        its output's ``answer`` blocks (blocking). Taken from the script's output, not from a
        file: without isolation another episode's agent can write in this one's scratch dir,
        and a forged answer would be given to every later sandbox."""
        fresh: dict[tuple[str, str], _Answer] = {}
        asked: list[str] | None = None
        lines: list[str] = []

        def done() -> None:
            if asked is not None and len(asked) == 3 and asked[2] == "0":
                answer = _answer(asked[0], asked[1], lines, scratch, repo, started)
                if answer is not None:
                    fresh[(asked[0], asked[1])] = answer

        for line in output.split("\n"):
            if line.startswith("\t") and asked is not None:
                lines.append(line[1:])
                continue
            done()
            asked, lines = None, []
            if line.startswith("answer\t"):
                asked = line.split("\t")[1:]
        done()
        if fresh:
            with self._lock:
                if key not in self._answers and len(self._answers) >= self.MAX_KEYS:
                    self._answers.clear()
                self._answers.setdefault(key, {}).update(fresh)


def _answer(
    py: str, target: str, lines: list[str], scratch: str, repo: str | None, started: int
) -> _Answer | None:
    """An interpreter's answer as :class:`_Answer`, or ``None`` where it may not be kept."""
    kept = [line for line in lines if line.startswith(("root ", "file "))]
    named = [line[4:] for line in lines if line.startswith("dep ")]
    text = "".join(f"{line}\n" for line in kept)
    if f"{scratch}/" in text or (repo and repo in text):
        return None
    limit = started - KEPT_SLACK_NS
    deps: dict[str, tuple[int, int] | None] = {}
    for path in [py, target, *named]:
        if not posixpath.isabs(path):
            return None
        for here in (path, os.path.realpath(path)):
            if here in deps:
                continue
            try:
                info = os.lstat(here)
            except FileNotFoundError:
                deps[here] = None
                continue
            except OSError:
                return None
            if info.st_ctime_ns >= limit:
                return None  # changed just before or while it ran
            deps[here] = (info.st_dev, info.st_ino)
    return _Answer(text, list(deps.items()), started)


_KEPT = _KeptAnswers()


def _fixed_sources(env: AgentEnv, record: Mapping[str, str]) -> tuple[object, ...] | None:
    """The host sources of every interpreter, root and start-up file of ``record`` (of each
    file's directory), where every one is at or below a read-only bind that no sandbox of
    this process can write (no pyenv shim among them: its choice reads version files
    elsewhere); ``None`` otherwise. Asked again when a later sandbox takes a known record:
    the same answer means the same files."""
    files = [k for k in record if not k.startswith(("bin:", "root:"))]
    if not all(posixpath.isabs(f) for f in files):
        return None
    paths = {p for k, p in record.items() if k.startswith("bin:")}
    paths |= {k.removeprefix("root:") for k in record if k.startswith("root:")}
    paths |= {posixpath.dirname(posixpath.normpath(f)) for f in files}
    found = []
    for path in sorted(paths):
        if not posixpath.isabs(path) or "/shims/" in path:
            return None
        source = env.read_only_source(path)
        if source is None:
            return None
        found.append((path, source))
    return tuple(found)


#: Test-environment records that no sandbox of this process can change, by
#: :func:`_fixed_key`, with their sources (:func:`_fixed_sources`): discovered once per
#: process (a run, a verl worker), not per episode.
_FIXED_RECORDS: dict[tuple[object, ...], tuple[dict[str, str], tuple[object, ...]]] = {}
_FIXED_RECORDS_MAX = 1_000
#: Keys of :data:`_FIXED_RECORDS` whose record was found not wholly read-only.
_UNFIXED_RECORDS: set[tuple[object, ...]] = set()


#: The digests of the names under test-environment roots that no sandbox of this process can
#: change (:meth:`~uniagent.env.AgentEnv.read_only_source`: a read-only bind under bubblewrap),
#: by root and the host path it shows: listed once per process, not per episode.
_READ_ONLY: dict[tuple[str, str | None], str] = {}
_READ_ONLY_MAX = 10_000


async def _hashes(sandbox: GradingSandbox, output: str, files: list[str]) -> dict[str, str]:
    """FILE -> sha256 (``missing`` when it cannot be read) of the start-up files, from the
    ``stat`` lines of ``output`` (read only where their key is new)."""
    keys = stat_keys(output)
    digests = await file_digests(sandbox, {f: keys[f] for f in files if f in keys})
    return {f: digests.get(f, "missing") for f in files}


async def verify(
    sandbox: GradingSandbox,
    baseline: Baseline,
    *,
    since_baseline: bool = True,
    moved: Callable[[str], str] | None = None,
    repo: str | None = None,
) -> tuple[list[Tamper], int]:
    """The test environment's changes since the baseline, and how many bytecode files
    written since were deleted.

    ``since_baseline`` (the episode's own sandbox) also checks which files changed after
    the baseline's clock. A fresh sandbox is compared by names, interpreters and contents
    only (a fresh machine may unpack its image anew), its paths mapped by ``moved`` (a
    sandbox's own directories differ between sandboxes; what they share must not), in
    ``repo``.
    """
    spec, recorded = baseline.test_env_spec, baseline.test_env
    if spec is None or recorded is None:
        return [], 0
    move = moved or (lambda path: path)
    before = {
        _moved_key(key, move): move(value) if key.startswith("bin:") else value
        for key, value in recorded.items()
    }
    if await off_loop(_unchangeable, sandbox, spec, before):
        return [], 0
    s = sandbox.scratch
    roots = [key.removeprefix("root:") for key in before if key.startswith("root:")]
    # In the episode's own sandbox, what it cannot write is as it was: not walked again.
    fixed = [r for r in roots if since_baseline and sandbox.env.read_only_source(r) is not None]
    roots = [r for r in roots if r not in fixed]
    files = [key for key in before if key.startswith("/")]
    since = (baseline.epoch or "") if since_baseline else ""
    shared = sandbox.env.sees_host_files()
    output = None
    if shared and not spec.activate.strip():  # answered from here, as the script would
        where = repo or baseline.repo or "/nonexistent"
        path = sandbox.environment.get("PATH", "")
        output = await off_loop(_verify_output, path, where, spec.interpreters, roots, files)
    if output is None:
        lines = (f"{r}\n" for r in roots)
        await sandbox.stage_bytes(f"{s}/roots", "".join(lines).encode("utf-8", "surrogateescape"))
        lines = (f"{f}\n" for f in files)
        await sandbox.stage_bytes(f"{s}/files", "".join(lines).encode("utf-8", "surrogateescape"))
        output = await run_script(
            sandbox, TEST_ENV, _variables(baseline, spec, s, "verify", since, repo, shared=shared),
            what="checking the test environment",
            resident=False,  # it sources the activation, which the agent may have changed
        )  # fmt: skip
    after, changed, purged = _record(output)
    walked = [key.removeprefix("root:") for key, digest in after.items() if digest == "shared"]
    answers = await asyncio.gather(*(_shared_since(root, since) for root in walked))
    for root, (digest, more, count) in zip(walked, answers, strict=True):
        after[f"root:{root}"], purged[root] = digest, count
        changed += more
    after.update(await _hashes(sandbox, output, files))
    after.update((f"root:{r}", before[f"root:{r}"]) for r in fixed)
    for key, value in after.items():
        if value == "=":  # no directory under the root changed: its names are the baseline's
            after[key] = before.get(key, "=")
    return changes(before, after, changed), sum(purged.values())


#: The words answered from here: a test runner's or an interpreter's name (bash's ``hash``
#: finds no path for a builtin, the script's functions are no programs) or a path.
_PLAIN_WORD = re.compile(
    r"(python|pypy|pytest|py\.test|tox|nosetests)[0-9.]*|[^\s*?\[\]]*/[^\s*?\[\]]*"
)


def _plain_words(words: tuple[str, ...]) -> bool:
    """Whether each of ``words`` is one the script reads as the grader does here
    (:data:`_PLAIN_WORD`: no pattern, no blank, no builtin's or function's name)."""
    return all(_PLAIN_WORD.fullmatch(word) for word in words)


def _find_word(word: str, path: str, here: str) -> tuple[str, str] | None:
    """``find_word``'s ``$p`` and ``$real`` for ``word`` in a shell in ``here`` (blocking):
    on ``PATH`` as bash's ``hash`` finds it, or a path (relative to ``here``) that is an
    executable file; ``None`` where it is not found. Raises :class:`hosttools.NotHere` where
    only the script can tell (a relative ``PATH`` entry; a pyenv shim: pyenv picks the
    program)."""
    if "/" in word:
        found = word if posixpath.isabs(word) else f"{here}/{word}"  # p=$PWD/$p
        if not (os.path.isfile(found) and os.access(found, os.X_OK)):
            return None
    else:
        looked = hosttools.lookup(word, path)
        if looked is None:
            return None
        found = looked
    real = os.path.realpath(found)
    if hosttools.is_shim(real):
        raise hosttools.NotHere(f"{found} is a pyenv shim")
    return found, real


#: A root right under a kept one that is a root of its own all the same (the script's awk).
_OWN_ROOT = re.compile(r"((envs|pkgs)/|(site|dist)-packages(/|$))")


def _discover_output(
    environment: Mapping[str, str],
    repo: str,
    scratch: str,
    words: tuple[str, ...],
    answers: Mapping[tuple[str, str], str],
    known: tuple[str, ...],
) -> str | None:
    """What :data:`TEST_ENV` prints in ``discover`` mode in a sandbox that sees the host's
    files (``SHARED``), with no activation, answered from this process line for line where
    every interpreter it would start has an answer in ``answers`` (by interpreter and target:
    :class:`_KeptAnswers`), blocking. ``None`` where the script must answer: an interpreter
    without an answer, a word or ``#!`` line it reads otherwise, a relative ``PATH`` entry,
    a pyenv shim, a conda installation (its roots are shell patterns), a root that holds
    the repository (the script walks it)."""
    if not _plain_words(words) or environment.get("CONDA_EXE") or "\\" in repo + scratch:
        return None  # (awk -v reads a backslash as an escape)
    path = environment.get("PATH", "")
    here = repo if os.path.isdir(repo) else "/"  # cd "$REPO" 2>/dev/null || cd /
    found: list[str] = []  # what the interpreters said, but for the lines it does not keep
    asked: set[str] = set()
    try:
        for word in words:
            where = _find_word(word, path, here)
            if where is None:
                continue
            p, real = where
            found += [f"env-bin {word} {real}", f"root {real}"]
            py = p  # as found, not the link's target
            head = hosttools.read_regular(real, 256)
            if head is None:
                return None  # (not a regular file, or unreadable: the script bounds its read)
            opening = head.partition(b"\n")[0]
            if head.startswith(b"#!"):
                if (len(opening) == len(head) == 256) or b"\0" in opening:
                    return None  # (a first line the shell reads otherwise)
                first = opening.decode("utf-8", "surrogateescape")
                if re.search(r"[*?\[\]]", first):
                    return None  # (the script expands a pattern there)
                parts = [part for part in re.split(r"[ \t]+", first[2:]) if part]
                py = parts[0] if parts else ""
                if posixpath.basename(py) == "env":
                    name = parts[1] if len(parts) > 1 else ""
                    if not re.fullmatch(r"(python|pypy)[0-9.]*", name):
                        return None  # (command -v: an option, a path, a builtin)
                    py = hosttools.lookup(name, path) or ""
            if not py:
                continue
            if not posixpath.isabs(py) or "\n" in py:
                return None  # (read from where the script runs)
            target = real if py == p else os.path.realpath(py)
            key = f"{posixpath.dirname(py)} {target}"
            if key in asked:
                continue
            asked.add(key)
            answer = answers.get((py, target))
            if answer is None:
                return None  # the interpreter must answer
            found += answer.splitlines()
    except hosttools.NotHere:
        return None
    if environment.get("CONDA_PREFIX"):
        found.append(f"root {environment['CONDA_PREFIX']}/etc/conda")
    if environment.get("VIRTUAL_ENV"):
        venv = environment["VIRTUAL_ENV"]
        found += [f"root {venv}/bin", f"root {venv}/pyvenv.cfg"]
    lines = [line for line in found if line.startswith("env-bin ")]
    # LC_ALL=C sort -u, then the awk: the roots kept, then the files
    kept: list[str] = []
    files: list[str] = []
    for line in sorted(set(found), key=lambda text: text.encode("utf-8", "surrogateescape")):
        if line.startswith("file "):
            files.append(line[5:])
            continue
        if not line.startswith("root "):
            continue
        root = line[5:]
        if root in ("/", repo) or root.startswith((f"{repo}/", f"{scratch}/")):
            continue
        if re.match(r"/(proc|sys|dev)(/|$)", root):
            continue
        if any(root.startswith(f"{k}/") and not _OWN_ROOT.match(root[len(k) + 1 :]) for k in kept):
            continue
        kept.append(root)
        lines.append(f"root {root}")
    lines += (f"file {f}" for f in files)
    lines += hosttools.stat_lines(files)
    for root in kept:
        if root in known:
            lines.append(f"digest {root} known")
        elif f"{repo}/".startswith(f"{root}/"):
            return None  # the script walks it
        else:
            lines.append(f"digest {root} shared")
    return "".join(f"{line}\n" for line in lines)


def _verify_output(
    path: str, repo: str, words: tuple[str, ...], roots: list[str], files: list[str]
) -> str | None:
    """What :data:`TEST_ENV` prints in ``verify`` mode in a sandbox that sees the host's files
    (its roots walked by the grader: ``SHARED``), with no activation, answered from this
    process line for line (blocking): ``env-bin`` for each word as ``find_word`` finds it from
    the repository (:func:`_find_word`), the ``stat`` line of each file, ``digest ROOT
    shared`` for each root. ``None`` where the script must answer: a word it reads otherwise
    (:func:`_plain_words`), a relative ``PATH`` entry, a pyenv shim, a root that holds the
    repository (the script walks it)."""
    if not _plain_words(words) or any(f"{repo}/".startswith(f"{root}/") for root in roots):
        return None
    here = repo if os.path.isdir(repo) else "/"  # cd "$REPO" 2>/dev/null || cd /
    lines: list[str] = []
    for word in words:
        try:
            found = _find_word(word, path, here)
        except hosttools.NotHere:
            return None
        if found is not None:
            lines.append(f"env-bin {word} {found[1]}")
    lines += hosttools.stat_lines(files)
    lines += (f"digest {root} shared" for root in roots)
    return "".join(f"{line}\n" for line in lines)


def _unchangeable(sandbox: GradingSandbox, spec: TestEnv, record: Mapping[str, str]) -> bool:
    """Whether nothing of the test environment ``record`` can differ in ``sandbox`` from what
    the baseline saw, so that checking it again runs no command: no activation (its scripts
    may read what the sandbox can write), the grading ``PATH`` wholly read-only
    (:func:`~uniagent.grading.integrity.fixed_path`), each interpreter word a name or an
    absolute path, and every interpreter, root (those that did not exist too) and start-up
    file at or below a read-only bind no sandbox of this process can write (no pyenv shim)."""
    if spec.activate.strip() or fixed_path(sandbox) is None:
        return False
    env = sandbox.env
    words = [w for w in spec.interpreters if "/" in w]
    if not all_read_only(env, words):
        return False
    return _fixed_sources(env, record) is not None


async def _shared_since(root: str, since: str) -> tuple[str, list[str], int]:
    """A root's digest (``=``: its names are the baseline's), its files changed since
    ``since`` (all of its names compared where empty) and how many bytecode files written
    since were deleted, from a walk shared with other episodes: the shell check's answer."""
    if not since:  # the names alone: an earlier walk where they still hold
        found = await walks.current_names(root)
        if not found.exists:
            return "missing", [], 0
        # (sorting and hashing tens of thousands of names: off the event loop)
        return await off_loop(found.names_digest), [], 0
    found = await walks.shared_walk(root)
    if not found.exists:
        return "missing", [], 0
    changed, purge, dir_changed = await off_loop(found.since, walks.since_ns(since), MAX_CHANGED)
    await off_loop(_delete, purge)
    names = dir_changed or found.too_many or not found.is_dir
    return await off_loop(found.names_digest) if names else "=", changed, len(purge)


def _delete(paths: list[str]) -> None:
    """``rm -f`` each path (a directory or a path gone meanwhile is left as it is)."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _moved_key(key: str, move: Callable[[str], str]) -> str:
    if key.startswith("root:"):
        return "root:" + move(key.removeprefix("root:"))
    return move(key) if key.startswith("/") else key


def changes(
    before: Mapping[str, str], after: Mapping[str, str], changed: list[str]
) -> list[Tamper]:
    """What differs: interpreters resolved elsewhere, roots whose names differ, changed files."""
    found: list[Tamper] = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) == after.get(key):
            continue
        change = "added" if key not in before else "deleted" if key not in after else "modified"
        detail = (
            f"{before.get(key)} -> {after.get(key)}"
            if key.startswith("bin:")
            else "it did not exist at the baseline"
            if key.startswith("root:") and before.get(key) == "missing"
            else "files were added or removed under it"
            if key.startswith("root:")
            else "its content changed"
        )
        found.append(Tamper("toolchain", key, change, "test-env", True, detail))
    for path in changed:
        found.append(
            Tamper("toolchain", path, "modified", "test-env", True, "changed since the baseline")
        )
    return found


_ACTIVATION = re.compile(
    r"^\s*(?:(?:source|\.)\s+\S*activate\b.*|(?:conda|mamba|micromamba)\s+activate\b.*"
    r"|cd\s+[^\s;&|]+"
    r"|export\s+(?:PATH|PYTHONPATH|VIRTUAL_ENV|CONDA_\w+|PYTHONHOME)=.*"
    r"|if \[ -f \S*activate \]; then .*activate.*fi)\s*$"
)


def script_test_env(script: str, commands: list[str]) -> TestEnv:
    """The test environment of a shell script: its activation lines, and the first word of
    each test command (``python``, ``pytest``, an absolute interpreter, after ``VAR=value``
    prefixes), with ``python``/``python3`` always."""
    activate = "\n".join(line for line in script.splitlines() if _ACTIVATION.match(line))
    words: list[str] = []
    for command in commands:
        for word in command.split():
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", word):
                continue
            name = posixpath.basename(word)
            if re.fullmatch(r"(python[0-9.]*|pytest|py\.test|tox|nosetests)", name):
                words.append(word)
            break
    return TestEnv(
        activate=activate,
        interpreters=tuple(dict.fromkeys([*words, "python", "python3"])),
        required=tuple(dict.fromkeys(words)),
    )
