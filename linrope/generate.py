"""Sample text from a trained checkpoint, token by token: a Hydra entry point (``conf/generate.yaml``).

    python -m linrope.generate ckpt=PATH prompt='"def main("' max_new_tokens=300 temperature=0.8 top_k=40

Linear-attention models generate with the recurrent form: each new byte updates the carried
state (S, z) of every layer, so memory per token is constant whatever the length.  Softmax
models re-read the last ``model.max_len`` bytes at every step.  The checkpoint is loaded with
``weights_only=True``; a missing or broken one is one line.  Writes nothing to disk.
"""
from __future__ import annotations

import sys
from typing import Optional

import hydra
import torch
from omegaconf import DictConfig

from linrope.checkpoint import load_checkpoint
from linrope.command_line import CONF_DIR, check_command_line
from linrope.errors import ConfigError, LinropeError
from linrope.lit import LanguageModel
from linrope.provenance import collect as current_provenance
from linrope.resume_diff import describe_checkpoint



def encode(text: str) -> torch.Tensor:
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long).unsqueeze(0)


def decode(ids: torch.Tensor) -> str:
    return bytes(int(i) for i in ids.flatten().tolist()).decode("utf-8", errors="replace")


def generate_text(model, prompt: str, max_new_tokens: int, *, temperature: float = 0.8, top_k: Optional[int] = 40,
                  seed: int = 0, device: str = "cpu") -> str:
    g = torch.Generator(device=device).manual_seed(seed)
    ids = model.generate(encode(prompt or "\n").to(device), max_new_tokens, temperature=temperature, top_k=top_k,
                         generator=g)
    return decode(ids[0])


def generate(cfg: DictConfig) -> str:
    if not cfg.ckpt:
        raise ConfigError("ckpt=PATH is required (see --help)")
    if int(cfg.max_new_tokens) < 0 or float(cfg.temperature) < 0 or (cfg.top_k is not None and int(cfg.top_k) < 1):
        raise ConfigError(f"max_new_tokens={cfg.max_new_tokens}, temperature={cfg.temperature}, "
                          f"top_k={cfg.top_k}: need max_new_tokens >= 0, temperature >= 0 (0: greedy), top_k >= 1 "
                          f"or null")
    device = cfg.device or ("cuda" if torch.cuda.is_available() else "cpu")
    checkpoint = load_checkpoint(str(cfg.ckpt))  # weights_only=True; one line if missing or broken
    print(describe_checkpoint(checkpoint, cfg.ckpt, CONF_DIR, current_provenance()), file=sys.stderr)  # stdout: the text
    model = LanguageModel.from_checkpoint(str(cfg.ckpt), map_location=device, checkpoint=checkpoint).model
    return generate_text(model, str(cfg.prompt), int(cfg.max_new_tokens), temperature=float(cfg.temperature),
                         top_k=None if cfg.top_k is None else int(cfg.top_k), seed=int(cfg.seed), device=device)


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="generate")
def main(cfg: DictConfig) -> None:
    try:
        print(generate(cfg))
    except LinropeError as e:
        print(f"linrope.generate: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def run() -> None:
    """The ``linrope-generate`` command (and ``python -m linrope.generate``): the command line checked, then Hydra."""
    check_command_line(config_name="generate", prefix="linrope.generate")
    main()


if __name__ == "__main__":
    run()
