"""GGUF files as `model.path`: each converted once into a cached save_pretrained folder.

transformers reads a GGUF file (`from_pretrained(folder, gguf_file=name)`) and dequantizes its weights. rlx
trains in float32 and saves checkpoints with save_pretrained, so a file is converted once into
`<cache>/gguf/<sha256 of the file>/` (float32 safetensors, the tokenizer, generation_config.json) and every
later part (policy, reference, checkpoints, `final/`, vLLM, evaluation) sees an ordinary model folder. The key
is the file's content, so a renamed or copied file is not converted again and an edited one is.

A GGUF carries no generation config; the one written here stops at the tokenizer's end tokens: its eos,
llama.cpp's end-of-turn ids when the file names them, and `<|im_end|>` for a ChatML chat template.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

from gguf import GGUFReader

from rlx.config.paths import cache_dir
from rlx.errors import UserError

# general.architecture as llama.cpp writes it -> the name in transformers' table, where the two differ
# (transformers.modeling_gguf_pytorch_utils.load_gguf_checkpoint renames these the same way)
ARCHITECTURE_ALIASES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss",
                        "minimax-m2": "minimax_m2", "t5encoder": "t5"}
END_OF_TURN_KEYS = ("tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")

_converted: dict[tuple[str, int, int], Path] = {}  # (file, size, mtime) -> folder: hash a file once per process


def gguf_folder(path: str | Path) -> Path:
    """The save_pretrained folder of a .gguf file, converting it on the first call for its content."""
    source = Path(path).expanduser().resolve()
    if not source.is_file():
        raise UserError(f"model.path '{path}' is not a file; point it at a .gguf file")
    stat = source.stat()
    key = (str(source), stat.st_size, stat.st_mtime_ns)
    if key in _converted and _converted[key].is_dir():
        return _converted[key]
    digest = file_sha256(source)
    folder = cache_dir() / "gguf" / digest
    if not is_converted(folder):
        check_gguf(source)
        with _lock(folder):
            if not is_converted(folder):  # another process may have converted it while this one waited
                convert(source, folder, digest)
    _converted[key] = folder
    return folder


def is_converted(folder: Path) -> bool:
    return (folder / "config.json").is_file()  # written into a temporary folder that is renamed when complete


def progress(message: str) -> None:
    print(f"rlx: {message}", file=sys.stderr, flush=True)


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    progress(f"hashing {path} ({path.stat().st_size / 1e6:.0f} MB)")
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def supported_architectures() -> list[str]:
    """The GGUF architectures transformers loads: its legacy table and its newer per-architecture mappings."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    try:
        from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    except ImportError:  # transformers < 5.19 (the vLLM extras' range starts at 5.16.1): the legacy table only
        GGUF_ARCHS = {}
    return sorted((set(GGUF_SUPPORTED_ARCHITECTURES) | set(GGUF_ARCHS)) - {"general", "tokenizer"})


def check_gguf(path: Path) -> str:
    """One line naming the fix for a file transformers cannot turn into a model and tokenizer; else its architecture."""
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # a bad magic, a header cut short, a tensor past the end: numpy and gguf raise many kinds
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path} is truncated or not a GGUF file ({first}); download or copy it again") from None
    size = path.stat().st_size
    end = max((t.data_offset + t.n_bytes for t in reader.tensors), default=reader.data_offset)
    if size < end:
        raise UserError(f"{path} is truncated ({size} bytes, its tensors end at byte {end}); download or copy it again")
    field = reader.get_field("general.architecture")
    architecture = str(field.contents()) if field is not None else None
    supported = supported_architectures()
    if architecture not in supported and ARCHITECTURE_ALIASES.get(architecture) not in supported:
        raise UserError(f"{path}: transformers cannot load GGUF architecture '{architecture}' "
                        f"(it loads {', '.join(supported)}); use the original model's Hugging Face folder or hub id")
    if reader.get_field("tokenizer.ggml.tokens") is None:
        raise UserError(f"{path} holds no tokenizer (no tokenizer.ggml.tokens); use a GGUF exported with its "
                        f"tokenizer (llama.cpp's convert_hf_to_gguf.py writes it) or the original model's folder")
    return architecture


def end_of_turn_ids(path: Path) -> list[int]:
    reader = GGUFReader(str(path))
    return [int(reader.get_field(k).contents()) for k in END_OF_TURN_KEYS if reader.get_field(k) is not None]


@contextlib.contextmanager
def _lock(folder: Path):
    """One converting process per file: the ranks of a multi-process launch wait for the first one."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def load_gguf(path: Path):
    """(model in float32, tokenizer) read from the file by transformers, dequantized, with no quantization marker
    left (save_pretrained refuses a model that still says it is quantized with gguf)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = {}
    if hasattr(transformers, "GgufConfig"):  # transformers >= 5.19: unpack every weight (no GgufLinear kept packed)
        options["quantization_config"] = transformers.GgufConfig(dequantize=True)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32, **options)
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:  # dequantize=True removes it; a transformers that keeps it is told to
        quantizer.remove_quantization_config(model)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model, tokenizer


def generation_config(model, tokenizer, extra_end_ids: list[int]):
    """The model's generation config, stopping at every end token the tokenizer and the file name."""
    config = model.generation_config
    config.bos_token_id = model.config.bos_token_id = tokenizer.bos_token_id  # LlamaConfig's default 1 otherwise
    ends = [tokenizer.eos_token_id, *extra_end_ids]
    if "<|im_end|>" in (tokenizer.chat_template or "") and "<|im_end|>" in tokenizer.get_vocab():
        ends.append(tokenizer.convert_tokens_to_ids("<|im_end|>"))
    ends = list(dict.fromkeys(i for i in ends if i is not None))
    config.eos_token_id = ends[0] if len(ends) == 1 else ends
    if tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


def convert(source: Path, folder: Path, digest: str) -> None:
    """Load, dequantize and save into a temporary folder, renamed to `folder` once complete."""
    partial = folder.parent / f".{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    progress(f"converting {source.name}: loading and dequantizing to float32 (once per file)")
    try:
        model, tokenizer = load_gguf(source)
        model.generation_config = generation_config(model, tokenizer, end_of_turn_ids(source))
        progress(f"saving the converted model to {folder}")
        model.save_pretrained(partial)  # config.json, model.safetensors, generation_config.json
        tokenizer.save_pretrained(partial)
        (partial / "source.json").write_text(json.dumps({"gguf": str(source), "sha256": digest}, indent=2) + "\n")
        os.replace(partial, folder)
    except (ValueError, KeyError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"cannot convert {source} ({type(exc).__name__}: {first}); use the original model's "
                        f"Hugging Face folder or hub id") from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
