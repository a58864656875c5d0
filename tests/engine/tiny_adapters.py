"""Tiny random LoRA adapters in PEFT's own folder format (peft writes them), for the tiny models."""
from __future__ import annotations

from pathlib import Path

import torch

ALL_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_tiny_adapter(base: Path, folder: Path, seed: int = 0, r: int = 4, alpha: int = 8,
                      target_modules=None, **config) -> Path:
    """Save a PEFT LoRA adapter of the model in `base` with random A and B (PEFT starts B at zero,
    which would make every adapter the identity); returns its folder."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=target_modules or ALL_MODULES, lora_dropout=0.0,
                          **config)
    peft_model = peft.get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    peft_model.save_pretrained(folder)
    return folder


def peft_logits(base: Path, adapter: Path | None, tokens: list[int]) -> torch.Tensor:
    """transformers + PEFT's PeftModel logits float32 [len(tokens), V] (the base alone for None)."""
    import peft
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).eval()
    if adapter is not None:
        model = peft.PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()
