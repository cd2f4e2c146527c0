"""Sample text from a trained checkpoint, token by token.

    python -m linrope.generate ckpt=PATH [prompt="def main("] [max_new_tokens=300] [temperature=0.8]
                               [top_k=40] [seed=0] [device=cpu]

Linear-attention models generate with the recurrent form: each new byte updates the carried
state (S, z) of every layer, so memory per token is constant whatever the length.  Softmax
models re-read the last ``model.max_len`` bytes at every step.
"""
from __future__ import annotations

import ast
import sys
from typing import Dict, List, Optional

import torch

USAGE = __doc__


def parse_kv(argv: List[str], defaults: Dict) -> Dict:
    """key=value arguments (values parsed as Python literals where they parse)."""
    out = dict(defaults)
    for arg in argv:
        if arg in ("-h", "--help"):
            print(USAGE)
            raise SystemExit(0)
        if "=" not in arg:
            raise SystemExit(f"linrope.generate: expected key=value, got {arg!r} (see --help)")
        key, value = arg.split("=", 1)
        if key not in defaults:
            raise SystemExit(f"linrope.generate: unknown key {key!r}; keys: {', '.join(defaults)}")
        try:
            out[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key] = value
    return out


def load_model(ckpt: str, device: str = "cpu"):
    from linrope.checkpoint import load_model as load

    return load(ckpt, map_location=device).model.to(device).eval()


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


def main(argv: Optional[List[str]] = None) -> None:
    args = parse_kv(sys.argv[1:] if argv is None else argv,
                    dict(ckpt=None, prompt="def ", max_new_tokens=300, temperature=0.8, top_k=40, seed=0, device="cpu"))
    if not args["ckpt"]:
        raise SystemExit("linrope.generate: ckpt=PATH is required (see --help)")
    model = load_model(str(args["ckpt"]), args["device"])
    print(generate_text(model, str(args["prompt"]), int(args["max_new_tokens"]), temperature=float(args["temperature"]),
                        top_k=args["top_k"], seed=int(args["seed"]), device=args["device"]))


if __name__ == "__main__":
    main()
