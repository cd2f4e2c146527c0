"""linrope report's provenance (linrope/analysis/report/provenance.py): a section per study naming commits, versions and
machines; runs from more than one commit or torch version are refused unless --allow-mixed, and then named in one
line at the top; runs that predate the record take their study's file, determined after the fact."""

from pathlib import Path

import pytest

from linrope.analysis.report import build_report
from linrope.analysis.report.command import main
from linrope.run import provenance as P
from tests.analysis.helpers import lm_rows, recorded, write_run


def two_runs(tmp_path, first: dict, second) -> Path:
    sweep = tmp_path / "sweep"
    for i, prov in enumerate((first, second)):
        folder = sweep / str(i)
        write_run(
            folder,
            name="linear_rope",
            kind="linear",
            position="rope",
            seed=i + 1,
            rows=lm_rows((3.0 + i, 2.5 + i), 2.4 + i, (1000, 1000)),
        )
        if prov is not None:
            P.write(folder, prov)
    return sweep


def test_runs_from_two_commits_are_refused_in_one_line_and_reported_with_allow_mixed(tmp_path, capsys):
    sweep = two_runs(tmp_path, recorded("a" * 40), recorded("b" * 40))
    with pytest.raises(SystemExit) as e:
        build_report([sweep], tmp_path / "out")
    assert str(e.value) == (
        "linrope report: the runs come from 2 commits (aaaaaaaaaa, bbbbbbbbbb): pass --allow-mixed "
        "to report them together, or report each apart"
    )
    assert not (tmp_path / "out" / "report.md").exists()
    assert main([str(sweep), "--out", str(tmp_path / "out"), "--allow-mixed"]) == 0
    top = "**Mixed provenance: the runs come from 2 commits (aaaaaaaaaa, bbbbbbbbbb).**"
    text = (tmp_path / "out" / "report.md").read_text()
    assert text.splitlines()[0] == top and capsys.readouterr().out.splitlines()[0] == top
    assert "| not recorded | aaaaaaaaaa | 2.13.0+cpu |" in text and "| not recorded | bbbbbbbbbb | 2.13.0+cpu |" in text


def test_runs_of_one_code_from_several_commits_are_one_study_and_two_codes_are_refused(tmp_path):
    """A study that commits each run as it finishes has a commit per run but one code: not mixed; the section
    names the code and its commits.  Two codes are refused, named by their code."""
    one = two_runs(tmp_path / "one", recorded("a" * 40, code="c0de00000001"), recorded("b" * 40, code="c0de00000001"))
    text = build_report([one], tmp_path / "out")
    assert "Mixed" not in text
    assert "| c0de00000001 | aaaaaaaaaa, bbbbbbbbbb | 2.13.0+cpu |" in text
    two = two_runs(tmp_path / "two", recorded("a" * 40, code="c0de00000001"), recorded("a" * 40, code="c0de00000002"))
    with pytest.raises(
        SystemExit,
        match=r"the runs come from 2 versions of the code \(code c0de00000001, "
        r"code c0de00000002\)",
    ):
        build_report([two], tmp_path / "out2")


def test_two_torch_versions_are_mixed_too_and_one_commit_is_not(tmp_path):
    sweep = two_runs(tmp_path, recorded("a" * 40), recorded("a" * 40, torch="2.5.0"))
    with pytest.raises(SystemExit, match=r"2 torch versions \(2.13.0\+cpu, 2.5.0\)"):
        build_report([sweep], tmp_path / "out")
    same = two_runs(tmp_path / "same", recorded("a" * 40), recorded("a" * 40))
    text = build_report([same], tmp_path / "out2")
    assert "Mixed" not in text
    section = text.split("## Provenance\n", 1)[1].split("\n## ", 1)[0]
    assert f"| not recorded | aaaaaaaaaa | 2.13.0+cpu | {P.version_of('lightning')} |" in section
    assert "| Test CPU (2 threads) | 32-true | 2 |" in section


def test_runs_without_their_own_provenance_take_the_studys_file(tmp_path):
    sweep = two_runs(tmp_path, None, None)
    text = build_report([sweep], tmp_path / "out")
    assert "| not recorded | – | – | – | – | – | – | 2 |" in text  # said, not hidden
    study = {**recorded("c" * 40), "determined": "from the history, by hand."}
    P.write(tmp_path / "out2", study)
    text = build_report([sweep], tmp_path / "out2")
    assert "| cccccccccc |" in text and "determined after the fact: from the history, by hand." in text


def test_pairs_from_two_machines_are_named_seed_by_seed():
    """Issue 55: a paired seed whose two runs ran on different machines (or torch versions) is named with both;
    pairs from one machine, and runs without a record, are not."""
    from types import SimpleNamespace as NS

    from linrope.analysis.report.provenance import mixed_pairs

    def on(gpu=None, torch="2.13.0+cpu"):
        machine = {"gpu": gpu, "gpu_driver": "580"} if gpu else {"cpu": "AMD EPYC", "threads": 1}
        return {"machine": machine, "versions": {"torch": torch}}

    gpu = on("NVIDIA H200", "2.11.0+cu130")
    runs = {
        "w128": {
            "a": [NS(seed=1, provenance=gpu), NS(seed=2, provenance=gpu), NS(seed=3, provenance=on())],
            "b": [NS(seed=1, provenance=on()), NS(seed=2, provenance=on()), NS(seed=3, provenance=on())],
            "c": [NS(seed=1, provenance=gpu), NS(seed=2, provenance=None), NS(seed=4, provenance=on())],
        }
    }
    claims = [NS(a="a", b="b"), NS(a="a", b="b"), NS(a="a", b="c")]  # a pair claimed twice is named once
    (text, blank) = mixed_pairs(runs, claims, ["w128"], ["width 128"])
    assert blank == "" and text.startswith("**Pairs from two machines** (1): ")
    assert text.endswith(
        "width 128: a − b, seeds 1, 2 (a on NVIDIA H200, torch 2.11.0+cu130; b on AMD EPYC, torch 2.13.0+cpu)."
    )
    same = {"w128": {"a": runs["w128"]["b"], "b": runs["w128"]["b"]}}
    assert mixed_pairs(same, claims[:1], ["w128"], ["width 128"]) == []
    torch_only = {"w128": {"a": [NS(seed=1, provenance=on(torch="2.11.0"))], "b": [NS(seed=1, provenance=on())]}}
    assert "torch 2.11.0; b on AMD EPYC, torch 2.13.0+cpu" in mixed_pairs(torch_only, claims[:1], ["w128"], ["w"])[0]
    threads = {"w128": {"a": [NS(seed=1, provenance={**on(), "machine": {"cpu": "AMD EPYC", "threads": 2}})],
                        "b": [NS(seed=1, provenance=on())]}}  # fmt: skip
    assert mixed_pairs(threads, claims[:1], ["w128"], ["w"]) == []  # one machine, two thread counts
