"""Generation: time per generated token of recurrent decoding, at positions far apart.

Two forms, each row labelled with what it times:

  recurrent_step   linrope.ops.recurrent_step(q, k, v, state, position=pos): one token of causal elu+1 linear
                   attention with RoPE in the numerator, B=1, H=8, d=64, float32
  linear_rope model   the linear_rope TransformerLM's forward(token, offset=pos, states=…, return_states=True):
                   one token through the whole model (d_model 256, 4 layers, 4 heads, d_ff 1024)

The state entering each position is the real one, built by the chunk form (op) or the model's forward (model)
over a random prefix of that length; the timed tokens then continue from it (positions pos, pos+1, …).  Per
position: ``--tokens`` consecutive tokens timed together, in ``--rounds`` rounds in which the positions alternate
(benchmarks/timing.py), after a warm-up; the median over the rounds, divided by the tokens.  The RoPE angle is
formed from the position itself, so the cost should not depend on it: the last column is time at the last
position ÷ time at the first.

Usage:  python benchmarks/generation.py                       # positions 1 024 and 65 536
        python benchmarks/generation.py --positions 1024 8192 --tokens 50 --rounds 3
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import timing  # noqa: E402
from benchmarks.forms import B, D, H  # noqa: E402

MODEL_SIZE = dict(d_model=256, n_layers=4, n_heads=4, d_ff=1024)
LABELS = {"op": "recurrent_step", "model": "linear_rope model"}


def op_steps(positions, g):
    """{position: one token of ``recurrent_step``}, each continuing from the chunk form's state over a prefix."""
    from linrope.ops import chunk_linear_attention, recurrent_step

    steps = {}
    for pos in positions:
        q, k, v = (torch.randn(B, H, pos, D, generator=g) for _ in range(3))
        state = [chunk_linear_attention(q, k, v, output_final_state=True)[1]]
        token = [torch.randn(B, H, D, generator=g) for _ in range(3)]

        def step(t, pos=pos, state=state, token=token):
            state[0] = recurrent_step(*token, state[0], position=pos + t)[1]

        steps[pos] = step
    return steps


def model_steps(positions, g):
    """{position: one token through the linear_rope model}, each continuing from the model's state over a prompt."""
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    attention = dict(kind="linear", feature_map="elu", placement="numerator", impl="chunk", chunk_size=64, eps=1e-6)
    position = {"name": "rope", "base": 10000.0, "scaling": None, "factor": 1.0}
    config = dict(vocab_size=256, max_len=1024, causal=True, attention=attention, position=position, **MODEL_SIZE)
    model = TransformerLM(config).eval()
    steps = {}
    for pos in positions:
        state = [model(torch.randint(0, 256, (1, pos), generator=g), return_states=True)[1]]
        token = torch.randint(0, 256, (1, 1), generator=g)

        def step(t, pos=pos, state=state, token=token):
            state[0] = model(token, offset=pos + t, states=state[0], return_states=True)[1]

        steps[pos] = step
    return steps


def per_token(steps: dict, tokens: int, rounds: int) -> dict:
    """Seconds per token at each position: ``tokens`` consecutive steps per call, positions alternating."""
    calls = {pos: (lambda step=step: [step(t) for t in range(tokens)]) for pos, step in steps.items()}
    return {pos: t / tokens for pos, t in timing.medians(timing.rounds(calls, rounds=rounds, warmup=1)).items()}


def main(argv=None) -> dict:
    p = timing.parser(__doc__)
    p.add_argument("--positions", type=int, nargs="+", default=[1024, 65536], help="positions (ratio: last ÷ first)")
    p.add_argument("--tokens", type=int, default=200, help="consecutive tokens timed per position and round")
    p.add_argument("--rounds", type=int, default=7, help="rounds per position; the median is reported")
    p.add_argument("--forms", nargs="+", choices=list(LABELS), default=list(LABELS), help="op, model or both")
    args = p.parse_args(argv)
    timing.start(args)
    pos = args.positions
    timing.header(
        "generation: time per token of recurrent decoding",
        f"{args.tokens} consecutive tokens from each position, median of {args.rounds} rounds (positions alternating)",
    )
    size = ", ".join(f"{k} {v}" for k, v in MODEL_SIZE.items())
    print(f"- {LABELS['op']}: linrope.ops.recurrent_step, B={B} H={H} d={D} float32, elu+1, RoPE numerator")
    print(f"- {LABELS['model']}: TransformerLM forward(token, offset=pos, states=…), {size}", flush=True)
    g = torch.Generator().manual_seed(0)
    res = {}
    with torch.no_grad():
        for form in args.forms:
            res[LABELS[form]] = per_token(
                {"op": op_steps, "model": model_steps}[form](pos, g), args.tokens, args.rounds
            )
    rows = [
        [label, *(f"{per[p_] * 1e6:.1f}" for p_ in pos), f"{per[pos[-1]] / per[pos[0]]:.3f}"]
        for label, per in res.items()
    ]
    head = ["form"] + [f"µs/token at {p_}" for p_ in pos] + [f"ratio {pos[-1]}/{pos[0]}"]
    print("\n".join([""] + timing.table(head, rows)), flush=True)
    return res


if __name__ == "__main__":
    main()
