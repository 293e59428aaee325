"""Load policies and tokenizers by hub id, local path or built-in name, through the Auto classes."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlx.config.paths import ASSETS_DIR
from rlx.errors import UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def resolve_model_path(path: str) -> str:
    """builtin:<name> -> the shipped asset; package:<name>, a .gguf file, or a folder holding one .gguf and no
    config.json -> its converted save_pretrained folder (rlx/models/gguf.py, converted once and cached);
    a local directory or a hub id is returned as is."""
    gguf = gguf_source(path)
    if gguf is not None:
        from rlx.models.gguf import gguf_folder

        return str(gguf_folder(gguf))
    if path.startswith("builtin:"):
        name = path.split(":", 1)[1]
        local = ASSETS_DIR / name
        if not local.is_dir():
            valid = sorted(p.name for p in ASSETS_DIR.iterdir() if p.is_dir())
            raise UserError(f"no built-in model '{name}'; valid choices: {', '.join('builtin:' + v for v in valid)}")
        return str(local)
    looks_local = path.startswith((".", "/", "~")) or os.sep in path and Path(path).expanduser().exists()
    if looks_local and not Path(path).expanduser().is_dir():
        raise UserError(f"model.path '{path}' is not a directory; point it at a save_pretrained folder or use a hub id")
    return str(Path(path).expanduser()) if looks_local else path


def gguf_source(path: str) -> Path | None:
    """The GGUF file model.path names, or None: package:<name> (rlx/models/packaged.py), a path ending in .gguf,
    or a local folder holding exactly one *.gguf and no config.json."""
    if path.startswith("package:"):
        from rlx.models.packaged import packaged_gguf

        return packaged_gguf(path.split(":", 1)[1])
    local = Path(path).expanduser()
    if path.lower().endswith(".gguf"):
        return local
    if local.is_dir() and not (local / "config.json").is_file():
        files = sorted(local.glob("*.gguf"))
        if len(files) == 1:
            return files[0]
    return None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def check_local_model(folder: str, need: str) -> None:
    """A local model folder: one line naming the file that is missing, truncated or corrupt.
    need: "tokenizer" or "weights"."""
    import json

    root = Path(folder)
    config = root / "config.json"
    if need == "weights" or config.is_file():
        if not config.is_file() and not (root / "adapter_config.json").is_file():
            raise UserError(f"{config} is missing: {folder} is not a save_pretrained model folder")
        if config.is_file():
            try:
                json.loads(config.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise UserError(f"{config} is broken ({exc}); re-save the model or repair the file") from None
    if need == "tokenizer" and not any((root / name).is_file() for name in TOKENIZER_FILES):
        raise UserError(f"{folder} has no tokenizer ({', '.join(TOKENIZER_FILES)}); save the tokenizer into the folder "
                        f"(tokenizer.save_pretrained)")
    if need == "weights":
        shards = sorted(root.glob("*.safetensors"))
        if not shards and not list(root.glob("*.bin")):
            raise UserError(f"{folder} holds no weights (*.safetensors or *.bin)")
        from safetensors import safe_open

        for shard in shards:
            try:
                with safe_open(str(shard), framework="pt") as handle:
                    keys = list(handle.keys())
                    if keys:
                        handle.get_slice(keys[-1])  # the header's last tensor must lie inside the file
                size = shard.stat().st_size
                with shard.open("rb") as raw:
                    header = int.from_bytes(raw.read(8), "little")
                    import json as _json

                    meta = _json.loads(raw.read(header))
                end = max((v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__"), default=0)
                if 8 + header + end > size:
                    raise ValueError(f"{size} bytes, the header needs {8 + header + end}")
            except Exception as exc:
                raise UserError(f"{shard} is truncated or corrupt "
                                f"({str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); re-save or re-copy "
                                "the model") from None


def _is_local(path: str, resolved: str) -> bool:
    return Path(resolved).is_dir()


def _local_failure(path: str, exc: Exception) -> UserError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return UserError(f"cannot load the local model folder {path}: {first}")


def _offline_hint(path: str, exc: Exception) -> UserError:
    return UserError(
        f"cannot load '{path}' ({type(exc).__name__}): download it first (huggingface-cli download {path}) "
        f"and set model.path=/local/dir, or unset HF_HUB_OFFLINE if this machine has network access"
    )


def load_tokenizer(path: str, revision: str | None = None, trust_remote_code: bool = False):
    resolved = resolve_model_path(path)
    local = _is_local(path, resolved)
    if local:
        check_local_model(resolved, "tokenizer")
    try:
        tok = AutoTokenizer.from_pretrained(resolved, revision=revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise (_local_failure(path, exc) if local else _offline_hint(path, exc)) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_causal_lm(path: str, dtype: str = "float32", revision: str | None = None, trust_remote_code: bool = False):
    resolved = resolve_model_path(path)
    if dtype not in DTYPES:
        raise UserError(f"unknown model.dtype '{dtype}'; valid choices: {', '.join(DTYPES)}")
    local = _is_local(path, resolved)
    if local:
        check_local_model(resolved, "weights")
    try:
        return AutoModelForCausalLM.from_pretrained(
            resolved, dtype=DTYPES[dtype], revision=revision, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as exc:
        raise (_local_failure(path, exc) if local else _offline_hint(path, exc)) from None


def is_run_model(folder: Path) -> bool:
    """A model folder of an rlx run: save_pretrained (config.json), a LoRA adapter (adapter_config.json),
    or a resumable checkpoint (checkpoints/step_N: model.safetensors or adapter/ beside trainer_state.json)."""
    return ((folder / "config.json").is_file() or (folder / "adapter_config.json").is_file()
            or (folder / "trainer_state.json").is_file() and ((folder / "model.safetensors").is_file()
                                                               or (folder / "adapter"
                                                                   / "adapter_config.json").is_file()))


def _run_dir_of(folder: Path) -> Path | None:
    for candidate in (folder.parent, folder.parent.parent):  # <run>/final, <run>/checkpoints/step_N
        if (candidate / "config.yaml").is_file():
            return candidate
    return None


def load_run_model(folder: str | Path, dtype: str = "float32", trust_remote_code: bool = False):
    """(model, tokenizer) of a folder that `is_run_model`: the full model of final/, or the run's base model
    (its config.yaml model.path, or final/'s architecture) with a LoRA adapter merged in, or with a
    checkpoint's weights loaded. LoRA adapters record the base by its config name (builtin:tiny, a hub
    id), so a run folder can move."""
    from omegaconf import OmegaConf

    folder = Path(folder).expanduser()
    if (folder / "config.json").is_file():
        return (load_causal_lm(str(folder), dtype, None, trust_remote_code),
                load_tokenizer(str(folder), None, trust_remote_code))
    run_dir = _run_dir_of(folder)
    base = OmegaConf.load(run_dir / "config.yaml").model.get("path") if run_dir is not None else None
    adapter = folder if (folder / "adapter_config.json").is_file() else folder / "adapter"
    if (run_dir is not None and (run_dir / "final" / "config.json").is_file()
        and not (adapter / "adapter_config.json").is_file()):
        base = str(run_dir / "final")  # a model built from scratch: final/ gives the architecture
    if base is None and (adapter / "adapter_config.json").is_file():
        import json

        base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if base is None:
        raise UserError(f"cannot tell the base model of {folder}: its run's config.yaml is missing or has model.path "
                        "null and no final/ model to take the architecture from")
    model = load_causal_lm(str(base), dtype, None, trust_remote_code)
    if (adapter / "adapter_config.json").is_file():
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    else:
        from safetensors.torch import load_file

        missing, unexpected = model.load_state_dict(load_file(folder / "model.safetensors"), strict=False)
        tied = {name for name in missing if "lm_head" in name and getattr(model.config, "tie_word_embeddings", False)}
        if unexpected or set(missing) - tied:
            raise UserError(f"checkpoint {folder} does not fit the base model {base}: "
                            f"{len(unexpected)} unexpected and {len(set(missing) - tied)} missing weights")
        if tied:
            model.tie_weights()
    tokenizer_dir = next((str(d) for d in (folder, run_dir / "final" if run_dir else None)
                          if d is not None and (d / "tokenizer_config.json").is_file()), str(base))
    return model, load_tokenizer(tokenizer_dir, None, trust_remote_code)
