#!/usr/bin/env python3
"""Generate the tiny fix-a-bug task set: small git repositories with a bug and tests.

    python examples/swe_tiny/make_tasks.py OUT_DIR

writes OUT_DIR/repos/<task>/ (git repositories) and OUT_DIR/tasks.jsonl. Each
task's sandbox clones its repository (per-task ``config_overrides``), and the
``command`` reward runs the task's tests in a clean grading shell: 1.0 when
they pass. The configs protect ``tests/`` (``reward.integrity.protect_paths``):
before grading, the grader puts the tests back as they were when the episode
started (from its own snapshot, not from git, whose history the agent could
rewrite) and, by default, scores a change to them 0. Standard library only; the
tests use ``unittest``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import textwrap
from pathlib import Path

# (task id, module name, buggy source, tests, problem statement)
TASKS = [
    (
        "mean-empty",
        "stats",
        """
        def mean(values):
            \"\"\"Arithmetic mean; 0.0 for an empty list.\"\"\"
            return sum(values) / len(values)
        """,
        """
        import unittest
        from stats import mean

        class TestMean(unittest.TestCase):
            def test_values(self):
                self.assertEqual(mean([1, 2, 3, 4]), 2.5)

            def test_empty(self):
                self.assertEqual(mean([]), 0.0)
        """,
        "`stats.mean([])` raises ZeroDivisionError but should return 0.0.",
    ),
    (
        "fahrenheit",
        "temperature",
        """
        def celsius_to_fahrenheit(celsius):
            \"\"\"Convert degrees Celsius to Fahrenheit.\"\"\"
            return celsius * 9 / 5 - 32
        """,
        """
        import unittest
        from temperature import celsius_to_fahrenheit

        class TestConvert(unittest.TestCase):
            def test_freezing(self):
                self.assertEqual(celsius_to_fahrenheit(0), 32)

            def test_boiling(self):
                self.assertEqual(celsius_to_fahrenheit(100), 212)
        """,
        "`celsius_to_fahrenheit(0)` returns -32 instead of 32.",
    ),
    (
        "palindrome-case",
        "words",
        """
        def is_palindrome(text):
            \"\"\"True when text reads the same backwards, ignoring case and spaces.\"\"\"
            cleaned = text.replace(" ", "")
            return cleaned == cleaned[::-1]
        """,
        """
        import unittest
        from words import is_palindrome

        class TestPalindrome(unittest.TestCase):
            def test_simple(self):
                self.assertTrue(is_palindrome("level"))

            def test_mixed_case(self):
                self.assertTrue(is_palindrome("Never odd or even"))

            def test_not(self):
                self.assertFalse(is_palindrome("uniagent"))
        """,
        "`is_palindrome('Never odd or even')` returns False; case should be ignored.",
    ),
    (
        "factorial-zero",
        "mathx",
        """
        def factorial(n):
            \"\"\"n! for n >= 0.\"\"\"
            result = 1
            for k in range(1, n):
                result *= k
            return result
        """,
        """
        import unittest
        from mathx import factorial

        class TestFactorial(unittest.TestCase):
            def test_small(self):
                self.assertEqual(factorial(5), 120)

            def test_zero(self):
                self.assertEqual(factorial(0), 1)
        """,
        "`factorial(5)` returns 24 instead of 120.",
    ),
    (
        "clamp-order",
        "bounds",
        """
        def clamp(value, low, high):
            \"\"\"Limit value to the closed interval [low, high].\"\"\"
            return max(high, min(low, value))
        """,
        """
        import unittest
        from bounds import clamp

        class TestClamp(unittest.TestCase):
            def test_inside(self):
                self.assertEqual(clamp(5, 0, 10), 5)

            def test_below(self):
                self.assertEqual(clamp(-3, 0, 10), 0)

            def test_above(self):
                self.assertEqual(clamp(42, 0, 10), 10)
        """,
        "`clamp(5, 0, 10)` returns 10; values inside the interval should be returned unchanged.",
    ),
    (
        "count-vowels",
        "text",
        """
        def count_vowels(text):
            \"\"\"Number of vowels (a, e, i, o, u, either case) in text.\"\"\"
            return sum(1 for ch in text if ch in "aeio")
        """,
        """
        import unittest
        from text import count_vowels

        class TestVowels(unittest.TestCase):
            def test_lower(self):
                self.assertEqual(count_vowels("uniagent"), 4)

            def test_upper(self):
                self.assertEqual(count_vowels("AEIOU"), 5)
        """,
        "`count_vowels` misses 'u' and upper-case vowels.",
    ),
]

TEST_COMMAND = "python3 -m unittest discover -s tests"
WORKFLOW = (
    "{problem}\n\nThe repository is your current working directory. Fix the bug in the "
    "source (not in the tests); run `python3 -m unittest discover -s tests` to check. "
    "When the tests pass, call submit."
)


def git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=uniagent", "-c", "user.email=uniagent@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
    )


def make(out: Path) -> Path:
    """Write the repositories and the task file; return the task file's path."""
    out = out.resolve()
    rows = []
    for task_id, module, source, tests, problem in TASKS:
        repo = out / "repos" / task_id
        (repo / "tests").mkdir(parents=True, exist_ok=True)
        (repo / f"{module}.py").write_text(textwrap.dedent(source).lstrip())
        (repo / "tests" / "__init__.py").write_text("")
        (repo / "tests" / f"test_{module}.py").write_text(textwrap.dedent(tests).lstrip())
        if not (repo / ".git").exists():
            git(repo, "init", "-q")
            git(repo, "add", ".")
            git(repo, "commit", "-q", "-m", "initial version")
        rows.append(
            {
                "instance_id": task_id,
                "problem_statement": WORKFLOW.format(problem=problem),
                "repo": str(repo),
                "test_command": TEST_COMMAND,
                "config_overrides": {
                    "env": {
                        "post_setup": [f"git clone -q {repo} ."],
                        # Visible inside a bubblewrap sandbox (without isolation it is anyway).
                        "deployment": {"ro_binds": [str(repo)]},
                    }
                },
            }
        )
    tasks = out / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for repos/ and tasks.jsonl")
    args = parser.parse_args()
    print(make(args.out))


if __name__ == "__main__":
    main()
