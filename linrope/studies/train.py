"""Train and test one model: ``python -m linrope train model=linear_rope`` (``linrope-train``; in a checkout also
``python train.py ...``; sweeps: ``-m``).

Reads like a table of contents: check the config, seed, build data / model / callbacks /
loggers / trainer, fit, test the best checkpoint (``train=false``: the ``ckpt_path`` given), return
the metric a sweeper optimises. ``--help`` lists the config groups and their options; ``--config-dir DIR``
adds a folder of the user's own presets and experiments (docs/package.md).  In the studies layer because it calls
every layer below: the training builders, then the extrapolation table of ``linrope.evaluation`` after the test.
Runnable as ``python -m linrope.studies.train``: the program Lightning's ``trainer=ddp`` starts once per further
process (``linrope.__main__`` makes this module the one it restarts)."""

import sys
from typing import Optional

import hydra
from omegaconf import DictConfig

from linrope.config.command_line import CONF_DIR
from linrope.run import sweep_folders, tidy  # noqa: F401 - sweep_folders: ${linrope.job_folder:} of conf/hydra/

tidy.filter_warnings()  # also in the processes trainer=ddp_spawn and submitit start, which import this module


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="train")
def main(cfg: DictConfig) -> Optional[float]:
    from linrope.config.checks import sweep_dir, validate
    from linrope.run.exit import one_line_errors
    from linrope.run.folder import claim_run_folder, other_process_of_a_run, resume_begins
    from linrope.training.builders import name_model, test_checkpoint

    tidy.quiet_logging()
    with tidy.no_folder_on_refusal(), one_line_errors(sweep=sweep_dir() is not None):
        validate(cfg)  # one-line errors before any data is read or model built
        tested = test_checkpoint(cfg)
        name_model(cfg)  # model.name follows attention=... position=... chosen on the command line
        claim_run_folder(cfg)  # a second run into this folder, or one that would overwrite it, is refused
        if cfg.get("retain_freed_memory", True):
            from linrope.base.memory import retain_freed_memory

            retain_freed_memory()
        from lightning import seed_everything

        from linrope.training import builders as T
        from linrope.training.after_training import explain_stop, job_overrides, validation_warning, where_next
        from linrope.training.plan import apply_plan

        seed_everything(cfg.seed, workers=True)
        datamodule = T.build_datamodule(cfg)
        module = T.build_module(cfg)
        # the checkpoint fits: refused before anything is written into the run folder
        T.check_resume(cfg, module, datamodule)
        # from here a resume changes the run (before: a refusal puts back the earlier .hydra/)
        resume_begins(cfg.paths.output_dir)
        provenance = T.record_provenance(cfg, datamodule)  # provenance.json; a resume prints what it changes
        # plan: trainer.max_steps from the model's size unless given; the hours it will take (printed)
        apply_plan(cfg, module, overrides=job_overrides())
        warning = validation_warning(cfg)  # max_steps below the validation interval: said now, not found in the report
        if warning and not other_process_of_a_run():
            print(f"linrope: {warning}", file=sys.stderr, flush=True)
        callbacks = T.build_callbacks(cfg)
        loggers = T.build_loggers(cfg)
        trainer = T.build_trainer(cfg, callbacks, loggers)
        T.log_config(cfg, module, loggers, provenance)

        metric, scored = None, None
        if cfg.train:
            trainer.fit(module, datamodule=datamodule, ckpt_path=T.resolve_ckpt(cfg))
            metric = T.metric(trainer, cfg.optimized_metric)
        with explain_stop(cfg, trainer) as progress:  # a signal now: one line, what is left and how to finish it
            if cfg.test:
                scored = T.best_ckpt(trainer) if cfg.train else tested
                trainer.test(module, datamodule=datamodule, ckpt_path=scored)
                from linrope.evaluation.evaluate import extrapolate_after_test

                extrapolate_after_test(cfg, trainer, module, datamodule, loggers)  # if extrapolation.enabled
            progress.completed()  # a signal now: one line saying where the results are; the run ends as it would
            T.finish(loggers)
        if trainer.is_global_zero:  # where the results are and what to run next
            print("\n".join(where_next(cfg, trainer, scored)), flush=True)
        return metric


def run() -> None:
    """The train command (``python -m linrope train``, ``linrope-train``, ``python train.py``)."""
    from linrope.config.command_line import answer_help, check_command_line

    answer_help("train")  # what the command does, its main options and groups; no config dump
    check_command_line()  # model=nope: one line naming the options, before Hydra's longer message
    main()


if __name__ == "__main__":
    run()
