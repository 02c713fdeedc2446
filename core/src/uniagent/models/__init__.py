"""Chat-model backends: a verl token server, OpenAI-compatible chat APIs, local HF models.

Every backend implements :class:`ChatModel`: it builds the episode's rollout
cache and appends each model turn to it itself, so the interaction loop never
touches token ids. :func:`from_spec` builds one from a ``--model`` string,
:func:`check_spec` checks one before anything starts.
"""

from __future__ import annotations

from uniagent.models.base import (
    ChatModel,
    ContextLimitError,
    FinishReason,
    Generation,
    ModelError,
    ModelTurn,
    TokenChatModel,
    Usage,
)
from uniagent.models.hf import HFLocalModel, smollm2_gguf_path
from uniagent.models.openai_chat import OpenAIChatModel
from uniagent.models.served import ServedTokenModel
from uniagent.models.spec import SPEC_FORMS, check_spec, from_spec
from uniagent.models.verl_server import VerlServerModel

__all__ = [
    "SPEC_FORMS",
    "ChatModel",
    "ContextLimitError",
    "FinishReason",
    "Generation",
    "HFLocalModel",
    "ModelError",
    "ModelTurn",
    "OpenAIChatModel",
    "ServedTokenModel",
    "TokenChatModel",
    "Usage",
    "VerlServerModel",
    "check_spec",
    "from_spec",
    "smollm2_gguf_path",
]
