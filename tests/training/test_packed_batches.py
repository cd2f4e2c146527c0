"""A language model's batch of three items, (tokens, targets, documents), trains packed documents apart; a batch
of two, the shortcut without resets, is what it was (docs/mathematics.md, "Packed documents")."""

import torch
import torch.nn.functional as F

from linrope.training.lit import LanguageModel
from tests.helpers import gen

MODEL = dict(
    vocab_size=32, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=32,
    attention={"kind": "linear", "impl": "chunk", "chunk_size": 4}, position={"name": "learned"},
)  # fmt: skip


def test_loss_of_a_packed_batch():
    torch.manual_seed(0)
    module = LanguageModel(model=MODEL)
    g = gen("packed-batch")
    x, y = torch.randint(0, 32, (2, 24), generator=g), torch.randint(0, 32, (2, 24), generator=g)
    docs = torch.tensor([[0] * 10 + [1] * 14, [0] * 24])
    packed = module.loss((x, y, docs))
    want = F.cross_entropy(module.model(x, documents=docs).flatten(0, 1), y.flatten())
    assert torch.equal(packed, want)
    assert torch.equal(module.loss((x, y)), F.cross_entropy(module.model(x).flatten(0, 1), y.flatten()))
    assert (packed - module.loss((x, y))).abs().item() > 1e-6  # the documents changed what was computed
