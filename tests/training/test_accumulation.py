"""Gradient accumulation (``trainer.accumulate_grad_batches``): each batch of an optimizer step draws its own
dropout masks, and ``trainer.val_check_interval`` counts optimizer steps, as the config says, not batches."""

import lightning as L
import torch
from omegaconf import OmegaConf
from torch.utils.data import DataLoader, TensorDataset

from linrope.training.builders import trainer_arguments
from linrope.training.lit import LanguageModel

MODEL = dict(vocab_size=32, d_model=32, n_layers=1, n_heads=4, d_ff=64, max_len=16, dropout=0.5,
             attention={"kind": "softmax"}, position={"name": "rope"})  # fmt: skip
OPTIM = dict(lr=1e-3, betas=[0.9, 0.95], weight_decay=0.1, warmup_steps=0, min_lr_ratio=0.1)


def masks(accumulate: int, steps: int = 2):
    """The embedding dropout's zeros at every training batch of a short fit."""
    module = LanguageModel(model=MODEL, optim=OPTIM)
    seen = []
    module.model.drop.register_forward_hook(lambda mod, args, out: seen.append(out == 0) if mod.training else None)
    x = torch.randint(0, 32, (8, 16), generator=torch.Generator().manual_seed(0))
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=steps, accumulate_grad_batches=accumulate, accelerator="cpu", logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(module, DataLoader(TensorDataset(x, x), batch_size=2))
    return seen


def test_each_batch_of_a_step_draws_its_own_dropout_masks():
    """The random state was a function of (seed, step, rank) alone: under accumulation every batch of a step
    repeated the first one's masks (correlated noise).  The batch's place in the step now enters it, and a
    step's first batch keeps the seed it had without accumulation (runs without accumulation are unchanged)."""
    two = masks(accumulate=2)
    assert len(two) == 4
    assert not torch.equal(two[0], two[1]) and not torch.equal(two[2], two[3])
    one = masks(accumulate=1)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[2])  # each step's first batch: as before
    assert all(torch.equal(a, b) for a, b in zip(two, masks(accumulate=2)))  # and reproducible


def test_the_validation_interval_counts_optimizer_steps():
    trainer = OmegaConf.create({"val_check_interval": 100, "accumulate_grad_batches": 4, "accelerator": "cpu"})
    assert trainer_arguments(OmegaConf.create({"trainer": trainer}))["val_check_interval"] == 400
    trainer.accumulate_grad_batches = 1
    assert trainer_arguments(OmegaConf.create({"trainer": trainer}))["val_check_interval"] == 100
    trainer.val_check_interval, trainer.accumulate_grad_batches = 0.5, 4  # a fraction of an epoch: as given
    assert trainer_arguments(OmegaConf.create({"trainer": trainer}))["val_check_interval"] == 0.5
