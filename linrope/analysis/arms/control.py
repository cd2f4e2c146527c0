"""The positive control of a study in arms (``control``: a configuration and its bar on the study's metric in every
seed): whether each arm met it, and the arms where it did not, whose claims get no verdict (linrope.analysis.arms)."""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from linrope.analysis.study_config import Study


def _worst(study: Study, by_arm: Dict[Any, Dict[Any, float]]) -> Tuple[bool, float, Dict[Any, Tuple[float, bool]]]:
    """(an ``at_least`` bar, the bar, {arm that has run: (its worst seed, whether that seed misses the bar)})."""
    low = "at_least" in study.control
    bar = study.control["at_least" if low else "at_most"]
    worst = {a: (min if low else max)(seeds.values()) for a, seeds in by_arm.items() if seeds}
    return low, bar, {a: (v, v < bar if low else v > bar) for a, v in worst.items()}


def control_missed(study: Study, by_arm: Dict[Any, Dict[Any, float]]) -> List[Any]:
    """The arms where some seed of the control misses its bar."""
    return [a for a, (_, missed) in _worst(study, by_arm)[2].items() if missed]


def control_text(study: Study, by_arm: Dict[str, Dict[Any, float]]) -> str:
    """Whether the control met its bar in every seed, arm by arm."""
    low, bar, ran = _worst(study, by_arm)
    what, name = study.control.get("what", study.metric), study.control["configuration"]
    seed_word = "lowest" if low else "highest"
    missed = [f"{a} ({seed_word} seed {v:.3f})" for a, (v, miss) in ran.items() if miss]
    met = [f"{a} ({seed_word} seed {v:.3f})" for a, (v, miss) in ran.items() if not miss]
    missing = [a for a in by_arm if a not in ran]
    verb = ("reach", "reached") if low else ("stay at or below", "stayed at or below")
    parts = []
    if missed:
        parts.append(
            f"Positive control NOT met: {name} must {verb[0]} {bar} {what} in every seed; it does not at "
            f"{', '.join(missed)}."
        )
    if met:
        parts.append(f"Positive control: {name} {verb[1]} {bar} {what} in every seed at {', '.join(met)}.")
    if missing:
        parts.append(f"{name} has not run yet at {', '.join(missing)}.")
    return " ".join(parts)
