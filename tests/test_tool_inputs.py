"""Inputs of evaluate and generate that did what a user would not expect (issue 33): `lengths=[]` silently ran
the default table; `temperature=0` was refused, where users expect greedy decoding."""
import pytest

from linrope.generate import generate, generate_text
from test_evaluate import compose_evaluate
from test_generate import compose_generate, tiny


def test_an_empty_list_of_lengths_is_refused_in_one_line(tmp_path):
    from linrope.evaluate import EvaluateError, evaluate
    with pytest.raises(EvaluateError) as e:
        evaluate(compose_evaluate(f"ckpt={tmp_path / 'none.ckpt'}", "lengths=[]"))
    assert str(e.value) == ("lengths=[]: no length to evaluate; give at least one (lengths=[256,512]), or leave "
                            "lengths out for factors × the training context")


def test_temperature_zero_is_greedy(tmp_path):
    """temperature=0 passes the checks (the next problem named is the missing checkpoint) and decodes greedily:
    the same bytes as top_k=1, whatever the seed."""
    from linrope.errors import LinropeError
    with pytest.raises(LinropeError) as e:
        generate(compose_generate(f"ckpt={tmp_path / 'none.ckpt'}", "temperature=0"))
    assert str(e.value) == f"checkpoint {tmp_path / 'none.ckpt'}: does not exist"
    with pytest.raises(LinropeError, match=r"temperature >= 0 \(0: greedy\)"):
        generate(compose_generate(f"ckpt={tmp_path / 'none.ckpt'}", "temperature=-1"))
    model = tiny({"name": "rope"}).float()
    greedy = {generate_text(model, "def ", 12, temperature=0, top_k=None, seed=s) for s in (0, 1, 2)}
    assert greedy == {generate_text(model, "def ", 12, temperature=1.0, top_k=1, seed=5)}
