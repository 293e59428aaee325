"""Value model for PPO: a scalar head on a transformer backbone, one value per completion token.

By default the backbone is a copy of the policy's own (same weights at the start, trained separately);
`algorithm.value_model=PATH` loads a separate model's backbone instead (hub id or local folder).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from rlx.models.forward import pack_rows


class ValueModel(nn.Module):
    """V(prompt, completion_<t): the value of the state before completion token t."""

    def __init__(self, backbone: nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.head.weight)  # start from V = 0 everywhere: no prior on the returns
        nn.init.zeros_(self.head.bias)

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask, pack: bool = False) -> torch.Tensor:
        """prompt_*: (N, P) left-padded; completion_*: (N, C). Returns values (N, C).
        pack: the rows' real tokens as one padding-free sequence (models/forward.py pack_rows; packed_forward);
        positions after a completion's end then hold 0 instead of a value nothing reads."""
        device = self.head.weight.device
        if pack and not hasattr(self.backbone, "module"):
            input_ids, position_ids, predictor = pack_rows(prompt_ids, prompt_mask, completion_ids, completion_mask,
                                                           device)
            hidden = self.backbone(input_ids=input_ids, position_ids=position_ids, attention_mask=None,
                                   use_cache=False).last_hidden_state[0]  # (L, H)
            flat = self.head(hidden[predictor].float()).squeeze(-1)  # (M,)
            keep = completion_mask.to(device).bool()  # (N, C)
            return torch.zeros(keep.shape, dtype=flat.dtype, device=device).masked_scatter(keep, flat)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1).to(device)  # (N, P+C)
        attention = torch.cat([prompt_mask, completion_mask], dim=1).to(device)  # (N, P+C)
        position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)  # (N, P+C)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
                               use_cache=False).last_hidden_state  # (N, P+C, H)
        # the hidden state that predicts completion token t sits one position before it
        states = hidden[:, prompt_ids.shape[1] - 1 : -1].float()  # (N, C, H)
        return self.head(states).squeeze(-1)  # (N, C)


def build_value_model(policy, path: str | None = None, dtype: str = "float32",
                      trust_remote_code: bool = False) -> ValueModel:
    """Value head on a copy of the policy backbone (path None), or on the backbone of a separate model.

    A LoRA policy gives a backbone copy with its own LoRA layers: only those (and the head) train, so the
    critic costs what the policy's adapter costs rather than a full trainable copy."""
    if path is None:
        inner = policy.get_base_model() if hasattr(policy, "get_base_model") else policy  # peft -> transformers model
        backbone = copy.deepcopy(inner.base_model)  # the decoder without its LM head
        hidden_size = inner.config.hidden_size
        adapter = [p for name, p in backbone.named_parameters() if "lora_" in name]
        if adapter:
            backbone.requires_grad_(False)
            for param in adapter:
                param.requires_grad_(True)
            return ValueModel(backbone, hidden_size).train()
    else:
        from transformers import AutoModel

        from rlx.models.loading import DTYPES, resolve_model_path

        backbone = AutoModel.from_pretrained(resolve_model_path(path), dtype=DTYPES[dtype],
                                             trust_remote_code=trust_remote_code)
        hidden_size = backbone.config.hidden_size
    backbone.requires_grad_(True)
    return ValueModel(backbone, hidden_size).train()


def value_learning_rate(value_lr: float | None, ratio: float, policy_lr: float) -> float:
    """The critic's AdamW learning rate: algorithm.value_lr when set, else ratio x optim.lr, so the critic
    follows the model preset's learning rate (tiny model 1e-4 -> 5e-4; real-model presets 1e-6 -> 5e-6 at
    the default ratio 5; verl's and OpenRLHF's PPO examples run the critic 10-20x the actor's rate)."""
    return float(value_lr) if value_lr is not None else float(ratio) * float(policy_lr)
