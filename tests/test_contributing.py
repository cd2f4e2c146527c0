"""CONTRIBUTING.md agrees with the code: its list of trivial presets is exactly the presets that only pick an
attention and a position config under the label ``attention=… position=…`` gives them, and each of them builds the
model, and is named, as those two options are (which is why a new scheme needs no preset).  Its worked example is run
by tests/positions/test_new_scheme.py."""

import re

import pytest
import yaml

from tests.helpers import CONF, ROOT, model_config, preset_pairing

GUIDE = (ROOT / "CONTRIBUTING.md").read_text()
LISTED = re.findall(r"`(\w+)`", GUIDE.split("<!-- trivial presets: begin -->")[1].split("<!-- trivial presets: end")[0])


def trivial() -> list:
    from linrope.models.spec import pair_label

    found = []
    for path in sorted((CONF / "model").glob("*.yaml")):
        attention, position, options = preset_pairing(path.stem)
        name = yaml.safe_load(path.read_text())["model"]["name"]
        if not options and name == path.stem == pair_label(attention, position):
            found.append(path.stem)
    return found


def test_the_guide_lists_the_trivial_presets():
    assert LISTED == trivial()


@pytest.mark.parametrize("preset", LISTED)
def test_a_trivial_preset_is_its_two_options(preset):
    from linrope.models.spec import ModelConfig

    attention, position, _ = preset_pairing(preset)
    by_preset = model_config(f"model={preset}", "size=tiny")
    by_options = model_config(f"attention={attention}", f"position={position}", "size=tiny")
    assert {k: v for k, v in by_preset.items() if k != "name"} == {k: v for k, v in by_options.items() if k != "name"}
    # train.py names a run of the two options by their pair (linrope.training.builders.name_model), from the pair of
    # the default preset it replaced
    default = next(d["model"] for d in yaml.safe_load((CONF / "train.yaml").read_text())["defaults"] if "model" in d)
    replaced = preset_pairing(default)[:2]
    label = ModelConfig.from_dict(by_options).label((attention, position), replaced)
    assert label == preset
