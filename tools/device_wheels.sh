#!/usr/bin/env bash
# Download the wheels the GPU device machine lacks into .whl/ (git-ignored), for benchmarks/gpu_check.sh,
# which installs them there with pip --no-index (the device machine reaches no package index).
#
#   bash tools/device_wheels.sh            # here, with network to PyPI; then on the device:
#   bash benchmarks/gpu_check.sh --triton  # (the run tool carries .whl/: carry=[".whl"])
#   bash tools/device_wheels.sh DEST       # into the folder DEST instead (gpu_check.sh: GPU_CHECK_WHEEL_DIR=DEST)
#
# The wheels already in the folder are replaced: in .whl/, the script's own folder, all of them (gpu_check.sh installs
# every wheel there, so a stale one would be installed too); in another DEST only those of the packages below, any
# version, and a DEST that holds other wheels is refused, nothing deleted (they are not this script's to delete, and
# gpu_check.sh would install them beside these).
#
# The device has Python 3.12, torch, triton, lightning (and so numpy, PyYAML, tqdm, packaging, fsspec,
# torchmetrics, lightning-utilities), but no hydra-core, omegaconf or fla-core.  What linrope imports when
# train.py, the benchmarks and the tests start (grep '^import\|^from' linrope/, or a sys.modules dump of
# `python train.py model=linear_rope size=tiny`):
#   torch, lightning, numpy, yaml            on the device
#   hydra-core, omegaconf, antlr4 (4.9.*)    here: hydra and omegaconf pin antlr4-python3-runtime==4.9.*
#   einops                                   here (linrope.ops.rope, linrope.models.attention; also fla-core's one dependency)
#   fla-core                                 here: impl=fla and fla's own kernel in the kernel table (imported lazily)
#   pytest, pluggy, iniconfig, pygments      here: the check's `pytest -m gpu` (the device may have no pytest;
#                                            pytest 9 needs packaging>=24, which lightning's install brings)
# Not here, on purpose: torchdiffeq (imported only when a model uses FLOATER; it needs scipy, ~35 MB),
# wandb (logger=none in the check), matplotlib (figures only).
# All of these are pure Python (py3-none-any).  antlr4-python3-runtime 4.9.3 is published only as an sdist:
# its wheel is built here (pure Python, no compiler needed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$ROOT/.whl}"
PY="${PYTHON:-python3}"
LIMIT_MIB=32   # the run tool carries 64 MiB in all (the working tree and carried paths together)

# name==version: the versions the project is tested with (the shared venv; pyproject's pins and ranges)
WHEELS=(hydra-core==1.3.8 omegaconf==2.3.1 fla-core==0.6.0 einops==0.8.2
        pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 pygments==2.21.0)
SDIST_ONLY=(antlr4-python3-runtime==4.9.3)

managed() {  # whether the wheel file $1 is one of a package above (any version): its name before the first "-"
  local dist spec
  dist="$(basename "$1")"; dist="$(echo "${dist%%-*}" | tr 'A-Z.-' 'a-z__')"
  for spec in "${WHEELS[@]}" "${SDIST_ONLY[@]}"; do
    [[ "$dist" == "$(echo "${spec%%==*}" | tr 'A-Z.-' 'a-z__')" ]] && return 0
  done
  return 1
}

mkdir -p "$DEST"
own=0; [[ "$(cd "$DEST" && pwd -P)" == "$(cd "$ROOT" && pwd -P)/.whl" ]] && own=1
others=()
for w in "$DEST"/*.whl; do
  [[ -e "$w" ]] || continue  # no wheel there: the pattern itself
  if (( own )) || managed "$w"; then continue; fi
  others+=("$(basename "$w")")
done
if (( ${#others[@]} )); then
  echo "device_wheels: $DEST holds wheels this script does not fill (${others[*]}): nothing deleted; give an empty folder" >&2
  exit 1
fi
rm -f "$DEST"/*.whl  # only the packages above (or .whl/, the script's own folder)
for spec in "${WHEELS[@]}"; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DEST" "$spec"
done
for spec in "${SDIST_ONLY[@]}"; do
  "$PY" -m pip wheel -q --no-deps -w "$DEST" "$spec"
done

# every wheel must install on any Python 3 (the device's is 3.12): pure Python only
bad=$(cd "$DEST" && ls *.whl | grep -v -- '-py3-none-any\.whl$\|-py2\.py3-none-any\.whl$' || true)
if [[ -n "$bad" ]]; then
  echo "device_wheels: not pure Python (would not install on the device's Python 3.12): $bad" >&2
  exit 1
fi
# they install together without an index (what gpu_check.sh does on the device)
check="$(mktemp -d)"
trap 'rm -rf "$check"' EXIT
"$PY" -m pip install -q --root-user-action=ignore --no-index --no-deps --no-compile --no-cache-dir --target "$check" "$DEST"/*.whl
for mod in hydra omegaconf antlr4 fla einops pytest pluggy iniconfig pygments; do
  [[ -d "$check/$mod" ]] || { echo "device_wheels: $mod missing after installing $DEST/*.whl" >&2; exit 1; }
done

ls -l "$DEST"/*.whl | awk '{printf "%9d  %s\n", $5, $NF}'
total=$(du -cb "$DEST"/*.whl | tail -1 | cut -f1)
echo "device_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $((total / 1024)) KiB in $DEST"
if (( total > LIMIT_MIB * 1024 * 1024 )); then
  echo "device_wheels: $((total / 1048576)) MiB is over ${LIMIT_MIB} MiB: the run tool carries 64 MiB in all" >&2
  exit 1
fi
