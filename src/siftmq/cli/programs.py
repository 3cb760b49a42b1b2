"""``siftmq admin program set|show|delete`` and ``siftmq filter test-program``: filter programs
registered on a broker, or run locally in the same sandbox the broker uses."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from siftmq.cli.admin import DEFAULT_URL, JsonOption, UrlOption, YesOption, call_api, print_json, quote_part
from siftmq.cli.console import fail, key_values, out

program_app = typer.Typer(no_args_is_help=True, help="Filter programs: consumers' match(message) code.")

ProgramFile = Annotated[Path, typer.Argument(help="A Python file defining match(message) -> bool.")]
Props = Annotated[list[str] | None, typer.Option("--prop", "-p", help="A property key=value; repeatable.")]
Body = Annotated[str | None, typer.Option("--body", help="The message body (text).")]
Tag = Annotated[str | None, typer.Option("--tag", help="The message tag.")]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"cannot read {path}: {exc}")


def _props(pairs: list[str] | None) -> dict[str, str]:
    try:
        return key_values(pairs)
    except ValueError as exc:
        fail(exc)


def _sample(body: str | None, props: list[str] | None, tag: str | None) -> dict[str, Any] | None:
    if body is None and not props and tag is None:
        return None
    return {"body": body or "", "properties": _props(props), "tag": tag}


@program_app.command("set")
def set_program(
    group: str,
    topic: str,
    path: ProgramFile,
    *,
    body: Body = None,
    prop: Props = None,
    tag: Tag = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Register (or replace) GROUP's program on TOPIC; it must not fail on the sample message given
    with --body/--prop/--tag (default: the topic's newest message)."""
    payload = {"source": _read(path), "sample": _sample(body, prop, tag)}
    answer = call_api("PUT", url, f"/groups/{quote_part(group)}/programs/{quote_part(topic)}", payload)
    out.print(
        f"{group} on {topic}: program version {answer['version']} ({answer['sha256'][:12]})", markup=False
    )


@program_app.command("show")
def show_program(group: str, topic: str, url: UrlOption = DEFAULT_URL, as_json: JsonOption = False) -> None:
    """The program's version, status, last error and counters."""
    data = call_api("GET", url, f"/groups/{quote_part(group)}/programs/{quote_part(topic)}")
    if print_json(data, as_json):
        return
    out.print(
        f"{group} on {topic}: version {data['version']} ({data['sha256'][:12]}), {data['status']}",
        markup=False,
    )
    if data["last_error"]:
        out.print(f"last error: {data['last_error']}", markup=False)
    out.print(", ".join(f"{k} {v}" for k, v in data["counters"].items()) or "not run yet", markup=False)


@program_app.command("delete")
def delete_program(group: str, topic: str, yes: YesOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """Remove GROUP's program on TOPIC (its members then get every message their filter matches)."""
    if not yes:
        typer.confirm(f"Remove the filter program of {group} on {topic}?", abort=True)
    call_api("DELETE", url, f"/groups/{quote_part(group)}/programs/{quote_part(topic)}")
    out.print(f"removed the filter program of {group} on {topic}", markup=False)


def test_program(
    path: ProgramFile,
    body: Body = None,
    prop: Props = None,
    tag: Tag = None,
    topic: Annotated[str, typer.Option("--topic", help="The message's topic.")] = "Test",
) -> None:
    """Run a program on one message locally, in the broker's sandbox: MATCH, REJECT or the error."""
    from siftmq.errors import BadRequestError
    from siftmq.filterserver.message import row
    from siftmq.filterserver.pool import (
        FilterServer,
        Limits,
        ProgramKey,
        ProgramLoadError,
        ProgramSuspended,
        WorkerDied,
    )
    from siftmq.filterserver.program import check_program
    from siftmq.filterserver.sandbox import SandboxUnavailable, check_supported
    from siftmq.filterserver.wire import MATCH

    source = _read(path)
    try:
        check_supported()
        check_program(source)
    except (SandboxUnavailable, BadRequestError) as exc:
        fail(exc)
    message = row(topic=topic, body=(body or "").encode(), tag=tag, properties=_props(prop))
    server = FilterServer(Limits(max_failures=1), 1)
    try:
        verdict = server.evaluate(ProgramKey("local", topic, 1), source, [message])
    except (ProgramLoadError, ProgramSuspended, WorkerDied) as exc:
        fail(f"the program failed: {exc}")
    finally:
        server.close()
    if verdict.errors:
        fail(f"match failed: {verdict.errors[0]}")
    out.print("MATCH" if verdict.codes[0] == MATCH else "REJECT", markup=False)
