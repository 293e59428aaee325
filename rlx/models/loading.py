"""Load policies and tokenizers by hub id, local path or built-in name, through the Auto classes."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlx.config import ASSETS_DIR, UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def resolve_model_path(path: str) -> str:
    """builtin:<name> -> the shipped asset; a local directory or a hub id is returned as is."""
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


def _offline_hint(path: str, exc: Exception) -> UserError:
    return UserError(
        f"cannot load '{path}' ({type(exc).__name__}): download it first (huggingface-cli download {path}) "
        f"and set model.path=/local/dir, or unset HF_HUB_OFFLINE if this machine has network access"
    )


def load_tokenizer(path: str, revision: str | None = None, trust_remote_code: bool = False):
    resolved = resolve_model_path(path)
    try:
        tok = AutoTokenizer.from_pretrained(resolved, revision=revision, trust_remote_code=trust_remote_code)
    except OSError as exc:
        raise _offline_hint(path, exc) from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_causal_lm(path: str, dtype: str = "float32", revision: str | None = None, trust_remote_code: bool = False):
    resolved = resolve_model_path(path)
    if dtype not in DTYPES:
        raise UserError(f"unknown model.dtype '{dtype}'; valid choices: {', '.join(DTYPES)}")
    try:
        return AutoModelForCausalLM.from_pretrained(
            resolved, dtype=DTYPES[dtype], revision=revision, trust_remote_code=trust_remote_code
        )
    except OSError as exc:
        raise _offline_hint(path, exc) from None
