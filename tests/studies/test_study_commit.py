"""A study part is one commit (linrope.studies.study_git): its compact results are committed as each job
finishes, amending the part's commit while it is the branch's own; a finished run is in git at once, and a
fresh checkout of that commit goes on without the run folders.  Tiny fake studies in temporary git
repositories; nothing trains."""

import json
import shutil
import subprocess

from linrope.analysis import compact
from linrope.studies.study import IGNORE, main
from linrope.studies.study_git import commit_part
from tests.analysis.helpers import fake_run
from tests.studies.helpers import finished_job


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


def repo(path):
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q")
    git(path, "config", "user.name", "t")
    git(path, "config", "user.email", "t@t")
    (path / "README").write_text("a repository\n")
    git(path, "add", "README")
    git(path, "commit", "-q", "-m", "start")
    return path


def finish(part, name, seed, jobs=3):
    """A job finishing as linrope study's driver sees it: its folder, then the compact results and the commit."""
    fake_run(part / name, name.split("-")[0], seed)
    compact.write(part, finished_only=True)
    commit_part(part, jobs)


def subjects(path):
    return git(path, "log", "--format=%s").splitlines()


def test_each_finished_job_amends_the_parts_one_commit(tmp_path):
    r = repo(tmp_path / "r")
    part = r / "results" / "steps8"
    part.mkdir(parents=True)
    (part / ".gitignore").write_text(IGNORE)
    finish(part, "a-seed1", 1)
    assert subjects(r) == ["results/steps8: 1 of 3 jobs finished", "start"]
    fake_run(part / "a-seed2", "a", 2, finished=False)  # still training: not kept, not committed
    finish(part, "b-seed1", 1)
    assert subjects(r) == ["results/steps8: 2 of 3 jobs finished", "start"]  # amended: still one commit
    message = git(r, "log", "-1", "--format=%B")
    assert "a-seed1: test/bpb 3.0375 (0.1 min)" in message and "b-seed1: test/bpb 4.0375 (0.1 min)" in message
    assert message.strip().endswith("Study-part: results/steps8")
    assert git(r, "show", "--name-only", "--format=", "HEAD").split() == [
        "results/steps8/.gitignore",
        "results/steps8/curves.csv",
        "results/steps8/results.csv",
        "results/steps8/runs.json",
    ]
    kept = json.loads(git(r, "show", "HEAD:results/steps8/runs.json"))["runs"]
    assert [k["run"] for k in kept] == ["a-seed1", "b-seed1"]  # every finished run is in the commit at once
    assert not git(r, "status", "--porcelain")


def test_a_commit_that_is_no_longer_the_parts_own_is_never_amended(tmp_path):
    """Another commit on top, a branch (or a merge, a push) holding the part's commit, or another part: a new
    commit starts; the part's commits made before are left as they are."""
    r = repo(tmp_path / "r")
    part, other = r / "steps8", r / "steps16"
    finish(part, "a-seed1", 1)
    (r / "notes").write_text("mine\n")
    git(r, "add", "notes")
    git(r, "commit", "-q", "-m", "a commit of someone else")
    finish(part, "a-seed2", 2)
    assert subjects(r) == [
        "steps8: 2 of 3 jobs finished",
        "a commit of someone else",
        "steps8: 1 of 3 jobs finished",
        "start",
    ]
    git(r, "branch", "merged")  # what a merge into main or a push leaves: another ref holds it
    finish(part, "a-seed3", 3)
    assert subjects(r)[:2] == ["steps8: 3 of 3 jobs finished", "steps8: 2 of 3 jobs finished"]
    finish(part, "b-seed1", 1, jobs=4)  # amends the last one: no other ref holds it
    finish(other, "a-seed1", 1)
    assert subjects(r)[:3] == [
        "steps16: 1 of 3 jobs finished",
        "steps8: 4 of 4 jobs finished",
        "steps8: 2 of 3 jobs finished",
    ]
    assert git(r, "log", "-1", "--format=%s", "merged") == "steps8: 2 of 3 jobs finished\n"


def test_a_fresh_checkout_of_the_parts_commit_goes_on_without_the_run_folders(tmp_path, capsys):
    """A session killed after a job finished: its commit holds the job.  A clone of it has no run folders (and
    no study_job.json): the job is done from its compact record, of the same configuration and code; a
    request of another configuration is told apart as before."""
    r = repo(tmp_path / "r")
    part = r / "s"
    asked = ["model=linear_rope", "size=tiny", "trainer.max_steps=40"]
    finished_job(part / "job", asked, code=_code())
    compact.write(part, finished_only=True)
    (part / ".gitignore").write_text(IGNORE)
    commit_part(part, 1)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(r), str(clone))
    assert not (clone / "s" / "job").exists() and (clone / "s" / "runs.json").is_file()
    assert main([str(clone / "s"), *asked, "--list"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["done", "job"]
    assert main([str(clone / "s"), "model=linear_rope", "size=tiny", "trainer.max_steps=80", "--list"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("differs") and "trainer.max_steps: 40 → 80" in out
    shutil.rmtree(part / "job")  # the same in the checkout the study ran in, once its folders are gone
    assert main([str(part), *asked, "--list"]) == 0
    assert capsys.readouterr().out.split()[:2] == ["done", "job"]


def _code():
    from linrope.studies.study_jobs import current_code

    return current_code().split()[-1]
