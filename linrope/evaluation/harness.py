"""A linrope checkpoint as a language model of EleutherAI's lm-evaluation-harness (``lm_eval``), so it scores on
any harness task the user has: ``python -m linrope.evaluation.harness --ckpt PATH --tasks TASK[,TASK]
[--include-path DIR]`` (a folder of the user's own task YAMLs: a local task needs no download), or from Python
``lm_eval.simple_evaluate(model=HarnessLM(model, tokenizer), tasks=[...])``; docs/usage.md ("Harness tasks").

The harness's three requests, one at a time (the models here are small), over linrope's own model:
``loglikelihood`` encodes context and continuation together and splits them where the context's own encoding ends
(as the harness's Hugging Face model does), the input cut from the left to ``max_length`` tokens (default the
model's ``max_len``: a learned position table holds no more); ``loglikelihood_rolling`` scores every token once in
the harness's rolling windows, the first token conditioned on the end-of-document token of a data=text model (a
document follows one) or a newline for a bytes model (files are joined by one); ``generate_until`` is greedy, with
the model's own generation (``TransformerLM.stream``), stopped at the first ``until`` string or, for a data=text
model, at the end-of-document token.  The tokenizer is the checkpoint's own
(``linrope.evaluation.passkey.checkpoint_tokenizer``), or the one ``--tokenizer`` names."""

from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from linrope.evaluation.passkey import ByteTokenizer, Tokenizer, load_model

try:  # the harness is the `eval` extra (in `dev`); without it, this module says how to install it when used
    from lm_eval.api.model import LM as _HarnessBase
except ImportError:  # pragma: no cover - exercised where lm_eval is absent
    _HarnessBase = object


def _need_harness() -> None:
    if _HarnessBase is object:
        raise ImportError("lm-evaluation-harness is not installed: pip install 'linrope[eval]' (or lm-eval)")


class HarnessLM(_HarnessBase):
    def __init__(self, model, tokenizer: Optional[Tokenizer] = None, *, device="cpu", max_length: Optional[int] = None,
                 prefix: str = "\n"):  # fmt: skip
        _need_harness()
        super().__init__()
        self.model = model.to(device).eval()
        self.tok = tokenizer or ByteTokenizer()
        self._device = torch.device(device)
        self.max_length = int(max_length or model.cfg.max_len)
        eod = getattr(self.tok, "eod", None)  # a text tokenizer's end of document, if the model has that token
        self.eod = int(eod) if eod is not None and int(eod) < int(model.cfg.vocab_size) else None
        self.prefix_ids = [self.eod] if self.eod is not None else self.tok.encode(prefix)[-1:]
        if not self.prefix_ids:
            raise ValueError("harness: the prefix must encode to at least one token")

    # ---- the model's log-probabilities -----------------------------------------------------------------------
    @torch.no_grad()
    def _scored(self, tokens: List[int], n: int) -> Tuple[float, bool]:
        """Summed log-probability of the last ``n`` of ``tokens`` given those before (the input cut from the left
        to ``max_length``), and whether each was the argmax."""
        inp = torch.tensor(tokens[-(self.max_length + 1) : -1], dtype=torch.long, device=self._device).unsqueeze(0)
        target = torch.tensor(tokens[-n:], dtype=torch.long, device=self._device)
        logits = self.model(inp)[0, -n:]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16/fp16 → float32; float64 stays
        logp = F.log_softmax(logits, -1)
        return logp.gather(-1, target.unsqueeze(-1)).sum().item(), bool((logits.argmax(-1) == target).all())

    def _pair(self, context: str, continuation: str) -> Tuple[List[int], List[int]]:
        """(context ids, continuation ids): the two encoded together, split where the context's encoding ends; a
        context's trailing spaces move to the continuation, as the harness's Hugging Face model does."""
        spaces = len(context) - len(context.rstrip(" "))
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self.tok.encode(context + continuation)
        ctx = self.tok.encode(context)
        return whole[: len(ctx)], whole[len(ctx) :]

    def loglikelihood(self, requests) -> List[Tuple[float, bool]]:
        out = []
        for req in _progress(requests, "loglikelihood"):
            context, continuation = req.args
            ctx, cont = self._pair(context, continuation)
            if not cont:
                raise ValueError(f"harness: the continuation {continuation!r} encodes to no token")
            if len(cont) > self.max_length:
                raise ValueError(f"harness: a continuation of {len(cont)} tokens exceeds max_length={self.max_length}")
            out.append(self._scored((ctx or self.prefix_ids) + cont, len(cont)))
        return out

    def loglikelihood_rolling(self, requests) -> List[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        out = []
        for req in _progress(requests, "loglikelihood_rolling"):
            (text,) = req.args
            total = 0.0
            windows = get_rolling_token_windows(self.tok.encode(text), self.prefix_ids[0], self.max_length, 1)
            for context, pred in map(make_disjoint_window, windows):
                total += self._scored(context + pred, len(pred))[0]
            out.append(total)
        return out

    @torch.no_grad()
    def generate_until(self, requests) -> List[str]:
        """Greedy continuations.  A prompt longer than the room left for it is cut from the left to its last
        ``max_length - min(max_gen_toks, max_length // 2)`` tokens (generation may then run past ``max_length``: a
        softmax model reads its last ``max_length`` tokens), and the cut is said in one warning per call."""
        out, cut = [], []
        for req in _progress(requests, "generate_until"):
            context, kwargs = req.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            budget = int(kwargs.get("max_gen_toks", 256))
            ids = self.tok.encode(context) or self.prefix_ids
            keep = self.max_length - min(budget, self.max_length // 2)
            if len(ids) > keep:
                cut.append((len(ids), keep))
                ids = ids[-keep:]
            prompt = torch.tensor(ids, dtype=torch.long, device=self._device).unsqueeze(0)
            made: List[int] = []
            text = ""
            for nxt in self.model.stream(prompt, budget, temperature=0.0, window=self.max_length):
                if int(nxt[0, 0]) == self.eod:  # the document ends
                    break
                made.append(int(nxt[0, 0]))
                text = self.tok.decode(made)
                if any(u in text for u in until):
                    break
            for u in until:
                text = text.split(u)[0]
            out.append(text)
        if cut:
            import warnings

            n, kept = len(cut), "/".join(str(k) for k in sorted({k for _, k in cut}))
            warnings.warn(
                f"harness: {n} prompt{'' if n == 1 else 's'} of generate_until cut from the left to "
                f"{'its' if n == 1 else 'their'} last {kept} tokens (of up to {max(t for t, _ in cut)}; the model "
                f"reads {self.max_length} tokens, and up to half of them are left for the max_gen_toks generated)",
                stacklevel=2,
            )
        return out


def _progress(requests, what: str):
    from tqdm import tqdm

    return tqdm(requests, desc=what, unit="request", disable=len(requests) < 2)


def evaluate_checkpoint(ckpt: str, tasks: Sequence[str], *, include_path: Optional[str] = None,
                        limit: Optional[float] = None, device: Optional[str] = None,
                        max_length: Optional[int] = None, num_fewshot: Optional[int] = None,
                        tokenizer: Optional[str] = None) -> dict:  # fmt: skip
    """The harness's results for a checkpoint on ``tasks`` (task names, the user's own under ``include_path``)."""
    _need_harness()
    import lm_eval
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=include_path) if include_path else TaskManager()
    unknown = [t for t in tasks if t not in set(manager.all_tasks)]  # before the model is loaded
    if unknown:
        raise ValueError(
            f"no harness task named {', '.join(unknown)}"
            + ("" if include_path else " (your own task YAMLs: --include-path DIR)")
            + "; lm_eval --tasks list lists them"
        )
    device, _, model, tok = load_model(ckpt, device, "harness", tokenizer)
    lm = HarnessLM(model, tok, device=device, max_length=max_length)
    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=manager, limit=limit,
                                   num_fewshot=num_fewshot, log_samples=False)  # fmt: skip


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m linrope.evaluation.harness",
        description="Score a linrope checkpoint on lm-evaluation-harness tasks (its own tokenizer; greedy generation).",
    )
    p.add_argument("--ckpt", required=True, help="a linrope checkpoint")
    p.add_argument("--tasks", required=True, help="comma-separated harness task names")
    p.add_argument("--include-path", help="a folder of your own task YAMLs (local data: nothing downloaded)")
    p.add_argument("--limit", type=float, help="examples per task (a fraction if < 1)")
    p.add_argument("--num-fewshot", type=int)
    p.add_argument("--max-length", type=int, help="tokens of context (default: the model's max_len)")
    p.add_argument("--device", help="default: cuda when available, else cpu")
    p.add_argument("--tokenizer", help="default: the run's own (bytes, or the data.tokenizer of a data=text run)")
    p.add_argument("--out", help="write the results as JSON here (refused if the file exists)")
    args = p.parse_args(argv)
    from pathlib import Path

    from linrope.base.errors import LinropeError

    if args.out and Path(args.out).exists():
        print(f"linrope.harness: {args.out} exists; pass another --out", file=sys.stderr)
        return 2
    if args.out and not Path(args.out).resolve().parent.is_dir():  # before the evaluation, not after it
        print(f"linrope.harness: --out {args.out}: no folder {Path(args.out).parent} to write it in", file=sys.stderr)
        return 2
    try:
        results = evaluate_checkpoint(args.ckpt, [t for t in args.tasks.split(",") if t], include_path=args.include_path,
                                      limit=args.limit, device=args.device, max_length=args.max_length,
                                      num_fewshot=args.num_fewshot, tokenizer=args.tokenizer)  # fmt: skip
    except (ValueError, ImportError, FileNotFoundError, LinropeError) as e:
        print(f"linrope.harness: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    table = results.get("results", {})
    print(json.dumps(table, indent=2, default=str))
    if args.out:
        Path(args.out).write_text(json.dumps(table, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
