"""A tamper report: one change of something the grader protects."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Tamper:
    """A change of something the grader protects."""

    kind: str  # protected_file | toolchain | content | tree
    path: str
    change: str  # modified | added | deleted | hit
    rule: str
    scores: bool = True
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        out: dict[str, Any] = {
            "kind": self.kind,
            "path": self.path,
            "change": self.change,
            "rule": self.rule,
        }
        if self.detail:
            out["detail"] = self.detail
        if not self.scores:
            out["scores"] = False
        return out
