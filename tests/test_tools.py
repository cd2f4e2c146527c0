"""The maintainers' shell tools of tools/ (and .ci/run's slow stage), run here on the CPU with stand-ins for what
they would reach: pip and PyPI, a study, pytest."""

import os
import shutil
import subprocess

from tests.helpers import ROOT

# a stand-in for `python -m pip` (device_wheels.sh's PYTHON): `download`/`wheel` write an empty wheel of the spec,
# `install --target` makes the folders the script looks for; no network
FAKE_PIP = r"""#!/usr/bin/env bash
[[ "$1 $2" == "-m pip" ]] || exit 9
cmd=$3; shift 3
while (( $# )); do
  case $1 in
    -d|-w) dest=$2; shift;;
    --target) target=$2; shift;;
    --python-version|--implementation|--platform) shift;;
    *) spec=$1;;
  esac
  shift
done
case $cmd in
  download|wheel) name=${spec%%==*}; : > "$dest/${name//-/_}-${spec##*==}-py3-none-any.whl";;
  install) for m in hydra omegaconf antlr4 fla einops pytest pluggy iniconfig pygments; do mkdir -p "$target/$m"; done;;
esac
"""


def device_wheels(tmp_path, *args, script=ROOT / "tools" / "device_wheels.sh"):
    pip = tmp_path / "python"
    pip.write_text(FAKE_PIP)
    pip.chmod(0o755)
    env = {**os.environ, "PYTHON": str(pip)}
    return subprocess.run(["bash", str(script), *map(str, args)], capture_output=True, text=True, env=env, timeout=60)


def test_device_wheels_deletes_only_the_wheels_it_fills(tmp_path):
    dest = tmp_path / "wheels"
    dest.mkdir()
    other, old = dest / "torch-2.5.0-cp312-cp312-linux_x86_64.whl", dest / "einops-0.7.0-py3-none-any.whl"
    other.write_bytes(b"not ours")
    old.write_bytes(b"an older einops")
    r = device_wheels(tmp_path, dest)
    assert r.returncode == 1 and other.exists() and old.exists(), r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"device_wheels: {dest} holds wheels this script does not fill ({other.name}): nothing deleted; "
        "give an empty folder"
    ]
    other.unlink()  # only its own packages' wheels there (an older version among them): replaced
    (dest / "Pygments-2.0-py3-none-any.whl").write_bytes(b"")
    r = device_wheels(tmp_path, dest)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        f"{name}-py3-none-any.whl"
        for name in (
            "hydra_core-1.3.8 omegaconf-2.3.1 fla_core-0.6.0 einops-0.8.2 pytest-9.2.0 pluggy-1.7.0 iniconfig-2.3.1 "
            "pygments-2.21.0 antlr4_python3_runtime-4.9.3"
        ).split()
    )


def test_device_wheels_empties_its_own_folder(tmp_path):
    """.whl/ is the script's own: gpu_check.sh installs every wheel there, so a stale one goes."""
    (tmp_path / "repo" / "tools").mkdir(parents=True)
    script = tmp_path / "repo" / "tools" / "device_wheels.sh"
    shutil.copy(ROOT / "tools" / "device_wheels.sh", script)
    stale = tmp_path / "repo" / ".whl" / "torchdiffeq-0.2.5-py3-none-any.whl"
    stale.parent.mkdir()
    stale.write_bytes(b"")
    r = device_wheels(tmp_path, script=script)
    assert r.returncode == 0 and not stale.exists(), r.stdout + r.stderr
    assert len(list(stale.parent.glob("*.whl"))) == 9


# a stand-in for `python` in .ci/run's slow stage: `-m pytest … --collect-only` answers as $COLLECT says, the run
# itself says it ran
FAKE_PYTHON = r"""#!/usr/bin/env bash
if [[ " $* " == *" --collect-only "* ]]; then
  case $COLLECT in
    error) echo "ERROR tests/run/test_slow.py - ImportError: no module named x"; exit 2;;
    none) echo "no tests collected (900 deselected)"; exit 5;;
    two) printf 'tests/run/test_a.py::test_one\ntests/run/test_a.py::test_two\n\n2/902 tests collected\n';;
  esac
else
  echo "ran: $*"
fi
"""


def slow_stage(tmp_path, collect):
    """.ci/run's last stage (after it activates .venv), run alone with the stand-in python first on PATH."""
    text = (ROOT / ".ci" / "run").read_text()
    stage = text[text.index("# the slow tests") :].replace(". .venv/bin/activate\n", "")
    (tmp_path / "python").write_text(FAKE_PYTHON)
    (tmp_path / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "COLLECT": collect}
    return subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + stage], capture_output=True, text=True, env=env, timeout=60
    )


def test_ci_slow_stage_fails_when_collection_fails(tmp_path):
    r = slow_stage(tmp_path, "error")
    assert r.returncode == 1 and "ran:" not in r.stdout, r.stdout + r.stderr
    assert r.stderr.splitlines()[-1] == "ci: collecting the slow tests failed (pytest exit 2)"
    r = slow_stage(tmp_path, "none")  # none collected: nothing to run, no failure
    assert r.returncode == 0 and r.stdout == "ci: no slow tests to run\n", r.stdout + r.stderr
    r = slow_stage(tmp_path, "two")
    assert r.returncode == 0 and r.stdout == "ci: 2 slow tests\nran: -m pytest -m slow -q\n", r.stdout + r.stderr


# a stand-in for `python -m linrope study FOLDER …` (device_studies.sh's PYTHON): the part named `ok` finishes a run,
# `bad` fails, `slow` runs until SIGTERM stops it with the study driver's status then (128 + 15)
FAKE_STUDY = r"""#!/usr/bin/env bash
case $4 in
  ok) mkdir -p ok/run && echo '{}' > ok/run/study_job.json;;
  bad) echo "a job failed"; exit 3;;
  slow) trap 'kill $!; exit 143' TERM; sleep 60 & wait;;
esac
"""


def device_studies(tmp_path, parts, seconds):
    (tmp_path / "repo" / "tools").mkdir(parents=True)  # a copy: the parts' folders are made in its root
    shutil.copy(ROOT / "tools" / "device_studies.sh", tmp_path / "repo" / "tools")
    (tmp_path / "python").write_text(FAKE_STUDY)
    (tmp_path / "python").chmod(0o755)
    (tmp_path / "list").write_text("# parts\n" + "".join(f"{p} --jobs 1\n" for p in parts))
    env = {
        **os.environ,
        "PYTHON": str(tmp_path / "python"),
        "OUT": str(tmp_path / "out"),
        "DEVICE_STUDIES_CPU": "1",
        "DEVICE_STUDIES_POLL": "0.2",
    }
    script = tmp_path / "repo" / "tools" / "device_studies.sh"
    return subprocess.run(
        ["bash", str(script), str(tmp_path / "list"), str(seconds)], capture_output=True, text=True, env=env, timeout=60
    )


def test_device_studies_exits_1_naming_the_parts_that_failed(tmp_path):
    r = device_studies(tmp_path, ["ok", "bad"], 30)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "ok: 1 runs finished; exit 0" in r.stdout.splitlines()
    assert f"bad: 0 runs finished; failed, exit 3 (its log: {tmp_path / 'out' / 'bad.log'})" in r.stdout.splitlines()
    assert r.stderr.splitlines() == ["device_studies: 1 of 2 parts failed: bad"]


def test_device_studies_a_part_stopped_at_the_limit_is_no_failure(tmp_path):
    r = device_studies(tmp_path, ["ok", "slow"], 1)
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    assert "slow: 0 runs finished; stopped after 1 s: resume it with the same line" in r.stdout.splitlines()


def test_compat_refuses_an_unknown_set(tmp_path):
    """A mistyped name would have run the newest set under that label; nothing is made, no Python started."""
    (tmp_path / "python").write_text("#!/bin/sh\necho started >&2\nexit 1\n")
    (tmp_path / "python").chmod(0o755)
    env = {**os.environ, "PY": str(tmp_path / "python"), "WORK": str(tmp_path / "work")}
    r = subprocess.run(
        ["bash", str(ROOT / "tools" / "compat.sh"), "floor", "flor"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 2 and r.stdout == "" and not (tmp_path / "work").exists(), r.stdout + r.stderr
    assert r.stderr == "compat: no set 'flor': the sets are floor and newest\n"
