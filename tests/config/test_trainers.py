"""The trainer presets (conf/trainer/) and the SLURM launcher do what they say: each composed with Hydra's compose
API and checked key by key; ``trainer.num_nodes`` and ``trainer.matmul_precision`` are accepted and checked;
the dry run of a sweep checks GPU jobs on a machine without a GPU; FSDP is refused where it cannot run.

These tests compose presets as they are (``linrope.studies.sweeps.compose_train``): the ``compose`` fixture pins
``trainer.accelerator=cpu``, which would hide what a preset picks."""

import pytest
import torch

from linrope.studies.sweeps import compose_train
from tests.helpers import CONF

# preset: (accelerator, devices, num_nodes, precision, strategy, matmul_precision)
PRESETS = {
    "default": ("auto", 1, 1, "32-true", "auto", "highest"),
    "cpu": ("cpu", 1, 1, "32-true", "auto", "highest"),
    "gpu": ("gpu", 1, 1, "bf16-mixed", "auto", "high"),
    "ddp": ("auto", 2, 1, "32-true", "ddp", "highest"),
    "ddp_spawn": ("auto", 2, 1, "32-true", "ddp_spawn", "highest"),
    "ddp_gpu": ("gpu", "auto", 1, "bf16-mixed", "ddp", "high"),
    "fsdp": ("gpu", "auto", 1, "bf16-mixed", "fsdp", "high"),
}


def test_every_trainer_preset_is_in_the_table():
    assert sorted(p.stem for p in (CONF / "trainer").glob("*.yaml")) == sorted(PRESETS)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_trainer_preset_composes_to_what_it_says(preset):
    from linrope.config.checks import strategy_name, validate

    cfg = compose_train([f"trainer={preset}"])
    t = cfg.trainer
    got = (t.accelerator, t.devices, t.num_nodes, t.precision, strategy_name(t.strategy), t.matmul_precision)
    assert got == PRESETS[preset]
    validate(cfg, hardware=False)  # the config alone is sound, whatever this machine has
    two_nodes = compose_train([f"trainer={preset}", "trainer.num_nodes=2"])
    assert two_nodes.trainer.num_nodes == 2
    validate(two_nodes, hardware=False)


def test_fsdp_preset_is_lightnings_fsdp_strategy_writing_whole_checkpoints():
    import hydra
    from lightning.pytorch.strategies import FSDPStrategy

    from linrope.config.checks import sharded_checkpoints

    cfg = compose_train(["trainer=fsdp"])
    strategy = hydra.utils.instantiate(cfg.trainer.strategy)  # the object builds on a CPU; the Trainer refuses it
    assert type(strategy) is FSDPStrategy and strategy._state_dict_type == "full"
    assert not sharded_checkpoints(cfg.trainer.strategy)  # so build_trainer gives it AtomicCheckpointIO
    assert sharded_checkpoints(
        compose_train(["trainer=fsdp", "trainer.strategy.state_dict_type=sharded"]).trainer.strategy
    )


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["trainer=fsdp", "trainer.accelerator=cpu"],
            "trainer.strategy=fsdp needs GPUs (trainer.accelerator=gpu), not cpu",
        ),
        (["trainer=fsdp", "trainer.strategy.state_dict_type=sharded"], "state_dict_type=sharded: linrope resumes"),
        (
            ["trainer.matmul_precision=fast"],
            "trainer.matmul_precision=fast: expected one of highest, high, medium, null",
        ),
        (["trainer.num_nodes=0"], "trainer.num_nodes=0: expected an integer >= 1"),
    ],
)
def test_trainer_config_refusals_are_one_line(overrides, message):
    from linrope.config.checks import ConfigError, validate

    with pytest.raises(ConfigError) as e:
        validate(compose_train(overrides), hardware=False)
    assert "\n" not in str(e.value) and message in str(e.value), str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what a machine without a GPU refuses")
def test_a_gpu_preset_is_refused_here_but_its_sweep_checks(capsys):
    """On this machine (no CUDA) a run of trainer=gpu is refused before anything is built; the dry run of a
    sweep of such jobs checks their configs and refuses none of them for want of a local GPU."""
    from linrope.config.checks import ConfigError, validate
    from linrope.studies import sweeps

    for preset in ("gpu", "ddp_gpu", "fsdp"):
        with pytest.raises(ConfigError, match="this machine has no CUDA GPU"):
            validate(compose_train([f"trainer={preset}", "size=tiny"]))
    results = sweeps.check_jobs(["trainer=gpu,ddp_gpu,fsdp", "size=tiny", "seed=1,2"], local=False)  # SLURM's srun
    assert len(results) == 6 and [err for _, err in results] == [None] * 6
    # launched here one after another, the strategies that re-run train.py are refused (each would run the sweep)
    results = sweeps.check_jobs(["trainer=gpu,ddp_gpu,fsdp", "size=tiny"])
    assert ["in a sweep (-m)" in (err or "") for _, err in results] == [False, True, True]
    slurm = sweeps.check_jobs(["trainer=gpu,ddp_gpu,fsdp", "size=tiny", "hydra/launcher=submitit_slurm"])
    assert [err for _, err in slurm] == [None] * 3  # the composed launcher says srun starts the processes
    assert sweeps.main(["trainer=gpu", "trainer.num_nodes=2", "size=tiny", "seed=1,2"]) == 0
    assert capsys.readouterr().out.strip().endswith("2 jobs, 0 refused")
    # a config problem of such a job is still found
    results = sweeps.check_jobs(["trainer=fsdp", "trainer.accelerator=cpu,gpu", "size=tiny"])
    assert ["needs GPUs" in (err or "") for _, err in results] == [True, False]


def test_num_nodes_passes_the_command_line_checks_and_a_typo_is_one_line():
    from linrope.config.command_line import check_command_line

    for preset in sorted(PRESETS):
        check_command_line([f"trainer={preset}", "trainer.num_nodes=2", "trainer.matmul_precision=high"])
    with pytest.raises(SystemExit) as e:
        check_command_line(["trainer=ddp_gpu", "trainer.num_node=2"])
    assert str(e.value) == "linrope: trainer.num_node: unknown option; did you mean num_nodes?"


def test_linrope_trainer_keys_are_known_to_the_option_check_and_kept_from_lightning(monkeypatch):
    """``matmul_precision`` is linrope's: the option check takes it, the Trainer never sees it; ``auto`` is
    resolved by linrope (CUDA, else the CPU: never MPS unless asked)."""
    from linrope.config import checks as C
    from linrope.training.builders import trainer_arguments

    cfg = compose_train(["paths.output_dir=/tmp/x"])
    assert C.trainer_option_errors(cfg.trainer._target_, list(cfg.trainer)) == []
    assert C.trainer_option_errors(cfg.trainer._target_, ["matmul_precison"]) == [
        "trainer.matmul_precison: unknown option; did you mean matmul_precision?"
    ]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = trainer_arguments(cfg)
    assert "matmul_precision" not in args and args["accelerator"] == "cpu" and args["num_nodes"] == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert trainer_arguments(cfg)["accelerator"] == "gpu"
    assert (
        trainer_arguments(compose_train(["paths.output_dir=/tmp/x", "trainer.accelerator=mps"]))["accelerator"] == "mps"
    )


def test_matmul_precision_is_applied_before_fit_and_in_every_process(compose):
    from linrope.run.checkpoint import AtomicCheckpointIO
    from linrope.run.signals import MatmulPrecision
    from linrope.training.builders import build_callbacks, build_trainer

    before = torch.get_float32_matmul_precision()
    try:
        cfg = compose("size=tiny", "logger=none", "trainer.matmul_precision=medium")
        callbacks = build_callbacks(cfg)
        torch.set_float32_matmul_precision("highest")
        trainer = build_trainer(cfg, callbacks, [])
        assert torch.get_float32_matmul_precision() == "medium"  # in this process, before fit
        assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
        assert type(trainer.accelerator).__name__ == "CPUAccelerator"
        hook = [c for c in callbacks if isinstance(c, MatmulPrecision)]
        torch.set_float32_matmul_precision("highest")  # a process started by ddp_spawn begins with the default
        hook[0].setup(trainer, None, "fit")
        assert len(hook) == 1 and torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)


def test_slurm_launcher_follows_the_trainer():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    import hydra

    cfg = compose_train(
        ["hydra/launcher=submitit_slurm", "trainer=ddp_gpu", "trainer.devices=4", "trainer.num_nodes=2"],
        hydra_config=True,
    )
    params = hydra.utils.instantiate(cfg.hydra.launcher).params  # what the plugin hands submitit
    assert (params["nodes"], params["tasks_per_node"], params["gpus_per_node"]) == (2, 4, 4)
    assert params["timeout_min"] == 240 and params["signal_delay_s"] == 120 and params["max_num_timeout"] == 0
    one = compose_train(
        ["hydra/launcher=submitit_slurm", "trainer=gpu", "hydra.launcher.timeout_min=60", "hydra.launcher.partition=p"],
        hydra_config=True,
    ).hydra.launcher
    assert (one.nodes, one.tasks_per_node, one.gpus_per_node, one.timeout_min, one.partition) == (1, 1, 1, 60, "p")


def test_slurm_counts_that_are_no_numbers_are_one_line_before_launch():
    from linrope.config.command_line import check_command_line, launcher_errors

    base = ["-m", "hydra/launcher=submitit_slurm", "seed=1,2"]
    assert launcher_errors([*base, "trainer=ddp_gpu", "trainer.devices=4", "trainer.num_nodes=2"]) == []
    assert launcher_errors(["-m", "trainer=ddp_gpu"]) == []  # another launcher: nothing to check
    with pytest.raises(SystemExit) as e:
        check_command_line([*base, "trainer=ddp_gpu"])
    assert str(e.value) == (
        "linrope: hydra.launcher.tasks_per_node, gpus_per_node follow trainer.devices=auto: "
        "SLURM needs a number >= 1; pass trainer.devices=<a number>"
    )
    assert launcher_errors([*base, "hydra.launcher.nodes=0"]) == ["hydra.launcher.nodes=0: SLURM needs a number >= 1"]


def test_a_checkpoint_whose_weights_the_strategy_loaded_is_still_checked_for_identity():
    """Under FSDP, Lightning's strategy loads the weights itself and takes ``state_dict`` out of the dict it
    hands on_load_checkpoint: the model's identity is still compared, the parameters are not."""
    from linrope.base.errors import CheckpointMismatch
    from linrope.models.spec import IDENTITY_KEY, model_identity
    from linrope.training.lit import LanguageModel

    cfg = compose_train(["size=tiny"])
    from linrope.config.checks import plain

    model_cfg = plain(cfg.model)
    module = LanguageModel(model=model_cfg)
    module.on_load_checkpoint({IDENTITY_KEY: model_identity(model_cfg)})  # no state_dict: nothing else to compare
    other = {**model_cfg, "position": {**model_cfg["position"], "name": "none"}}
    with pytest.raises(CheckpointMismatch, match="another model"):
        module.on_load_checkpoint({IDENTITY_KEY: model_identity(other)})


def test_a_search_the_dry_run_cannot_list_is_one_line():
    """hparams_search=optuna samples its jobs as it runs (interval ranges): the dry run said so in a 30-line
    HydraException traceback; now in one line naming what to run instead."""
    from linrope.studies import sweeps

    with pytest.raises(SystemExit) as e:
        sweeps.main(["hparams_search=optuna", "size=tiny"])
    message = str(e.value.code)
    assert message.startswith("linrope sweeps: BasicSweeper does not support sweep type") and "\n" not in message
    assert message.endswith("python train.py -m <the same overrides> runs the search")
