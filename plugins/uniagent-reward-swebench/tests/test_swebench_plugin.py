"""Discovery of the installed distribution and its reward configs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from uniagent_reward_swebench import (
    R2EGymRewardConfig,
    SweBenchRewardConfig,
    SweRebenchRewardConfig,
    r2e_gym_reward,
    swe_bench_reward,
    swe_rebench_reward,
)

from uniagent import UnknownPluginNameError, get_registry, load_plugins, reset_plugins

DIST = "uniagent-reward-swebench"


def test_plugin_is_discovered() -> None:
    rewards = get_registry().rewards()
    expected = {
        "swe_bench": (swe_bench_reward, SweBenchRewardConfig),
        "swe_rebench": (swe_rebench_reward, SweRebenchRewardConfig),
        "r2e_gym": (r2e_gym_reward, R2EGymRewardConfig),
    }
    for name, (fn, config) in expected.items():
        spec = rewards[name]
        assert spec.distribution == DIST
        assert not spec.builtin
        assert spec.fn is fn
        assert spec.settings is config
        assert spec.description
    info = next(i for i in load_plugins().report() if i.distribution == DIST)
    assert info.status == "loaded"
    assert info.version == "0.2.0"
    assert info.hooks == ["uniagent_rewards"]


def test_rewards_are_unknown_without_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNIAGENT_DISABLE_PLUGINS", DIST)
    reset_plugins()
    blocked = f"unknown reward .swe_bench.*comes with {DIST}, which is installed but blocked"
    with pytest.raises(UnknownPluginNameError, match=blocked):
        get_registry().rewards()["swe_bench"]


def test_reward_configs_reject_unknown_fields() -> None:
    with pytest.raises(ValidationError, match="eval_timout"):
        SweBenchRewardConfig.model_validate({"eval_timout": 10})
    with pytest.raises(ValidationError, match="exact_match"):
        SweBenchRewardConfig.model_validate({"exact_match": False})
    assert R2EGymRewardConfig.model_validate({"exact_match": False}).exact_match is False
    assert SweRebenchRewardConfig().workdir == "/testbed"


def test_discovery_does_not_import_the_swebench_harness() -> None:
    # swebench.harness takes about a second to import; rewards load it on first use.
    code = (
        "import sys; from uniagent import get_registry; get_registry().rewards()['swe_bench'];"
        "print('swebench' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
