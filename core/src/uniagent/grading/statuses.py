"""Test statuses from a second channel: what the test runner itself reported, not what it printed.

A test log is text the tested code shares: code under test can print a status line,
finish one the runner started (Django's ``test_x (m.C) ... `` then ``ok``), make its
own failure read as an expected failure or a skip, or end the interpreter early with
status 0. So a reward can also ask the runner. :func:`status_recorder` gives the shell lines
that put a grader-owned start-up module in front of the command's Python: a
``sitecustomize`` on ``PYTHONPATH`` that loads the environment's own ``sitecustomize``
after it, and takes itself off ``PYTHONPATH`` and ``sys.path`` so that no child
process or test sees it. In the test process it

- registers a pytest plugin with the first configuration pytest makes in the process
  (pytest's config module is patched as it is imported; an inner session, as pytester
  runs, gets none), which records the session's start and end and every test report:
  node id, phase, outcome, whether it was an expected failure, and whether the test
  declared it: with a marker, or by calling ``pytest.xfail()`` from its own file or a
  ``conftest.py`` (not from the code under test);
- wraps :class:`unittest.TestResult`'s ``startTestRun``, ``stopTestRun`` and ``add*``
  methods (unittest's runner and Django's report through them) and records each
  test's description and outcome;
- watches every top-level import (before the module's code runs): one found below where
  the tests run (the repository) that has a namesake in the standard library shadows it
  (:func:`module_shadow_reports` judges those files against the base commit);

and appends each record as one JSON line to a file in the grader's scratch directory
(the path is taken out of the environment at start-up). Nothing of it reaches the log.
:class:`StatusRecords` reads them back; :meth:`StatusRecords.unfinished` names a runner that
started and never reported its end (the interpreter left in the middle of the run).

The tested code runs in the same process as the recorder, so code written to defeat
this recorder in particular can; what it closes is the channel that any code can write
by accident or on purpose without knowing the grader: its output.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from uniagent.grading.sandbox import GradingSandbox

#: The start-up module (Python 3.5+ syntax: SWE-bench's oldest environments).
HOOK = r'''"""uniagent's test-status recorder (a grader-owned start-up module; see the grader)."""
import os
import sys


def _uniagent_status_hook():
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.pop("UNIAGENT_STATUS_FILE", None)
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        # every time it is there (put first again after an eval script's own export)
        parts = [p for p in pythonpath.split(os.pathsep) if os.path.abspath(p or ".") != here]
        if parts:
            os.environ["PYTHONPATH"] = os.pathsep.join(parts)
        else:
            del os.environ["PYTHONPATH"]
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    # The environment's own sitecustomize, if it has one, as if this one were not here.
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401
    except ImportError:
        sys.modules["sitecustomize"] = me
    except Exception:
        sys.modules["sitecustomize"] = me
        import traceback
        traceback.print_exc()
    if not path:
        return
    import json

    def emit(record):
        try:
            with open(path, "a") as out:
                out.write(json.dumps(record) + "\n")
        except Exception:
            pass

    # Where the command runs its tests (the repository): a top-level module found below it
    # that has a namesake outside it (the standard library, site-packages, a built-in)
    # shadows that one. Seen as it is imported (before its code runs), once per name.
    import importlib.machinery
    top = os.getcwd()
    stdlib = os.path.dirname(os.path.abspath(os.__file__))
    seen = set()

    def outside(entry):
        entry = os.path.abspath(entry or ".")
        return entry != top and not entry.startswith(top + os.sep)

    def watch(name):
        if name in seen:
            return
        seen.add(name)
        spec = importlib.machinery.PathFinder.find_spec(name, sys.path)
        origin = spec and spec.origin and os.path.abspath(spec.origin)
        if not origin or outside(origin):
            return
        if name in sys.builtin_module_names:
            other, where = "built-in", "stdlib"
        else:
            found = importlib.machinery.PathFinder.find_spec(
                name, [p for p in sys.path if outside(p)]
            )
            other = found and found.origin and os.path.abspath(found.origin)
            parts = other.split(os.sep) if other else ()
            where = "site" if "site-packages" in parts or "dist-packages" in parts else (
                "stdlib" if other and other.startswith(stdlib + os.sep) else "other"
            )
        if other:
            emit({"f": "python", "shadow": name, "file": origin, "other": other, "in": where})

    # pytest: a plugin registered with the first config pytest makes in this process (its
    # config module is patched as it loads; an inner session, as pytester's, gets none).
    import types
    plugin = types.ModuleType("uniagent_status_pytest")

    def pytest_configure(config):
        emit({"f": "pytest", "session": True, "pid": os.getpid()})

    def pytest_unconfigure(config):
        emit({"f": "pytest", "finish": True, "pid": os.getpid()})

    def pytest_runtest_logreport(report):
        emit({
            "f": "pytest",
            "id": report.nodeid,
            "when": report.when,
            "o": report.outcome,
            "xfail": hasattr(report, "wasxfail"),
            # A marker the test declares (pytest.mark.xfail, on it or its parameters).
            "declared_xfail": "xfail" in getattr(report, "keywords", {}),
        })

    def pytest_runtest_makereport(item, call):
        # An expected failure raised while the test ran (pytest.xfail()): by the test's own
        # code (its file, a conftest.py) or by the code under test.
        try:
            excinfo = call.excinfo
            if excinfo is None or excinfo.type.__name__ != "XFailed":
                return None
            tb, where = excinfo.tb, None
            while tb is not None:
                name = os.path.abspath(tb.tb_frame.f_code.co_filename)
                parts = name.split(os.sep)
                if "_pytest" not in parts and "pytest" not in parts:
                    where = name
                tb = tb.tb_next
            path = getattr(item, "path", None) or getattr(item, "fspath", None)
            own = (path is not None and os.path.abspath(str(path)) == where) or (
                where is not None and os.path.basename(where) == "conftest.py"
            )
            if own:
                emit({"f": "pytest", "id": item.nodeid, "xfail_in_test": True})
        except Exception:
            pass
        return None

    def pytest_collectreport(report):
        if report.failed:
            emit({"f": "pytest", "id": report.nodeid, "when": "collect", "o": "failed"})

    plugin.pytest_configure = pytest_configure
    plugin.pytest_unconfigure = pytest_unconfigure
    plugin.pytest_runtest_logreport = pytest_runtest_logreport
    plugin.pytest_collectreport = pytest_collectreport
    plugin.pytest_runtest_makereport = pytest_runtest_makereport

    def patch_config(module):
        original = module.get_config
        state = []

        def get_config(*args, **kwargs):
            config = original(*args, **kwargs)
            if not state:
                state.append(config)
                try:
                    config.pluginmanager.register(plugin, "uniagent-status")
                except Exception:
                    pass
            return config

        module.get_config = get_config

    class Finder(object):
        """Watches top-level imports for shadows; patches pytest's config module."""

        def find_spec(self, fullname, path=None, target=None):
            if path is None and "." not in fullname:
                try:
                    watch(fullname)
                except Exception:
                    pass
            if fullname != "_pytest.config" or "_pytest.config" in seen:
                return None
            seen.add("_pytest.config")
            try:
                import importlib.util
                spec = importlib.util.find_spec(fullname)
                execute = spec.loader.exec_module
            except Exception:
                return None

            def exec_module(module):
                execute(module)
                try:
                    patch_config(module)
                except Exception:
                    pass

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder())

    # unittest (and Django's runner, which reports through it).
    try:
        import unittest.result
    except Exception:
        return
    result = unittest.result.TestResult

    def describe(test):
        try:
            doc = test.shortDescription()
        except Exception:
            doc = None
        return {"f": "unittest", "id": str(test), "doc": doc or None}

    def wrap(method, outcome):
        original = getattr(result, method)

        def recorded(self, test, *args):
            try:
                record = describe(test)
                record["o"] = outcome(args) if callable(outcome) else outcome
                if record["o"] is not None:
                    emit(record)
            except Exception:
                pass
            return original(self, test, *args)

        setattr(result, method, recorded)

    def subtest(args):
        err = args[1] if len(args) > 1 else None
        if err is None:
            return None
        return "FAIL" if issubclass(err[0], AssertionError) else "ERROR"

    wrap("addSuccess", "ok")
    wrap("addFailure", "FAIL")
    wrap("addError", "ERROR")
    wrap("addSkip", "skipped")
    wrap("addExpectedFailure", "expected failure")
    wrap("addUnexpectedSuccess", "unexpected success")
    wrap("addSubTest", subtest)
    start = result.startTestRun

    def start_test_run(self):
        emit({"f": "unittest", "session": True, "pid": os.getpid()})
        return start(self)

    stop = result.stopTestRun

    def stop_test_run(self):
        emit({"f": "unittest", "finish": True, "pid": os.getpid()})
        return stop(self)

    result.startTestRun = start_test_run
    result.stopTestRun = stop_test_run


_uniagent_status_hook()
del _uniagent_status_hook
'''

#: Bytes of records read at most.
MAX_RECORD_BYTES = 32 << 20


def status_recorder(hook_dir: str, record: str, nonce: str) -> str:
    """Shell lines that write the start-up module into ``hook_dir``, make ``record`` empty
    and hand both to the Python processes of the commands that follow."""
    q = shlex.quote
    end = f"EOF_HOOK_{nonce}"
    return (
        "\n".join(
            [
                f"mkdir -p {q(hook_dir)} && cat > {q(hook_dir + '/sitecustomize.py')} <<'{end}'",
                HOOK.rstrip("\n"),
                end,
                f": > {q(record)}",
                f"export UNIAGENT_STATUS_FILE={q(record)}",
                f'export PYTHONPATH={q(hook_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"',
            ]
        )
        + "\n"
    )


def keep_recorder(script: str, hook_dir: str) -> str:
    """``script`` with :func:`status_recorder`'s directory put first on ``PYTHONPATH`` again
    after each statement that sets it: ``export PYTHONPATH=src`` (as eval scripts and test
    commands say) would start the tests' Python without the recorder.

    A statement is rewritten where it starts a line or follows ``;`` or ``&&`` outside quotes,
    and ends the line or is followed by ``;`` or ``&&``: ``export PYTHONPATH=src; pytest``
    and ``cd x && export PYTHONPATH=. && pytest``. Anything else is left as it is, so its
    run may have no records (``absent``): a ``PYTHONPATH=src pytest`` prefix (that command's
    own environment), an export after ``||`` or ``|``, or in a quoted command. A
    here-document's body (``<<EOF`` ... ``EOF``: a test patch, say) is not read as commands.
    """
    again = f'export PYTHONPATH={shlex.quote(hook_dir)}"${{PYTHONPATH:+:$PYTHONPATH}}"'
    out: list[str] = []
    last = 0
    for end, terminator in _pythonpath_exports(script):
        out.append(script[last:end])
        out.append({"": "\n", "\n": "\n", ";": "; ", "&&": " && "}[terminator] + again)
        last = end
    out.append(script[last:])
    return "".join(out)


_EXPORT = re.compile(r"export[ \t]+PYTHONPATH=")


def _pythonpath_exports(script: str) -> list[tuple[int, str]]:
    """Where each rewritable ``export PYTHONPATH=...`` statement of ``script`` ends (before
    its spaces), and what ends it: ``""`` (the end), a newline, ``;`` or ``&&``."""
    found: list[tuple[int, str]] = []
    i, n, start = 0, len(script), True  # start: a command may begin here
    export_end: int | None = None  # in a rewritable statement: where its last word ended
    heredocs: list[tuple[str, bool]] = []  # bodies that start after this line (delimiter, <<-)
    while i < n:
        c = script[i]
        if c in " \t":
            i += 1
            continue
        if start and c == "#":  # a comment to the end of the line
            while i < n and script[i] != "\n":
                i += 1
            continue
        if start and _EXPORT.match(script, i):
            export_end, start = i, False
        if _heredoc(script, i):  # << WORD: its body starts on the next line
            strip = script.startswith("-", i + 2)
            j = i + 2 + strip
            while j < n and script[j] in " \t":
                j += 1
            i = _word_end(script, j)
            heredocs.append((re.sub(r"[\\'\"]", "", script[j:i]), strip))
            start = False
            continue
        terminator = next((t for t in ("\n", ";", "&&") if script.startswith(t, i)), None)
        if terminator is not None or c in "|&()":
            if (
                export_end is not None
                and terminator is not None
                and not (terminator == ";" and script.startswith(";;", i))
            ):
                found.append((export_end, terminator))
            export_end = None
            start = terminator is not None or c == "("
            i += len(terminator or c)
            if terminator == "\n" and heredocs:  # here-document bodies are not commands
                i = _after_heredocs(script, i, heredocs)
                heredocs = []
            continue
        start = False
        i = _word_end(script, i)  # a word, its quotes and escapes included
        if export_end is not None:
            export_end = i
    if export_end is not None:
        found.append((export_end, ""))
    return found


def _heredoc(script: str, i: int) -> bool:
    """Whether a here-document operator (``<<`` or ``<<-``, not ``<<<``) starts at ``i``."""
    return script.startswith("<<", i) and not script.startswith("<<<", i)


def _after_heredocs(script: str, i: int, heredocs: list[tuple[str, bool]]) -> int:
    """Where the script goes on after the here-document bodies that start at ``i``."""
    for delimiter, strip in heredocs:
        while i < len(script):
            end = script.find("\n", i)
            line = script[i:] if end < 0 else script[i:end]
            i = len(script) if end < 0 else end + 1
            if (line.lstrip("\t") if strip else line) == delimiter:
                break
    return i


def _word_end(script: str, i: int) -> int:
    """The end of the shell word starting at ``i`` (quotes, escapes, ``$(...)`` kept whole
    only as far as quotes go: a word ends at an unquoted space, operator or ``<<``)."""
    n, first = len(script), i
    while i < n:
        c = script[i]
        if c == "<" and i > first and _heredoc(script, i):
            return i
        if c == "\\":
            i += 2
        elif c == "'":
            close = script.find("'", i + 1)
            i = n if close < 0 else close + 1
        elif c == '"':
            i += 1
            while i < n and script[i] != '"':
                i += 2 if script[i] == "\\" else 1
            i += 1
        elif c in " \t\n;&|()":
            return i
        else:
            i += 1
    return min(i, n)


async def read_status_records(
    sandbox: GradingSandbox, path: str
) -> tuple[StatusRecords | None, str | None]:
    """The records of a run; or why there are none: ``removed`` (the file :func:`status_recorder`
    made empty before the command is gone or no longer a regular file), ``too_large``."""
    from uniagent.grading.sandbox import GradingReadError

    try:
        data = await sandbox.read_bytes(path, max_bytes=MAX_RECORD_BYTES)
    except GradingReadError as exc:
        return None, "too_large" if "larger than" in str(exc) else "removed"
    return await asyncio.to_thread(StatusRecords.parse, data.decode("utf-8", "replace")), None


#: Prints each file (relative to the repository, one a line on stdin) that differs from the
#: base commit ($BASE) or is not in it: compared by content, without git's filters.
_CHANGED = r"""
while IFS= read -r f; do
  want=$(gitc rev-parse -q --verify "$BASE:$f" 2>/dev/null) || want=none
  have=$(gitc hash-object --no-filters -- "$f" 2>/dev/null) || have=gone
  [ "$want" = "$have" ] || printf '%s\n' "$f"
done <<'{end}'
"""


async def module_shadow_reports(
    sandbox: GradingSandbox,
    records: StatusRecords,
    repo: str,
    base: str | None,
    exclude: Iterable[str] = (),
) -> list[dict[str, str]]:
    """Tamper reports (kind ``verdict``, rule ``module-shadow``) for the standard-library
    modules the run imported from a file of the repository that the base commit does not
    hold as it is now: a module the agent wrote, found before the one the runner wanted."""
    from uniagent.grading.sandbox import GIT_FUNCTION

    root = repo.rstrip("/") + "/"
    skip = set(exclude)
    files = {f[len(root) :]: name for name, f in records.shadows if f.startswith(root)}
    files = {f: name for f, name in files.items() if f not in skip and "\n" not in f}
    if not files:
        return []
    end = f"EOF_FILES_{secrets.token_hex(8)}"
    listing = "".join(f"{f}\n" for f in sorted(files))
    script = (
        f"{GIT_FUNCTION}\nBASE={shlex.quote(base or 'HEAD')}\n"
        f"{_CHANGED.lstrip().replace('{end}', end)}{listing}{end}\n"
    )
    done = await sandbox.run(script, timeout=120, cwd=repo)
    changed = [line for line in done.output.splitlines() if line in files]
    return [
        {"kind": "verdict", "rule": "module-shadow", "path": f,
         "change": f"shadows the standard library's {files[f]!r} in the test run"}
        for f in changed
    ]  # fmt: skip


@dataclass
class StatusRecords:
    """The records of one eval run, by family."""

    #: The families whose runner started (a pytest session, a unittest run).
    sessions: set[str] = field(default_factory=set)
    #: Runs started and runs that reported their end, per family.
    started: dict[str, int] = field(default_factory=dict)
    finished: dict[str, int] = field(default_factory=dict)
    #: pytest: node id -> {phase: (outcome, was an expected failure)}.
    pytest: dict[str, dict[str, tuple[str, bool]]] = field(default_factory=dict)
    declared_xfail: set[str] = field(default_factory=set)
    #: unittest: (description, docstring line) -> outcomes in order.
    unittest: dict[tuple[str, str | None], list[str]] = field(default_factory=dict)
    #: Top-level modules the run imported from below where it ran (the repository) that
    #: have a namesake in the standard library (or built in): (name, file).
    shadows: set[tuple[str, str]] = field(default_factory=set)
    malformed: int = 0

    @classmethod
    def parse(cls, text: str) -> StatusRecords:
        """Read the JSON lines; a line that is not one record is counted, not trusted."""
        records = cls()
        for line in text.splitlines():
            try:
                record = json.loads(line)
                records._add(record)
            except (ValueError, TypeError, KeyError, AttributeError):
                records.malformed += 1
        return records

    def _add(self, record: dict[str, Any]) -> None:
        kind = record["f"]
        if kind == "python" and "shadow" in record:
            if record.get("in") == "stdlib":
                self.shadows.add((_text(record["shadow"]), _text(record["file"])))
            return
        if kind not in ("pytest", "unittest"):
            raise ValueError(kind)
        if record.get("session") is True:
            self.sessions.add(kind)
            self.started[kind] = self.started.get(kind, 0) + 1
            return
        if record.get("finish") is True:
            self.finished[kind] = self.finished.get(kind, 0) + 1
            return
        if kind == "pytest":
            test = _text(record["id"])
            if record.get("declared_xfail") is True or record.get("xfail_in_test") is True:
                self.declared_xfail.add(test)
            if "when" not in record:
                return
            phases = self.pytest.setdefault(test, {})
            phases[_text(record["when"])] = (_text(record["o"]), record.get("xfail") is True)
            return
        doc = record.get("doc")
        key = (_text(record["id"]), None if doc is None else _text(doc))
        self.unittest.setdefault(key, []).append(_text(record["o"]))

    def unfinished(self) -> list[str]:
        """The families with a run that started and never reported its end: the process
        left in the middle of its tests (``os._exit``, a signal)."""
        return sorted(k for k, n in self.started.items() if self.finished.get(k, 0) < n)

    def log(self, kind: str) -> str:
        """The records as lines of the runner's own output, for the row's parser."""
        return "\n".join(self._pytest_lines() if kind == "pytest" else self._django_lines())

    def undeclared_xfail_log(self) -> str:
        """``XFAIL`` lines of the pytest tests whose expected failure no marker declares."""
        return "\n".join(
            f"XFAIL {test}"
            for test, phases in self.pytest.items()
            if _pytest_status(phases) == "XFAIL" and test not in self.declared_xfail
        )

    def _pytest_lines(self) -> Iterable[str]:
        for test, phases in self.pytest.items():
            yield f"{_pytest_status(phases)} {test}"

    def _django_lines(self) -> Iterable[str]:
        for (test, doc), outcomes in self.unittest.items():
            status = _unittest_status(outcomes)
            first = test.splitlines()[0] if test else test
            # unittest's verbose line: the description's first line, then its docstring line.
            yield f"{first}\n{doc} ... {status}" if doc else f"{first} ... {status}"


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(type(value).__name__)
    return value


def _pytest_status(phases: dict[str, tuple[str, bool]]) -> str:
    """pytest's short-summary word for a test's reports.

    The test's own outcome is its call's (or its set-up's, where that failed or skipped):
    an error in its teardown alone leaves it as the call ended, since ``-rA`` prints both
    lines, in an order that differs between pytest versions, and the log's parser keeps the
    last one. The channel then never contradicts a log that says the call passed.
    """
    if phases.get("collect", ("", False))[0] == "failed":
        return "ERROR"
    outcome, xfail = phases.get("setup", ("", False))
    if outcome == "failed":
        return "ERROR"
    if outcome != "skipped":
        outcome, xfail = phases.get("call", ("", False))
    if outcome == "failed":
        return "FAILED"
    if outcome == "skipped":
        return "XFAIL" if xfail else "SKIPPED"
    if outcome == "passed":
        return "XPASS" if xfail else "PASSED"
    return "ERROR"  # no call report: the test never ran to the end


def _unittest_status(outcomes: list[str]) -> str:
    """One word for a unittest test: any failure wins (a failed subtest fails its test)."""
    for word in ("ERROR", "FAIL", "unexpected success", "expected failure", "skipped"):
        if word in outcomes:
            return word
    return "ok" if outcomes else "ERROR"
