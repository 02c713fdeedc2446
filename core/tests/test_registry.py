"""Registry look-ups: conflicts, overrides, unknown names, the deployment-config union."""

from __future__ import annotations

import types
from typing import Literal

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from uniagent import DeploymentSpec, RewardSpec, ToolSpec, hookimpl
from uniagent.errors import ConfigError, PluginConflictError, UnknownPluginNameError
from uniagent.plugins import PluginManager
from uniagent.registry import PluginOverrideWarning, Registry


class NoArgs(BaseModel):
    pass


def tools_plugin(*names):
    @hookimpl
    def uniagent_tools():
        return [ToolSpec(name=n, description="d", arguments=NoArgs) for n in names]

    return types.SimpleNamespace(uniagent_tools=uniagent_tools)


class AlphaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["alpha"] = "alpha"
    size: int = 1


class BetaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["beta"] = "beta"
    image: str


def deployments_plugin(*configs):
    @hookimpl
    def uniagent_deployments():
        return [
            DeploymentSpec(name=c.model_fields["type"].default, config=c, factory=lambda cfg: cfg)
            for c in configs
        ]

    return types.SimpleNamespace(uniagent_deployments=uniagent_deployments)


def test_two_external_plugins_with_one_name_conflict_naming_both():
    manager = PluginManager()
    manager.register(tools_plugin("grep"), "uniagent-tools-one")
    manager.register(tools_plugin("grep"), "uniagent-tools-two")
    with pytest.raises(PluginConflictError) as err:
        Registry(manager).tools()
    assert "uniagent-tools-one" in str(err.value) and "uniagent-tools-two" in str(err.value)


def test_external_plugin_overrides_builtin_with_a_warning():
    manager = PluginManager()
    manager.register(tools_plugin("grep"), "uniagent", builtin=True, module="uniagent.builtin.x")
    manager.register(tools_plugin("grep"), "uniagent-tools-better")
    with pytest.warns(PluginOverrideWarning, match="uniagent-tools-better"):
        tools = Registry(manager).tools()
    assert tools["grep"].distribution == "uniagent-tools-better"


def test_external_override_wins_whatever_the_registration_order():
    manager = PluginManager()
    manager.register(tools_plugin("grep"), "uniagent-tools-better")
    manager.register(tools_plugin("grep"), "uniagent", builtin=True, module="uniagent.builtin.x")
    with pytest.warns(PluginOverrideWarning):
        assert Registry(manager).tools()["grep"].distribution == "uniagent-tools-better"


def test_unknown_name_lists_installed_and_suggests_a_close_one():
    manager = PluginManager()
    manager.register(tools_plugin("grep", "ls"), "uniagent-tools-one")
    with pytest.raises(UnknownPluginNameError) as err:
        Registry(manager).tools()["grpe"]
    message = str(err.value)
    assert "grep, ls" in message
    assert "Did you mean 'grep'?" in message
    assert "uniagent-tools" not in message and "First-party plugins" in message


@pytest.mark.parametrize(
    ("kind", "name", "distribution"),
    [
        ("rewards", "swe_bench", "uniagent-reward-swebench"),
        ("deployments", "modal", "uniagent-deploy-modal"),
        ("tools", "str_replace_editor", "uniagent-tools-swe"),
        ("tools", "search", "uniagent-tools-search"),
        ("agents", "claude-code", "uniagent-agents-cli"),
    ],
)
def test_a_name_one_of_our_plugins_provides_names_the_distribution_to_install(
    tmp_path, kind, name, distribution
):
    manager = PluginManager(search_path=[str(tmp_path)])  # nothing installed there
    manager.load(entry_points=False)
    with pytest.raises(UnknownPluginNameError) as err:
        Registry(manager).get(kind)[name]
    message = str(err.value)
    assert f"{name!r} comes with {distribution}, which is not installed: " in message
    assert message.endswith(f"pip install {distribution}")
    assert "Did you mean" not in message, "no other backend/tool for ours"


def test_a_deployment_type_of_ours_names_its_distribution_too(tmp_path):
    manager = PluginManager(search_path=[str(tmp_path)])
    manager.load(entry_points=False)
    with pytest.raises(ConfigError) as err:
        Registry(manager).validate_deployment_config({"type": "modal"})
    assert "pip install uniagent-deploy-modal" in str(err.value)
    assert "did you mean 'local'" not in str(err.value).lower()


def test_a_provider_that_is_installed_but_not_loaded_says_why(tmp_path, monkeypatch):
    info = tmp_path / "uniagent_deploy_modal-9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: uniagent-deploy-modal\nVersion: 9.0\n"
    )
    (info / "entry_points.txt").write_text("[uniagent]\nuniagent-deploy-modal = nowhere_xyz\n")
    for env, why in [
        ({"UNIAGENT_LOAD_PLUGINS": "x"}, "is installed but not loaded: UNIAGENT_LOAD_PLUGINS"),
        ({"UNIAGENT_DISABLE_PLUGINS": "uniagent-deploy-modal"}, "is installed but blocked by"),
        ({}, "failed to load (ModuleNotFoundError: No module named 'nowhere_xyz')"),
    ]:
        for var in ("UNIAGENT_LOAD_PLUGINS", "UNIAGENT_DISABLE_PLUGINS"):
            monkeypatch.delenv(var, raising=False)
        for var, value in env.items():
            monkeypatch.setenv(var, value)
        manager = PluginManager(search_path=[str(tmp_path)]).load()
        with pytest.raises(UnknownPluginNameError) as err:
            Registry(manager).deployments()["modal"]
        assert f"'modal' comes with uniagent-deploy-modal, which {why}" in str(err.value)
        assert "pip install" not in str(err.value)


def test_unknown_name_without_known_provider_points_at_plugins_command():
    manager = PluginManager()
    with pytest.raises(UnknownPluginNameError, match="uniagent plugins"):
        Registry(manager).rewards()["my_reward"]


def test_a_plugin_yielding_the_wrong_record_type_fails_alone():
    @hookimpl
    def uniagent_rewards():
        return [ToolSpec(name="x", description="d", arguments=NoArgs)]

    @hookimpl
    def uniagent_tools():
        return [ToolSpec(name="kept", description="d", arguments=NoArgs)]

    manager = PluginManager()
    manager.register(
        types.SimpleNamespace(uniagent_rewards=uniagent_rewards, uniagent_tools=uniagent_tools),
        "confused",
    )
    manager.register(tools_plugin("grep"), "uniagent-tools-fine")
    info = manager.plugins["confused"]
    assert info.status == "failed"
    assert "uniagent_rewards must yield RewardSpec records, not ToolSpec" in info.error
    registry = Registry(manager)
    assert list(registry.tools()) == ["grep"]  # the failed plugin contributes nothing
    assert list(registry.rewards()) == []


def test_a_plugin_whose_hook_raises_or_yields_invalid_records_fails_alone():
    @hookimpl
    def uniagent_tools():
        yield ToolSpec(name="bad name!", description="d", arguments=NoArgs)

    manager = PluginManager()
    manager.register(types.SimpleNamespace(uniagent_tools=uniagent_tools), "invalid")
    manager.register(tools_plugin("grep"), "uniagent-tools-fine")
    assert manager.plugins["invalid"].status == "failed"
    assert "must be non-empty and use only letters" in manager.plugins["invalid"].error
    assert list(Registry(manager).tools()) == ["grep"]


def test_deployment_union_is_built_from_installed_backends():
    manager = PluginManager()
    manager.register(deployments_plugin(AlphaConfig, BetaConfig), "uniagent-deploy-ab")
    adapter = Registry(manager).deployment_config_adapter()
    assert adapter.validate_python({"type": "beta", "image": "x"}) == BetaConfig(image="x")
    assert adapter.validate_python({"type": "alpha"}) == AlphaConfig()
    with pytest.raises(ValidationError, match="image"):
        adapter.validate_python({"type": "beta"})


def test_single_backend_union_still_checks_the_type():
    manager = PluginManager()
    manager.register(deployments_plugin(AlphaConfig), "uniagent-deploy-a")
    adapter = Registry(manager).deployment_config_adapter()
    assert adapter.validate_python({"type": "alpha", "size": 3}).size == 3
    with pytest.raises(ValidationError, match="installed deployments: alpha"):
        adapter.validate_python({"type": "beta", "image": "x"})


def test_an_unknown_deployment_type_names_installed_types_and_where_to_look():
    manager = PluginManager()
    manager.register(deployments_plugin(AlphaConfig, BetaConfig), "uniagent-deploy-ab")
    registry = Registry(manager)
    with pytest.raises(ConfigError) as err:
        registry.validate_deployment_config({"type": "gke"})
    assert "alpha, beta" in str(err.value)
    assert "First-party plugins" in str(err.value)
    with pytest.raises(ValidationError, match="First-party plugins"):
        registry.deployment_config_adapter().validate_python({"type": "gke"})
    with pytest.raises(ValidationError, match="'modal' comes with uniagent-deploy-modal, which"):
        registry.deployment_config_adapter().validate_python({"type": "modal"})


def test_deployment_config_without_type_lists_types():
    manager = PluginManager()
    manager.register(deployments_plugin(AlphaConfig, BetaConfig), "uniagent-deploy-ab")
    with pytest.raises(ConfigError, match="no 'type'.*alpha, beta"):
        Registry(manager).validate_deployment_config({"image": "x"})


def test_deployment_spec_requires_a_matching_type_literal():
    with pytest.raises(ValueError, match="Literal\\['gamma'\\]"):
        DeploymentSpec(name="gamma", config=AlphaConfig, factory=lambda c: c)


def test_record_names_are_checked():
    with pytest.raises(ValueError, match="letters, digits"):
        RewardSpec(name="bad name", fn=lambda ctx: None)


def test_tool_spec_builds_openai_schema_and_command():
    class Args(BaseModel):
        command: str
        path: str
        view_range: list[int] | None = None
        flag: bool = False

    spec = ToolSpec(name="editor", description="Edit files.", arguments=Args)
    schema = spec.openai_schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "editor"
    assert schema["function"]["parameters"]["required"] == ["command", "path"]
    assert spec.to_command({"command": "view", "path": "/a b", "view_range": [1, 5]}) == (
        "editor --command view --path '/a b' --view_range '[1, 5]'"
    )
    assert spec.to_command({"command": "it's", "path": "/x", "flag": True}) == (
        "editor --command 'it'\"'\"'s' --path /x --flag true"
    )
