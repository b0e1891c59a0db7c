"""Calibration of the extraction thresholds on a labelled set (issue 37, docs/calibration.md).

The policy's per-field thresholds (`policy.Thresholds`) decide which extracted values are
kept. Calibration runs the product's own pipeline (`extract_and_route`, the entry point of
the worker's extract activity, through the same `Runner`) with every threshold at 0, so each
field keeps its confidence, then scores what each threshold of a 0.05 grid would keep
against what a person reading the mail answered. Only counts and rates leave this module:
no value, label or message text is ever in a report or an error.
"""

from __future__ import annotations

import json
import math
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inboxcrm.domain.policy import TenantPolicy, Thresholds
from inboxcrm.platform.workpool import IN_PROCESS, Runner
from inboxcrm.schemas.sources import SOURCE_NAMES

from . import ExtractionOutcome, Extractor, extract_and_route

FIELDS: tuple[str, ...] = ("sender_email", "contact_name", "company")
# The extractor's yes/no findings a label can check, and the route reasons that are the
# finding. `ambiguous`: the mail leaves open who the contact is.
SIGNAL_REASONS: Mapping[str, frozenset[str]] = {
    "opt_out": frozenset({"opt_out_phrase"}),
    "injection": frozenset({"prompt_injection"}),
    "ambiguous": frozenset({
        "several_identities", "different_contact_address", "forwarded_sender_mismatch",
        "forwarded_sender_unknown", "sender_not_corroborated",
    }),
}
SIGNALS: tuple[str, ...] = tuple(SIGNAL_REASONS)
GRID: tuple[float, ...] = tuple(round(step * 0.05, 2) for step in range(21))
SOURCES: tuple[str, ...] = (*SOURCE_NAMES, "smtp")
_KEYS = frozenset({"id", "path", "raw", "source", "labels", "note"})
_ZERO = Thresholds(sender_email=0.0, contact_name=0.0, company=0.0)


class LabelsError(ValueError):
    """The labels file cannot be used. The message names the line and what is wrong, never
    a value from the file."""


@dataclass(frozen=True)
class LabelledMessage:
    """One line of a labels file. `fields`: the accepted answers per labelled field (an
    empty tuple: the person says the mail has none); a field not labelled is not scored."""

    line: int
    raw: bytes
    source: str
    fields: Mapping[str, tuple[str, ...]]
    signals: Mapping[str, bool]


def load_labels(path: Path) -> list[LabelledMessage]:
    """Read a JSONL labels file (docs/calibration.md). `path` entries are relative to the
    file. Raises LabelsError for the first bad line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise LabelsError(f"cannot read the labels file: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise LabelsError("the labels file is not UTF-8") from None
    messages: list[LabelledMessage] = []
    ids: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        message = _parse_line(line, number, Path(path).parent, ids)
        messages.append(message)
    if not messages:
        raise LabelsError("the labels file has no labelled message")
    return messages


def _parse_line(line: str, number: int, base: Path, ids: set[str]) -> LabelledMessage:
    where = f"line {number}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LabelsError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise LabelsError(f"{where}: expected a JSON object")
    unknown = sorted(set(row) - _KEYS)
    if unknown:
        raise LabelsError(f"{where}: unknown key {unknown[0]!r} (expected: "
                          f"{', '.join(sorted(_KEYS))})")
    ident = row.get("id")
    if ident is not None:
        if not isinstance(ident, str) or not ident:
            raise LabelsError(f"{where}: 'id' must be a non-empty string")
        if ident in ids:
            raise LabelsError(f"{where}: 'id' repeats an earlier line's")
        ids.add(ident)
    source = row.get("source", "standard")
    if source not in SOURCES:
        raise LabelsError(f"{where}: 'source' must be one of {', '.join(SOURCES)}")
    raw = _message_bytes(row, where, base)
    labels = row.get("labels")
    if not isinstance(labels, dict) or not labels:
        raise LabelsError(f"{where}: 'labels' must be a non-empty object")
    fields: dict[str, tuple[str, ...]] = {}
    signals: dict[str, bool] = {}
    for key, value in labels.items():
        if key in FIELDS:
            fields[key] = _answers(value, f"{where}: label {key!r}")
        elif key in SIGNALS:
            if not isinstance(value, bool):
                raise LabelsError(f"{where}: label {key!r} must be true or false")
            signals[key] = value
        else:
            raise LabelsError(f"{where}: unknown label {key!r} (expected: "
                              f"{', '.join(FIELDS + SIGNALS)})")
    return LabelledMessage(number, raw, str(source), fields, signals)


def _message_bytes(row: Mapping[str, Any], where: str, base: Path) -> bytes:
    if ("path" in row) == ("raw" in row):
        raise LabelsError(f"{where}: give exactly one of 'path' and 'raw'")
    if "raw" in row:
        if not isinstance(row["raw"], str) or not row["raw"]:
            raise LabelsError(f"{where}: 'raw' must be the message as a non-empty string")
        return row["raw"].encode("utf-8", "surrogateescape")
    if not isinstance(row["path"], str) or not row["path"]:
        raise LabelsError(f"{where}: 'path' must be a non-empty string")
    try:
        return (base / row["path"]).read_bytes()
    except OSError as exc:
        raise LabelsError(f"{where}: cannot read the message named by 'path' "
                          f"({exc.strerror})") from None


def _answers(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str) and value.strip():
        return (normalise(value),)
    if (isinstance(value, list) and value
            and all(isinstance(item, str) and item.strip() for item in value)):
        return tuple(normalise(item) for item in value)
    raise LabelsError(f"{where} must be null, a non-empty string or a list of them")


def normalise(value: str) -> str:
    """What two answers must share to be the same: NFKC, case-folded, whitespace collapsed,
    surrounding quotes and punctuation dropped ("ACME Inc." and "acme inc" agree)."""
    text = " ".join(unicodedata.normalize("NFKC", value).casefold().split())
    return text.strip(" \"'.,;:<>()[]")


@dataclass(frozen=True)
class Observation:
    """What the pipeline proposed for one message, reduced to what is scored."""

    route: str
    fields: Mapping[str, tuple[str, float] | None]   # (normalised value, confidence)
    signals: Mapping[str, bool]


def observe(outcome: ExtractionOutcome) -> Observation:
    """An ignored message proposes nothing (the thresholds never apply to it); otherwise a
    field is the validated value with its confidence (evidence and sender corroboration
    already checked by the pipeline, the thresholds not yet)."""
    reasons = set(outcome.reasons)
    signals = {name: bool(reasons & wanted) for name, wanted in SIGNAL_REASONS.items()}
    fields: dict[str, tuple[str, float] | None] = {}
    for name in FIELDS:
        extracted = getattr(outcome.extraction, name)
        if outcome.route == "ignore" or extracted.value is None:
            fields[name] = None
        else:
            fields[name] = (normalise(extracted.value), float(extracted.confidence))
    return Observation(outcome.route, fields, signals)


async def observe_all(messages: Iterable[LabelledMessage], policy: TenantPolicy,
                      extractor: Extractor | None = None,
                      runner: Runner = IN_PROCESS) -> list[Observation]:
    """Run each message through `extract_and_route` under `policy` with zero thresholds.
    Extractor errors propagate (the caller says the model could not answer)."""
    open_policy = policy.model_copy(update={"thresholds": _ZERO})
    observed: list[Observation] = []
    for message in messages:
        outcome = await extract_and_route(message.raw, open_policy, extractor, message.source,
                                          runner=runner)
        observed.append(observe(outcome))
    return observed


@dataclass(frozen=True)
class Point:
    """At one threshold: kept and right (tp), kept and wrong or unwanted (fp), a wanted
    answer not kept right (fn). A wrong value is both an fp and an fn."""

    threshold: float
    tp: int
    fp: int
    fn: int

    @property
    def precision(self) -> float | None:
        return _rate(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float | None:
        return _rate(self.tp, self.tp + self.fn)

    def as_json(self) -> dict[str, Any]:
        return {"threshold": self.threshold, "tp": self.tp, "fp": self.fp, "fn": self.fn,
                "precision": _round(self.precision), "recall": _round(self.recall)}


@dataclass(frozen=True)
class FieldReport:
    field: str
    labelled: int          # scored messages with a label for this field
    with_answer: int       # ... whose label names a value (not null)
    current: float         # the policy's threshold
    grid: tuple[Point, ...]
    chosen: Point | None   # the lowest threshold meeting the target precision

    def at(self, threshold: float) -> Point | None:
        return next((p for p in self.grid if math.isclose(p.threshold, threshold)), None)

    def as_json(self) -> dict[str, Any]:
        current = self.at(self.current)
        return {"field": self.field, "labelled": self.labelled,
                "with_answer": self.with_answer, "current_threshold": self.current,
                "at_current": current.as_json() if current else None,
                "grid": [p.as_json() for p in self.grid],
                "chosen": self.chosen.as_json() if self.chosen else None}


@dataclass(frozen=True)
class SignalReport:
    signal: str
    labelled: int
    tp: int
    fp: int
    fn: int
    tn: int

    @property
    def precision(self) -> float | None:
        return _rate(self.tp, self.tp + self.fp)

    @property
    def recall(self) -> float | None:
        return _rate(self.tp, self.tp + self.fn)

    def as_json(self) -> dict[str, Any]:
        return {"signal": self.signal, "labelled": self.labelled, "tp": self.tp,
                "fp": self.fp, "fn": self.fn, "tn": self.tn,
                "precision": _round(self.precision), "recall": _round(self.recall)}


@dataclass(frozen=True)
class Calibration:
    tenant: str
    extractor: str
    target_precision: float
    messages: int
    ignored: int           # routed `ignore`: no field scored, every signal "no"
    fields: tuple[FieldReport, ...]
    signals: tuple[SignalReport, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "extractor": self.extractor,
                "target_precision": self.target_precision, "messages": self.messages,
                "ignored": self.ignored, "grid": list(GRID),
                "fields": [f.as_json() for f in self.fields],
                "signals": [s.as_json() for s in self.signals]}


def score(messages: Sequence[LabelledMessage], observed: Sequence[Observation],
          thresholds: Thresholds, target_precision: float, *, tenant: str = "",
          extractor: str = "") -> Calibration:
    """Precision and recall per field at every threshold of GRID, the lowest threshold whose
    precision meets `target_precision` (it has the best recall of those that do), and the
    yes/no findings once each. Fields of ignored messages are not scored."""
    if len(messages) != len(observed):
        raise ValueError("one observation per labelled message")
    pairs = list(zip(messages, observed, strict=True))
    scored = [(m, o) for m, o in pairs if o.route != "ignore"]
    reports: list[FieldReport] = []
    for name in FIELDS:
        rows = [(m.fields[name], o.fields[name]) for m, o in scored if name in m.fields]
        grid = tuple(_point(rows, threshold) for threshold in GRID)
        chosen = next((p for p in grid if p.precision is not None
                       and p.precision >= target_precision), None)
        reports.append(FieldReport(name, len(rows), sum(1 for answers, _ in rows if answers),
                                   float(getattr(thresholds, name)), grid, chosen))
    signal_reports: list[SignalReport] = []
    for name in SIGNALS:
        cells = [(m.signals[name], o.signals[name]) for m, o in pairs if name in m.signals]
        signal_reports.append(SignalReport(
            name, len(cells),
            tp=sum(1 for want, got in cells if want and got),
            fp=sum(1 for want, got in cells if not want and got),
            fn=sum(1 for want, got in cells if want and not got),
            tn=sum(1 for want, got in cells if not want and not got)))
    return Calibration(tenant, extractor, target_precision, len(pairs),
                       len(pairs) - len(scored), tuple(reports), tuple(signal_reports))


def _point(rows: Sequence[tuple[tuple[str, ...], tuple[str, float] | None]],
           threshold: float) -> Point:
    tp = fp = fn = 0
    for answers, got in rows:
        # kept exactly when route.validate_and_route keeps it: not below the threshold
        kept = got is not None and not got[1] < threshold
        right = kept and got is not None and got[0] in answers
        if kept and not right:
            fp += 1
        if answers and not right:
            fn += 1
        if right:
            tp += 1
    return Point(threshold, tp, fp, fn)


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
