"""``faultstream diff``: replay history under a base and a candidate configuration, compare incidents."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stream.cli.common import (
    Commands,
    add_command,
    add_input_arguments,
    parse_options_from_args,
    print_json,
    progress_bar,
)
from stream.inputs.parsers import Format

if TYPE_CHECKING:
    from schemas.outputs import Incident
    from stream.diff import IncidentChange, IncidentDiff, Replayed, Variant

__all__ = ["EXIT_DIFFERS", "add_diff_parser", "run_diff"]

#: ``--exit-code``: the candidate adds, removes or changes incidents (``git diff --exit-code``'s 1).
EXIT_DIFFERS = 1


def add_diff_parser(commands: Commands) -> None:
    """Add ``diff`` and its options.

    Parameters
    ----------
    commands
        The ``faultstream`` subcommands.
    """
    diff = add_command(
        commands,
        "diff",
        help="replay history under two configurations and list the incidents a rule change adds, "
        "removes or changes",
        example="faultstream diff examples/sim-48x14/logs --set storm_min_events=10",
        description="Replay the same history twice in memory (no store), under the base configuration "
        "(the environment, with --base-set and --base-catalog) and the candidate (the base with --set "
        "and --catalog), and list the incidents the candidate adds, removes or changes (severity, "
        "first evidence), with counts. A rule change is reviewed on real history before it pages anyone.",
    )
    add_input_arguments(diff)
    diff.add_argument(
        "--set",
        dest="candidate_set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="the candidate's change: a detection setting (FAULTSTREAM_QUIET_PERIOD_SECONDS=7200) or a "
        "detector tunable (storm_min_events=10, lemon.threshold=6); repeatable",
    )
    diff.add_argument(
        "--catalog",
        dest="candidate_catalog",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="the candidate's XID catalog overrides: TOML, [xid.CODE] tables setting severity, category, "
        "hardware, action, name; repeatable",
    )
    diff.add_argument(
        "--base-set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="change the base too (the candidate starts from it); repeatable",
    )
    diff.add_argument(
        "--base-catalog",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="XID catalog overrides of the base (and so of the candidate); repeatable",
    )
    diff.add_argument(
        "--base-env",
        type=Path,
        metavar="FILE",
        help="read the base's settings from this environment file (FAULTSTREAM_* lines of NAME=VALUE, "
        "as docker/.env) over the environment",
    )
    diff.add_argument(
        "--candidate-env",
        type=Path,
        metavar="FILE",
        help="an environment file of the candidate, read over the base's",
    )
    diff.add_argument("--all", action="store_true", help="also list the unchanged incidents")
    diff.add_argument("--json", action="store_true", help="print the comparison as JSON")
    diff.add_argument(
        "--exit-code",
        action="store_true",
        help=f"exit with {EXIT_DIFFERS} when the candidate adds, removes or changes an incident",
    )
    diff.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help="progress bars")
    diff.set_defaults(handler=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    """Replay the files under both configurations and print what the candidate changes.

    Parameters
    ----------
    args
        The parsed ``diff`` command line.

    Returns
    -------
    int
        0, or :data:`EXIT_DIFFERS` with ``--exit-code`` when an incident differs (errors are
        raised and turned into exit codes by :func:`stream.cli.main.main`).
    """
    from stream.diff import Variant, diff_incidents, replay_in_memory

    base_env = [args.base_env] if args.base_env else []
    candidate_env = [args.candidate_env] if args.candidate_env else []
    base = Variant.build("base", args.base_set, args.base_catalog, env_files=base_env)
    candidate = Variant.build(
        "candidate", args.candidate_set, args.candidate_catalog, env_files=candidate_env, start=base
    )
    if not (args.candidate_set or args.candidate_catalog or args.candidate_env):
        sys.stderr.write(
            "faultstream: note: no --set, --catalog or --candidate-env: the candidate is the base\n"
        )
    options = parse_options_from_args(args, base.settings)
    fmt = Format(args.format) if args.format else None
    runs: list[Replayed] = []
    for variant in (base, candidate):
        bar, update = progress_bar(args.progress, desc=variant.label)
        try:
            runs.append(replay_in_memory(args.files, variant, options, fmt=fmt, progress=update))
        finally:
            bar.close()
    diff = diff_incidents(runs[0].incidents, runs[1].incidents)
    described = (_described("the environment", base), _described("the base", candidate))
    if args.json:
        print_json(_as_json(diff, (base, candidate), runs, described, args.all))
    else:
        _print(diff, (base, candidate), runs, described, args.all)
    return EXIT_DIFFERS if args.exit_code and diff.differs else 0


def _described(start: str, variant: Variant) -> str:
    """What a variant is, in words: where it starts and what it changes."""
    return start + (" with " + ", ".join(variant.assignments) if variant.assignments else "")


def _when(ts_ms: int | None) -> str:
    from schemas.timeutil import format_ts

    # Seconds shown: a lower threshold may move a first evidence by less than a minute.
    return "-" if ts_ms is None else format_ts(ts_ms)[:19].replace("T", " ")


def _where(incident: Incident, clusters: int) -> str:
    where = f"{incident.node}/{incident.gpu}" if incident.gpu else incident.node
    return f"{incident.cluster}:{where}" if clusters > 1 else where


def _before_after(change: IncidentChange, value: Callable[[Incident], str]) -> str:
    before = "-" if change.base is None else value(change.base)
    after = "-" if change.candidate is None else value(change.candidate)
    return before if change.base is not None and before == after else f"{before} -> {after}"


def _print(
    diff: IncidentDiff,
    variants: tuple[Variant, Variant],
    runs: list[Replayed],
    described: tuple[str, str],
    everything: bool,
) -> None:
    out = sys.stdout
    base, candidate = runs
    out.write(
        f"Replayed {len(base.summary.sources)} files twice ({base.summary.events:,} events, "
        f"{base.summary.seconds + candidate.summary.seconds:.1f} s)\n"
    )
    for variant, run, words in zip(variants, runs, described, strict=True):
        out.write(f"  {variant.label + ':':10} {words}: {len(run.incidents):,} incidents\n")
    counts = diff.counts()
    out.write("\n" + ", ".join(f"{change.value} {n:,}" for change, n in counts.items()) + "\n")
    by_kind = diff.counts_by_kind()
    if by_kind and diff.differs:
        out.write("\n")
        rows = [["kind", *(c.value for c in counts)]]
        rows += [[kind, *(f"{n:,}" for n in row.values())] for kind, row in by_kind.items() if _differs(row)]
        out.write(_table(rows))
    shown = [c for c in diff.changes if everything or c.change.value != "unchanged"]
    if not shown:  # nothing differs (what differs is always listed)
        out.write("\nNo incident differs.\n")
        return
    clusters = len({c.either.cluster for c in shown})
    rows = [["first evidence", "change", "kind", "where", "severity", "first evidence (base -> candidate)"]]
    for change in shown:
        rows.append(
            [
                _when(change.first_evidence_ms),
                change.change.value,
                change.either.kind.value,
                _where(change.either, clusters),
                _before_after(change, lambda i: i.severity.value),
                _before_after(change, lambda i: _when(i.first_evidence_ms)),
            ]
        )
    out.write("\n" + _table(rows))


def _differs(row: dict[Any, int]) -> bool:
    return any(n for change, n in row.items() if change.value != "unchanged")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  " + "  ".join("-" * width for width in widths))
    return "\n".join(lines) + "\n"


def _incident_json(incident: Incident | None) -> dict[str, Any] | None:
    if incident is None:
        return None
    from schemas.timeutil import format_ts

    return {
        "incident_id": incident.incident_id,
        "severity": incident.severity.value,
        "status": incident.status.value,
        "first_evidence": format_ts(incident.first_evidence_ms),
        "last_evidence": format_ts(incident.last_evidence_ms),
        "evidence_count": incident.evidence_count,
        "summary": incident.summary,
    }


def _as_json(
    diff: IncidentDiff,
    variants: tuple[Variant, Variant],
    runs: list[Replayed],
    described: tuple[str, str],
    everything: bool,
) -> dict[str, Any]:
    from schemas.timeutil import format_ts

    return {
        "variants": {
            variant.label: {
                "assignments": list(variant.assignments),
                "described": words,
                "incidents": len(run.incidents),
                "events": run.summary.events,
                "dead_letters": run.summary.dead_letters,
                "seconds": run.summary.seconds,
            }
            for variant, run, words in zip(variants, runs, described, strict=True)
        },
        "counts": {change.value: n for change, n in diff.counts().items()},
        "by_kind": {
            kind: {c.value: n for c, n in row.items()} for kind, row in diff.counts_by_kind().items()
        },
        "changes": [
            {
                "change": change.change.value,
                "kind": change.either.kind.value,
                "cluster": change.either.cluster,
                "node": change.either.node,
                "gpu": change.either.gpu,
                "first_evidence": format_ts(change.first_evidence_ms),
                "differences": list(change.differences),
                "base": _incident_json(change.base),
                "candidate": _incident_json(change.candidate),
            }
            for change in diff.changes
            if everything or change.change.value != "unchanged"
        ],
    }
