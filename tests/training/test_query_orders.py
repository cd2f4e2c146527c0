"""The accuracy of each example's k-th query (mqar: val/acc_q1 … acc_q<P>, linrope.training.lit): counted from the
targets on a hand-made batch, and logged by a test epoch weighed by the queries each batch scores, only for data
that declares its query orders."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from linrope.data.task_modules import MQARDataModule
from linrope.data.tasks import IGNORE
from linrope.training.lit import LanguageModel, query_order_hits

V = 8  # the vocabulary of the hand-made batches


def rows(answers):
    """(targets, predictions) of rows of 8 positions whose scored positions are 1, 4, 6 (the queries, in order):
    ``answers`` holds per row the truth of each query's prediction (True: right)."""
    targets = torch.full((len(answers), 8), IGNORE)
    pred = torch.zeros(len(answers), 8, dtype=torch.long)
    for r, row in enumerate(answers):
        for at, right, value in zip((1, 4, 6), row, (3, 5, 7)):
            targets[r, at] = value
            pred[r, at] = value if right else (value + 1) % V
    return targets, pred


def test_the_kth_scored_position_of_each_row_is_its_kth_query():
    targets, pred = rows([(True, False, True), (True, True, False), (False, False, True)])
    pred[0, 0] = pred[0, 2] = 7  # predictions where nothing is scored count for nothing
    hits, counts = query_order_hits(pred, targets, 3)
    assert hits.tolist() == [2.0, 1.0, 2.0] and counts.tolist() == [3, 3, 3]
    hits, counts = query_order_hits(pred, targets, 2)  # the third query is beyond the orders asked for
    assert hits.tolist() == [2.0, 1.0] and counts.tolist() == [3, 3]


class Scripted(LanguageModel):
    """A model whose logits are the batch's third tensor, one-hot: the hand-made predictions."""

    def outputs(self, batch):
        x, y, pred = batch
        return torch.nn.functional.one_hot(pred, V).float().flatten(0, 1), y.flatten()


class Data(L.LightningDataModule):
    def __init__(self, batches, query_orders):
        super().__init__()
        self.batches, self.query_orders = batches, query_orders

    def test_dataloader(self):
        data = torch.utils.data.ConcatDataset([TensorDataset(*b) for b in self.batches])
        sizes = [len(b[0]) for b in self.batches]  # batches of unequal size, in order
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        return DataLoader(data, batch_sampler=[list(range(s, s + n)) for s, n in zip(starts, sizes)])


def epoch_metrics(query_orders):
    model = Scripted(model=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, max_len=8, vocab_size=V, task="mqar"))
    # one row: first query right, second wrong; then three rows: first wrong, second right (third always right)
    batches = []
    for answers in ([(True, False, True)], [(False, True, True)] * 3):
        y, pred = rows(answers)
        batches.append((torch.zeros_like(y), y, pred))
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu")
    trainer.test(model, datamodule=Data(batches, query_orders), verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def test_each_order_is_logged_weighed_by_its_queries_across_batches():
    got = epoch_metrics(3)
    # per query over the epoch (not the mean of the two batches' values, 0.5 and 0.5)
    assert got["test/acc_q1"] == 0.25 and got["test/acc_q2"] == 0.75 and got["test/acc_q3"] == 1.0
    assert abs(got["test/acc"] - 8 / 12) < 1e-6
    assert "test/acc_q4" not in got


def test_data_without_query_orders_logs_none():
    got = epoch_metrics(None)
    assert "test/acc" in got and not [k for k in got if "acc_q" in k]


def test_mqar_declares_its_queries_and_other_data_does_not():
    assert MQARDataModule(context=64, num_kv_pairs=4).query_orders == 4
    assert MQARDataModule(context=64, num_kv_pairs=8, num_queries=3).query_orders == 3
    from linrope.data.task_modules import OffsetCopyDataModule

    assert OffsetCopyDataModule(context=64).query_orders is None
