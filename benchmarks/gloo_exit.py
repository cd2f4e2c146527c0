"""How often a spawned gloo rank dies as it exits, with and without its process group destroyed at exit.

    python benchmarks/gloo_exit.py --rounds 60               # with the cleanup LanguageModel.setup registers
    python benchmarks/gloo_exit.py --rounds 60 --no-cleanup  # as Lightning leaves a gloo group

Each round spawns two processes that join a gloo group, run 20 all-reduces and one asynchronous one, and
return.  A rank that does not exit cleanly (SIGABRT: "terminate called without an active exception") makes
torch.multiprocessing raise ProcessExitedException for that round.  Prints one line per failed round and
the count.  ``tests/run/test_slow_reliability.py`` runs 12 rounds with the cleanup.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank(index: int, store: str, cleanup: bool) -> None:
    """One of two spawned ranks: a group as LanguageModel.setup leaves it (or not), collectives, a plain exit."""
    from linrope.run.signals import destroy_process_group_at_exit

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=index, world_size=2)
    if cleanup:
        destroy_process_group_at_exit()
    for _ in range(20):
        dist.all_reduce(torch.randn(64))
    dist.all_reduce(torch.ones(2), async_op=True).wait()


def run_rounds(rounds: int, cleanup: bool, folder: Path) -> list:
    """The indices of the rounds in which a rank did not exit cleanly."""
    failed = []
    for k in range(rounds):
        try:
            mp.start_processes(rank, args=(str(folder / f"store{k}"), cleanup), nprocs=2, start_method="spawn")
        except mp.ProcessExitedException as e:
            failed.append(k)
            print(f"round {k}: {e}", flush=True)
    return failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60, help="rounds of two spawned ranks (default 60)")
    parser.add_argument("--no-cleanup", action="store_true", help="leave the group alive at exit, as Lightning does")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        failed = run_rounds(args.rounds, not args.no_cleanup, Path(folder))
    print(
        f"{len(failed)} of {args.rounds} rounds lost a rank at exit "
        f"({'without' if args.no_cleanup else 'with'} the process group destroyed at exit)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
