"""The pass-key probe (Mohtashami & Jaggi 2023, "Landmark Attention"; the "needle in a haystack" of later work): a
random key of ``digits`` digits hidden at a controlled depth in filler text, the model asked for it at the end,
at 1–16× its training context (docs/usage.md, "The pass-key probe").  Nothing is downloaded; any tokenizer with
``encode``/``decode`` serves (the command reads the checkpoint's own: ``checkpoint_tokenizer``).  Each piece of
the prompt is encoded alone and the pieces joined, so a subword tokenizer splits the key the same way wherever it
is hidden.

Scoring is one teacher-forced forward pass per prompt: the key is retrieved (``exact``) when the most likely
token at every answer position is the answer's, exactly when greedy decoding would write it; ``token_acc`` is the
fraction so predicted, ``nll`` the answer's mean negative log-likelihood per token (nats).  The positive control
(``control=true``, ``InductionOracle``) copies what followed the longest earlier occurrence of its context: it
retrieves the key everywhere if the prompts are answerable by copying and the scoring is right, so a model that
fails where it succeeds fails to retrieve.  The negative control is chance: 10⁻ᵏ for k digits."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Dict, List, Optional, Protocol, Sequence, Tuple

import torch
import torch.nn.functional as F
from pydantic import Field

from linrope.run.folder import run_folder

INTRO = (
    "There is an important piece of information hidden inside a lot of irrelevant text. Find it and remember "
    "it; you will be asked about it.\n"
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"
NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key.\n"
QUESTION = "What is the pass key? The pass key is"


class Tokenizer(Protocol):
    def encode(self, text: str) -> List[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes, the tokenizer of data=bytes: 256 ids, no end-of-document one (linrope.data.tokenizer's
    ``bytes``, of data=text, adds EOD = 256; generate tells the two apart by their class)."""

    vocab_size = 256

    def encode(self, text: str) -> List[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Prompt:
    ids: List[int]  # the prompt and the answer
    answer: Tuple[int, int]  # [start, end) of the answer's tokens in ids
    key: str
    depth: float  # where the needle starts, as a fraction of the filler before the question
    needle_at: int  # the needle's first token


def build_prompt(tok: Tokenizer, length: int, depth: float, key: str, filler: str = FILLER) -> Prompt:
    """A prompt of about ``length`` tokens (never more): intro, filler with the needle after ``depth`` of it (0: the
    needle first, 1: just before the question), the question, then " <key>" as the answer."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"passkey: depth must be in [0, 1], got {depth}")
    intro, needle = tok.encode(INTRO), tok.encode(NEEDLE.format(key=key))
    question, answer = tok.encode("\n" + QUESTION), tok.encode(" " + key)
    fixed = len(intro) + len(needle) + len(question) + len(answer)
    room = length - fixed
    if room < 0:
        raise ValueError(f"passkey: a prompt of {length} tokens cannot hold the {fixed} tokens of its fixed text")
    unit = tok.encode(filler)
    hay = (unit * (room // max(len(unit), 1) + 1))[:room]
    cut = int(round(depth * room))
    before, after = hay[:cut], hay[cut:]
    ids = intro + before + needle + after + question + answer
    start = len(ids) - len(answer)
    return Prompt(ids=ids, answer=(start, len(ids)), key=key, depth=depth, needle_at=len(intro) + len(before))


def shortest(tok: Tokenizer, keys: Sequence[str]) -> int:
    """The fewest tokens every prompt with one of ``keys`` can have: its fixed text (intro, needle, question, answer)
    without filler, for the key that takes the most (a subword tokenizer splits keys of one length differently)."""
    fixed = (sum(len(tok.encode(t)) for t in (INTRO, NEEDLE.format(key=k), "\n" + QUESTION, " " + k)) for k in keys)
    return max(fixed, default=0)  # no key (no depth or trial): nothing to hold


def random_key(rng: random.Random, digits: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(digits))


def cell_keys(seed: int, length: int, depths: Sequence[float], trials: int, digits: int) -> List[List[str]]:
    """The keys of a length's cells, one list per depth, one key per trial: a function of the seed, the cell and the
    trial only, so two models are scored on the same prompts."""
    return [
        [random_key(random.Random(f"{seed}-{length}-{float(d)}-{t}"), digits) for t in range(trials)] for d in depths
    ]


@torch.no_grad()
def score_prompt(logits_of: Callable[[torch.Tensor], torch.Tensor], prompt: Prompt, device="cpu") -> Dict[str, float]:
    """exact, token_acc and nll of the answer, from one teacher-forced forward pass (see the module's note)."""
    ids = torch.tensor(prompt.ids, dtype=torch.long, device=device).unsqueeze(0)
    start, end = prompt.answer
    logits = logits_of(ids[:, :-1])[0, start - 1 : end - 1].float()  # the predictions of the answer's tokens
    target = ids[0, start:end]
    hit = logits.argmax(-1) == target
    return {
        "exact": float(hit.all()),
        "token_acc": hit.float().mean().item(),
        "nll": F.cross_entropy(logits, target).item(),
    }


class InductionOracle:
    """The positive control: logits that put all mass on the token that followed the longest earlier occurrence of
    the current context's last ``order`` … 1 tokens (uniform where none occurred)."""

    def __init__(self, vocab_size: int, order: int = 8):
        self.vocab_size, self.order = vocab_size, order

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        seq = ids[0].tolist()
        out = torch.zeros(1, len(seq), self.vocab_size)
        seen: Dict[tuple, int] = {}  # context tuple -> the token that followed its latest occurrence
        for i in range(len(seq)):
            for n in range(self.order, 0, -1):
                ctx = tuple(seq[max(0, i - n + 1) : i + 1])
                if len(ctx) == n and ctx in seen:
                    out[0, i, seen[ctx]] = 1e4
                    break
            if i + 1 < len(seq):  # what follows position i becomes known after it is predicted
                for n in range(1, self.order + 1):
                    if i - n + 1 >= 0:
                        seen[tuple(seq[i - n + 1 : i + 1])] = seq[i + 1]
        return out


def passkey_table(
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    tok: Tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float],
    *,
    trials: int = 5,
    digits: int = 5,
    seed: int = 0,
    filler: str = FILLER,
    device="cpu",
    progress: Optional[Callable[[int], None]] = None,
) -> List[Dict[str, float]]:
    """One row per (length, depth): the mean of ``trials`` prompts' exact, token_acc and nll, each with its own key.
    The keys depend on ``seed``, the cell and the trial only, so two models are scored on the same prompts."""
    rows = []
    for length in lengths:
        for depth, keys in zip(depths, cell_keys(seed, int(length), depths, trials, digits)):
            cells = []
            for key in keys:
                prompt = build_prompt(tok, int(length), float(depth), key, filler)
                cells.append(score_prompt(logits_of, prompt, device))
                if progress:
                    progress(1)
            mean = {k: sum(c[k] for c in cells) / trials for k in ("exact", "token_acc", "nll")}
            rows.append({"length": int(length), "depth": float(depth), "trials": trials, **mean})
    return rows


def chance_exact(digits: int) -> float:
    return 10.0**-digits


def heatmap(rows: List[Dict[str, float]], path, title: str, train_context: Optional[int] = None) -> None:
    """exact by length (x) and depth (y), one cell per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r["length"] for r in rows})
    depths = sorted({r["depth"] for r in rows})
    grid = [[next(r["exact"] for r in rows if r["length"] == n and r["depth"] == d) for n in lengths] for d in depths]
    fig, ax = plt.subplots(figsize=(1.1 * len(lengths) + 2, 0.5 * len(depths) + 1.6))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto", origin="lower")
    ax.set_xticks(
        range(len(lengths)), [f"{n:,}" + (f"\n{n / train_context:g}×" if train_context else "") for n in lengths]
    )
    ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
    ax.set_xlabel("prompt length, tokens" + (" (× training context)" if train_context else ""))
    ax.set_ylabel("needle depth")
    for y, row in enumerate(grid):
        for x, v in enumerate(row):
            ax.text(x, y, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=8)
    fig.colorbar(im, ax=ax, label="pass key retrieved (exact)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def checkpoint_tokenizer(checkpoint: Dict[str, Any], vocab_size: int, who: str, spec: Optional[str] = None):
    """The tokenizer a checkpoint's model reads: ``spec`` when given (``bytes``, a tokenizer.json, an HF name), else
    bytes for a data=bytes run and the saved ``data.tokenizer`` of a data=text run.  A task that reads no text, a
    text checkpoint without its data config, or a tokenizer with more tokens than the model: one line each."""
    from linrope.base.errors import ConfigError
    from linrope.data.tokenizer import load_tokenizer
    from linrope.run.provenance import PROVENANCE_KEY

    task = ((checkpoint.get("hyper_parameters") or {}).get("model") or {}).get("task", "bytes")
    if spec is None and task == "bytes":
        return ByteTokenizer()
    if spec is None and task != "text":
        raise ConfigError(f"{who}: the checkpoint was trained on task {task!r}, which reads no text")
    saved = (((checkpoint.get(PROVENANCE_KEY) or {}).get("data") or {}).get("tokenizer")) or {}
    if spec is None and saved.get("path") and Path(saved["path"]).is_file():
        spec = saved["path"]  # the run's own file, by its absolute path: not a tok.json of the folder run from
    if spec is None:
        data = checkpoint.get("datamodule_hyper_parameters") or {}
        if "tokenizer" not in data:
            raise ConfigError(f"{who}: the checkpoint holds no data config to name its tokenizer: pass tokenizer=…")
        spec = data["tokenizer"]
    tok = load_tokenizer(spec)  # one line if unknown or unreadable
    from linrope.data.record import check_tokenizer

    flag = "--tokenizer" if who == "harness" else "tokenizer="
    check_tokenizer(saved, tok, who, f"pass {flag} naming the run's file (or a copy of it)")
    if tok.vocab_size > vocab_size and not (tok.name == "bytes" and vocab_size == 256):
        raise ConfigError(
            f"{who}: tokenizer {spec} has {tok.vocab_size} tokens but the model's vocabulary {vocab_size}"
        )
    return tok


def load_model(ckpt, device: Optional[str], who: str, tokenizer: Optional[str] = None, shown=None) -> tuple:
    """(device, checkpoint, model, tokenizer) of the checkpoint file ``ckpt`` for the command ``who``: loaded with
    ``weights_only=True`` (one line if missing or broken) on ``device`` (default: cuda when available, else cpu),
    the tokenizer ``checkpoint_tokenizer``'s; ``shown`` is given the checkpoint before the model is built."""
    from linrope.run.checkpoint import load_checkpoint
    from linrope.training.lit import LanguageModel

    device = checked_device(device)
    checkpoint = load_checkpoint(str(ckpt))
    if shown:
        shown(checkpoint)
    model = LanguageModel.from_checkpoint(str(ckpt), map_location=device, checkpoint=checkpoint).model
    return device, checkpoint, model, checkpoint_tokenizer(checkpoint, int(model.cfg.vocab_size), who, tokenizer)


def checked_device(device: Optional[str]) -> str:
    """``device=`` of an evaluation command (default: cuda when available, else cpu); ConfigError in one line for
    a name torch does not know or a CUDA device this machine lacks."""
    from linrope.base.errors import ConfigError

    if not device:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(str(device)).type
    except RuntimeError:
        raise ConfigError(f"device={device}: not a device (cpu, cuda, cuda:1, …)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={device}: no CUDA device here (leave device out: cuda when there is one, else cpu)")
    return str(device)


def training_context(checkpoint: Dict[str, Any], model) -> int:
    """The context the checkpoint was trained at: its data module's ``context``, saved with it (``model.max_len`` may be
    longer: a learned table raised for a longer eval_context), else ``model.max_len`` (a checkpoint without one)."""
    data = checkpoint.get("datamodule_hyper_parameters") or {}
    return int(data.get("context") or model.cfg.max_len)


def lengths_for(train_context: int, factors: Sequence[float]) -> List[int]:
    bad = [f for f in factors if not f > 0]
    if bad:
        raise ValueError(f"passkey: factors must be positive, got {bad}")
    return [int(round(train_context * f)) for f in factors]


# ---- the command: python -m linrope passkey ckpt=PATH (conf/passkey.yaml) -------------------------------------
@dataclass
class PasskeySettings:
    """The keys of ``conf/passkey.yaml`` (their values and meaning there), with their types and ranges."""

    ckpt: Optional[str]
    factors: List[float]
    depths: List[float]
    trials: Annotated[int, Field(ge=1)]
    digits: Annotated[int, Field(ge=1)]
    seed: int
    control: bool
    out: Optional[str]
    device: Optional[str]
    tokenizer: Optional[str]


def check(cfg) -> None:
    from linrope.base.errors import ConfigError
    from linrope.base.options import declared, option_errors

    if not cfg.ckpt:
        raise ConfigError("ckpt=PATH is required (see --help)")
    problems = option_errors(declared(PasskeySettings), cfg)  # factors and depths lists of numbers, among others
    if not problems:
        problems += [f"factors: {f} is not positive" for f in cfg.factors if not float(f) > 0]
        problems += [f"depths: {d} is not in [0, 1]" for d in cfg.depths if not 0 <= float(d) <= 1]
    if problems:
        raise ConfigError("; ".join(problems))


def out_dir(cfg) -> Path:
    return Path(str(cfg.out)).expanduser() if cfg.out else run_folder(cfg.ckpt) / "passkey"


def probe(cfg) -> List[Dict[str, Any]]:
    """Score the checkpoint (and the positive control, ``control=true``) at factors × its training context; write
    passkey.csv and passkey.png into ``out`` (default ``<run>/passkey``), refusing to overwrite an earlier probe's."""
    from tqdm import tqdm

    from linrope.base.csv_files import write_rows
    from linrope.base.errors import ConfigError, SequenceTooLong
    from linrope.base.writable import writable_folder

    check(cfg)
    out = out_dir(cfg)
    for name in ("passkey.csv", "passkey.png"):
        if (out / name).exists():
            raise ConfigError(f"{out / name} exists (an earlier probe): pass out=<another folder> to keep both")
    writable_folder(out, "out")  # before the probe: a folder it cannot write is one line, not a traceback after it
    device, checkpoint, model, tok = load_model(cfg.ckpt, cfg.device, "passkey", cfg.tokenizer)
    model.eval()
    context = training_context(checkpoint, model)
    lengths = lengths_for(context, [float(f) for f in cfg.factors])
    depths = [float(d) for d in cfg.depths]
    arms: List[Tuple[str, Callable]] = [(model.cfg.name or "model", model)]
    if cfg.control:
        arms.append(("control: induction oracle", InductionOracle(int(model.cfg.vocab_size))))
    rows: List[Dict[str, Any]] = []
    bar = tqdm(total=len(arms) * len(lengths) * len(depths) * int(cfg.trials), desc="passkey", unit="prompt")

    def skipped(length: int, note: str) -> List[Dict[str, Any]]:  # a length not probed: a row per depth says why
        bar.update(len(depths) * int(cfg.trials))
        nan = {k: float("nan") for k in ("exact", "token_acc", "nll")}
        return [{"length": length, "depth": d, "trials": 0, **nan, "note": note} for d in depths]

    for arm, logits_of in arms:
        for length in lengths:
            keys = cell_keys(int(cfg.seed), length, depths, int(cfg.trials), int(cfg.digits))
            fewest = shortest(tok, [k for one in keys for k in one])  # the keys this length draws
            if length < fewest:
                got = skipped(length, f"{length} tokens cannot hold the prompt's fixed text ({fewest} tokens)")
            else:
                try:
                    got = passkey_table(logits_of, tok, [length], depths, trials=int(cfg.trials),
                                        digits=int(cfg.digits), seed=int(cfg.seed), device=device,
                                        progress=bar.update)  # fmt: skip
                except SequenceTooLong as e:  # a learned table of max_len positions: no longer prompt
                    got = skipped(length, str(e).splitlines()[0])
            rows += [{"arm": arm, "factor": length / context, **r} for r in got]
    bar.close()
    keys = ["arm", "length", "factor", "depth", "trials", "exact", "token_acc", "nll", "note"]
    write_rows(rows, keys, out / "passkey.csv")
    mine = [r for r in rows if r["arm"] == arms[0][0] and r["trials"]]
    if mine:
        heatmap(mine, out / "passkey.png", f"{arms[0][0]}: pass key, {cfg.digits} digits, {cfg.trials} keys per cell "
                f"(chance {chance_exact(int(cfg.digits)):g})", train_context=context)  # fmt: skip
    return rows


def summary_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """One line per arm and length: exact over the depths."""
    lines = []
    for arm in dict.fromkeys(r["arm"] for r in rows):
        for length in dict.fromkeys(r["length"] for r in rows if r["arm"] == arm):
            cell = [r for r in rows if r["arm"] == arm and r["length"] == length]
            if not cell[0]["trials"]:
                lines.append(f"{arm:>28}  {length:>7,} tokens  {cell[0]['note']}")
                continue
            exact = sum(r["exact"] for r in cell) / len(cell)
            lines.append(f"{arm:>28}  {length:>7,} tokens ({cell[0]['factor']:g}x)  exact {exact:.2f}  "
                         f"token acc {sum(r['token_acc'] for r in cell) / len(cell):.2f}")  # fmt: skip
    return lines


def main_from_config(cfg) -> None:
    import sys

    from linrope.base.errors import LinropeError

    try:
        rows = probe(cfg)
    except LinropeError as e:
        print(f"linrope passkey: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print("\n".join(summary_lines(rows)))
    print(f"linrope passkey: wrote {out_dir(cfg) / 'passkey.csv'}", file=sys.stderr)


def run() -> None:
    """The ``linrope-passkey`` command (and ``python -m linrope passkey``): the command line checked, then Hydra."""
    import hydra

    from linrope.config.command_line import CONF_DIR, check_command_line

    check_command_line(config_name="passkey", prefix="linrope passkey")
    hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="passkey")(main_from_config)()
