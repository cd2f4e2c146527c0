"""A sweep's job folders are named by what distinguishes each job (linrope.run.sweep_folders): the values that
differ between its jobs, as linrope study names its job folders (linrope.base.naming.job_names), one folder each,
never nested or outside the sweep folder, never shared."""

import subprocess
import sys
import textwrap

from omegaconf import OmegaConf

from linrope.base.naming import NAME_MAX, job_names, safe_name

# Hydra's multirun with train.py's config (conf/hydra/default.yaml) and a job that trains nothing: the folders
# Hydra makes for each job, in seconds
APP = textwrap.dedent(
    """
    import hydra

    import linrope.studies.train  # noqa: F401 - registers what train.py's config needs, as train.py does
    from linrope.config.command_line import CONF_DIR

    @hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
    def main(cfg):
        pass

    main()
    """
)


def sweep(tmp_path, *overrides):
    """Run ``APP -m overrides`` into ``tmp_path/sweep``: {job folder name: its overrides}."""
    (tmp_path / "app.py").write_text(APP)
    out = tmp_path / "sweep"
    cmd = [sys.executable, str(tmp_path / "app.py"), "-m", *overrides, f"hydra.sweep.dir={out}"]
    cmd.append("~hydra.callbacks.check_jobs")  # the jobs' configs (paths that do not exist) are not what is tested
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.py", "sweep"]  # nothing made beside the sweep
    jobs = {p.parent.parent: p for p in out.rglob(".hydra/overrides.yaml")}
    assert all(folder.parent == out for folder in jobs)  # each job one folder, directly in the sweep folder
    return {folder.name: list(OmegaConf.load(p)) for folder, p in jobs.items()}


def test_sweep_folders_are_named_by_what_varies_and_never_nest(tmp_path):
    """model x data.path: a path's '/' never nests a folder nor leads out of the sweep folder; two paths made
    equal by it stay two folders."""
    models, paths = ["linear", "linear_rope"], ["/data/a/b", "/data/a_b", "../../outside"]
    got = sweep(tmp_path, f"model={','.join(models)}", f"data.path={','.join(paths)}", "seed=1", "size=tiny")
    names = job_names([[f"model={m}", f"data.path={p}"] for m in models for p in paths])
    expected = dict(zip([(m, p) for m in models for p in paths], names))
    assert sorted(got) == sorted(names) and len(got) == 6  # one folder per job
    assert {"linear-path.._.._outside", "linear_rope-path.._.._outside"} <= set(got)
    for name, job in got.items():  # each folder holds the job its name says
        given = dict(o.split("=", 1) for o in job)
        assert name == expected[given["model"], given["data.path"]]


def test_sweep_folders_follow_the_study_convention(tmp_path):
    """An experiment's sweep of model x seed, the command line sweeping both in the other order: each folder holds
    the job its name says, and the names are those linrope study (and linrope sweeps' dry run) give the same jobs."""
    from linrope.studies.sweeps import sweep_jobs

    overrides = ["experiment=pe_compare", "seed=1,2", "model=linear,linear_rope", "size=tiny"]
    got = sweep(tmp_path, *overrides)
    study = job_names(sweep_jobs(overrides))
    assert sorted(got) == sorted(study) == ["seed1-linear", "seed1-linear_rope", "seed2-linear", "seed2-linear_rope"]
    for name, job in got.items():
        seed, model = name.split("-")
        assert f"seed={seed[4:]}" in job and f"model={model}" in job


def test_job_names_are_one_safe_folder_each():
    assert safe_name("..") == "_." and safe_name(".hidden") == "_hidden" and safe_name("") == "job"
    assert safe_name("path/etc/passwd") == "path_etc_passwd"
    long = [[f"data.path=/{'x' * 200}/{i}"] for i in range(3)]
    names = job_names(long)
    assert len(set(names)) == 3 and all(len(n) <= NAME_MAX and "/" not in n for n in names)
    assert names[0].startswith("path_xxx") and names[0][-9] == "-"  # cut, then a hash of the whole value
    assert job_names([["data.path=/a/b"], ["data.path=/a_b"]]) == ["path_a_b-250dbb7a", "path_a_b-ec30a8b6"]
    assert job_names([["seed=1", "model=x"], ["seed=1", "model=x"]]) == ["job-1", "job-2"]  # asked twice: two folders


def test_a_job_no_list_of_the_sweep_holds_is_numbered(tmp_path):
    """A sweeper that picks its jobs as it goes (optuna), or a multirun.yaml of another sweep: the job's number,
    then its values of the sweeper's params."""
    from linrope.run.sweep_folders import job_folder

    (tmp_path / "multirun.yaml").write_text(
        "hydra:\n  sweeper:\n    _target_: hydra._internal.core_plugins.basic_sweeper.BasicSweeper\n"
        "    params: null\n  overrides:\n    task: [seed=1,2]\n"
    )
    root = OmegaConf.create(
        {
            "hydra": {
                "job": {"num": 3},
                "overrides": {"task": ["optim.lr=0.0012", "optim.warmup_steps=30", "model=linear"]},
                "sweep": {"dir": str(tmp_path)},
                "sweeper": {"params": {"optim.lr": "interval(1e-4, 1e-2)", "optim.warmup_steps": "choice(0, 30)"}},
            }
        }
    )
    assert job_folder(_root_=root) == "3-lr0.0012-warmup_steps30"
    (tmp_path / "multirun.yaml").unlink()
    assert job_folder(_root_=root) == "3-lr0.0012-warmup_steps30"
