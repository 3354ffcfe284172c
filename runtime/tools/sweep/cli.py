"""``registry sweep`` (the command) and ``python -m causalab_mini.tools.sweep TYPE``
(one architecture, one JSON line)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from .report import coverage_markdown, joined_with_moved, summarize, write_report
from .runner import Result, run_one, sweep


@click.command("sweep")
@click.option("--only", default=None, help="Comma-separated model types (default: all).")
@click.option(
    "--group",
    "groups",
    default=None,
    help="Comma-separated groups of registry/tiny.yaml (causal_lm, image_text_to_text, "
    "audio_text_to_text, seq2seq; "
    "default: every group).",
)
@click.option("--jobs", type=int, default=2, show_default=True, help="Architectures at once.")
@click.option(
    "--timeout",
    type=float,
    default=240.0,
    show_default=True,
    help="Seconds one architecture may take.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the JSON report here; with --build both, the default build's report here "
    "and the moved build's beside it (coverage.json, coverage-moved.json), which --doc joins.",
)
@click.option(
    "--doc",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the coverage table (markdown) here, e.g. docs/coverage.md.",
)
@click.option(
    "--against",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="With --doc: another run's report (--out of a sweep under another nnsight or "
    "transformers); the table lists where it differs.",
)
@click.option(
    "--build",
    "build",
    type=click.Choice(["default", "moved", "both"]),
    default="both",
    show_default=True,
    help="Which tiny build to certify: the default one, the moved one "
    "(tiny:<type>?build=moved: scales, caps, head and expert sizes, epsilons moved, norms "
    "drawn away from identity), or both (a place is ok only where it holds on both).",
)
@click.option(
    "--moved",
    "moved_report",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="With --doc: a report of the moved build alone (--build moved --out ...), joined "
    "architecture by architecture with this run's default build.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def sweep_command(
    only: str | None,
    jobs: int,
    timeout: float,
    out: Path | None,
    doc: Path | None,
    as_json: bool = False,
    against: Path | None = None,
    groups: str | None = None,
    build: str = "both",
    moved_report: Path | None = None,
) -> None:
    """Certify every causal-LM architecture of the installed transformers, and every
    architecture of the other groups registry/tiny.yaml names (image-text-to-text
    wrappers, on their text stacks): each component of the table ok (identities and
    oracles pass), refused (with the reason), or broken. Each architecture runs in
    its own process with a timeout; the report and the table give each group apart.

    \b
    Example:
      registry sweep --only llama,gpt2,bloom
      registry sweep --group image_text_to_text
      registry sweep --jobs 2 --out docs/coverage.json --doc docs/coverage.md
      registry sweep --doc docs/coverage.md --against nnsight-0.8.json
      registry sweep --build moved --jobs 1 --out moved.json
      registry sweep --build default --out docs/coverage.json --doc docs/coverage.md --moved moved.json
      registry sweep --only llama,gpt2 --out both.json --doc both.md   # both builds, both reports
    """
    chosen = _chosen(only, groups)
    started = time.perf_counter()
    builds = ("default", "moved") if build == "both" else (build,)
    per_build: dict[str, list[Result]] = {}
    results = _swept(chosen, jobs, timeout, builds, per_build)
    seconds = time.perf_counter() - started
    _print_results(results, seconds, as_json)
    if out is not None and len(builds) > 1:
        # each build's own report: the default build's at --out, the moved build's
        # beside it (docs/coverage.json, docs/coverage-moved.json); the doc joins them
        moved_out = moved_path(out)
        write_report(per_build.get("default", []), out, seconds)
        write_report(per_build.get("moved", []), moved_out, seconds)
        click.echo(f"wrote {out} (default build) and {moved_out} (moved build)", err=True)
        if moved_report is None:
            moved_report = moved_out
    elif out is not None:
        write_report(results, out, seconds)
    if doc is not None:
        report_path = out
        if report_path is None:
            import tempfile

            report_path = Path(tempfile.mkstemp(suffix=".json")[1])
            write_report(results, report_path, seconds)
        doc.parent.mkdir(parents=True, exist_ok=True)
        other = json.loads(against.read_text()) if against is not None else None
        report = json.loads(report_path.read_text())
        if moved_report is not None:
            report = joined_with_moved(report, json.loads(moved_report.read_text()))
        doc.write_text(coverage_markdown(report, other))


def _chosen(only: str | None, groups: str | None) -> list[str]:
    """The model types ``--only`` and ``--group`` pick (a usage error names any that is
    not a group of registry/tiny.yaml or a model type of the picked groups)."""
    from causalab_mini.tools.tiny import group_model_types

    by_group = group_model_types()
    picked = [g.strip() for g in groups.split(",") if g.strip()] if groups else list(by_group)
    wrong = [g for g in picked if g not in by_group]
    if wrong:
        raise click.UsageError(
            f"not groups of registry/tiny.yaml: {', '.join(wrong)} (its groups: "
            f"{', '.join(by_group)})"
        )
    every = [t for g in picked for t in by_group[g]]
    chosen = [t.strip() for t in only.split(",") if t.strip()] if only else every
    # a model type the picked groups hold only as <group>/<model_type> (the whole
    # encoder-decoder beside its decoder alone) names that member
    members = {t.partition("/")[2]: t for t in every if "/" in t}
    chosen = [members.get(t, t) if t not in every else t for t in chosen]
    unknown = [t for t in chosen if t not in every]
    if unknown:
        raise click.UsageError(
            f"not model types of the groups {', '.join(picked)} of this transformers: "
            f"{', '.join(unknown)}"
        )
    return chosen


def moved_path(out: Path) -> Path:
    """Where ``--build both --out PATH`` writes the moved build's report: beside PATH,
    ``-moved`` before its suffix (coverage.json -> coverage-moved.json)."""
    return out.with_name(f"{out.stem}-moved{out.suffix or '.json'}")


def _swept(
    chosen: list[str],
    jobs: int,
    timeout: float,
    builds: tuple[str, ...] = ("default",),
    per_build: dict[str, list[Result]] | None = None,
) -> list[Result]:
    """``sweep`` over ``chosen``, with a progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task("sweeping", total=len(chosen) * len(builds))

        def advance(result: Result) -> None:
            bar.update(task, advance=1, description=f"{result.model_type}: {result.outcome}")

        results = sweep(chosen, jobs, timeout, advance, builds, per_build)
    return results


def _print_results(results: list[Result], seconds: float, as_json: bool) -> None:
    """The report as JSON (``--json``), or a table (a terminal) or a line an
    architecture (piped), then the summary."""
    from rich.console import Console
    from rich.table import Table

    if as_json:  # the report, as --out writes it, on stdout instead of the table
        report = {"seconds": round(seconds, 1), "summary": summarize(results)}
        report["results"] = [r.__dict__ for r in results]
        click.echo(json.dumps(report, indent=1, sort_keys=True))
    table = Table(title=f"registry sweep: {len(results)} architectures in {seconds:.0f} s")
    for column in ("architecture", "structure", "outcome", "ok", "refused", "broken"):
        table.add_column(column)
    for r in results:
        c = r.counts()
        table.add_row(
            r.model_type,
            r.structure or "",
            r.outcome,
            str(c["ok"]),
            str(c["refused"]),
            str(c["broken"]),
        )
    if not as_json and sys.stdout.isatty():  # a terminal: the table, in colour
        Console().print(table)
        click.echo(json.dumps(summarize(results)))
    elif not as_json:  # piped: plain text, a line an architecture
        click.echo(f"registry sweep: {len(results)} architectures in {seconds:.0f} s")
        width = max((len(r.model_type) for r in results), default=0)
        for r in results:
            c = r.counts()
            click.echo(
                f"{r.model_type:{width}}  {r.structure or '-':16} {r.outcome:11} "
                f"ok={c['ok']} refused={c['refused']} broken={c['broken']}"
            )
        click.echo(json.dumps(summarize(results)))


def main(argv: list[str] | None = None) -> None:
    """``python -m causalab_mini.tools.sweep TYPE``: one architecture, one JSON line."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit(
            "usage: python -m causalab_mini.tools.sweep MODEL_TYPE (one architecture, one "
            "JSON line; `registry sweep --only MODEL_TYPE` for the table)"
        )
    result = run_one(args[0])
    sys.stdout.write("\n" + json.dumps(result.__dict__) + "\n")
