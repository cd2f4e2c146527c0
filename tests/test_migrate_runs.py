"""Run folders saved before linrope's folders became its layers are migrated once, by a tool
(tools/migrate_runs.py), not by an import hook: the tool rewrites a saved ``_target_``'s old path, names what it
cannot map, and leaves everything else of a file as it was; no committed record names code that does not exist."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT

_spec = importlib.util.spec_from_file_location("migrate_runs", ROOT / "tools" / "migrate_runs.py")
migrate_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(migrate_runs)

OLD = "linrope.movement.PositionMovement"
NEW = "linrope.training.movement.PositionMovement"
CONFIG = f"""callbacks:
  position_movement:
    _target_: {OLD}
    dirpath: ${{paths.output_dir}}
  last:
    _target_: linrope.run.last_checkpoint.LastCheckpoint
model:
  name: linear_rope   # a comment the rewrite keeps
"""


def old_run(folder):
    """A run folder and a study's compact record as saved before the move."""
    (folder / "run" / ".hydra").mkdir(parents=True)
    (folder / "run" / ".hydra" / "config.yaml").write_text(CONFIG)
    (folder / "run" / "provenance.json").write_text(json.dumps({"command": "python train.py"}))
    runs = {"format": "linrope.runs/1", "runs": [{"config": {"callbacks": {"m": {"_target_": OLD}}}}]}
    (folder / "runs.json").write_text(json.dumps(runs, indent=1) + "\n")
    return folder


def tool(*args):
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "migrate_runs.py"), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_old_paths_in_a_copied_folder_become_the_new_ones(tmp_path):
    folder = old_run(tmp_path)
    before = (folder / "run" / "provenance.json").read_bytes()
    r = tool(folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (folder / "run" / ".hydra" / "config.yaml").read_text() == CONFIG.replace(OLD, NEW)  # only the path
    runs = (folder / "runs.json").read_text()
    assert NEW in runs and OLD not in runs and '"format": "linrope.runs/1"' in runs  # a format tag is no path
    assert (folder / "run" / "provenance.json").read_bytes() == before
    assert sorted(r.stdout.splitlines()) == [
        f"{folder / 'run' / '.hydra' / 'config.yaml'}: rewrote 1 path(s): {OLD} -> {NEW}",
        f"{folder / 'runs.json'}: rewrote 1 path(s): {OLD} -> {NEW}",
    ]
    again = tool(folder)  # nothing left to do
    assert again.returncode == 0 and again.stdout == "", again.stdout


def test_check_says_what_would_change_and_writes_nothing(tmp_path):
    folder = old_run(tmp_path)
    r = tool("--check", folder)
    assert r.returncode == 1 and r.stdout.count("would rewrite 1 path(s)") == 2, r.stdout
    assert (folder / "run" / ".hydra" / "config.yaml").read_text() == CONFIG


def test_an_unknown_linrope_name_is_reported_and_left(tmp_path):
    saved = tmp_path / "config.yaml"
    text = "a:\n  _target_: linrope.nowhere.Thing\nb:\n  _target_: linrope.training.movement.NoSuchClass\n"
    saved.write_text(text)
    r = tool(tmp_path)
    assert r.returncode == 1 and saved.read_text() == text
    assert r.stdout.splitlines() == [
        f"{saved}: _target_ {name}: no such module or name in linrope today, and not an old path: left as it is"
        for name in ("linrope.nowhere.Thing", "linrope.training.movement.NoSuchClass")
    ]


def test_a_checkpoint_is_named_never_rewritten(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    data = b"PK\x03\x04...\x8c!" + OLD.encode() + b"\x94..."  # the bytes a pickled string leaves
    ckpt.write_bytes(data)
    r = tool(tmp_path)
    assert r.returncode == 0 and ckpt.read_bytes() == data
    assert (
        r.stdout.strip()
        == f"{ckpt}: a checkpoint naming old paths (linrope.movement): left as it is (module docstring)"
    )


def test_the_old_and_new_names_of_the_table():
    assert migrate_runs.current_name(OLD) == NEW
    assert migrate_runs.current_name("linrope.training.build_module") == "linrope.training.builders.build_module"
    assert migrate_runs.current_name("linrope.training.lit.LanguageModel") == "linrope.training.lit.LanguageModel"
    assert migrate_runs.current_name("linrope.config.validate") == "linrope.config.checks.validate"
    assert migrate_runs.current_name("lightning.pytorch.Trainer") == "lightning.pytorch.Trainer"
    for old, new in migrate_runs.MOVED.items():
        assert migrate_runs.exists(new), new
        assert not migrate_runs.exists(old), f"{old} exists again: take it out of the table"


def committed_targets():
    """Every ``_target_`` of the committed records (run configs, a study's runs.json, fixtures): {name: files}."""
    files = subprocess.run(
        ["git", "ls-files", "docs/results", "tests/fixtures"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    if not files:
        pytest.skip("not a git checkout")
    found = {}
    for f in files:
        if f.endswith(migrate_runs.SAVED):
            for m in migrate_runs.TARGET.finditer((ROOT / f).read_text()):
                found.setdefault(m.group("name"), set()).add(f)
    return found


@pytest.mark.results  # committed study data: CI's results stage
def test_no_committed_record_names_code_that_does_not_exist():
    """What the import hook was for cannot come back: every ``_target_`` docs/results and tests/fixtures hold names a
    module of linrope, or a name one defines, as it is today (else: python tools/migrate_runs.py FOLDER)."""
    found = committed_targets()
    assert NEW in found  # the runs.json files migrated once
    assert {name: sorted(f) for name, f in found.items() if not migrate_runs.exists(name)} == {}


def test_line_endings_are_kept_byte_for_byte(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_bytes(CONFIG.replace("\n", "\r\n").encode())
    r = tool(tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert saved.read_bytes() == CONFIG.replace(OLD, NEW).replace("\n", "\r\n").encode()


def linked(tmp_path):
    """A folder whose config.yaml and other/ are symbolic links to an old config and its folder outside it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.yaml").write_text(CONFIG)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "config.yaml").symlink_to(outside / "config.yaml")
    (folder / "other").symlink_to(outside)
    return folder, outside


def test_a_symbolic_link_in_a_folder_is_skipped_saying_so(tmp_path):
    """Never followed: its target may lie outside the folder."""
    folder, outside = linked(tmp_path)
    r = tool(folder)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines() == [
        f"{folder / 'config.yaml'}: skipped: a symbolic link",
        f"{folder / 'other'}: skipped: a symbolic link",
    ]
    assert (folder / "config.yaml").is_symlink() and (outside / "config.yaml").read_text() == CONFIG


def test_a_symbolic_link_named_is_refused(tmp_path):
    """Rewriting it would replace the link by a copy of its target, rewritten."""
    folder, outside = linked(tmp_path)
    r = tool(folder / "config.yaml")
    assert r.returncode == 2 and (folder / "config.yaml").is_symlink(), r.stdout + r.stderr
    assert r.stderr.splitlines() == [
        f"migrate_runs: {folder / 'config.yaml'} (to {outside / 'config.yaml'}): a symbolic link: "
        "name the file or folder it points to"
    ]
    assert (outside / "config.yaml").read_text() == CONFIG


def test_only_a_target_key_is_rewritten():
    kept = (
        "my_target_: linrope.runs.x\n"
        'note: "_target_: linrope.runs.x"\n'
        'json: {"note": "_target_: linrope.runs.x", "a_target_": "linrope.runs.x"}\n'
        "prose: the _target_: linrope.runs.x of a report\n"
    )
    assert migrate_runs.migrate_text(kept)[0] == kept
    keys = (
        "_target_: linrope.runs.x\n"
        "a:\n  - _target_: linrope.runs.x\n"
        "  - '_target_': 'linrope.runs.x'\n"
        '  "_target_": "linrope.runs.x"\n'
        '{"a": 1, "_target_": "linrope.runs.x"}\n'
    )
    new, changed, _ = migrate_runs.migrate_text(keys)
    assert new == keys.replace("linrope.runs.x", "linrope.analysis.runs.x") and len(changed) == 5
