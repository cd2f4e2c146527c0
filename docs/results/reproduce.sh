#!/usr/bin/env bash
# Re-run the studies behind README's "Results" and rewrite their reports (docs/results/<study>/).
#
#   bash docs/results/reproduce.sh [logs folder]        (default: logs/studies)
#
# The two sweeps (experiment=rope_study: 60 runs; experiment=probes: 48 runs) are cut into five pieces,
# and two pieces run at a time, each one process with one thread: 1 h 37 min on 2 CPU cores (the pieces
# add up to 3 h 6 min of one-thread time).  With more cores raise JOBS: every run is fixed by its
# configuration and its seed, whichever piece runs it (another thread count or machine can change the
# last digits, as floating-point sums are added in another order).
# A piece whose folder already exists is refused by train.py (nothing is overwritten): choose a new
# logs folder, or delete the old one, to run again.
set -euo pipefail
cd "$(dirname "$0")/../.."
LOGS=${1:-logs/studies}
JOBS=${JOBS:-2}
PYTHON=${PYTHON:-python}

pieces() {
  echo "rope_s12 experiment=rope_study seed=1,2"
  echo "rope_s34 experiment=rope_study seed=3,4"
  echo "rope_s5 experiment=rope_study seed=5"
  echo "probes_copy experiment=probes data=offset_copy"
  echo "probes_mqar experiment=probes data=mqar"
}

run_piece() {  # <name> <overrides...>: one sweep, one thread, its output in $LOGS/<name>.log
  local name=$1
  shift
  local start=$SECONDS
  if OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 "$PYTHON" train.py -m "$@" logger=csv "hydra.sweep.dir=$LOGS/$name" \
    >"$LOGS/$name.log" 2>&1; then
    echo "$name: done in $(((SECONDS - start) / 60)) min"
  else
    echo "$name: failed, see $LOGS/$name.log" >&2
    return 1
  fi
}
export -f run_piece
export LOGS PYTHON

mkdir -p "$LOGS"
pieces | xargs -P "$JOBS" -L 1 bash -c 'run_piece "$@"' _

"$PYTHON" -m linrope.report "$LOGS"/rope_s12 "$LOGS"/rope_s34 "$LOGS"/rope_s5 --out docs/results/rope_study \
  --pair linear_alibi:linear_rope --pair linear_alibi:softmax_alibi --pair softmax_rope:softmax_none >/dev/null
"$PYTHON" -m linrope.report "$LOGS"/probes_copy "$LOGS"/probes_mqar --out docs/results/probes \
  --pair softmax_rope:softmax_none --pair linear_alibi:linear --pair softmax_alibi:softmax_none >/dev/null
echo "wrote docs/results/rope_study and docs/results/probes"
