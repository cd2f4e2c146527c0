"""Names a run carries into its logs: the model's label (``model.name``) and the wandb group of a sweep.

Light on purpose (no Lightning, no wandb): train.py, the report and ``python -m linrope.dashboard`` use it.

* ``model_name``: a preset (``model=linear_rope``) names the model, but ``attention=…`` / ``position=…``
  on the command line replace the preset's attention or position and keep its name; the label then
  follows what was chosen (``attention=softmax position=none`` → ``softmax_none``).
* ``wandb_group``: one group per sweep, ``<task_name>-<sweep folder name>`` (the sweep folder is named
  by its start time, ``logs/<task_name>/multiruns/<time>``); a single run is grouped by ``task_name``."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple

import yaml
from omegaconf import OmegaConf, open_dict

# Hydra (~0.15 s) is imported inside name_model, the one function that needs a Hydra run: the dashboard CLI,
# which reads names from a sweep folder, stays fast

CONF = Path(__file__).resolve().parents[1] / "conf"


def preset_choice(preset: str, conf_dir: Path = CONF) -> Optional[Tuple[str, str]]:
    """(attention, position) options a model preset selects (its ``override /attention: …`` lines)."""
    path = conf_dir / "model" / f"{preset}.yaml"
    if not path.is_file():
        return None
    picked: Dict[str, str] = {}
    for entry in (yaml.safe_load(path.read_text()) or {}).get("defaults") or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                group = key.replace("override", "").strip().lstrip("/")
                if group in ("attention", "position"):
                    picked[group] = str(value)
    if len(picked) != 2:
        return None
    return picked["attention"], picked["position"]


def _plain_presets(conf_dir: Path) -> Dict[Tuple[str, str], list]:
    """(attention, position) -> names of the presets that select exactly that and change nothing else."""
    found: Dict[Tuple[str, str], list] = {}
    for path in sorted((conf_dir / "model").glob("*.yaml")):
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
        pair = preset_choice(path.stem, conf_dir)
        if pair and set(model) == {"name"}:
            found.setdefault(pair, []).append(path.stem)
    return found


def label_for(attention: str, position: str, conf_dir: Path = CONF) -> str:
    """The label of an attention × position pairing: its plain preset's name (``softmax_none``,
    ``linear``, ``linear_cosine_rope``), else ``<attention>_<position>``."""
    wanted = f"{attention}_{position}"
    names = _plain_presets(conf_dir).get((attention, position), [])
    if wanted in names or not names:
        return wanted
    return min(names, key=len)


def model_name(name: Optional[str], choices: Mapping[str, Optional[str]], overrides=(),
               conf_dir: Path = CONF) -> Optional[str]:
    """``model.name`` for a run whose config groups were ``choices`` (Hydra's runtime choices:
    model, attention, position): the preset's name while its attention and position are the ones
    chosen, else the label of the chosen pairing.  A name set on the command line (``model.name=…``,
    in ``overrides``) is kept."""
    if any(str(o).lstrip("+~").startswith("model.name=") for o in overrides):
        return name
    preset, attention, position = (choices.get(k) for k in ("model", "attention", "position"))
    if not (preset and attention and position):
        return name
    picked = preset_choice(str(preset), conf_dir)
    if picked is None or picked == (attention, position):
        return name
    return label_for(str(attention), str(position), conf_dir)


def wandb_group(task_name: str, sweep_dir: Optional[str] = None) -> str:
    """``<task_name>-<sweep folder name>`` for a job of a sweep, ``task_name`` for a single run.  A sweep
    folder already named after the task (``hydra.sweep.dir=results/pe_compare``) is not named twice."""
    if not sweep_dir:
        return str(task_name)
    folder = Path(str(sweep_dir)).name
    return folder if str(task_name) in folder else f"{task_name}-{folder}"


def name_model(cfg) -> None:
    """Set ``cfg.model.name`` from Hydra's runtime choices (``model_name``) and keep the run folder's
    ``.hydra/config.yaml`` saying the same (the report reads labels from it).  No-op without a Hydra run."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get() if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001 - no Hydra run (tests call train.main with a composed config)
        hc = None
    if hc is None or "model" not in cfg:
        return
    name = model_name(cfg.model.get("name"), dict(hc.runtime.choices), list(hc.overrides.task))
    if name == cfg.model.get("name"):
        return
    with open_dict(cfg):
        cfg.model.name = name
    if hc.output_subdir is not None:
        saved = Path(hc.runtime.output_dir) / str(hc.output_subdir) / "config.yaml"
        if saved.is_file():
            saved.write_text(OmegaConf.to_yaml(cfg))
