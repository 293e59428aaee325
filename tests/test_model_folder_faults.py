"""Broken local model folders: one line naming the file, no "download it" advice (issue 17)."""

import shutil

import pytest

from rlx.config.paths import ASSETS_DIR
from rlx.errors import UserError
from rlx.models.loading import load_causal_lm, load_tokenizer


@pytest.fixture
def folder(tmp_path):
    target = tmp_path / "model"
    shutil.copytree(ASSETS_DIR / "tiny", target)
    return target


def _damage(folder, how):
    if how == "no_tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json"):
            (folder / name).unlink(missing_ok=True)
        return "no tokenizer", load_tokenizer
    if how == "truncated_weights":
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        return "model.safetensors is truncated or corrupt", load_causal_lm
    if how == "garbage_weights":
        (folder / "model.safetensors").write_bytes(b"\x00" * 64)
        return "model.safetensors is truncated or corrupt", load_causal_lm
    if how == "broken_config":
        (folder / "config.json").write_text('{"model_type": "llama", ')
        return "config.json is broken", load_causal_lm
    if how == "no_weights":
        (folder / "model.safetensors").unlink()
        return "holds no weights", load_causal_lm
    raise AssertionError(how)


@pytest.mark.parametrize("how", ["no_tokenizer", "truncated_weights", "garbage_weights", "broken_config", "no_weights"])
def test_a_broken_local_model_folder_is_one_line_naming_the_file(folder, how):
    needle, loader = _damage(folder, how)
    with pytest.raises(UserError) as info:
        loader(str(folder))
    message = str(info.value)
    assert needle in message and str(folder) in message and "\n" not in message
    assert "download" not in message


def test_an_intact_copy_loads(folder):
    assert load_tokenizer(str(folder)) is not None and load_causal_lm(str(folder)) is not None
