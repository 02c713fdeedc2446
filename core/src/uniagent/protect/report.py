"""What an episode's grading says about probing: flags per tamper class, for metrics and alerts.

Frameworks prevent reward hacking; this makes it visible while a run trains. From
an episode's ``reward_info`` (its ``integrity.tampered`` reports, ``score_reason``
and ``probing``), :func:`integrity_flags` gives the flags that ``summary.json``
counts, verl's metric dict averages per step (``integrity/...``) and the tamper
alert (``reward.integrity.alert``) watches:

- ``tampered``: some change of what the grader protects counts (it scored 0, or
  would have under ``on_tamper: zero``), or the reward reported tampering of its own
  (``reward_info.tampered``, e.g. the ``harbor`` reward's ``verifier_input``);
- ``tampered/<kind>``: of that kind (``protected_file``, ``toolchain`` (the
  toolchain and the test environment), ``content`` (the patch screen), ``tree`` (what
  git's summary hides: nested repositories, symlinks out of the repository), ``verdict``
  (the ``swe_bench`` reward's: a test status in the log that the runner did not report));
- ``tampered/<class>``: an attack of that class (:data:`CLASSES`, docs/rewards.md) showed:
  a scoring tamper report of its rule (:data:`RULE_CLASSES`, else its kind's
  :data:`KIND_CLASSES`), a score the grader forced for a reason of the class
  (:data:`REASON_CLASSES`: a grading time-out, a sandbox ended or broken by the
  agent, a reward that failed on the tested code's output), or the reward's own
  word (``reward_info.probing``, a list of classes: ``swe_bench`` names
  ``self_masking`` for grader markers in the test output or a log parser that
  failed on it);
- ``rule/<rule>``: a report of that rule, scored or not (``conftest.py`` as
  ``pytest-plugins``, a content rule, ``test-env``, ``git-foreign``, ...);
- ``score_reason/<reason>``: the grader forced the score (``tampered``,
  ``reward_failed``, ``grading_timed_out``, ``sandbox_ended_by_agent``, ...).

``tampered`` (and so the alert) is the scoring tamper reports only: a class seen only
through a forced score or the reward's word is counted under its class, not as tampering.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import Any

#: The kinds of tamper reports (the classes counted for every step, seen or not).
KINDS = ("protected_file", "toolchain", "content", "tree", "verdict")

#: The attack classes (docs/rewards.md, "The classes of attack"), counted every step. Root
#: under ``isolation: none`` has none: bwrap and containers hold it before anything reaches
#: the grader, and without isolation nothing can see it (``uniagent run`` warns instead).
CLASSES = (
    "artifacts",  # the test log, the runner's scripts and output, a hang of grading
    "test_env",  # the toolchain and the task's test environment
    "plugin_config",  # plugins, runner config and caches in the repository
    "patch_screen",  # what hides from the patch screen (.gitattributes, .git/, rules hit)
    "outside_paths",  # the benchmark's paths outside the repository
    "self_masking",  # making the episode look like an infrastructure failure
    "task_files",  # the reward's own files of the task (its tests), protect_paths
    "status_channel",  # a test status the log reports and the test runner did not
)

#: A tamper report's rule -> its class.
RULE_CLASSES: dict[str, str] = {
    "toolchain": "test_env",
    "test-env": "test_env",
    "pytest-plugins": "plugin_config",
    "runner-config": "plugin_config",
    "runner-config-sections": "plugin_config",
    "interpreter-hooks": "plugin_config",
    "package-metadata": "plugin_config",
    "runner-shadows": "plugin_config",
    "caches": "plugin_config",
    "git-attributes": "patch_screen",
    "git-metadata": "patch_screen",
    "git-foreign": "patch_screen",
    "binary-source": "patch_screen",
    "nested-git": "patch_screen",
    "symlink-outside": "patch_screen",
    "gitlink": "patch_screen",
    "git-dir": "patch_screen",
    "outside-paths": "outside_paths",
    "task-paths": "task_files",
    "config-paths": "task_files",
    "module-shadow": "plugin_config",  # a module of the agent's found before the stdlib's
}
#: A tamper report's kind -> its class, for rules not in :data:`RULE_CLASSES` (content rules
#: are the patch screen's).
KIND_CLASSES: dict[str, str] = {
    "content": "patch_screen",
    "tree": "patch_screen",
    "toolchain": "test_env",
    "protected_file": "task_files",
    "verifier_input": "task_files",  # the harbor reward's: the verifier's inputs
    "verdict": "status_channel",  # swe_bench's status channel: the log disagrees with the runner
}
#: A forced ``score_reason`` -> the class of the attack that forces it.
REASON_CLASSES: dict[str, str] = {
    "grading_timed_out": "artifacts",
    "patch_too_large": "patch_screen",
    "agent_killed_shell": "self_masking",
    "sandbox_ended_by_agent": "self_masking",
    "sandbox_broken_by_agent": "self_masking",
    "reward_failed": "self_masking",
    "judge_refused": "self_masking",
}


def report_class(report: Mapping[str, Any]) -> str | None:
    """The attack class of one tamper report (``None`` for a kind and rule of no class)."""
    rule, kind = report.get("rule"), report.get("kind")
    if isinstance(rule, str) and rule in RULE_CLASSES:
        return RULE_CLASSES[rule]
    return KIND_CLASSES.get(kind) if isinstance(kind, str) else None


def episode_classes(reward_info: Mapping[str, Any] | None) -> set[str]:
    """The attack classes one episode's grading shows (see the module's doc)."""
    info = reward_info if isinstance(reward_info, Mapping) else {}
    found = {
        cls
        for report in _reports(info)
        if report.get("scores", True) and (cls := report_class(report)) is not None
    }
    reason = info.get("score_reason")
    if isinstance(reason, str) and reason in REASON_CLASSES:
        found.add(REASON_CLASSES[reason])
    probing = info.get("probing")
    if isinstance(probing, list | tuple):
        found |= {c for c in probing if isinstance(c, str) and c in CLASSES}
    return found


def integrity_flags(reward_info: Mapping[str, Any] | None) -> dict[str, int]:
    """The probing flags of one episode (each present one is 1)."""
    info = reward_info if isinstance(reward_info, Mapping) else {}
    flags: dict[str, int] = {}
    for report in _reports(info):
        flags[f"rule/{report.get('rule')}"] = 1
        if report.get("scores", True):
            flags["tampered"] = 1
            flags[f"tampered/{report.get('kind')}"] = 1
    for cls in episode_classes(info):
        flags[f"tampered/{cls}"] = 1
    reason = info.get("score_reason")
    if isinstance(reason, str) and reason:
        flags[f"score_reason/{reason}"] = 1
    return flags


def _reports(info: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The grader's tamper reports (``integrity.tampered``) and the reward's own
    (``tampered``: e.g. the ``harbor`` reward's files left where the verifier's inputs go)."""
    integrity = info.get("integrity")
    graders = integrity.get("tampered") if isinstance(integrity, Mapping) else None
    rewards = info.get("tampered")
    return [
        t
        for reports in (graders, rewards)
        if isinstance(reports, list | tuple)
        for t in reports
        if isinstance(t, Mapping)
    ]


def is_tampered(record: Mapping[str, Any]) -> bool:
    """Whether a finished episode's record (a ``results.jsonl`` line) reports tampering."""
    return bool(integrity_flags(record.get("reward_info")).get("tampered"))


def integrity_metrics(
    records: Iterable[Mapping[str, Any]], prefix: str = "integrity"
) -> dict[str, float]:
    """``integrity/<flag>``: the share of the records whose ``integrity`` flags (as
    :func:`integrity_flags` gives them) hold it; ``tampered``, every kind and every class
    always."""
    flags = [f if isinstance(f := r.get("integrity"), Mapping) else {} for r in records]
    if not flags:
        return {}
    names = {"tampered", *(f"tampered/{name}" for name in (*KINDS, *CLASSES))}
    names |= {name for f in flags for name in f}
    return {
        f"{prefix}/{name}": fmean(1.0 if f.get(name) else 0.0 for f in flags)
        for name in sorted(names)
    }
