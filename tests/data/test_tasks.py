"""The synthetic tasks: generators right on hand-checked examples and deterministic per seed; data
modules resume and evaluate as ByteDataModule does; a task sets the model's mode; each trains."""

import math

import pytest
import torch
import torch.nn.functional as F

from linrope.data.tasks import (
    CLOSE,
    IGNORE,
    MQAR,
    OPEN,
    PAD,
    ListOps,
    OffsetCopy,
    apply_op,
    example_rng,
    listops_eval,
    listops_text,
    listops_tokenize,
    mqar_assemble,
    offset_copy_assemble,
)

TASK_TINY = [
    "size=tiny",
    "logger=none",
    "trainer.enable_progress_bar=false",
    "data.val_examples=4",
    "data.test_examples=4",
    "data.batch_size=4",
    "data.eval_batch_size=4",
]


def same(a, b):
    return all(torch.equal(x, y) for x, y in zip(a, b))


# ---- MQAR ------------------------------------------------------------------------------------------------------
def test_mqar_assemble_by_hand():
    # pairs (3 -> 70), (1 -> 66); query pair 1 (key 1) at slot 0, pair 0 (key 3) at slot 2
    x, y = mqar_assemble(keys=[3, 1], values=[70, 66], asked=[1, 0], slots=[0, 2], context=11)
    assert x.tolist() == [3, 70, 1, 66, 1, 66, 0, 0, 3, 70, 0]
    assert y.tolist() == [IGNORE] * 4 + [66] + [IGNORE] * 3 + [70] + [IGNORE] * 2


def test_mqar_answers_are_the_values_bound_to_the_queried_keys():
    task = MQAR(num_kv_pairs=6, num_queries=4, key_vocab=20, value_vocab=30)
    assert task.vocab_size == 51
    for i in range(20):
        x, y = task.sample(example_rng(7, 0, i), 40)
        assert x.shape == y.shape == (40,)
        keys, values = x[0:12:2].tolist(), x[1:12:2].tolist()
        assert len(set(keys)) == 6 and all(1 <= k <= 20 for k in keys) and all(21 <= v <= 50 for v in values)
        scored = (y != IGNORE).nonzero().flatten().tolist()
        assert len(scored) == 4 and all(p >= 12 for p in scored)
        for p in scored:
            assert y[p] == values[keys.index(int(x[p]))]
            assert x[p + 1] == y[p] if p + 1 < 40 else True  # the value follows its query (teacher forcing)
        assert len({int(x[p]) for p in scored}) == 4  # distinct keys queried


def test_mqar_is_deterministic_per_seed_and_index():
    task = MQAR()
    assert same(task.sample(example_rng(1, 0, 5), 64), task.sample(example_rng(1, 0, 5), 64))
    assert not same(task.sample(example_rng(1, 0, 5), 64), task.sample(example_rng(2, 0, 5), 64))
    assert not same(task.sample(example_rng(1, 0, 5), 64), task.sample(example_rng(1, 0, 6), 64))
    with pytest.raises(ValueError, match="too short"):
        task.sample(example_rng(1, 0, 0), 20)


# ---- offset copy -----------------------------------------------------------------------------------------------
def test_offset_copy_assemble_by_hand():
    x, y = offset_copy_assemble([5, 1, 4, 1, 5, 9, 2, 6], 3)
    assert x.tolist() == [5, 1, 4, 1, 5, 9, 2, 6]
    assert y.tolist() == [IGNORE] * 3 + [5, 1, 4, 1, 5]
    x, y = offset_copy_assemble([5, 1, 4, 1, 5, 9, 2, 6], 2, marker=70)  # the marker is never a target
    assert x.tolist() == [70, 1, 4, 1, 5, 9, 2, 6]
    assert y.tolist() == [IGNORE] * 3 + [1, 4, 1, 5, 9]


@pytest.mark.parametrize("max_offset", [None, 12])
def test_offset_copy_targets_are_the_token_d_back(max_offset):
    task = OffsetCopy(n_symbols=10, offset=4, max_offset=max_offset)
    seen = set()
    for i in range(30):
        x, y = task.sample(example_rng(3, 0, i), 50)
        d = 4 if max_offset is None else int(x[0]) - 10 + 4
        seen.add(d)
        scored = (y != IGNORE).nonzero().flatten()
        assert len(scored) == 50 - d - (max_offset is not None)
        assert all(y[p] == x[p - d] for p in scored.tolist())
        assert int(y[scored].max()) < 10  # targets are symbols, not markers
    assert seen == {4} if max_offset is None else len(seen) > 3
    assert task.vocab_size == (10 if max_offset is None else 19)


# ---- ListOps ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,value",
    [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[SM 3 [MED 1 5 8 2 ] 7 ]", 3),  # MED(1,5,8,2) = (2+5)//2 = 3; (3+3+7) mod 10 = 3
        ("[MED 4 [MAX 1 8 ] [MIN 6 2 5 ] 3 0 ]", 3),  # MED(4,8,2,3,0) = 3
        ("[MIN [SM 9 9 ] [MAX 0 [MED 7 7 1 ] ] ]", 7),  # SM = 8, MED = 7, MAX = 7, MIN(8, 7) = 7
    ],
)
def test_listops_expressions_by_hand(text, value):
    tokens = listops_tokenize(text)
    assert listops_eval(tokens) == value
    assert listops_eval(tokens + [PAD] * 5) == value
    assert listops_text(tokens) == text


def test_listops_tokens_and_operators():
    assert listops_tokenize("[MAX 2 0 ]") == [OPEN, 13, 3, 1, CLOSE]
    assert (apply_op("MED", [1, 9]), apply_op("MED", [5, 1, 3]), apply_op("SM", [9, 9, 9])) == (5, 3, 7)
    for bad in ("[MAX 2 9", "[MAX 2 9 ] ]", "2 3", "[ 2 3 ]", "[MAX ]"):
        with pytest.raises(ValueError):
            listops_eval(listops_tokenize(bad))


def nesting(tokens):
    depth = deepest = 0
    for t in tokens.tolist():
        depth += (t == OPEN) - (t == CLOSE)
        deepest = max(deepest, depth)
    return deepest


def test_listops_samples_are_valid_within_limits_and_deterministic():
    task = ListOps(max_depth=3, max_args=5)
    labels = []
    for i in range(60):
        x, label, mask = task.sample(example_rng(1, 0, i), 100)
        n = int(mask.sum())
        assert x.shape == (100,) and mask[:n].all() and not mask[n:].any() and (x[n:] == PAD).all()
        assert 25 <= n <= 100  # context // 4 ... context
        assert x[0] == OPEN and nesting(x) <= 3
        assert listops_eval(x) == int(label)
        labels.append(int(label))
    assert len(set(labels)) >= 5
    assert same(task.sample(example_rng(1, 0, 9), 100), task.sample(example_rng(1, 0, 9), 100))


# ---- data modules ----------------------------------------------------------------------------------------------
def test_training_examples_are_a_pure_function_of_seed_and_index():
    from linrope.data.task_modules import TaskExamples

    task = MQAR()
    resumed = TaskExamples(task, 64, seed=5, stream=0, length=10, start=7)
    fresh = TaskExamples(task, 64, seed=5, stream=0, length=20)
    assert all(same(resumed[i], fresh[7 + i]) for i in range(10))


def test_training_loader_resumes_where_the_run_stands():
    from types import SimpleNamespace

    from linrope.data.task_modules import MQARDataModule

    dm = MQARDataModule(context=64, batch_size=4, seed=3)
    dm.trainer = SimpleNamespace(max_steps=10, global_step=6, accumulate_grad_batches=2, world_size=1)
    ds = dm.train_dataloader().dataset
    assert ds.start == 6 * 8 and ds.seed == 3 and ds.context == 64
    fresh = MQARDataModule(context=64, batch_size=4, seed=3)
    fresh.trainer = SimpleNamespace(max_steps=10, global_step=0, accumulate_grad_batches=2, world_size=1)
    assert same(ds[0], fresh.train_dataloader().dataset[48])


def test_eval_sets_are_fixed_across_seeds_and_given_at_any_length():
    from linrope.data.task_modules import ListOpsDataModule, OffsetCopyDataModule

    a = OffsetCopyDataModule(context=64, seed=1, val_examples=5, test_examples=6)
    b = OffsetCopyDataModule(context=64, seed=2, val_examples=5, test_examples=6)
    assert len(a.eval_dataset("val")) == 5
    assert all(same(a.eval_dataset("val")[i], b.eval_dataset("val")[i]) for i in range(5))
    assert a.eval_dataset("test")[0][0].shape == (256,)  # test_factor 4 by default
    assert a.eval_dataset("val", context=512, max_windows=2)[1][0].shape == (512,)
    assert not same(a.eval_dataset("val")[0], a.eval_dataset("test", context=64)[0])
    lo = ListOpsDataModule(context=64, val_examples=3)
    x, y, mask = next(iter(lo.val_dataloader()))
    assert x.shape == (3, 64) and y.shape == (3,) and mask.dtype == torch.bool


@pytest.mark.parametrize(
    "task,expected",
    [
        ("mqar", dict(vocab_size=129, causal=True, n_classes=None)),
        ("offset_copy", dict(vocab_size=64, causal=True, n_classes=None, max_len=256)),
        ("listops", dict(vocab_size=17, causal=False, n_classes=10)),
    ],
)
def test_the_task_sets_the_model(compose, task, expected):
    from linrope.training import builders as T

    cfg = compose(f"data={task}", "model=softmax_learned", *TASK_TINY)
    module = T.build_module(cfg)
    got = module.model.cfg
    assert {k: getattr(got, k) for k in expected} == expected
    assert module.task == task and not module.bytes_like
    if task == "listops":
        assert module.model.head.out_features == 10


@pytest.mark.parametrize(
    "overrides,line",
    [
        (["model=softmax_t5", "model.position.num_buckets=3"], "num_buckets=3 is too few \\(bidirectional"),
        (["model=softmax_xpos", "model.position.blockwise=true"], "blockwise is the paper's blockwise \\*causal\\*"),
    ],
)
def test_the_config_check_sees_the_model_the_task_makes(overrides, line):
    """ListOps makes the model bidirectional when it is built; what that makes impossible is refused by the config
    check, before any data is read (it was refused only at build, after the data module), and not in a causal task."""
    from linrope.config.checks import ConfigError, validate
    from linrope.studies.sweeps import compose_train

    with pytest.raises(ConfigError, match=line):
        validate(compose_train([*overrides, "data=listops", "size=tiny"]))
    validate(compose_train([*overrides, "data=mqar", "size=tiny"]))


def test_bytes_keep_their_model_and_metric(compose):
    from linrope.training import builders as T

    cfg = compose("model=linear_rope", "size=tiny")
    module = T.build_module(cfg)
    assert module.bytes_like and module.model.cfg.vocab_size == 256 and module.model.cfg.max_len == 64
    assert cfg.optimized_metric == "val/bpb"


def test_loss_ignores_unscored_positions_and_classifies():
    from linrope.training.lit import LanguageModel

    torch.manual_seed(0)
    lm = LanguageModel(
        model=dict(
            vocab_size=20,
            d_model=16,
            n_heads=2,
            n_layers=1,
            d_ff=32,
            max_len=12,
            attention={"kind": "softmax"},
            position={"name": "rope"},
            task="mqar",
        )
    )
    x = torch.randint(0, 20, (2, 12))
    y = torch.full((2, 12), IGNORE)
    y[0, 5], y[1, 9] = 3, 7
    logits = lm.model(x)
    expected = F.cross_entropy(torch.stack([logits[0, 5], logits[1, 9]]), torch.tensor([3, 7]))
    assert torch.allclose(lm.loss((x, y)), expected, atol=1e-6)
    clf = LanguageModel(
        model=dict(
            vocab_size=17,
            d_model=16,
            n_heads=2,
            n_layers=1,
            d_ff=32,
            max_len=12,
            causal=False,
            n_classes=10,
            attention={"kind": "linear", "impl": "naive"},
            position={"name": "rope"},
            task="listops",
        )
    )
    mask = torch.ones(2, 12, dtype=torch.bool)
    mask[1, 6:] = False
    labels = torch.tensor([4, 9])
    out = clf.model(x.clamp(max=16), mask=mask)
    assert out.shape == (2, 10)
    assert math.isclose(
        float(clf.loss((x.clamp(max=16), labels, mask))), float(F.cross_entropy(out, labels)), rel_tol=1e-5
    )


@pytest.mark.parametrize(
    "kind,position",
    [("softmax", "none"), ("softmax", "rope"), ("softmax", "t5"), ("softmax", "learned"), ("linear", "rope"),
     ("linear", "none"), ("linear", "alibi")],
)  # fmt: skip
def test_the_classifier_does_not_see_how_much_padding_follows(kind, position):
    """ListOps rows are padded to the context, and the extrapolation rows to 2-16× it: no token attends to the
    padding (a document of its own, in both kinds of attention), so the logits of an expression are the same at
    every padded length (they moved by up to 0.7 after training, changing 21-42 of 200 predictions). Without the
    mask the padding is seen."""
    from linrope.models.model import TransformerLM

    torch.manual_seed(0)
    model = TransformerLM(
        dict(vocab_size=17, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_len=256, causal=False, n_classes=10,
             attention={"kind": kind}, position={"name": position})
    ).double().eval()  # fmt: skip
    expr = torch.randint(1, 17, (2, 20), generator=torch.Generator().manual_seed(1))
    logits = []
    for n in (20, 64, 256):
        x = torch.zeros(2, n, dtype=torch.long)
        x[:, :20] = expr
        x[1, 13:] = 0  # the second row's expression is shorter
        logits.append(model(x, mask=x != 0))
    assert all((got - logits[0]).abs().max() < 1e-12 for got in logits[1:])
    padded = torch.zeros(2, 64, dtype=torch.long)
    padded[:, :20] = expr
    assert (model(padded) - model(expr)).abs().max() > 1e-6  # the test can tell: unmasked, the padding is seen
    leading = torch.zeros(2, 64, dtype=torch.long)
    leading[:, 44:] = expr  # padding in front: the same logits (positions are counted from the expression's start)
    assert (model(leading, mask=leading != 0) - model(expr, mask=expr != 0)).abs().max() < 1e-12
    model(padded, mask=padded != 0, positions=torch.arange(64))  # with explicit positions: pooling only, no error


@pytest.mark.parametrize(
    "task,model",
    [
        ("mqar", "linear_rope"),
        ("offset_copy", "softmax_learned"),
        ("listops", "linear_rope"),
        ("listops", "softmax_t5"),
    ],
)
def test_each_task_trains_fast_dev_run(compose, task, model):
    import train

    cfg = compose(f"data={task}", f"model={model}", *TASK_TINY, "+trainer.fast_dev_run=2")
    metric = train.main(cfg)
    assert cfg.optimized_metric == "val/loss" and cfg.callbacks.model_checkpoint.monitor == "val/loss"
    assert metric is not None and 0.0 < metric < 10.0


@pytest.mark.slow
def test_offset_copy_is_learned_by_softmax_rope(compose):
    """A few hundred steps: softmax attention with RoPE copies from 16 back almost perfectly."""
    import train

    cfg = compose(
        "data=offset_copy",
        "model=softmax_rope",
        *TASK_TINY,
        "data.val_examples=32",
        "data.batch_size=16",
        "trainer.max_steps=250",
        "trainer.val_check_interval=250",
    )
    assert train.main(cfg) < 0.5
