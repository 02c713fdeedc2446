"""The agent config: validation with key paths, plugin names, per-task overrides."""

from __future__ import annotations

import sys
import warnings

import pytest

from uniagent.config import AgentConfig, deep_merge
from uniagent.errors import ConfigError, UnknownPluginNameError
from uniagent.exit import ExitReason
from uniagent.plugins import reset_plugins
from uniagent.resolver import resolve

MINIMAL = {"tools": [], "tool_parser": "hermes"}


def test_defaults_validate_against_the_builtins():
    config = AgentConfig.from_dict(MINIMAL)
    assert config.env.deployment == {"type": "host"}
    assert config.interaction.max_turns == 30
    assert config.treatment(ExitReason.ENV_ERROR) == "mask"
    assert config.treatment(ExitReason.FINISHED) == "train"


def test_unknown_keys_are_rejected_with_their_path():
    with pytest.raises(ConfigError) as err:
        AgentConfig.from_dict({**MINIMAL, "interaction": {"max_turn": 3}, "rewrad": {}})
    message = str(err.value)
    assert "interaction.max_turn: unknown key" in message
    assert "rewrad: unknown key" in message


def test_bad_values_name_their_path():
    with pytest.raises(ConfigError, match=r"interaction\.max_turns: Input should be greater"):
        AgentConfig.from_dict({**MINIMAL, "interaction": {"max_turns": 0}})
    with pytest.raises(ConfigError, match=r"exit_policy\.finished"):
        AgentConfig.from_dict({**MINIMAL, "exit_policy": {"finished": "ignore"}})


@pytest.fixture
def core_only(monkeypatch):
    """Only the built-ins, whatever else this environment has installed."""
    monkeypatch.setenv("UNIAGENT_LOAD_PLUGINS", "")
    reset_plugins()
    yield
    reset_plugins()


@pytest.mark.usefixtures("core_only")
def test_unknown_plugin_names_list_what_is_installed():
    with pytest.raises(UnknownPluginNameError, match="tool_parser: .*installed tool parsers"):
        resolve(AgentConfig.from_dict({"tools": [], "tool_parser": "json_mode"}))
    with pytest.raises(UnknownPluginNameError, match=r"tools\.0\.name: .*uniagent-tools-swe"):
        resolve(AgentConfig.from_dict({**MINIMAL, "tools": ["str_replace_editor"]}))
    with pytest.raises(UnknownPluginNameError, match=r"reward\.name: .*Did you mean 'command'"):
        resolve(AgentConfig.from_dict({**MINIMAL, "reward": {"name": "comand"}}))


@pytest.mark.usefixtures("core_only")
def test_the_defaults_are_valid_with_the_core_alone():
    agent = resolve(AgentConfig())
    assert agent.tools == () and agent.parser.name == "hermes"
    assert agent.deployment.name == "host"


@pytest.mark.usefixtures("core_only")
def test_deployment_is_checked_against_installed_backends():
    with pytest.raises(
        ConfigError,
        match=r"env\.deployment: .*installed deployments: host, local, remote\. "
        r"'modal' comes with uniagent-deploy-modal, ",
    ):
        resolve(AgentConfig.from_dict({**MINIMAL, "env": {"deployment": {"type": "modal"}}}))
    with pytest.raises(ConfigError, match=r"env\.deployment: .*nope: unknown key"):
        resolve(
            AgentConfig.from_dict({**MINIMAL, "env": {"deployment": {"type": "host", "nope": 1}}})
        )


@pytest.mark.usefixtures("core_only")
@pytest.mark.parametrize(
    ("config", "path"),
    [
        ({"env": {"post_setpu": ["x"]}}, "env.post_setpu: unknown key"),
        (
            {"reward": {"name": "command", "settings": {"comand": "x"}}},
            "reward.settings.comand: unknown key",
        ),
        (
            {"reward": {"name": "command", "integrity": {"on_tamperr": "zero"}}},
            "reward.integrity.on_tamperr: unknown key",
        ),
        ({"interaction": {"max_turnz": 1}}, "interaction.max_turnz: unknown key"),
        ({"tools": [{"name": "x", "setings": {}}]}, "tools.0.setings: unknown key"),
        ({"exit_policy": {"finishd": "train"}}, "exit_policy.finishd"),
        ({"env": {"deployment": {"type": "host", "isolaton": "none"}}}, "isolaton: unknown key"),
    ],
)
def test_a_typo_in_any_section_names_its_key_path(config, path):
    with pytest.raises(ConfigError) as err:
        resolve(AgentConfig.from_dict({**MINIMAL, **config}, source="agent.yaml"))
    assert path in str(err.value) and "agent.yaml" in str(err.value)


def test_task_overrides_deep_merge_and_revalidate():
    config = AgentConfig.from_dict(
        {
            **MINIMAL,
            "interaction": {"max_turns": 5, "action_timeout": 9},
            "env": {"deployment": {"type": "host"}, "post_setup": ["echo a"]},
        }
    )
    merged = config.with_overrides(
        {"interaction": {"max_turns": 7}, "env": {"post_setup": ["echo b"]}}
    )
    assert merged.interaction.max_turns == 7
    assert merged.interaction.action_timeout == 9, "siblings of an overridden key survive"
    assert merged.env.post_setup == ["echo b"]
    assert config.interaction.max_turns == 5, "the original is unchanged"
    with pytest.raises(ConfigError, match=r"(?s)task 7:.*interaction\.max_turnz: unknown key"):
        config.with_overrides({"interaction": {"max_turnz": 1}}, source="task 7")


@pytest.mark.parametrize("base_key", ["settings", "config"])
@pytest.mark.parametrize("row_key", ["settings", "config"])
def test_a_renamed_key_is_one_key_whichever_spelling_each_side_uses(base_key, row_key):
    """reward.config (now settings) and env.startup_timeout (now start_timeout): a row's
    override merges into the config's key under either spelling; an old spelling warns."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        config = AgentConfig.from_dict({
            "reward": {"name": "command", base_key: {"command": "a", "timeout": 5}},
            "env": {"startup_timeout" if base_key == "config" else "start_timeout": 7},
        })  # fmt: skip
    env_key = "startup_timeout" if row_key == "config" else "start_timeout"
    override = {"reward": {row_key: {"command": "b"}}, "env": {env_key: 9}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        merged = config.with_overrides(override, source="task 1")
    assert merged.reward is not None
    assert merged.reward.settings == {"command": "b", "timeout": 5}, "merged, not replaced"
    assert merged.env.start_timeout == 9
    said = sorted(str(w.message).partition(" ")[0] for w in caught)
    assert said == (["env.startup_timeout", "reward.config"] if row_key == "config" else [])
    assert override == {"reward": {row_key: {"command": "b"}}, "env": {env_key: 9}}


def test_both_spellings_in_one_override_are_refused_naming_the_task():
    config = AgentConfig.from_dict({"reward": {"name": "command", "settings": {"command": "a"}}})
    both = {"reward": {"config": {"command": "b"}, "settings": {"command": "c"}}}
    with pytest.raises(ConfigError, match=r"(?s)task 3:.*reward: give `settings` .*not both"):
        config.with_overrides(both, source="task 3")


def test_yaml_errors_are_clear(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="does not exist"):
        AgentConfig.from_yaml(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("tools: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        AgentConfig.from_yaml(bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        AgentConfig.from_yaml(listing)


def test_deep_merge_replaces_lists_and_scalars():
    assert deep_merge({"a": {"b": 1, "c": [1]}, "d": 1}, {"a": {"c": [2]}, "d": {"e": 1}}) == {
        "a": {"b": 1, "c": [2]},
        "d": {"e": 1},
    }


@pytest.mark.parametrize(
    ("sampling", "message"),
    [
        ({"max_token": 20}, "sampling.max_token: unknown key (did you mean max_tokens?"),
        ({"temprature": 0.7}, "sampling.temprature: unknown key (did you mean temperature?"),
        ({"temperature": "hot"}, "sampling.temperature: Input should be a valid number"),
        ({"temperature": True}, "sampling.temperature: Input should be a valid number"),
        ({"temperature": -0.1}, "sampling.temperature: Input should be greater than or equal"),
        ({"top_p": 0}, "sampling.top_p: Input should be greater than 0"),
        ({"top_p": 1.5}, "sampling.top_p: Input should be less than or equal to 1"),
        ({"max_tokens": 0}, "sampling.max_tokens: Input should be greater than or equal to 1"),
        ({"max_tokens": 20.5}, "sampling.max_tokens: Input should be a valid integer"),
        ({"seed": "7"}, "sampling.seed: Input should be a valid integer"),
        ({"stop": 3}, "sampling.stop"),
        ({"extra_body": [1]}, "sampling.extra_body: Input should be a valid dictionary"),
    ],
)
def test_sampling_is_checked_like_every_section(sampling, message):
    with pytest.raises(ConfigError) as err:
        AgentConfig.from_dict({**MINIMAL, "sampling": sampling}, source="agent.yaml")
    assert message in str(err.value) and "agent.yaml" in str(err.value)


def test_sampling_reads_as_the_parameters_that_are_set():
    written = {"temperature": 0.0, "max_tokens": 160, "extra_body": {"min_tokens": 2}}
    config = AgentConfig.from_dict({**MINIMAL, "sampling": written})
    # What the backends receive (dict(config.sampling)) and what a manifest records: as written.
    assert dict(config.sampling) == config.sampling.params() == written
    assert config.model_dump()["sampling"] == written
    assert config.sampling["max_tokens"] == 160 and "top_p" not in config.sampling
    assert dict(AgentConfig().sampling) == {} and not AgentConfig().sampling
    merged = config.with_overrides({"sampling": {"temperature": 0.5}})
    assert dict(merged.sampling) == {**written, "temperature": 0.5}
    with pytest.raises(ConfigError, match=r"(?s)task 3:.*sampling\.max_token: unknown key"):
        config.with_overrides({"sampling": {"max_token": 1}}, source="task 3")


def test_a_backend_whose_extra_is_missing_is_refused_at_resolve(monkeypatch):
    config = AgentConfig.from_dict(
        {**MINIMAL, "env": {"deployment": {"type": "local", "image": "x"}}}
    )
    assert resolve(config).deployment.name == "local"  # the core suite has the [swerex] extra
    monkeypatch.setitem(sys.modules, "swerex", None)  # as an install without it
    with pytest.raises(
        ConfigError,
        match=r"env\.deployment\.type: the 'local' backend needs "
        r"uniagent\[swerex\].*pip install 'uniagent\[swerex\]'",
    ):
        resolve(config)
    resolve(AgentConfig.from_dict(MINIMAL))  # host needs nothing more
