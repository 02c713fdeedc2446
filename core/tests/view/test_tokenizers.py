"""Which tokenizers the token view loads, and how many it keeps."""

from __future__ import annotations

import json
from pathlib import Path

from uniagent.view.tokens import Tokenizers


def test_code_shipped_with_a_tokenizer_is_never_run(tmp_path: Path):
    """A run folder's rollout can name any folder; one that asks for its own tokenizer
    class (``auto_map``) is refused, its code not imported, and nothing asks the user."""
    folder = tmp_path / "tokenizer"
    folder.mkdir()
    marker = tmp_path / "ran"
    (folder / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "from transformers import PreTrainedTokenizer\n"
        "class EvilTokenizer(PreTrainedTokenizer):\n    pass\n"
    )
    config = {
        "tokenizer_class": "EvilTokenizer",
        "auto_map": {"AutoTokenizer": ["evil.EvilTokenizer", None]},
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", **config}))
    decoder, reason = Tokenizers().get(str(folder))
    assert decoder is None and "contains custom code" in reason
    assert not marker.exists(), "the folder's code ran"


def test_only_the_last_few_tokenizers_are_kept(tmp_path: Path):
    tokenizers = Tokenizers(kept=2)
    for name in ("a", "b", "c"):
        decoder, reason = tokenizers.get(str(tmp_path / name))  # none of them loads
        assert decoder is None and name in reason
    assert tokenizers.cached() == [str(tmp_path / "b"), str(tmp_path / "c")]
    tokenizers.get(str(tmp_path / "b"))  # used again: kept longest
    tokenizers.get(str(tmp_path / "d"))
    assert tokenizers.cached() == [str(tmp_path / "b"), str(tmp_path / "d")]


def test_the_tokenizer_given_on_the_command_line_is_used_for_every_rollout(tmp_path: Path):
    tokenizers = Tokenizers(str(tmp_path / "given"))
    _, reason = tokenizers.get("Qwen/Qwen3-8B")
    assert "given" in reason and tokenizers.cached() == [str(tmp_path / "given")]
