#!/usr/bin/env bash
# Maintainer's script (issue 26): the default test suite in a fresh environment per dependency set.
#
#   tools/compat.sh                 # both sets: floor, then newest
#   tools/compat.sh floor           # one set
#   TORCH=2.6.0 tools/compat.sh     # both sets with another torch
#
# floor:  every dependency of pyproject.toml at its lower bound (">=X" installed as "==X"), torch too
#         (torch>=2.4: 2.4.0, whose PyPI wheel is the CUDA build: about 3 GB with its nvidia-* wheels);
# newest: the newest releases pip finds within each declared range (upper caps kept), torch 2.13.0 (the CPU
#         build this machine's index serves; the newest torch on PyPI is a CUDA build of several GB).
# TORCH=X installs torch X in every set instead.
# Both also install the dev extra (the tests' tools, unpinned: whatever pip resolves beside the set).
# Each environment is a venv under $WORK (default: a new folder in /tmp), deleted at the end unless KEEP=1.
# Prints one markdown row per set (versions, passed/failed/skipped, wall time) for docs/compat.md.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NEWEST_TORCH=2.13.0
PY=${PY:-python3}
SETS=("$@"); [ ${#SETS[@]} -gt 0 ] || SETS=(floor newest)
for set in "${SETS[@]}"; do  # any other name would run the newest set under that label
  case "$set" in
    floor | newest) ;;
    *) echo "compat: no set '$set': the sets are floor and newest" >&2; exit 2 ;;
  esac
done
WORK=${WORK:-$(mktemp -d /tmp/linrope-compat.XXXXXX)}
SHOWN="torch lightning hydra-core omegaconf wandb einops torchdiffeq matplotlib numpy tqdm"

requirements() {  # the set's requirement lines, read from pyproject.toml
  "$PY" - "$ROOT/pyproject.toml" "$1" "${TORCH:-}" "$NEWEST_TORCH" <<'PYEOF'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
for dep in deps:
    name = re.match(r"[A-Za-z0-9_.-]+", dep).group(0)
    low = re.search(r">=\s*([^,;\s]+)", dep)
    if name == "torch":
        floor = low.group(1) + ".0" * (2 - low.group(1).count("."))  # >=2.4: 2.4.0
        print(f"torch=={sys.argv[3] or (floor if sys.argv[2] == 'floor' else sys.argv[4])}")
    elif sys.argv[2] == "floor" and low:
        print(f"{name}=={low.group(1)}")
    else:  # newest: the newest releases the declared range admits (its caps too)
        print(dep)
PYEOF
}

extra_requirements() {  # the requirement lines of pyproject.toml's extras named as arguments
  "$PY" - "$ROOT/pyproject.toml" "$@" <<'PYEOF'
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
for name in sys.argv[2:]:
    for dep in extras[name]:
        print(dep)
PYEOF
}

rows=()
for set in "${SETS[@]}"; do
  env="$WORK/$set"
  echo "== $set: $env" >&2
  "$PY" -m venv "$env"
  requirements "$set" > "$env/requirements.txt"
  cat "$env/requirements.txt" >&2
  # the dev extra's tools, resolved beside the set (linrope itself runs from this checkout, PYTHONPATH below), and
  # the interp extra (fla under Triton's CPU interpreter, triton 3.9) only beside the CPU torch 2.13.0: any other torch
  # pins its own triton, so the interpreter tests skip there, saying why
  extras=(dev); grep -qx "torch==$NEWEST_TORCH" "$env/requirements.txt" && extras+=(interp)
  extra_requirements "${extras[@]}" > "$env/tools.txt"
  "$env/bin/python" -m pip install -q -r "$env/requirements.txt" -r "$env/tools.txt"
  versions=$("$env/bin/python" -m pip list --format=freeze 2>/dev/null | tr '[:upper:]' '[:lower:]' |
             grep -E "^($(echo $SHOWN | tr ' ' '|'))==" | tr '\n' ' ')
  start=$(date +%s)
  set +e
  # SIGINT as in a terminal even when this script runs in the background (`&` starts it ignored; tests/run/test_run.py
  # checks the handler a signal stop restores)
  (cd "$ROOT" && PYTHONPATH="$ROOT" "$env/bin/python" -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider"]))') > "$env/pytest.log" 2>&1
  status=$?
  set -e
  wall=$(( $(date +%s) - start ))
  summary=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed).* =+$" "$env/pytest.log" | tail -1 | tr -d '=' || true)
  grep -E "^(FAILED|ERROR) " "$env/pytest.log" >&2 || true
  tail -1 "$env/pytest.log" >&2
  rows+=("| $set | $(date -u +%Y-%m-%d) | ${versions% } | ${summary# } | ${wall} s | exit $status |")
  [ "${KEEP:-0}" = 1 ] || rm -rf "$env"
done
echo "| set | date | versions | tests | wall | |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"
[ "${KEEP:-0}" = 1 ] || rmdir "$WORK" 2>/dev/null || true
