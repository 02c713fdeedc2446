"""Task rows of SWE-bench, SWE-rebench and R2E-Gym, mapped onto one evaluation spec.

Each dataset describes an instance differently; :func:`build_spec` turns a row
into an :class:`EvalSpec` that the one grader (swebench's) understands: which
tests must pass, the eval script that prints their results between the output
markers, the log parser to read them, and how test names are normalised.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from uniagent_reward_swebench.config import (
    R2EGymRewardConfig,
    SweBenchRewardConfig,
    SweRebenchRewardConfig,
)
from uniagent_reward_swebench.errors import TaskRowError
from uniagent_reward_swebench.harness import harness_module
from uniagent_reward_swebench.scripts import (
    DEFAULT_TEST_COMMANDS,
    generate_eval_script,
    patch_files,
    test_directives,
)

Dataset = Literal["swe_bench", "swe_rebench", "r2e_gym"]


@dataclass(frozen=True)
class EvalSpec:
    """What the grader needs to evaluate one task in the sandbox."""

    dataset: Dataset
    instance_id: str
    repo: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    eval_script: str
    log_parser: str
    eval_type: str
    workdir: str
    test_patch: str = ""
    apply_test_patch: bool = False
    base_commit: str | None = None
    #: R2E-Gym: every test's expected status, compared exactly when ``exact_match``.
    expected_statuses: Mapping[str, str] | None = None
    normalize_test_name: Callable[[str], str] | None = field(default=None, compare=False)


# -- field readers --------------------------------------------------------------------


def _where(row: Mapping[str, Any]) -> str:
    ident = row.get("instance_id") or row.get("docker_image") or row.get("commit_hash")
    return f"task {ident!r}" if ident else "task row"


def _text(row: Mapping[str, Any], key: str, *, required: bool = False) -> str:
    value = row.get(key)
    if value is None or value == "":
        if required:
            raise TaskRowError(
                f"{_where(row)} has no {key!r}; a row needs: {key} (present keys: "
                f"{', '.join(sorted(row)) or 'none'})"
            )
        return ""
    if not isinstance(value, str):
        raise TaskRowError(f"{_where(row)}: {key!r} must be a string, got {type(value).__name__}")
    return value


def _json_value(row: Mapping[str, Any], key: str, value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise TaskRowError(
                f"{_where(row)}: {key!r} is a string but not valid JSON ({exc.msg} at "
                f"position {exc.pos}); give a list (or a JSON-encoded list) of test names"
            ) from None
    return value


def test_list(row: Mapping[str, Any], key: str, *, required: bool = True) -> tuple[str, ...]:
    """A FAIL_TO_PASS / PASS_TO_PASS field: a list of test names or its JSON encoding."""
    if key not in row or row[key] is None:
        if not required:
            return ()
        raise TaskRowError(
            f"{_where(row)} has no {key!r}: SWE-bench rows list the tests that must pass in "
            "FAIL_TO_PASS and PASS_TO_PASS (lists of test names, or JSON strings of lists)"
        )
    value = _json_value(row, key, row[key])
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise TaskRowError(
            f"{_where(row)}: {key!r} must be a list of test names (or its JSON encoding), "
            f"got {str(row[key])[:80]!r}"
        )
    return tuple(value)


def _mapping(row: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = _json_value(row, key, row.get(key) or {})
    if not isinstance(value, Mapping):
        raise TaskRowError(
            f"{_where(row)}: {key!r} must be a mapping (or its JSON encoding), "
            f"got {type(value).__name__}"
        )
    return dict(value)


def _commands(value: Any, where: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple) and all(isinstance(c, str) for c in value):
        return [c for c in value if c.strip()]
    raise TaskRowError(f"{where} must be a command or a list of commands, got {value!r}")


# -- parsers --------------------------------------------------------------------------


def parser_names() -> dict[Callable[..., Any], str]:
    """Parser function → its name in swebench's ``PARSER_REGISTRY``."""
    PARSER_REGISTRY = harness_module("log_parsers").PARSER_REGISTRY

    names: dict[Callable[..., Any], str] = {}
    for name, fn in PARSER_REGISTRY.items():
        names.setdefault(fn, name)
    return names


def repo_parser(repo: str) -> str | None:
    """The parser name swebench's per-language repo maps give a repository, if any."""

    def of(language: str, suffix: str) -> Mapping[str, Any]:
        return getattr(harness_module(f"log_parsers.{language}"), f"MAP_REPO_TO_PARSER_{suffix}")

    maps = (
        of("python", "PY"),
        of("javascript", "JS"),
        of("java", "JAVA"),
        of("go", "GO"),
        of("rust", "RUST"),
        of("php", "PHP"),
        of("ruby", "RUBY"),
        of("c", "C"),
    )
    for mapping in maps:
        fn = mapping.get(repo)
        if fn is not None:
            return parser_names().get(fn)
    return None


def _check_parser(row: Mapping[str, Any], name: str) -> str:
    if name not in harness_module("log_parsers").PARSER_REGISTRY:
        raise TaskRowError(
            f"{_where(row)}: unknown log parser {name!r}; swebench 5.0.2 has: "
            f"{', '.join(sorted(harness_module('log_parsers').PARSER_REGISTRY))}"
        )
    return name


def _resolve_parser(
    row: Mapping[str, Any], repo: str, candidates: Sequence[str | None], default: str | None
) -> str:
    for name in candidates:
        if name:
            return _check_parser(row, name)
    mapped = repo_parser(repo)
    if mapped:
        return mapped
    if default:
        return _check_parser(row, default)
    raise TaskRowError(
        f"{_where(row)}: no log parser for repo {repo!r}: give the row a 'log_parser' (a key of "
        "swebench.harness.log_parsers.PARSER_REGISTRY, e.g. 'parse_log_pytest') or set the "
        "reward config's log_parser"
    )


def _eval_type(row: Mapping[str, Any], repo: str) -> str:
    constants = harness_module("constants")
    EvalType, FAIL_ONLY_REPOS = constants.EvalType, constants.FAIL_ONLY_REPOS

    value = row.get("eval_type")
    if value:
        allowed = [e.value for e in EvalType]
        if value not in allowed:
            raise TaskRowError(
                f"{_where(row)}: eval_type {value!r} is not one of {', '.join(allowed)}"
            )
        return str(value)
    return (EvalType.FAIL_ONLY if repo in FAIL_ONLY_REPOS else EvalType.PASS_AND_FAIL).value


def _workdir(config: SweBenchRewardConfig, row: Mapping[str, Any], repo: str) -> str:
    if config.workdir is None:
        return "."  # the episode's work dir: the grader passes the real path in
    fields = {
        "repo": repo,
        "repo_name": repo.rsplit("/", 1)[-1],
        "instance_id": str(row.get("instance_id", "")),
    }
    try:
        return config.workdir.format_map(fields)
    except (KeyError, ValueError) as exc:
        raise TaskRowError(
            f"reward config workdir {config.workdir!r} is not a valid template ({exc}); "
            "it may use {repo}, {repo_name} and {instance_id}"
        ) from None


def _should_apply(mode: str, test_patch: str, eval_script: str, generated: bool) -> bool:
    if not test_patch.strip() or mode == "never":
        return False
    if mode == "always" or generated:
        return True
    # swebench eval scripts apply the test patch themselves (git apply ... <<EOF).
    return "git apply" not in eval_script


# -- the three datasets ---------------------------------------------------------------


def _from_swebench_like(
    dataset: Dataset,
    row: Mapping[str, Any],
    config: SweBenchRewardConfig,
    *,
    row_test_cmds: list[str],
    row_parser: str | None,
    pre_commands: Sequence[str] = (),
    normalize: Callable[[str], str] | None = None,
) -> EvalSpec:
    instance_id = _text(row, "instance_id", required=True)
    repo = _text(row, "repo", required=True)
    f2p = test_list(row, "FAIL_TO_PASS")
    p2p = test_list(row, "PASS_TO_PASS")
    test_patch = _text(row, "test_patch")
    base_commit = _text(row, "base_commit") or None
    workdir = _workdir(config, row, repo)
    eval_script = _text(row, "eval_script")
    generated = not eval_script
    if generated:
        commands = row_test_cmds or _commands(config.test_cmd, "reward config test_cmd")
        if not commands and repo in DEFAULT_TEST_COMMANDS:
            commands = [DEFAULT_TEST_COMMANDS[repo]]
        if not commands:
            raise TaskRowError(
                f"{_where(row)} has no eval_script and no test command for repo {repo!r}: give "
                "the row an 'eval_script' (swebench 5.x rows have one), or a test command "
                "(SWE-rebench: install_config.test_cmd), or set the reward config's test_cmd"
            )
        if not test_patch.strip():
            raise TaskRowError(
                f"{_where(row)} has neither an eval_script nor a test_patch: without one of "
                "them there is no way to know which tests to run"
            )
        directives = test_directives(repo, [f.path for f in patch_files(test_patch)])
        eval_script = generate_eval_script(
            workdir=workdir,
            test_commands=commands,
            directives=directives,
            pre_commands=pre_commands,
            conda_env=config.conda_env,
        )
    log_parser = _resolve_parser(row, repo, [row_parser, config.log_parser], None)
    return EvalSpec(
        dataset=dataset,
        instance_id=instance_id,
        repo=repo,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        eval_script=eval_script,
        log_parser=log_parser,
        eval_type=_eval_type(row, repo),
        workdir=workdir,
        test_patch=test_patch,
        apply_test_patch=_should_apply(config.apply_test_patch, test_patch, eval_script, generated),
        base_commit=base_commit,
        normalize_test_name=normalize,
    )


def swe_bench_spec(row: Mapping[str, Any], config: SweBenchRewardConfig) -> EvalSpec:
    """A SWE-bench row (Verified, Lite, full, multilingual; 4.x or 5.x style)."""
    return _from_swebench_like(
        "swe_bench",
        row,
        config,
        row_test_cmds=_commands(row.get("test_cmd"), f"{_where(row)}: 'test_cmd'"),
        row_parser=_text(row, "log_parser") or None,
    )


_REBENCH_TIMING = (
    re.compile(r"\s*\[\s*\d+(?:\.\d+)?\s*(?:ms|s)\s*\]\s*$", re.IGNORECASE),
    re.compile(r"\s+in\s+\d+(?:\.\d+)?\s+(?:msec|sec)\b", re.IGNORECASE),
    re.compile(r"\s*\(\s*\d+(?:\.\d+)?\s*(?:ms|s)\s*\)\s*$", re.IGNORECASE),
)


def rebench_test_name(name: str) -> str:
    """Strip the timing suffixes some runners print after test names (SWE-rebench's rule)."""
    for pattern in _REBENCH_TIMING:
        name = pattern.sub("", name)
    return name.strip()


def swe_rebench_spec(row: Mapping[str, Any], config: SweRebenchRewardConfig) -> EvalSpec:
    """A SWE-rebench row: SWE-bench fields plus ``install_config`` (test_cmd, log_parser, ...)."""
    install = _mapping(row, "install_config")
    where = f"{_where(row)}: install_config"
    pre = _commands(install.get("eval_commands"), f"{where}.eval_commands")
    if config.run_install_commands:
        installs = _commands(install.get("install"), f"{where}.install")
        # Generated scripts run without `set -e`, so a failing install does not stop the tests.
        pre = [*pre, *installs]
    return _from_swebench_like(
        "swe_rebench",
        row,
        config,
        row_test_cmds=_commands(install.get("test_cmd"), f"{where}.test_cmd")
        or _commands(row.get("test_cmd"), f"{_where(row)}: 'test_cmd'"),
        row_parser=(install.get("log_parser") or _text(row, "log_parser") or None),
        pre_commands=pre,
        normalize=rebench_test_name if config.normalize_test_names else None,
    )


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

#: R2E-Gym's run_tests.sh: moved to /root by its environment set-up, else in the checkout.
R2E_TEST_COMMAND = (
    "if [ -f /root/run_tests.sh ]; then bash /root/run_tests.sh; else bash run_tests.sh; fi"
)


def r2e_test_name(name: str) -> str:
    """R2E-Gym's test key: no colours, no file path, '::' joined by '.', no ' - reason'."""
    name = _ANSI.sub("", name).strip()
    if "::" in name:
        name = ".".join(name.split("::")[1:])
    return name.split(" - ")[0].strip()


def r2e_gym_spec(row: Mapping[str, Any], config: R2EGymRewardConfig) -> EvalSpec:
    """An R2E-Gym row: ``expected_output_json`` (test → status) and the image's run_tests.sh."""
    repo = _text(row, "repo_name") or _text(row, "repo")
    if not repo:
        raise TaskRowError(f"{_where(row)} has no 'repo_name' (or 'repo'); R2E-Gym rows name it")
    instance_id = (
        _text(row, "instance_id") or _text(row, "docker_image") or _text(row, "commit_hash")
    )
    if not instance_id:
        raise TaskRowError(
            "R2E-Gym row has no 'instance_id', 'docker_image' or 'commit_hash' to name it by"
        )
    expected: dict[str, str] | None = None
    if row.get("expected_output_json") is not None:
        raw = _mapping(row, "expected_output_json")
        if not all(isinstance(v, str) for v in raw.values()):
            raise TaskRowError(
                f"{_where(row)}: expected_output_json must map test names to statuses "
                "('PASSED', 'FAILED', ...)"
            )
        expected = {r2e_test_name(k): v for k, v in raw.items() if r2e_test_name(k)}
    if "FAIL_TO_PASS" in row:
        f2p = tuple(r2e_test_name(t) for t in test_list(row, "FAIL_TO_PASS"))
        p2p = tuple(r2e_test_name(t) for t in test_list(row, "PASS_TO_PASS", required=False))
    elif expected is not None:
        # R2E-Gym records the statuses on the fixed commit only: every test expected to
        # pass must pass (F2P and P2P cannot be told apart, and grade alike).
        f2p = tuple(sorted(k for k, v in expected.items() if v == "PASSED"))
        p2p = ()
    else:
        raise TaskRowError(
            f"{_where(row)} has neither 'expected_output_json' nor 'FAIL_TO_PASS': an R2E-Gym "
            "row needs expected_output_json (a mapping, or its JSON, of test name to status)"
        )
    if not f2p and not p2p:
        raise TaskRowError(f"{_where(row)}: no test is expected to pass; nothing to grade")
    workdir = _workdir(config, {**row, "instance_id": instance_id}, repo)
    eval_script = _text(row, "eval_script") or generate_eval_script(
        workdir=workdir,
        test_commands=[config.test_cmd or R2E_TEST_COMMAND],
        conda_env=None,
    )
    log_parser = _resolve_parser(
        row, repo, [_text(row, "log_parser") or None, config.log_parser], "parse_log_pytest"
    )
    return EvalSpec(
        dataset="r2e_gym",
        instance_id=instance_id,
        repo=repo,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        eval_script=eval_script,
        log_parser=log_parser,
        eval_type=_eval_type(row, repo),
        workdir=workdir,
        expected_statuses=expected if config.exact_match else None,
        normalize_test_name=r2e_test_name,
    )


def build_spec(dataset: Dataset, row: Mapping[str, Any], config: SweBenchRewardConfig) -> EvalSpec:
    """Map a task row of ``dataset`` onto an :class:`EvalSpec` (raises :class:`TaskRowError`)."""
    if not isinstance(row, Mapping):
        raise TaskRowError(f"a task row must be a mapping, got {type(row).__name__}")
    if dataset == "swe_bench":
        return swe_bench_spec(row, config)
    if dataset == "swe_rebench":
        assert isinstance(config, SweRebenchRewardConfig)
        return swe_rebench_spec(row, config)
    assert isinstance(config, R2EGymRewardConfig)
    return r2e_gym_spec(row, config)
