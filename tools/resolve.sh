#!/usr/bin/env bash
# Maintainer's script: do README's install lines resolve on ordinary machines, against the public index?
#
#   tools/resolve.sh            # every check below; one markdown row each (for docs/compat.md); exit 1 if any is wrong
#
# This machine is not an ordinary one: pip here reads a local wheel of torch 2.13.0 (CPU build), a local index and a
# constraints file (pip.conf, PIP_FIND_LINKS). Elsewhere `torch==2.13.0` on Linux is the CUDA build, which pins its own
# triton. So every resolve here switches all of that off (--no-config, PyPI only) and asks for other platforms:
# uv's resolver (`uv pip compile --python-platform`) reads each package's metadata for the named platform and builds
# metadata from an sdist where there is no wheel (antlr4-python3-runtime, which hydra-core needs, is sdist-only, so
# pip's own --platform dry run, which takes wheels only, cannot resolve hydra at all).
#
# Checks (requirement set -> platform -> expected):
#   readme-linux     -e .[dev] + torch==2.13.0 (README's quick start)  x86_64 Linux, Python 3.11    resolves
#   readme-mac       the same                                            arm64 macOS 14, Python 3.11   resolves
#   gpu-linux        -e .[dev,gpu] + torch==2.11.0 (a CUDA machine)     x86_64 Linux, Python 3.12    resolves, triton from torch
#   gpu-floor        -e .[gpu] + torch==2.4.0                            x86_64 Linux, Python 3.11    refused (fla-core needs torch>=2.7)
#   interp-cuda      -e .[dev,interp] + torch==2.13.0 (CUDA build)      x86_64 Linux, Python 3.11    refused (the positive control:
#                    the resolver does see torch's triton pin, which is why the interpreter's pin lives in its own extra)
#   keeps-torch      pip install --dry-run -e .[dev,gpu] in a venv that already has torch (this checkout's .venv)
#                    -> pip installs no torch (a user's CUDA torch is kept)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /tmp/linrope-resolve.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
unset PIP_FIND_LINKS PIP_CONSTRAINT PIP_INDEX_URL PIP_EXTRA_INDEX_URL UV_INDEX_URL UV_EXTRA_INDEX_URL UV_FIND_LINKS
export PIP_CONFIG_FILE=/dev/null UV_NO_CONFIG=1 UV_CACHE_DIR="$WORK/uv-cache"
INDEX=https://pypi.org/simple

echo "resolve: installing uv into $WORK/uv (from PyPI)" >&2
python3 -m venv "$WORK/uv" && "$WORK/uv/bin/pip" install -q --index-url "$INDEX" uv >&2 || { echo "resolve: cannot install uv" >&2; exit 2; }
UV="$WORK/uv/bin/uv"

fail=0
row() { printf '| %s | %s | %s | %s | %s |\n' "$@"; }
echo "| check | requirements | platform | expected | got |"
echo "|---|---|---|---|---|"

# compile NAME EXPECT(ok|refused) PYVER PLATFORM REQ...
compile() {
  local name=$1 expect=$2 py=$3 plat=$4; shift 4
  printf '%s\n' "$@" > "$WORK/$name.in"
  local out="$WORK/$name.txt" got
  if (cd "$ROOT" && MACOSX_DEPLOYMENT_TARGET=14.0 "$UV" pip compile --quiet --index-url "$INDEX" --python-version "$py" \
        --python-platform "$plat" "$WORK/$name.in" -o "$out" 2> "$WORK/$name.err"); then
    got="resolves: $(grep -E '^(torch|triton|fla-core)==' "$out" | tr '\n' ' ')"
    [ "$expect" = ok ] || fail=1
  else
    got="refused: $(grep -m1 -oE 'Because [^,]*' "$WORK/$name.err" | head -c 160)"
    [ "$expect" = refused ] || { fail=1; sed 's/^/    /' "$WORK/$name.err" >&2; }
  fi
  row "$name" "$(echo "$*" | tr '\n' ' ')" "$plat, Python $py" "$expect" "$got"
}

compile readme-linux ok 3.11 x86_64-manylinux_2_28 "-e .[dev]" "torch==2.13.0"
compile readme-mac ok 3.11 aarch64-apple-darwin "-e .[dev]" "torch==2.13.0"
compile gpu-linux ok 3.12 x86_64-manylinux_2_28 "-e .[dev,gpu]" "torch==2.11.0"
compile gpu-floor refused 3.11 x86_64-manylinux_2_28 "-e .[gpu]" "torch==2.4.0"
compile interp-cuda refused 3.11 x86_64-manylinux_2_28 "-e .[dev,interp]" "torch==2.13.0"

# keeps-torch: an environment that already has torch (here this checkout's .venv, torch 2.13.0+cpu standing in for a
# user's CUDA build) asked for the GPU install line: pip must plan no torch.
venv="$ROOT/.venv/bin/python"
if [ -x "$venv" ] && "$venv" -c 'import torch' 2>/dev/null; then
  have=$("$venv" -c 'import torch; print(torch.__version__)')
  if (cd "$ROOT" && "$venv" -m pip install --dry-run --quiet --index-url "$INDEX" --report "$WORK/keep.json" -e '.[dev,gpu]' \
        > /dev/null 2> "$WORK/keep.err"); then
    planned=$("$venv" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(" ".join(sorted(i["metadata"]["name"]+"=="+i["metadata"]["version"] for i in r["install"] if i["metadata"]["name"] in ("torch","triton"))))' "$WORK/keep.json")
    if [ -z "$planned" ]; then got="keeps torch $have"; else got="would install $planned"; fail=1; fi
  else
    got="pip failed: $(tail -n 1 "$WORK/keep.err")"; fail=1
  fi
  row keeps-torch "pip install -e .[dev,gpu] (torch $have installed)" "this machine" "installs no torch" "$got"
else
  echo "resolve: no .venv with torch in $ROOT: keeps-torch not checked (run README's set-up first)" >&2
  fail=1
fi

echo "resolve: $(date -u +%Y-%m-%d), uv $("$UV" --version | cut -d' ' -f2), $([ $fail = 0 ] && echo 'all as expected' || echo 'SOME NOT AS EXPECTED')" >&2
exit $fail
