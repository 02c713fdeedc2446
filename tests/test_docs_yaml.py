"""Every YAML block of the README, docs/ and the plugin READMEs is a config that works;
every sample ``task.toml`` of docs/ is one the Harbor loader reads.

Each ```yaml block is validated against the installed plugins the way ``uniagent run``
does (``AgentConfig`` then ``resolve``: every key, plugin name and plugin setting), or,
for verl's agent-loop lists, as agent-loop entries (their inline keys are agent-config
keys). A block that is not meant to validate says so on the line before its fence::

    <!-- yaml-check: skip (why) -->
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from uniagent import AgentConfig, resolve

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        *sorted((ROOT / "plugins").glob("*/README.md"))]  # fmt: skip
BLOCK = re.compile(
    r"(?:<!--\s*yaml-check:\s*skip\s*(?P<why>\([^)]*\))?\s*-->\s*\n)?```ya?ml\n(?P<body>.*?)```",
    re.S,
)
AGENT_LOOP = "uniagent.verl.agent_loop.UniAgentLoop"
#: Keys of a verl agent-loop entry that are not agent-config keys.
LOOP_KEYS = {"name", "_target_", "agent_config", "trajectory_dir", "trajectory_rate",
             "branches", "shared_weight", "max_branches", "tree_advantage"}  # fmt: skip


def blocks() -> list[Any]:
    found = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for match in BLOCK.finditer(text):
            line = text.count("\n", 0, match.start("body"))
            where = f"{path.relative_to(ROOT)}:{line}"
            found.append(pytest.param(where, match.group("body"), match.group("why"), id=where))
    return found


def test_the_docs_have_yaml_blocks():
    assert len(blocks()) >= 10


@pytest.mark.parametrize(("where", "body", "skip"), blocks())
@pytest.mark.filterwarnings("error::FutureWarning", "error::DeprecationWarning:uniagent")
def test_yaml_block_validates_against_the_installed_plugins(where, body, skip):
    """Every config block in the docs resolves, and uses no deprecated key."""
    if skip is not None:
        assert skip.strip("() "), f"{where}: a skipped block says why"
        pytest.skip(f"{where}: {skip}")
    data = yaml.safe_load(body)
    if isinstance(data, list):  # verl's agent-loop YAML
        for entry in data:
            assert entry["_target_"] == AGENT_LOOP, where
            inline = {k: v for k, v in entry.items() if k not in LOOP_KEYS}
            resolve(AgentConfig.from_dict(inline, source=where), source=where)
        return
    assert isinstance(data, dict), f"{where}: a config block is a mapping"
    resolve(AgentConfig.from_dict(data, source=where), source=where)


TASK_TOML = re.compile(r"```toml\n(?P<body>schema_version = .*?)```", re.S)


def test_the_docs_sample_task_toml_is_read_with_every_key_it_shows(tmp_path: Path) -> None:
    """docs/tasks.md's sample ``task.toml`` loads as written and with its commented keys on."""
    from uniagent.harbor.schema import load_task_toml

    text = (ROOT / "docs" / "tasks.md").read_text(encoding="utf-8")
    samples = [m.group("body") for m in TASK_TOML.finditer(text)]
    assert samples, "docs/tasks.md shows a sample task.toml"
    for body in samples:
        enabled = re.sub(r"(?m)^# (\w+ = )", r"\1", body)
        assert enabled != body, "the sample shows optional keys commented out"
        for n, variant in enumerate((body, enabled)):
            path = tmp_path / f"task{n}.toml"
            path.write_text(variant, encoding="utf-8")
            config = load_task_toml(path)
            assert config.verifier.timeout_sec == 120 and config.environment.workdir == "/app"
        assert config.environment.docker_image and config.verifier.user == "tester"


def test_the_readme_links_every_doc_and_lays_out_every_plugin() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md"))
                if f"](docs/{p.name})" not in readme]  # fmt: skip
    assert not unlinked, f"README.md links no docs/{unlinked}"
    plugins = [p.name for p in sorted((ROOT / "plugins").iterdir())
               if (p / "pyproject.toml").exists()]  # fmt: skip
    missing = [name for name in plugins if f"plugins/{name}/" not in readme]
    assert not missing, f"README.md's layout omits {missing}"
