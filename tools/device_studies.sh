#!/usr/bin/env bash
# Run study parts on a lent GPU machine inside one call of the run tool, and bring their results back in one file.
#
#   bash tools/device_studies.sh LIST SECONDS        # on the device, from the repo root (carry=[".whl"])
#   DEVICE_STUDIES_CPU=1 bash tools/device_studies.sh LIST SECONDS   # here: the same mechanics on the CPU
#
# LIST: a file of `python -m linrope study ...` argument lines (one study folder per line, `#` comments), each
# started at once in the background (so the folders train side by side); SECONDS: when the parts are stopped
# (SIGTERM: the study driver stops its jobs and says what is left; the folders stay resumable).  Every 30 s
# (DEVICE_STUDIES_POLL) and at the end, every folder named in LIST is packed, without checkpoints, into
# $OUT/studies.tar.gz, so a call killed at its limit still returns what had finished.  Unpack it here with
# `tar -xzf`, delete the run folders that did not finish (no study_job.json), and resume the study where it
# stopped with the same line.
#
# At the end, one line per part: its runs finished and how it ended (exit 0; stopped at SECONDS, resumable; failed,
# with its exit status and log).  Exit status 1 when a part failed, saying which; a part stopped at SECONDS is no
# failure (that is what SECONDS is for).
#
# The wheels the device lacks (tools/device_wheels.sh fills .whl/) are installed into /tmp/site, except fla-core:
# without it impl=auto resolves to chunk, the kernel the CPU runs, so a study's numbers do not depend on which
# machine trained a run (provenance.json records the device of each).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LIST="${1:?usage: device_studies.sh LIST SECONDS}"
SECONDS_LEFT="${2:?usage: device_studies.sh LIST SECONDS}"
PY="${PYTHON:-python3}"
OUT="${OUT:-$ROOT/outputs/device_studies}"
mkdir -p "$OUT"
LOG="$OUT/device_studies.log"
: > "$LOG"

if [[ "${DEVICE_STUDIES_CPU:-0}" != 1 ]]; then
  shopt -s nullglob
  wheels=()
  for w in .whl/*.whl; do [[ "$(basename "$w")" == fla_core-* ]] || wheels+=("$w"); done
  if (( ${#wheels[@]} )); then
    "$PY" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site "${wheels[@]}" >> "$LOG" 2>&1 || { echo "pip install of .whl failed" | tee -a "$LOG"; exit 1; }
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

folders=()
names=()
pids=()
while IFS= read -r line; do
  line="${line%%#*}"
  [[ -z "${line// /}" ]] && continue
  read -r -a args <<< "$line"
  folders+=("${args[0]}")
  name="$(echo "${args[0]}" | tr '/' '_')"
  names+=("$name")
  echo "== start $(date -u +%T) ${args[*]}" >> "$LOG"
  "$PY" -m linrope study "${args[@]}" > "$OUT/$name.log" 2>&1 &
  pids+=($!)
done < "$LIST"
(( ${#folders[@]} )) || { echo "no study lines in $LIST" | tee -a "$LOG"; exit 2; }

pack() {  # the folders, without checkpoints, into one file (written aside, then moved: never half a file)
  local present=()
  for f in "${folders[@]}"; do [[ -d "$f" ]] && present+=("$f"); done
  (( ${#present[@]} )) || return 0  # none made yet
  tar -czf "$OUT/studies.tar.gz.tmp" --exclude='*.ckpt' --exclude='*.pt' --exclude='.*.lock' "${present[@]}" \
    2>> "$LOG" && mv "$OUT/studies.tar.gz.tmp" "$OUT/studies.tar.gz"
}

start=$(date +%s)
stopped=0
while :; do
  sleep "${DEVICE_STUDIES_POLL:-30}"
  running=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && running=1; done
  pack
  (( running )) || break
  if (( $(date +%s) - start >= SECONDS_LEFT )); then
    echo "== stop $(date -u +%T): SIGTERM after ${SECONDS_LEFT} s" >> "$LOG"
    for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
    stopped=1
    break
  fi
done
statuses=()  # each part's exit status, in the order of LIST (a plain `wait` would discard them)
for p in "${pids[@]}"; do wait "$p"; statuses+=($?); done
pack
failed=()
for i in "${!folders[@]}"; do
  f="${folders[$i]}" rc="${statuses[$i]}"
  done_=$(find "$f" -name study_job.json 2>/dev/null | wc -l)
  if (( rc == 0 )); then
    how="exit 0"
  elif (( stopped && rc == 128 + 15 )); then  # the study driver's status when SIGTERM stopped it
    how="stopped after ${SECONDS_LEFT} s: resume it with the same line"
  else
    how="failed, exit $rc (its log: $OUT/${names[$i]}.log)"
    failed+=("$f")
  fi
  echo "$f: $done_ runs finished; $how" | tee -a "$LOG"
done
tail -n 3 "$OUT"/*.log
if (( ${#failed[@]} )); then
  list="$(printf '%s, ' "${failed[@]}")"
  echo "device_studies: ${#failed[@]} of ${#folders[@]} parts failed: ${list%, }" | tee -a "$LOG" >&2
  exit 1
fi
