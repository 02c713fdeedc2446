"""Grading settings: the config's ``reward.integrity`` section and a reward's own defaults."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from uniagent.protect.rules import (
    CACHES,
    GIT_ATTRIBUTES,
    GIT_FOREIGN,
    GIT_METADATA,
    PYTHON_CONTENT,
    PYTHON_HARNESS,
    ContentRule,
    ProtectRule,
    RuleSet,
    compiled_rules,
    literal_pattern,
)

GradeIn = Literal["episode", "fresh"]


@dataclass(frozen=True)
class Workspace:
    """The repository a reward grades, as the reward sees it for one task.

    ``repo`` is an absolute path in the sandbox (``None``: the episode's work
    dir); ``base_commit`` the task's base (``None``: ``HEAD`` when the episode
    starts, before the agent's first turn); ``protect_paths`` are repository
    paths the benchmark owns for this task (e.g. the files of SWE-bench's test
    patch), restored like the protect rules' files.
    """

    repo: str | None = None
    base_commit: str | None = None
    protect_paths: tuple[str, ...] = ()
    #: Absolute paths outside the repository that the benchmark owns (files or
    #: directories, e.g. R2E-Gym's /root/run_tests.sh): snapshotted at the baseline and
    #: put back before grading in the episode's sandbox.
    outside_paths: tuple[str, ...] = ()


@dataclass(frozen=True)
class TestEnv:
    """How a task's tests find their interpreter: the eval script's activation lines (and its
    changes of directory) and the words its test commands start with (``pytest``,
    ``python``, an absolute path, a path relative to where the tests run)."""

    __test__ = False  # not a test class (for pytest)

    activate: str = ""
    interpreters: tuple[str, ...] = ("python", "python3", "pytest")
    #: The words of :attr:`interpreters` that must resolve at the baseline: the test
    #: commands' own (a task whose tests cannot find their interpreter cannot be graded).
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class IntegrityDefaults:
    """A reward's defaults for what the grader protects (``RewardSpec.integrity``)."""

    scrub_history: bool = False
    protect: tuple[ProtectRule, ...] = PYTHON_HARNESS
    content_rules: tuple[ContentRule, ...] = PYTHON_CONTENT
    #: Whether the task set's tests run without pytest's auto-loaded plugins.
    disable_plugin_autoload: bool = False
    #: Where the reward grades by default (``reward.grade_in`` overrides).
    grade_in: GradeIn = "episode"
    #: ``workspace(task, settings)``: the repository, base and benchmark-owned paths of a task.
    workspace: Callable[[Mapping[str, Any], Any], Workspace] | None = field(
        default=None, compare=False
    )
    #: ``test_env(task, settings)``: how the task's tests find their interpreter (default:
    #: ``python``, ``python3`` and ``pytest`` on the grading PATH, no activation).
    test_env: Callable[[Mapping[str, Any], Any], TestEnv] | None = field(
        default=None, compare=False
    )


class TamperAlert(BaseModel):
    """``reward.integrity.alert``: stop a ``uniagent run`` whose policy keeps probing."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(
        gt=0, le=1, description="stop once this share of the graded episodes report tampering"
    )
    min_episodes: int = Field(
        20, ge=1, description="graded episodes to wait for before the share is judged"
    )


class IntegritySettings(BaseModel):
    """``reward.integrity``: how the grader defends the reward against the agent."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on_tamper: Literal["zero", "report"] = Field(
        "zero",
        description="'zero': any tampering (a protected file changed, a content rule hit, a "
        "changed toolchain) scores 0; 'report': protected files are restored and the reward "
        "is computed as usual, tampering only reported",
    )
    scrub_history: bool | None = Field(
        None,
        description="remove refs, tags after the base, remotes, stashes, reflogs and unreachable "
        "objects before the first turn (default: the reward's; on for the SWE rewards)",
    )
    protect: list[ProtectRule] | None = Field(
        None, description="the protect rules (default: the reward's, Python test-harness files)"
    )
    protect_paths: list[str] = Field(
        default_factory=list,
        description="more gitignore-style patterns of repository paths to restore (e.g. tests/)",
    )
    content_rules: list[ContentRule] | None = Field(
        None, description="patterns the agent's added lines must not hold (default: the reward's)"
    )
    drop_rules: list[str] = Field(
        default_factory=list, description="names of default protect or content rules to drop"
    )
    verify_toolchain: bool = Field(
        True,
        description="checksum bash, git, timeout, the interpreters, their start-up hooks and "
        "the test runner, and the test environment the tests really run in (after the eval "
        "script's activation: its prefixes, site-packages, stdlib), at start and verify them "
        "before grading in the episode's sandbox (grade_in: episode)",
    )
    on_toolchain_tamper: Literal["fresh", "zero"] = Field(
        "fresh",
        description="when the toolchain changed: grade in a fresh sandbox instead, or score 0",
    )
    repo: str | None = Field(
        None, description="the repository to grade (default: the reward's, else the work dir)"
    )
    grading_env: dict[str, str] = Field(
        default_factory=dict, description="variables set for grading commands, applied last"
    )
    disable_plugin_autoload: bool | None = Field(
        None,
        description="set PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 for grading commands: pytest loads no "
        "plugin through entry points (a [pytest11] one planted in the environment); for task "
        "sets whose tests need no auto-loaded plugin. null: the reward's default (off)",
    )
    grading_timeout: float = Field(
        3600.0,
        gt=0,
        description="seconds grading an episode may take in all (stop, checks, a fresh "
        "sandbox, the reward); past it the episode scores 0 (score_reason grading_timed_out, "
        "trained on: the tested code can hang), unless a fresh sandbox was still starting "
        "(reward_error). Keep it above the reward's own test timeout",
    )
    alert: TamperAlert | None = Field(
        None,
        description="stop the run (status stopped, exit 1) when at least `share` of the graded "
        "episodes report tampering, after `min_episodes` of them; null: never",
    )
    max_patch_bytes: int = Field(
        50_000_000, ge=1, description="a larger patch (grade_in: fresh, content rules) scores 0"
    )
    snapshot_max_bytes: int = Field(
        200_000_000, ge=1, description="protected files larger than this in all are an error"
    )

    def rules(self, defaults: IntegrityDefaults, extra_paths: tuple[str, ...] = ()) -> RuleSet:
        """The protect and content rules in force; git's attributes, foreign files under
        ``.git`` and git metadata always included."""
        protect = list(self.protect if self.protect is not None else defaults.protect)
        content = list(
            self.content_rules if self.content_rules is not None else defaults.content_rules
        )
        protect = [r for r in protect if r.name not in self.drop_rules]
        content = [r for r in content if r.name not in self.drop_rules]
        if self.protect_paths:
            protect.append(ProtectRule(name="config-paths", patterns=tuple(self.protect_paths)))
        if extra_paths:
            patterns = tuple(literal_pattern(p) for p in extra_paths)
            protect.append(ProtectRule(name="task-paths", patterns=patterns))
        return compiled_rules(
            (*protect, GIT_ATTRIBUTES, GIT_FOREIGN, GIT_METADATA, CACHES), tuple(content)
        )
