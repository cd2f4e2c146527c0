"""The command line of ``python -m linrope report DIR`` (``linrope-report``): a sweep's report
(linrope.analysis.report), or, for the folder of a study run in arms, each arm's report and the study's table
across them (linrope.analysis.arms).  Which pairs, claims and verdicts: the study's config
(linrope.analysis.study_config), found from the runs or named with ``--study``.  Light: no torch."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional, Sequence, Tuple

from linrope.analysis import study_config
from linrope.analysis.arms import arm_folders, arms_table
from linrope.analysis.report import build_report
from linrope.analysis.runs import find_runs
from linrope.base.errors import LinropeError
from linrope.config.command_line import program


def parse_pair(text: str) -> Tuple[str, str]:
    a, sep, b = text.partition(":")
    if not sep or not a or not b or ":" in b:
        raise argparse.ArgumentTypeError(f"{text!r}: a pair is two configuration names, A:B")
    return a, b


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=program("python -m linrope report"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Summarise a sweep without wandb: reads <run>/csv/metrics.csv and <run>/.hydra/config.yaml\n"
        "of every run under the folder(s); writes report.md (per configuration the mean test score\n"
        "over seeds with its 95% t-interval; paired differences of declared pairs with CI and p),\n"
        "summary.csv, pairs.csv, runs.csv (every run's values), val_curves.png and, when runs\n"
        "evaluated length extrapolation, extrapolation.png.  The pairs compared where both ran are\n"
        "those of the runs' study: conf/study/<experiment>.yaml (the runs' task_name), else\n"
        "conf/study/default.yaml.  A study whose config declares arms (<folder><N>/ of runs) gets\n"
        "each arm's report and its table of claims across the arms.",
        epilog="examples:\n  python -m linrope report logs/pe_compare/multiruns/2025-01-01_12-00-00 "
        "--pair linear_alibi:linear\n"
        "  python -m linrope report docs/results/<study>   (a study in arms: each arm's report, its table)",
    )
    p.add_argument("sweeps", nargs="+", type=Path, help="sweep folder(s) (e.g. logs/<task_name>/multiruns/<time>)")
    p.add_argument("--out", type=Path, default=None, help="where to write (default: the first sweep folder)")
    p.add_argument(
        "--pair",
        type=parse_pair,
        action="append",
        default=[],
        metavar="A:B",
        help="also compare configuration A with B, paired over seeds (repeatable)",
    )
    p.add_argument(
        "--study",
        metavar="NAME|FILE",
        help="read the pairs and claims of conf/study/NAME.yaml, or of a YAML file (default: the runs')",
    )
    p.add_argument(
        "--no-reports", action="store_true", help="a study in arms: only its table, not each arm's own report"
    )
    p.add_argument(
        "--allow-mixed",
        action="store_true",
        help="report runs from more than one commit or torch version together (named at the top)",
    )
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = parser()
    # intermixed: options may sit between folders (`<sweep> --allow-mixed <sweep>`)
    args = p.parse_intermixed_args(argv)
    for s in args.sweeps:
        if not s.is_dir():
            p.error(f"{s}: not a folder")
    try:
        study = study_config.named(args.study) if args.study else None
        folder = args.sweeps[0]
        if len(args.sweeps) == 1:
            study = study or study_config.for_runs(find_runs(folder))
        if len(args.sweeps) == 1 and arm_folders(folder, study):
            if args.out or args.pair:
                p.error(
                    f"{'--out' if args.out else '--pair'}: {folder} holds the arms of {study.path}, which "
                    f"declares their pairs and where their table goes"
                )
            print(arms_table(folder, study, reports=not args.no_reports, allow_mixed=args.allow_mixed))
            print(f"\nwrote {folder / study.table['file']}.md")
            return 0
        out = args.out or folder
        print(build_report(args.sweeps, out, args.pair, allow_mixed=args.allow_mixed, study=study))
    except LinropeError as e:
        raise SystemExit(f"linrope report: {e}") from None
    print(f"\nwrote {out / 'report.md'}")
    return 0
