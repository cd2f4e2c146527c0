"""Checkpoints written by main at 4955a32 (tests/fixtures/make_checkpoints.py: real tiny runs of train.py) still
load: through LanguageModel.from_checkpoint, with the logits computed when they were written (float32, to
1e-6: bit for bit on the CPU kind that wrote them; another CPU's matmul kernels round differently, seen up to
7e-8 on an AMD EPYC), and through the identity checks of a resume (ckpt_path=…), which accept the same model and refuse
another."""

from pathlib import Path

import pytest
import torch

DATA = Path(__file__).resolve().parents[1] / "fixtures"
SMALL = ["size=tiny", "context=32", "model.d_model=32", "model.n_heads=2", "model.n_layers=1", "model.d_ff=32"]
RUNS = {
    "linear_rope": ["model=linear_rope"],
    "softmax_t5": ["model=softmax_t5", "model.position.num_buckets=8", "model.position.max_distance=16"],
}
OTHER = {
    "linear_rope": (
        "model.attention.feature_map=cosine",
        "model.attention.feature_map: elu in the checkpoint, cosine now",
    ),
    "softmax_t5": ("model.position.num_buckets=16", "model.position.num_buckets: 8 in the checkpoint, 16 now"),
}


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_checkpoint_of_main_loads_and_computes_what_it_did(name):
    from linrope.training.lit import LanguageModel

    saved = torch.load(DATA / f"main_{name}.logits.pt", weights_only=True)
    module = LanguageModel.from_checkpoint(DATA / f"main_{name}.ckpt")
    with torch.no_grad():
        logits = module(saved["input"])
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, saved["logits"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_a_checkpoint_of_main_passes_the_resume_identity_checks(compose, name):
    from linrope.config.checks import ConfigError, validate
    from linrope.training.lit import LanguageModel

    path = DATA / f"main_{name}.ckpt"
    validate(compose(*RUNS[name], *SMALL, f"ckpt_path={path}"))  # the same model: accepted
    override, difference = OTHER[name]
    with pytest.raises(ConfigError) as e:
        validate(compose(*RUNS[name], *SMALL, f"ckpt_path={path}", override))
    assert str(e.value) == f"ckpt_path={path}: is a checkpoint of another model: {difference}"
    # what the Trainer calls when it resumes: the stored identity and the parameters fit the module's config
    ckpt = torch.load(path, weights_only=True)
    LanguageModel(model=ckpt["hyper_parameters"]["model"]).on_load_checkpoint(ckpt)
    # the identity stored by main is the one today's code derives from the saved model config
    from linrope.models.spec import model_identity

    assert ckpt["linrope_identity"] == model_identity(ckpt["hyper_parameters"]["model"])
