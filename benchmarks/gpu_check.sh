#!/usr/bin/env bash
# The device check in one command (issue 31): environment, `pytest -m gpu`, the kernel table, training tokens/s
# and peak memory, a short FSDP run, the GPU goals; everything as markdown in $OUT/gpu_check.md (with
# gpu_check.log and gpu_check.jsonl beside it).  At most about 9 minutes (520 s) on one H100 or H200; each part
# has its own time budget and a failing part does not stop the others.  Exit status 1 if any part failed (2: no
# CUDA GPU, no --cpu).
#
#   bash benchmarks/gpu_check.sh --triton      # on the GPU machine, issue 50's check (OUT=... or outputs/gpu_check/)
#   bash benchmarks/gpu_check.sh               # the same with linrope's chunk and fla forms instead of its Triton
#   bash benchmarks/gpu_check.sh --cpu         # the CPU stand-in: the same code paths at tiny sizes (~1 min)
#   GPU_CHECK_CPU=1 bash benchmarks/gpu_check.sh   # the same
#   bash benchmarks/gpu_check.sh --parts env,kernels      # a subset (python benchmarks/gpu_check.py --help)
#
# Wheels: if .whl/*.whl exists (tools/device_wheels.sh fills it), they are installed with pip --no-index into
# $GPU_CHECK_SITE (default /tmp/site) and that folder goes on PYTHONPATH; with --cpu only if GPU_CHECK_WHEELS=1.
# On the GPU, none there (or their install failing) stops the check at once (exit 2): the device lacks hydra-core,
# omegaconf and fla, and every training row and fla baseline would fail after minutes of its time
# (GPU_CHECK_NO_WHEELS=1 runs without them).  GPU_CHECK_WHEEL_DIR: another folder than .whl/.
# The repo itself goes first on PYTHONPATH, so linrope imports without being installed.
# PYTHON picks the interpreter (default python3).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
cpu="${GPU_CHECK_CPU:-0}"
for a in "$@"; do [[ "$a" == "--cpu" ]] && cpu=1; done
OUT="${OUT:-$ROOT/outputs/gpu_check}"
mkdir -p "$OUT"
: > "$OUT/gpu_check.log"

WHEELS="${GPU_CHECK_WHEEL_DIR:-.whl}"
note="none in $WHEELS/"
shopt -s nullglob
wheels=("$WHEELS"/*.whl)
if (( ${#wheels[@]} )); then
  if [[ "$cpu" == 1 && "${GPU_CHECK_WHEELS:-0}" != 1 ]]; then
    note="${#wheels[@]} in $WHEELS/, not installed (--cpu; GPU_CHECK_WHEELS=1 installs them)"
  else
    SITE="${GPU_CHECK_SITE:-/tmp/site}"
    if pip_out=$("$PY" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --upgrade \
                   --target "$SITE" "${wheels[@]}" 2>&1); then
      note="installed ${#wheels[@]} from $WHEELS/ into $SITE: $(basename -a "${wheels[@]}" | tr '\n' ' ')"
      export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else
      note="pip install of $WHEELS/*.whl failed: $(echo "$pip_out" | grep -v '^WARNING' | tail -1)"
      installed_none=1
    fi
    printf '%s\n' "$pip_out" >> "$OUT/gpu_check.log"
  fi
fi
echo "# wheels: $note" | tee -a "$OUT/gpu_check.log"
if [[ "$cpu" != 1 && "${GPU_CHECK_NO_WHEELS:-0}" != 1 && ( ${#wheels[@]} == 0 || -n "${installed_none:-}" ) ]]; then
  echo "gpu_check: wheels $note; the device lacks hydra-core, omegaconf and fla: run bash tools/device_wheels.sh" \
       "here and carry .whl (GPU_CHECK_NO_WHEELS=1 runs without them)" | tee -a "$OUT/gpu_check.log" >&2
  exit 2
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export GPU_CHECK_WHEELS="$note"
if [[ "$cpu" == 1 ]]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # tiny sizes: one thread is steadier on a shared CPU
fi
export OUT
exec "$PY" benchmarks/gpu_check.py "$@" --out "$OUT"
