"""Planning a study's seeds from a pilot run: how many seeds detect a difference, at what cost.

A pilot is the summary.json of a run of the same spec with a few seeds (at least 2; 3 for the
differences against the seed-to-seed baseline). :func:`plan_seeds` recomputes its differences
and their power from its tables (:func:`analysis.studies.results.differences`, the formulas of
:mod:`analysis.studies.power`) and answers, per difference, the seeds that would detect the
target at 80 % power — ``detect`` for every difference, or without one the observed difference of
every undecided one — and for the study the most of these with its cost in trainings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis.studies.plan import StudyPlan, plan
from analysis.studies.power import check_detect, power_settings
from analysis.studies.results import differences
from analysis.studies.spec import StudyError

__all__ = ["SeedPlan", "load_pilot", "plan_seeds"]


@dataclass(frozen=True)
class SeedPlan:
    """A pilot's answer: ``differences`` (the pilot's, each with its ``power``), ``asked`` (those
    the answer covers), ``seeds`` (the most any of them needs; None when none is in reach),
    ``out_of_reach`` (asked ones no number of seeds up to the search's cap detects) and the
    cost: ``trainings_per_seed`` unique trainings per seed, of which the pilot's are reused."""

    study: str
    pilot_seeds: list[int]
    settings: dict[str, Any]
    differences: list[dict[str, Any]]
    asked: list[dict[str, Any]]
    seeds: int | None
    out_of_reach: list[dict[str, Any]]
    trainings_per_seed: int

    @property
    def detect(self) -> float | None:
        detect = self.settings["detect"]
        return None if detect is None else float(detect)

    def needed(self, item: Mapping[str, Any]) -> int | None:
        """The seeds one difference needs for this plan's target."""
        power = item.get("power") or {}
        return power.get("seeds_for_detect" if self.detect is not None else "seeds_needed")

    def trainings(self, seeds: int) -> int:
        """Unique trainings of the study with seeds 0..seeds-1."""
        return self.trainings_per_seed * seeds

    def new_trainings(self, seeds: int) -> int:
        """Of :meth:`trainings`, those the pilot did not train (its checkpoints are reused)."""
        return self.trainings_per_seed * len(set(range(seeds)) - set(self.pilot_seeds))


def load_pilot(source: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """A pilot summary from a summary.json file (or an already parsed one)."""
    if isinstance(source, Mapping):
        return dict(source)
    try:
        document = json.loads(Path(source).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise StudyError(f"cannot read the pilot summary '{source}': {exc}") from None
    except json.JSONDecodeError as exc:
        raise StudyError(f"the pilot summary '{source}' is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise StudyError(f"the pilot '{source}' is not a study's summary.json")
    return document


def _check(pilot: Mapping[str, Any], expected: StudyPlan) -> None:
    try:
        arms = [a["name"] for a in pilot["arms"]]
        reference = pilot["reference"]["name"]
        tables = [(a.get("cka_diagonal") or {}).get("table") for a in pilot["arms"]]
        base = pilot["baselines"]["seed_to_seed"]
    except (KeyError, TypeError):
        raise StudyError("the pilot is not a study's summary.json") from None
    names = [e.name for e in expected.entries]
    if reference != expected.reference.name or sorted(arms) != sorted(names):
        differ = sorted(set(arms) ^ set(names)) or [reference]
        raise StudyError(
            f"the pilot summary (study '{pilot.get('study')}') is not a run of the spec "
            f"'{expected.spec.name}': {len(differ)} arms differ, e.g. '{differ[0]}'"
        )
    if all(t is None for t in tables) and base.get("table") is None:
        raise StudyError(
            "the pilot summary has no per-seed tables (it predates them): re-run the study "
            "for a pilot"
        )


def plan_seeds(
    spec: Any,
    pilot: str | Path | Mapping[str, Any],
    *,
    detect: float | None = None,
    target: float | None = None,
) -> SeedPlan:
    """How many seeds the study ``spec`` (anything :func:`analysis.studies.load_spec` takes)
    needs to detect ``detect`` (default: the spec's ``detect``; without either, each undecided
    difference as observed) with ``target`` power (default 80 %), from the pilot's own variance
    components."""
    summary = load_pilot(pilot)
    expected = plan(spec, seeds=1)
    _check(summary, expected)
    detect = check_detect(detect if detect is not None else expected.spec.detect)
    stored = dict(summary.get("power") or {})
    stored.update(detect=detect, target=target if target is not None else stored.get("target"))
    summary["power"] = power_settings({**summary, "power": stored})
    items = differences(summary)
    with_power = [d for d in items if d.get("power")]
    key = "seeds_for_detect" if detect is not None else "seeds_needed"
    asked = [d for d in with_power if detect is not None or d.get("decision") == "undecided"]
    reach = [d["power"][key] for d in asked if d["power"][key] is not None]
    return SeedPlan(
        study=expected.spec.name,
        pilot_seeds=[int(s) for s in summary.get("seeds") or []],
        settings=summary["power"],
        differences=items,
        asked=asked,
        seeds=max(reach) if reach else None,
        out_of_reach=[d for d in asked if d["power"][key] is None],
        trainings_per_seed=len(expected.trainings),
    )
