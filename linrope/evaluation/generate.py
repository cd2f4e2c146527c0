"""Sample text from a trained checkpoint, token by token: a Hydra entry point (``conf/generate.yaml``).

    python -m linrope generate ckpt=PATH prompt='"def main("' max_new_tokens=300 temperature=0.8 top_k=40

Linear-attention models generate with the recurrent form (constant memory per token); softmax models re-read the
last ``model.max_len`` tokens at every step.  The text streams to stdout as it is sampled (log lines go to
stderr); Ctrl+C or SIGTERM stops it with everything sampled printed, one line on stderr, exit status 130 / 143.
More than ``MAX_NEW_TOKENS`` are refused unless ``allow_long=true``.  A prompt that is not UTF-8 is one line
before Hydra reads it (``linrope.config.command_line.encoding_errors``); in a prompt ``\\n`` is a newline, ``\\t``
a tab and ``\\\\`` a backslash (``prompt_text``).  Writes nothing to disk.
"""

from __future__ import annotations

import codecs
import re
import signal
import sys
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Optional

import hydra
import torch
from omegaconf import DictConfig
from pydantic import Field

from linrope.base.errors import ConfigError, LinropeError
from linrope.base.options import Count, declared, option_errors
from linrope.base.stopping import Stopped, signals_to, stopped
from linrope.config.command_line import CONF_DIR, check_command_line
from linrope.evaluation.passkey import ByteTokenizer, load_model
from linrope.run.provenance import collect as current_provenance
from linrope.run.resume_diff import describe_checkpoint

MAX_NEW_TOKENS = 1_000_000  # above this, allow_long=true is needed (about an hour of CPU for a small model)


_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}


def prompt_text(value: Any) -> str:
    """The prompt as typed (``prompt='"a\\nb"'``) as the text it means: ``\\n`` a newline, ``\\t`` a tab, ``\\\\`` one
    backslash (Hydra keeps a typed ``\\n`` as two characters); any other backslash is kept."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m.group(1)], str(value))


def generate_text(
    model,
    prompt: str,
    max_new_tokens: int,
    *,
    temperature: float = 0.8,
    top_k: Optional[int] = 40,
    seed: int = 0,
    device: str = "cpu",
    write: Optional[Callable[[str], None]] = None,
    tokenizer=None,
) -> str:
    """Prompt + ``max_new_tokens`` sampled bytes, as text.  ``write`` (e.g. ``sys.stdout.write``) is given the
    prompt and then each piece of text as its bytes are sampled.  A signal (``Stopped``, raised by the
    caller's handler) carries the text sampled so far, all of it already given to ``write``.  ``tokenizer``: a
    data=text run's (linrope.data.tokenizer), which encodes the prompt and decodes the tokens; None: bytes."""
    g = torch.Generator(device=device).manual_seed(seed)
    prompt = prompt or "\n"
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace") if tokenizer is None else _Pieces(tokenizer)
    pieces = [prompt]
    emit = write or (lambda text: None)
    shown = False

    def show_prompt() -> None:  # once the model has read it: a line its first forward logs comes before it
        nonlocal shown
        if not shown:
            shown = True
            emit(prompt)

    sampled = 0
    ids = torch.tensor([(ByteTokenizer() if tokenizer is None else tokenizer).encode(prompt)], dtype=torch.long)
    # what the model draws itself (randomized positions) comes from the global RNG: seeded too, the caller's kept
    cuda = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        try:
            for nxt in model.stream(ids.to(device), max_new_tokens, temperature=temperature, top_k=top_k, generator=g):
                show_prompt()
                sampled += 1
                piece = decoder.decode(bytes([int(nxt[0, 0])])) if tokenizer is None else decoder.decode(int(nxt[0, 0]))
                if piece:
                    pieces.append(piece)
                    emit(piece)
        finally:  # a byte sequence cut short: its replacement character, as decode() gives it
            show_prompt()  # no token sampled (none asked for, or a stop before the first): the prompt alone
            tail = decoder.decode(b"", final=True)
            if tail:
                pieces.append(tail)
                emit(tail)
            stopped = sys.exc_info()[1]
            if isinstance(stopped, Stopped):
                stopped.text, stopped.sampled = "".join(pieces), sampled
    return "".join(pieces)


class _Pieces:
    """A tokenizer's text piece by piece: the tokens not yet shown are decoded together and held back while they
    end inside a character (U+FFFD), for at most 8 tokens."""

    def __init__(self, tokenizer):
        self.tokenizer, self.pending = tokenizer, []

    def decode(self, token, final: bool = False) -> str:
        if not final:
            self.pending.append(token)
        text = self.tokenizer.decode(self.pending) if self.pending else ""
        if text.endswith("\ufffd") and not final and len(self.pending) < 8:
            return ""
        self.pending = []
        return text


@dataclass
class GenerateSettings:
    """The keys of ``conf/generate.yaml`` (their values and meaning there), with their types and ranges."""

    ckpt: Optional[str]
    prompt: Any  # text; Hydra reads prompt=42 as a number, used as its text
    max_new_tokens: Count
    allow_long: bool
    temperature: Annotated[float, Field(ge=0, description="0: greedy")]
    top_k: Annotated[Optional[int], Field(ge=1, description="null: every byte")]
    seed: int
    device: Optional[str]
    tokenizer: Optional[str] = None


def check(cfg: DictConfig) -> None:
    """One line for keys and values generation cannot use, before the checkpoint is read."""
    if not cfg.ckpt:
        raise ConfigError("ckpt=PATH is required (see --help)")
    problems = option_errors(declared(GenerateSettings), cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    if int(cfg.max_new_tokens) > MAX_NEW_TOKENS and not cfg.get("allow_long", False):
        raise ConfigError(
            f"max_new_tokens={cfg.max_new_tokens}: more than {MAX_NEW_TOKENS:,} bytes; if you mean "
            f"it, add allow_long=true (the text streams as it is sampled; Ctrl+C keeps what is printed)"
        )


def generate(cfg: DictConfig, write: Optional[Callable[[str], None]] = None) -> str:
    """Prompt + continuation for one composed ``conf/generate.yaml``; ``write``: see ``generate_text``."""
    check(cfg)

    def shown(checkpoint):  # on stderr: stdout is the text
        print(describe_checkpoint(checkpoint, cfg.ckpt, CONF_DIR, current_provenance()), file=sys.stderr)

    device, _, model, tok = load_model(cfg.ckpt, cfg.device, "generate", cfg.get("tokenizer"), shown)
    tok = None if isinstance(tok, ByteTokenizer) else tok  # a data=text run's: not the bytes of data=bytes
    return generate_text(
        model,
        prompt_text(cfg.prompt),
        int(cfg.max_new_tokens),
        temperature=float(cfg.temperature),
        top_k=None if cfg.top_k is None else int(cfg.top_k),
        seed=int(cfg.seed),
        device=device,
        write=write,
        tokenizer=tok,
    )


def _streamed(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="generate")
def main(cfg: DictConfig) -> None:
    try:
        with signals_to(stopped):
            generate(cfg, write=_streamed)
            _streamed("\n")
    except Stopped as e:
        name = signal.Signals(e.signum).name
        if e.text is None:
            print(f"linrope generate: stopped by {name} before any byte was sampled", file=sys.stderr, flush=True)
        else:
            _streamed("\n")
            said = f"after {e.sampled} of {cfg.max_new_tokens} bytes: all of them are printed above"
            print(f"linrope generate: stopped by {name} {said}", file=sys.stderr, flush=True)
        raise SystemExit(128 + e.signum) from None
    except LinropeError as e:
        print(f"linrope generate: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def run() -> None:
    """The ``linrope-generate`` command (and ``python -m linrope generate``): the command line checked, then Hydra."""
    check_command_line(config_name="generate", prefix="linrope generate")
    main()
