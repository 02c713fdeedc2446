"""The episode's integrity baseline (taken before the agent's first turn) and the checks against it.

At the start, in a clean shell: the history scrub (optional), the listing of the
repository, a byte-exact snapshot of every protected file (kept in this
process, never in the sandbox, so nothing the agent does to the sandbox or its
git objects can change it), and checksums of the toolchain. Before grading:
the same listing and checksums again, compared; protected files are put back
from the snapshot. The agent's patch (taken, split, scanned, applied) is in
:mod:`uniagent.grading.patch`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import io
import logging
import posixpath
import re
import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from uniagent.env.errors import EnvError
from uniagent.grading import hosttools, scripts
from uniagent.grading.sandbox import OUTPUT_LIMIT, GradingSandbox, grading_environment, off_loop
from uniagent.grading.tamper import Tamper
from uniagent.grading.tree import MAX_LINKS, Tree, judge, nested_roots, parse_links
from uniagent.protect.rules import RuleSet, runner_section
from uniagent.protect.settings import IntegrityDefaults, IntegritySettings, TestEnv, Workspace

if TYPE_CHECKING:  # pragma: no cover
    from uniagent.env import AgentEnv

log = logging.getLogger(__name__)

#: Seconds one of :mod:`uniagent.grading.scripts` may run.
SCRIPT_TIMEOUT = 600.0
#: Bytes of tar read at most, at grading, of the shared config files (``setup.cfg``,
#: ``tox.ini``, ...) added since the baseline, whose test-runner section decides whether
#: they may stay: one not read whole within it is judged as one with such a section.
ADDED_CONFIG_MAX = 4 << 20


class GradingSetupError(EnvError):
    """The grader could not take its baseline or prepare grading (infrastructure)."""


@dataclass(frozen=True)
class Member:
    """One protected entry: a file (its bytes), a symlink (its target) or a directory."""

    kind: str
    data: bytes = b""
    link: str = ""
    mode: int = 0o644

    def same(self, other: Member) -> bool:
        """Whether the two entries are the same file, link or directory."""
        return (self.kind, self.data, self.link) == (other.kind, other.data, other.link)


@dataclass
class Baseline:
    """What the grader knows from before the agent's first turn."""

    repo: str | None
    base: str | None
    environment: dict[str, str]
    rules: RuleSet
    base_tree: str | None = None
    listing: dict[str, str] = field(default_factory=dict)
    snapshot: dict[str, Member] = field(default_factory=dict)
    toolchain: dict[str, str] | None = None
    scrub: dict[str, Any] | None = None
    #: Ignored files of the repository at the start (they are not the agent's patch).
    ignored: frozenset[str] = frozenset()
    #: The sandbox's clock at the start (bash's ``$EPOCHREALTIME``, else ``date +%s.%N``):
    #: later changes have a newer ctime.
    epoch: str | None = None
    #: The test environment (:mod:`uniagent.grading.testenv`): ``bin:WORD`` -> interpreter,
    #: ``root:PATH`` -> digest of the names under it; and how it was resolved.
    test_env: dict[str, str] | None = None
    test_env_spec: TestEnv | None = None
    #: The benchmark's paths outside the repository (:mod:`uniagent.grading.outside`).
    outside_paths: tuple[str, ...] = ()
    outside: dict[str, Member] = field(default_factory=dict)
    outside_dirs: set[str] = field(default_factory=set)
    #: The pyenv versions' ``bin`` directories put before pyenv's shims on the grading PATH
    #: (``shims``, ``bins``; :func:`pin_pyenv`), or ``None``.
    pyenv: dict[str, Any] | None = None

    def report(self) -> dict[str, Any]:
        """What the result records about the baseline."""
        return {
            "repo": self.repo,
            "base_commit": self.base,
            "protected_files": len(self.snapshot),
            "toolchain_files": len(self.toolchain or {}),
            "test_env_roots": sum(1 for k in self.test_env or {} if k.startswith("root:")),
            "history_scrub": self.scrub,
            **({"pyenv": self.pyenv} if self.pyenv else {}),
        }


async def run_script(
    sandbox: GradingSandbox,
    script: str,
    variables: Mapping[str, str],
    *,
    what: str,
    max_bytes: int = OUTPUT_LIMIT,
    resident: bool = True,
) -> str:
    """Run one of :mod:`uniagent.grading.scripts`; its output, or a :class:`GradingSetupError`.

    ``resident``: it runs nothing but tools found on the grading ``PATH`` (``False`` for a
    script that starts an interpreter or sources an activation the agent may have changed):
    see :meth:`GradingSandbox.run`."""
    done = await sandbox.run(
        scripts.with_vars(script, variables),
        timeout=SCRIPT_TIMEOUT,
        cwd="/",
        max_bytes=max_bytes,
        resident=resident,
    )
    if done.timed_out:
        raise GradingSetupError(f"{what} did not finish within {SCRIPT_TIMEOUT:g} s")
    if done.truncated:
        raise GradingSetupError(f"{what} printed more than {max_bytes} bytes")
    if done.exit_code != 0:
        raise GradingSetupError(
            f"{what} failed in the sandbox (exit {done.exit_code}): {done.output[-800:]}"
        )
    return done.output


def blob(output: str, name: str) -> bytes:
    """The bytes a script printed as ``blob:NAME=<base64>`` (a :class:`GradingSetupError` if
    it printed none)."""
    for line in output.splitlines():
        if line.startswith(f"blob:{name}="):
            try:
                return base64.b64decode(line.split("=", 1)[1].strip(), validate=True)
            except ValueError as exc:
                raise GradingSetupError(f"the sandbox's {name} is garbled: {exc}") from None
    raise GradingSetupError(f"the sandbox printed no {name}: {output[-500:]}")


async def capture(
    env: AgentEnv,
    settings: IntegritySettings,
    defaults: IntegrityDefaults,
    workspace: Workspace,
    session_env: Mapping[str, str],
    *,
    check_toolchain: bool | None = None,
    after: Callable[[GradingSandbox, Baseline], Awaitable[None]] | None = None,
) -> Baseline:
    """Take the baseline in ``env`` (after set-up, before the agent's first turn).

    ``check_toolchain`` (default ``settings.verify_toolchain``) records the toolchain;
    ``after`` runs in the same grading shell once the rest is taken.
    """
    environment = await environment_of(env, settings, session_env, defaults)
    repo = settings.repo or workspace.repo or env.workdir
    rules = settings.rules(defaults, workspace.protect_paths)
    baseline = Baseline(repo=repo, base=None, environment=environment, rules=rules)
    if repo is None:
        return baseline
    sandbox = await GradingSandbox.open(env, environment, workdir=None, lazy=True)
    try:
        # One call for the checks, the scrub, the base and the listing (each call to a
        # sandbox costs a process start, under bubblewrap a namespace set-up too).
        scrub = settings.scrub_history
        scrub = scrub if scrub is not None else defaults.scrub_history
        variables = {
            "REPO": repo,
            "BASE": workspace.base_commit or "",
            "SCRUB": "1" if scrub else "0",
        }
        output = await run_script(sandbox, scripts.PREPARE, variables, what="taking the baseline")
        report = key_values(output)
        if report.get("missing"):
            raise GradingSetupError(
                f"the repository to grade, {repo!r}, does not exist in the sandbox; set the "
                "reward's workdir (or reward.integrity.repo) to the checkout"
            )
        pin_pyenv(baseline, sandbox, report)
        if scrub:
            baseline.scrub = {
                k: v
                for k, v in report.items()
                if k not in ("head", "tree", "epoch") and not k.startswith("pyenv_")
            }
            baseline.scrub["head_is_base"] = bool(baseline.scrub.get("head_is_base"))
        head = str(report.get("head", ""))
        baseline.base = workspace.base_commit or (
            head if re.fullmatch(r"[0-9a-f]{40,64}", head) else None
        )
        if baseline.base is not None:
            baseline.base_tree = str(report.get("tree")) if report.get("tree") else None
        baseline.listing = _parse_listing(blob(output, "list"))
        baseline.ignored = frozenset(nul_list(blob(output, "ignored")))
        epoch = str(report.get("epoch", ""))
        baseline.epoch = epoch if re.fullmatch(r"\d+(\.\d+)?", epoch) else None
        protected = [
            p for p, kind in baseline.listing.items() if kind in "fl" and is_protected(rules, p)
        ]
        baseline.snapshot = await pack(sandbox, repo, protected, settings.snapshot_max_bytes)
        if settings.verify_toolchain if check_toolchain is None else check_toolchain:
            baseline.toolchain = await toolchain(sandbox)
        if after is not None:
            await after(sandbox, baseline)
    finally:
        await sandbox.close()
    return baseline


async def environment_of(
    env: AgentEnv,
    settings: IntegritySettings,
    session_env: Mapping[str, str],
    defaults: IntegrityDefaults | None = None,
) -> dict[str, str]:
    """The grading environment of ``env``: its start-up environment, cleaned (see sandbox),
    with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` where the task set declares it."""
    start_env = await env.start_environment()
    exclude = tuple(p for p in (env.tools_dir, env.workdir) if p)
    autoload_off = settings.disable_plugin_autoload
    if autoload_off is None:
        autoload_off = defaults.disable_plugin_autoload if defaults is not None else False
    extra = {
        **({"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} if autoload_off else {}),
        **settings.grading_env,
    }
    return grading_environment({**start_env, **session_env}, exclude_path=exclude, extra=extra)


def pin_pyenv(baseline: Baseline, sandbox: GradingSandbox, report: Mapping[str, Any]) -> None:
    """Put the ``bin`` directories of the pyenv versions the baseline found
    (:data:`~uniagent.grading.scripts.PYENV_PIN`) before pyenv's shims on the grading PATH.

    The tests and every grading step then run the interpreter pyenv picked in the repository
    before the agent's first turn, without pyenv's shell scripts (a dozen processes for
    every ``python3``): the agent's version files, ``PYENV_VERSION`` or edits to pyenv do
    not choose it. A command none of the versions holds still goes through the shims.
    """
    shims, bins = str(report.get("pyenv_shims") or ""), str(report.get("pyenv_bins") or "")
    pin = {"shims": shims, "bins": [d for d in bins.split(":") if d]}
    path = _pinned_path(baseline.environment.get("PATH", ""), pin) if shims else None
    if path is not None and pin["bins"]:
        baseline.pyenv = pin
        baseline.environment["PATH"] = sandbox.environment["PATH"] = path


def pinned_environment(environment: dict[str, str], baseline: Baseline) -> dict[str, str]:
    """``environment`` (a fresh sandbox's) with the baseline's pyenv pin on its PATH
    (:func:`pin_pyenv`), where its PATH has the same shims."""
    path = _pinned_path(environment.get("PATH", ""), baseline.pyenv) if baseline.pyenv else None
    return environment if path is None else {**environment, "PATH": path}


def _pinned_path(path: str, pin: Mapping[str, Any]) -> str | None:
    """``path`` with ``pin``'s bin directories before its shims (``None``: no such shims)."""
    entries = path.split(":")
    normalized = [posixpath.normpath(e) if e else e for e in entries]
    if posixpath.normpath(pin["shims"]) not in normalized:
        return None
    at = normalized.index(posixpath.normpath(pin["shims"]))
    dirs = [d for d in pin["bins"] if d not in entries[:at]]
    return ":".join([*entries[:at], *dirs, *entries[at:]])


def moved_repo(repo: str, old: AgentEnv, new: AgentEnv) -> str:
    """Where ``repo`` of sandbox ``old`` is in ``new`` (work dirs can differ between sandboxes)."""
    if old.workdir and new.workdir and (repo + "/").startswith(old.workdir.rstrip("/") + "/"):
        return posixpath.normpath(posixpath.join(new.workdir, posixpath.relpath(repo, old.workdir)))
    return repo


def moved_path(path: str, old: AgentEnv, new: AgentEnv) -> str:
    """Where ``path`` of sandbox ``old`` is in ``new``: where their work dirs differ, what is
    under the old work dir's parent (the sandbox's own directory) moves with it."""
    if not old.workdir or not new.workdir or old.workdir == new.workdir:
        return path
    own, there = (
        posixpath.dirname(old.workdir.rstrip("/")),
        posixpath.dirname(new.workdir.rstrip("/")),
    )
    if own in ("", "/") or not (path + "/").startswith(own + "/"):
        return path
    return posixpath.normpath(posixpath.join(there, posixpath.relpath(path, own)))


def forked_baseline(baseline: _T, moved: Mapping[str, str]) -> _T:
    """``baseline`` (or a :class:`Workspace`) for a fork of its sandbox (a tree rollout's
    leaf) whose directories are elsewhere: ``moved`` maps the sandbox's root to the fork's
    (none with bubblewrap, whose sandboxes see the same paths). Every absolute path at or
    below a moved root, in any field (the repository, the grading environment, the test
    environment, the outside paths...), is moved; digests, contents and repository-relative
    paths are not paths of the host and stay as they are."""
    if not moved:
        return baseline
    roots = sorted(((old.rstrip("/"), new.rstrip("/")) for old, new in moved.items()),
                   key=lambda pair: -len(pair[0]))  # fmt: skip

    def path(text: str) -> str:
        for old, new in roots:
            if text == old or text.startswith(old + "/"):
                return new + text[len(old) :]
        return text

    def move(value: Any) -> Any:
        if isinstance(value, str):  # a path, a PATH-like list, a "root:/x" key
            return ":".join(path(part) for part in value.split(":"))
        if isinstance(value, Member):  # bytes and a link's target as the copy holds them
            return value
        if isinstance(value, dict):
            return {move(k): move(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return type(value)(move(v) for v in value)
        if is_dataclass(value) and not isinstance(value, type):
            twin = copy.copy(value)
            for item in fields(value):
                object.__setattr__(twin, item.name, move(getattr(value, item.name)))
            return twin
        return value  # bytes, numbers, compiled rules (repository-relative patterns)

    return move(baseline)


_T = TypeVar("_T")


def is_protected(rules: RuleSet, path: str) -> bool:
    """Whether the grader protects ``path`` (a whole file, or its test section)."""
    return rules.is_protected(path)


async def scrub_history(sandbox: GradingSandbox, repo: str, base: str | None) -> dict[str, Any]:
    """Remove what could reveal the fix from the repository's git data (see ``SCRUB``)."""
    variables = {"REPO": repo, "BASE": base or ""}
    output = await run_script(sandbox, scripts.SCRUB, variables, what="the history scrub")
    report = key_values(output)
    report["head_is_base"] = bool(report.get("head_is_base"))
    return report


def key_values(output: str) -> dict[str, Any]:
    """``key=value`` lines (numbers as ints)."""
    report: dict[str, Any] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().isidentifier():
            report[key.strip()] = int(value) if value.strip().isdigit() else value.strip()
    return report


async def list_tree(
    sandbox: GradingSandbox,
    repo: str,
    *,
    since: str = "",
    nested: list[str] | None = None,
    packed: list[str] | None = None,
    pack_limit: int = 1 << 30,
) -> tuple[Tree, Packed]:
    """Every entry under ``repo``: path -> ``f`` / ``l`` / ``d`` (git's bulk skipped); with
    ``since`` (the baseline's clock), also the symlinks made since then and where each leads,
    and the files changed since then below the ``nested`` repositories; and the files and
    symlinks of ``packed`` that are there, read as :func:`pack_bounded` reads them, at most
    ``pack_limit`` bytes of tar (the same call)."""
    variables = {"REPO": repo, "SINCE": since, "NESTED": "\n".join(nested or ())}
    variables["MAX_LINKS"] = str(MAX_LINKS)
    max_bytes = OUTPUT_LIMIT
    if packed:
        names = f"{sandbox.scratch}/names"
        await sandbox.stage_bytes(names, _nul_list(packed))
        variables["PACK_LIST"] = names
        variables["PACK_MAX"] = str(pack_limit + 1)
        max_bytes += _pack_output(pack_limit + 1)
    output = await run_script(
        sandbox, scripts.LIST, variables, what="listing the repo", max_bytes=max_bytes
    )
    at = output.find("\nblob:pack=") if packed else -1
    if (at if at >= 0 else len(output)) > OUTPUT_LIMIT:  # (the listing's own bound, as before)
        raise GradingSetupError(f"listing the repo printed more than {OUTPUT_LIMIT} bytes")

    def parse() -> tuple[Tree, Packed]:
        tree = Tree(_parse_listing(blob(output, "list")))
        if since:
            tree.real, tree.links = parse_links(blob(output, "links"))
            count = key_values(output).get("links")
            tree.links_total = count if isinstance(count, int) else len(tree.links)
            tree.nested_changed = nul_list(blob(output, "nested_changed"))
        return tree, (_unpack(blob(output, "pack"), pack_limit) if packed else Packed({}))

    return await off_loop(parse)


def _parse_listing(data: bytes) -> dict[str, str]:
    text = data.decode("utf-8", "surrogateescape")
    listing = {}
    for item in text.split("\0"):
        kind, _, path = item.partition(" ")
        if path and path != ".":
            listing[path] = kind
    return listing


class Packed(dict[str, Member]):
    """What a pack read: path -> member; ``cut``: its tar was longer than the limit, so the
    member it was cut in and those after it are not here (nor read whole in the sandbox)."""

    cut: bool = False

    def __init__(self, members: dict[str, Member], *, cut: bool = False) -> None:
        super().__init__(members)
        self.cut = cut


async def pack(
    sandbox: GradingSandbox, repo: str, paths: list[str], limit: int
) -> dict[str, Member]:
    """The bytes of ``paths`` (files and symlinks) in the sandbox, read through one tar: a
    :class:`GradingSetupError` where they take more than ``limit`` bytes (the baseline's
    files: narrow what is protected)."""
    members = await pack_bounded(sandbox, repo, paths, limit)
    if members.cut:
        raise GradingSetupError(
            f"the protected files of {repo} take more than snapshot_max_bytes ({limit} bytes); "
            "narrow reward.integrity.protect_paths"
        )
    return dict(members)


async def pack_bounded(sandbox: GradingSandbox, repo: str, paths: list[str], limit: int) -> Packed:
    """The bytes of ``paths`` as :func:`pack` reads them, at most ``limit`` bytes of tar: what
    the agent could have grown is read up to a bound (the runner's memory, the sandbox's
    time), and what lies past it is missing from the answer (``cut``)."""
    if not paths:
        return Packed({})
    names = f"{sandbox.scratch}/names"
    await sandbox.stage_bytes(names, _nul_list(paths))  # byte for byte (names need no UTF-8)
    output = await run_script(
        sandbox,
        scripts.PACK,
        {"REPO": repo, "LIST": names, "MAX": str(limit + 1)},
        what="packing files",
        max_bytes=_pack_output(limit + 1),
    )
    raw = await off_loop(blob, output, "pack")
    return await off_loop(_unpack, raw, limit)


def _pack_output(limit: int) -> int:
    """Bytes a pack of at most ``limit`` bytes takes in a script's output (base64, a line)."""
    return min(limit, 1 << 40) * 4 // 3 + (1 << 20)


def tar_bound(members: Mapping[str, Member], *, more: Iterable[str] = ()) -> int:
    """Bytes a tar of ``members`` as they are takes at most, in any of tar's formats (a
    member: its header, a long name's or a pax header's block and records, the data padded
    to a block; the end and the record's padding): a pack of the same files is never cut
    at this bound, so one that is cut holds a file that grew. Each path of ``more`` may
    also grow by :data:`ADDED_CONFIG_MAX` (a shared config file: the agent's to edit but
    for its runner section, so read whole)."""
    size = 2 * 10240 + ADDED_CONFIG_MAX * len(set(more))
    for path, member in members.items():
        size += 5 * 512 + 2 * len(path.encode("utf-8", "surrogateescape"))
        size += len(member.data) + 2 * len(member.link.encode("utf-8", "surrogateescape"))
    return size


def _unpack(raw: bytes, limit: int | None = None) -> Packed:
    """The members of a tar; longer than ``limit``: those wholly before the cut (``cut``)."""
    cut = limit is not None and len(raw) > limit
    members: dict[str, Member] = {}
    if not raw:
        return Packed(members)
    if cut:
        raw = raw[:limit]
    try:
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
            for info in tar:
                path = info.name.removeprefix("./")
                if info.issym():
                    members[path] = Member("l", link=info.linkname, mode=info.mode)
                elif info.isfile():
                    handle = tar.extractfile(info)
                    data = handle.read() if handle else b""
                    if len(data) != info.size:
                        raise tarfile.ReadError("unexpected end of data")
                    members[path] = Member("f", data, mode=info.mode)
    except (tarfile.TarError, EOFError):
        if not cut:
            raise GradingSetupError("the sandbox's pack is not a whole tar") from None
    return Packed(members, cut=cut)


async def toolchain(sandbox: GradingSandbox) -> dict[str, str]:
    """``bin:NAME`` -> resolved path and FILE -> sha256 for the toolchain the grader trusts.

    Where nothing of it can change (:func:`fixed_path`), the answer of the first sandbox
    that asked is every later one's, and no command runs.
    """
    key = fixed_path(sandbox)
    if key is None or key in _UNFIXED_TOOLCHAINS:
        return await _toolchain(sandbox, None)
    if key in _FIXED_TOOLCHAINS:
        return dict(_FIXED_TOOLCHAINS[key])
    async with first_of_a_wave(("toolchain", key)):  # the others take its answer
        if key in _FIXED_TOOLCHAINS:
            return dict(_FIXED_TOOLCHAINS[key])
        return await _toolchain(sandbox, key)


async def _toolchain(
    sandbox: GradingSandbox, key: tuple[str, tuple[str, ...]] | None
) -> dict[str, str]:
    # Without isolation, answered from here but for the interpreters' own answer.
    output = await hosttools.toolchain_output(sandbox, SCRIPT_TIMEOUT)
    if output is None:
        variables = {"TOOLS": scripts.TOOLCHAIN_TOOLS, "PYCODE": scripts.TOOLCHAIN_PY}
        # (it starts the interpreters on PATH, which the agent may have replaced: a one-off)
        output = await run_script(
            sandbox, scripts.TOOLCHAIN, variables, what="the toolchain check", resident=False
        )
    found: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith("bin "):
            _, name, path = line.split(" ", 2)
            found[f"bin:{name}"] = path
    digests = await file_digests(sandbox, stat_keys(output))
    found.update((path, digest) for path, digest in digests.items() if digest != "missing")
    if key is not None:
        if await off_loop(_all_fixed, sandbox, found):
            if len(_FIXED_TOOLCHAINS) > _FIXED_TOOLCHAINS_MAX:
                _FIXED_TOOLCHAINS.clear()
            _FIXED_TOOLCHAINS[key] = dict(found)
        else:  # (later sandboxes of this key check it themselves, none waits for another)
            if len(_UNFIXED_TOOLCHAINS) > _FIXED_TOOLCHAINS_MAX:
                _UNFIXED_TOOLCHAINS.clear()
            _UNFIXED_TOOLCHAINS.add(key)
    return found


#: Toolchains no sandbox of this process can change, by :func:`fixed_path`: checked once
#: per process (a run, a verl worker), not twice per episode.
_FIXED_TOOLCHAINS: dict[tuple[str, tuple[str, ...]], dict[str, str]] = {}
_FIXED_TOOLCHAINS_MAX = 1_000
#: Keys of :data:`_FIXED_TOOLCHAINS` whose toolchain was found not wholly read-only.
_UNFIXED_TOOLCHAINS: set[tuple[str, tuple[str, ...]]] = set()

#: The locks of :func:`first_of_a_wave` in use, by event loop and key, with their users.
_WAVES: dict[tuple[asyncio.AbstractEventLoop, object], tuple[asyncio.Lock, list[int]]] = {}


@contextlib.asynccontextmanager
async def first_of_a_wave(key: object) -> AsyncIterator[None]:
    """Hold ``key``'s lock (one per event loop): a check whose answer is kept for every later
    sandbox of its key (the toolchain's, the test environment's) runs once when many
    sandboxes ask at once (a run's first wave: all its episodes start together), the
    others waiting for its answer instead of each working it out."""
    loop = asyncio.get_running_loop()
    entry = _WAVES.get((loop, key))
    if entry is None:
        for old in [k for k in _WAVES if k[0].is_closed()]:  # loops that ended (tests)
            del _WAVES[old]
        entry = _WAVES[(loop, key)] = (asyncio.Lock(), [0])
    lock, users = entry
    users[0] += 1
    try:
        async with lock:
            yield
    finally:
        users[0] -= 1
        if not users[0] and _WAVES.get((loop, key)) is entry:
            del _WAVES[(loop, key)]


def fixed_path(sandbox: GradingSandbox) -> tuple[str, tuple[str, ...]] | None:
    """The grading ``PATH`` and the host sources of its directories, where every one of them
    is at or below a read-only bind that no sandbox of this process can write
    (:meth:`GradingSandbox.read_only_path`): then no tool can be put before the ones found,
    and the found ones cannot change. ``None`` otherwise (the toolchain is checked as usual)."""
    return sandbox.read_only_path()


def _all_fixed(sandbox: GradingSandbox, found: Mapping[str, str]) -> bool:
    """Whether every tool and file the check found is on such a bind too, and no tool is a
    pyenv shim (whose choice reads version files elsewhere)."""
    tools = [path for key, path in found.items() if key.startswith("bin:")]
    files = [key for key in found if not key.startswith("bin:")]
    env = sandbox.env
    return all(
        posixpath.isabs(t) and "/shims/" not in t and env.read_only_source(t) is not None
        for t in tools
    ) and all_read_only(env, files)


def all_read_only(env: AgentEnv, paths: Iterable[str]) -> bool:
    """Whether every one of ``paths`` (absolute) lies in a directory that no sandbox of this
    process can change (:meth:`~uniagent.env.AgentEnv.read_only_source`), asked once per
    directory: a file's own answer follows from its directory's (nothing writable at or
    below it). Hundreds of a test runner's files share a few dozen directories."""
    dirs: set[str] = set()
    for path in paths:
        if not posixpath.isabs(path) or "/shims/" in path:
            return False
        dirs.add(posixpath.dirname(posixpath.normpath(path)))
    return all(env.read_only_source(d) is not None for d in dirs)


#: sha256 of files seen in sandboxes, by path and :data:`~scripts.STAT_FILES` key (device,
#: inode, size, mtime, ctime to the nanosecond): a file keeps its key only as long as its
#: content, since its ctime cannot be set back without setting the clock. Kept for the
#: process (episodes of a run, a verl worker), so the toolchain and the test environment's
#: start-up files are read once, not per episode; cleared when it grows past
#: :data:`_DIGESTS_MAX` entries.
_DIGESTS: dict[tuple[str, str], str] = {}
_DIGESTS_MAX = 200_000


def stat_keys(output: str, kind: str = "stat") -> dict[str, str]:
    """path -> key of the ``stat KEY PATH`` lines (or ``KIND KEY PATH``) of ``output``."""
    keys: dict[str, str] = {}
    for line in output.splitlines():
        if line.startswith(f"{kind} "):
            parts = line.split(" ", 6)
            if len(parts) == 7:
                keys[parts[6]] = " ".join(parts[1:6])
    return keys


async def file_digests(sandbox: GradingSandbox, keys: Mapping[str, str]) -> dict[str, str]:
    """path -> sha256 (or ``missing``: it could not be read) of each file of ``keys``, read
    in the sandbox only where this process has not seen the file with that key.

    Sandboxes that ask for the same unseen files at once (a run's first wave: the same
    toolchain, the same test environment) read them once: the others wait, then take what
    the first one remembered."""
    found: dict[str, str] = {}
    unseen = _unseen(keys, found)
    if not unseen:
        return found
    async with first_of_a_wave(("hashing", frozenset((path, keys[path]) for path in unseen))):
        unseen = _unseen({path: keys[path] for path in unseen}, found)
        if unseen:
            await _hash_files(sandbox, unseen, found)
    return found


def _unseen(keys: Mapping[str, str], found: dict[str, str]) -> list[str]:
    """The paths of ``keys`` whose digest this process has not seen with that key; the
    others' digests go into ``found``."""
    unseen: list[str] = []
    for path, key in keys.items():
        known = _DIGESTS.get((path, key))
        if known is None:
            unseen.append(path)
        else:
            found[path] = known
    return unseen


async def _hash_files(sandbox: GradingSandbox, unseen: list[str], found: dict[str, str]) -> None:
    """Read ``unseen`` in ``sandbox``: each digest into ``found``, remembered where the file
    kept its key while it was read."""
    listed = f"{sandbox.scratch}/unseen"
    await sandbox.stage_bytes(listed, _nul_list(unseen))
    output = await run_script(sandbox, scripts.HASH_FILES, {"LIST": listed}, what="hashing files")
    before, after = stat_keys(output), stat_keys(output, "restat")  # around each read
    if len(_DIGESTS) > _DIGESTS_MAX:
        _DIGESTS.clear()
    for line in output.splitlines():
        if line.startswith("hash "):
            path, _, digest = line[5:].rpartition(" ")
            found[path] = digest
            first = before.get(path)
            if digest != "missing" and first is not None and first == after.get(path):
                _DIGESTS[(path, first)] = digest
    for path in unseen:
        found.setdefault(path, "missing")


def toolchain_changes(before: Mapping[str, str], after: Mapping[str, str]) -> list[Tamper]:
    """What differs between two toolchain records."""
    changes = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) == after.get(key):
            continue
        change = "added" if key not in before else "deleted" if key not in after else "modified"
        detail = f"{before.get(key)} -> {after.get(key)}" if key.startswith("bin:") else ""
        changes.append(Tamper("toolchain", key, change, "toolchain", True, detail))
    return changes


async def screen(sandbox: GradingSandbox, baseline: Baseline, *, restore: bool) -> list[Tamper]:
    """Compare the protected files with the snapshot; with ``restore``, put them back."""
    repo, rules = baseline.repo, baseline.rules
    if repo is None:
        return []
    # The snapshot's paths are read in the listing's call; a protected file added since is
    # read in a call of its own only where its content decides (a shared config file). Both
    # reads are bounded: the snapshot's files as they were (a shared config file up to
    # ADDED_CONFIG_MAX more) fit in _snapshot_bound, so one not read within it grew
    # (changed); a new config file past ADDED_CONFIG_MAX is judged as one with a
    # test-runner section.
    tree, packed = await list_tree(
        sandbox,
        repo,
        since=baseline.epoch or "",
        nested=nested_roots(baseline.listing),
        packed=list(baseline.snapshot),
        pack_limit=_snapshot_bound(baseline, baseline.snapshot),
    )
    listing = tree.listing
    purged = [p for p in listing if rules.purges(p) and not rules.purges(posixpath.dirname(p))]
    current_paths = [p for p, k in listing.items() if k in "fl" and is_protected(rules, p)]
    grown: set[str] = set()
    if packed.cut:
        present = {p for p, k in listing.items() if k in "fl"}
        unread = [p for p in baseline.snapshot if p in present and p not in packed]
        grown = await _read_past_a_cut(sandbox, baseline, unread, packed)
    current = {p: packed[p] for p in current_paths if p in packed}
    added = [p for p in current_paths if p not in baseline.snapshot]
    sections = await pack_bounded(
        sandbox, repo, [p for p in added if rules.protects_section(p)], ADDED_CONFIG_MAX
    )
    current.update(sections)
    for path in added:  # (its bytes are not read: it is removed whatever they are)
        current.setdefault(path, Member(listing[path]))
    # What git's summary hides (nested repositories, symlinks out): reported, and removed
    # before the patch is taken.
    tampered, remove = judge(baseline.listing, tree)
    put_back: list[str] = []
    for path, before in baseline.snapshot.items():
        now = current.get(path)
        if now is not None and (now.same(before) or _same_section(rules, path, before, now)):
            continue
        change = "deleted" if now is None and path not in grown else "modified"
        if now is not None or path in grown:
            remove.add(path)
        put_back.append(path)
        tampered.append(_file_tamper(rules, path, change))
    for path, now in current.items():
        if path in baseline.snapshot:
            continue
        if (
            rules.protects_section(path)
            and now.kind == "f"
            and path in sections
            and runner_section(path, _text(now)) is None
        ):
            continue  # a new shared config file without a test-runner section (not a link)
        remove.add(path)
        tampered.append(_file_tamper(rules, path, "added"))
    # Something at a protected directory's place that is no longer a directory hides what
    # the snapshot holds below it: remove it so the snapshot's files can come back.
    for path, kind in listing.items():
        hides = kind != "d" and baseline.listing.get(path) == "d" and path not in remove
        if hides and any(p.startswith(path + "/") for p in baseline.snapshot):
            remove.add(path)
    new_dirs = [
        p
        for p, k in listing.items()
        if k == "d" and p not in baseline.listing and rules.protects(p + "/")
    ]
    if restore and (remove or put_back or new_dirs or purged):
        await _restore(sandbox, baseline, sorted(remove | set(purged)), put_back, new_dirs)
    return tampered


#: Packs at most, after the listing's was cut, to tell which protected files grew.
MAX_REPACKS = 8


def _snapshot_bound(baseline: Baseline, paths: Iterable[str]) -> int:
    """What a pack of the snapshot's ``paths`` may take at grading: as they were, and the
    shared config files among them grown by up to :data:`ADDED_CONFIG_MAX` (the agent may
    edit all but their runner section, which is compared)."""
    members = {p: baseline.snapshot[p] for p in paths}
    sections = [p for p in members if baseline.rules.protects_section(p)]
    return tar_bound(members, more=sections)


async def _read_past_a_cut(
    sandbox: GradingSandbox, baseline: Baseline, unread: list[str], packed: Packed
) -> set[str]:
    """The protected files that grew past what they took at the baseline, of ``unread`` (in
    the snapshot's order: those a cut pack did not read), the others read into ``packed``.

    The files from the first unread one on are packed again within what they took at the
    baseline: a pack cut in its first file means that file grew (it alone had the whole
    bound); else the files read are read, and the rest is tried again. After
    :data:`MAX_REPACKS` packs, what is still unread counts as grown (changed)."""
    assert baseline.repo is not None
    grown: set[str] = set()
    for _ in range(MAX_REPACKS):
        if not unread:
            break
        bound = _snapshot_bound(baseline, unread)
        more = await pack_bounded(sandbox, baseline.repo, unread, bound)
        packed.update(more)
        if not more.cut:
            return grown
        rest = [p for p in unread if p not in more]
        if rest and rest[0] == unread[0]:
            grown.add(rest.pop(0))
        unread = rest
    return grown | set(unread)


def _file_tamper(rules: RuleSet, path: str, change: str) -> Tamper:
    rule = rules.rule_for(path)
    return Tamper("protected_file", path, change, rule.name, rule.scores)


def _text(member: Member) -> str | None:
    return member.data.decode("utf-8", "replace") if member.kind == "f" else None


def _same_section(rules: RuleSet, path: str, before: Member, now: Member) -> bool:
    """Whether only what is not the runner's changed in a shared config file (a file that
    became a symlink changed, whatever it points to: the runner reads the target)."""
    if not rules.protects_section(path) or not before.kind == now.kind == "f":
        return False
    return runner_section(path, _text(before)) == runner_section(path, _text(now))


async def _restore(
    sandbox: GradingSandbox,
    baseline: Baseline,
    remove: list[str],
    put_back: list[str],
    new_dirs: list[str],
) -> None:
    assert baseline.repo is not None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:") as tar:
        for path in put_back:
            member = baseline.snapshot[path]
            info = tarfile.TarInfo(path)
            info.mode = member.mode
            if member.kind == "l":
                info.type, info.linkname = tarfile.SYMTYPE, member.link
                tar.addfile(info)
            else:
                info.size = len(member.data)
                tar.addfile(info, io.BytesIO(member.data))
    s = sandbox.scratch
    await sandbox.stage_bytes(f"{s}/remove", _nul_list(remove))
    await sandbox.stage_bytes(f"{s}/rmdirs", _nul_list(sorted(new_dirs, key=len, reverse=True)))
    await sandbox.write_file(
        f"{s}/restore.b64", base64.b64encode(buffer.getvalue()).decode() if put_back else ""
    )
    variables = {
        "REPO": baseline.repo,
        "REMOVE": f"{s}/remove",
        "TAR": f"{s}/restore.b64",
        "RMDIRS": f"{s}/rmdirs",
    }
    await run_script(sandbox, scripts.RESTORE, variables, what="restoring protected files")


def _nul_list(paths: list[str]) -> bytes:
    return b"".join(p.encode("utf-8", "surrogateescape") + b"\0" for p in paths)


def nul_list(data: bytes) -> list[str]:
    """The paths of a NUL-separated list (undecodable bytes kept as surrogates)."""
    return [p for p in data.decode("utf-8", "surrogateescape").split("\0") if p]


def sorted_nul_list(paths: frozenset[str] | set[str]) -> bytes:
    """``paths`` NUL-separated in byte order (as ``LC_ALL=C sort -z`` sorts)."""
    encoded = sorted(p.encode("utf-8", "surrogateescape") for p in paths)
    return b"".join(p + b"\0" for p in encoded)


async def verify_toolchain(sandbox: GradingSandbox, baseline: Baseline) -> list[Tamper]:
    """The toolchain's changes since the start (empty when unchecked)."""
    if baseline.toolchain is None:
        return []
    return toolchain_changes(baseline.toolchain, await toolchain(sandbox))
