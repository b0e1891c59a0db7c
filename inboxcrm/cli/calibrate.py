"""`inboxcrm calibrate --labels FILE`: precision and recall of the extraction thresholds on
a labelled set (docs/calibration.md). Offline: writes nothing, prints counts and rates only
(never a value, a label or message text)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from inboxcrm.cli.common import JsonOpt, fail
from inboxcrm.domain.extraction import Extractor, ExtractorError, build_extractor, work_pool
from inboxcrm.domain.extraction.calibration import (
    GRID,
    Calibration,
    LabelledMessage,
    LabelsError,
    load_labels,
    observe_all,
    score,
)
from inboxcrm.domain.policy import PolicyError, TenantPolicy, UnknownTenant, get_policy
from inboxcrm.platform.config import Settings, get_settings
from inboxcrm.platform.workpool import Runner, WorkPoolUnavailable


class CalibrateFailed(Exception):
    """The command cannot give a table; the message says why in one line."""


def calibrate(
    labels: Annotated[Path, typer.Option("--labels", help="The JSONL labels file "
                                         "(docs/calibration.md).")],
    tenant: Annotated[str, typer.Option(help="Tenant whose policy applies.")] = "acme",
    target_precision: Annotated[float, typer.Option(
        min=0.0, max=1.0, help="The precision a threshold must reach.")] = 0.95,
    as_json: JsonOpt = False,
) -> None:
    """Precision and recall per extraction threshold on a labelled set, and the lowest
    threshold meeting the target precision. Runs the product's extractor in a work pool
    under the configured work budget; writes nothing."""
    try:
        result = run_calibrate(labels, tenant, target_precision)
    except CalibrateFailed as exc:
        fail(str(exc))
        return
    print(json.dumps(result.as_json()) if as_json else render(result))


def run_calibrate(
    labels: Path, tenant: str, target_precision: float,
    extractor: Extractor | None = None, runner: Runner | None = None,
) -> Calibration:
    """Score the labelled set. Without `runner` a one-process work pool runs the work on
    each message, as in a worker. Raises CalibrateFailed (one line, no value from the file)
    when the labels file, the tenant or the extractor cannot be used."""
    return asyncio.run(_calibrate(labels, tenant, target_precision, extractor, runner))


async def _calibrate(labels: Path, tenant: str, target_precision: float,
                     extractor: Extractor | None, runner: Runner | None) -> Calibration:
    try:
        messages = load_labels(labels)
    except LabelsError as exc:
        raise CalibrateFailed(f"{labels}: {exc}") from None
    policy = _policy(tenant)
    settings = _settings()
    if extractor is None:
        try:
            extractor = build_extractor(settings)
        except ValueError as exc:
            raise CalibrateFailed(str(exc)) from None
    if runner is not None:
        return await _run(messages, policy, extractor, runner, target_precision)
    pool = work_pool(settings, processes=1)
    try:
        await pool.start()
        return await _run(messages, policy, extractor, pool, target_precision)
    except WorkPoolUnavailable:
        raise CalibrateFailed("the work pool could not start a child process") from None
    finally:
        await pool.close()


async def _run(messages: list[LabelledMessage], policy: TenantPolicy, extractor: Extractor,
               runner: Runner, target_precision: float) -> Calibration:
    try:
        observed = await observe_all(messages, policy, extractor, runner)
    except ExtractorError as exc:  # the model could not answer: no partial table
        raise CalibrateFailed(f"the extractor could not answer ({type(exc).__name__}, "
                              f"{exc.category}); nothing was scored") from None
    return score(messages, observed, policy.thresholds, target_precision,
                 tenant=policy.tenant, extractor=extractor.version)


def _policy(tenant: str) -> TenantPolicy:
    try:
        return get_policy(tenant)
    except UnknownTenant:
        raise CalibrateFailed(f"unknown tenant {tenant!r}") from None
    except PolicyError as exc:
        raise CalibrateFailed(str(exc)) from None


def _settings() -> Settings:
    """The configured extractor and work budget; the defaults (the rules extractor, the
    default budget) where the environment holds no complete settings, as `extract` does."""
    try:
        return get_settings()
    except Exception:  # noqa: BLE001 - an incomplete environment: stay offline, say so
        print("inboxcrm calibrate: no complete INBOXCRM_* settings; using the rules "
              "extractor and the default work budget", file=sys.stderr)
        return Settings.model_construct()


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def render(result: Calibration) -> str:
    """The table `inboxcrm calibrate` prints: counts and rates only."""
    lines = [
        f"labelled messages: {result.messages} (tenant {result.tenant}, extractor "
        f"{result.extractor}); ignored by the route, fields not scored: {result.ignored}",
        f"target precision: {result.target_precision:.2f}",
        "",
        f"{'field':<14}{'labelled':>9}{'answers':>9}{'current':>9}{'P':>7}{'R':>7}"
        f"  lowest threshold meeting the target (P / R)",
    ]
    for report in result.fields:
        current = report.at(report.current)
        chosen = report.chosen
        meets = (f"{chosen.threshold:.2f} ({_rate(chosen.precision)} / "
                 f"{_rate(chosen.recall)})") if chosen else "none"
        lines.append(
            f"{report.field:<14}{report.labelled:>9}{report.with_answer:>9}"
            f"{report.current:>9.2f}{_rate(current.precision if current else None):>7}"
            f"{_rate(current.recall if current else None):>7}  {meets}")
    lines += ["", "threshold" + "".join(f"  {r.field + ' P / R':>22}" for r in result.fields)]
    for index, threshold in enumerate(GRID):
        cells = "".join(
            f"  {_rate(r.grid[index].precision) + ' / ' + _rate(r.grid[index].recall):>22}"
            for r in result.fields)
        lines.append(f"{threshold:>9.2f}{cells}")
    lines += ["", f"{'signal':<11}{'labelled':>9}{'tp':>5}{'fp':>5}{'fn':>5}{'tn':>5}"
                  f"{'precision':>11}{'recall':>8}"]
    for signal in result.signals:
        lines.append(f"{signal.signal:<11}{signal.labelled:>9}{signal.tp:>5}{signal.fp:>5}"
                     f"{signal.fn:>5}{signal.tn:>5}{_rate(signal.precision):>11}"
                     f"{_rate(signal.recall):>8}")
    return "\n".join(lines)
