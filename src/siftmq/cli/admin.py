"""``siftmq admin ...``: the admin HTTP API from the command line, printed as tables."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from siftmq.cli.console import error, fail, out

admin_app = typer.Typer(
    no_args_is_help=True, help="Inspect and change a running broker (its admin HTTP API)."
)

UrlOption = Annotated[str, typer.Option("--url", envvar="SIFTMQ_ADMIN_URL", help="The broker's admin API.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print the JSON answer.")]
DEFAULT_URL = "http://127.0.0.1:8082"
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


#: A broker with authentication on wants a login (a user and password, or a bearer token from
#: ``siftmq admin token``); from the environment, so it is never in a command line (which other
#: users of the machine can see) or the shell's history.
USER_ENV, PASSWORD_ENV, CA_ENV = "SIFTMQ_ADMIN_USER", "SIFTMQ_ADMIN_PASSWORD", "SIFTMQ_ADMIN_CA_FILE"
TOKEN_ENV = "SIFTMQ_ADMIN_TOKEN"


def call_api(
    method: str,
    url: str,
    path: str,
    body: dict[str, Any] | None = None,
    params: dict[str, str] | None = None,
) -> Any:
    """Call the admin API; an error answer is printed and exits 1."""
    import os
    import ssl

    import httpx

    user, password, ca_file = (os.environ.get(name) for name in (USER_ENV, PASSWORD_ENV, CA_ENV))
    token = os.environ.get(TOKEN_ENV)
    login = (user, password or "") if user and not token else None
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers["X-Siftmq-Client"] = "cli"  # (a POST without a body needs it: see the admin API)
    verify: Any = ssl.create_default_context(cafile=ca_file) if ca_file else True
    try:
        response = httpx.request(
            method,
            url.rstrip("/") + path,
            json=body,
            params=params,
            timeout=30,
            auth=login,
            headers=headers,
            verify=verify,
        )  # path parts are quoted
    except httpx.HTTPError as exc:
        fail(f"cannot reach the admin API at {url}: {exc}")
    if response.status_code >= 400:
        try:
            detail = response.json()
            message = detail.get("message") or json.dumps(detail.get("detail", detail))
        except ValueError:
            message = response.text
        error(message, label=f"error {response.status_code}")
        raise typer.Exit(1)
    return None if response.status_code == 204 else response.json()


def quote_part(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


def print_table(title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    out.print(table)


def print_json(data: Any, as_json: bool) -> bool:
    if as_json:
        out.print(json.dumps(data, ensure_ascii=False, indent=2), markup=False)
    return as_json


@admin_app.command("topics")
def topics(url: UrlOption = DEFAULT_URL, as_json: JsonOption = False) -> None:
    """List topics."""
    data = call_api("GET", url, "/topics")
    if not print_json(data, as_json):
        print_table("topics", data, ["name", "queue_nums", "perm"])


@admin_app.command("topic")
def topic(name: str, url: UrlOption = DEFAULT_URL, as_json: JsonOption = False) -> None:
    """Describe a topic: its queues and their offsets."""
    data = call_api("GET", url, f"/topics/{quote_part(name)}")
    if not print_json(data, as_json):
        print_table(f"{data['name']}: {data['messages']} messages, perm {data['perm']}", data["queues"],
               ["queue_id", "min_offset", "max_offset"])  # fmt: skip


@admin_app.command("create-topic")
def create_topic(
    name: str,
    queues: Annotated[int, typer.Option("--queues", min=1, help="at most the broker's max_queue_nums")] = 8,
    perm: Annotated[int, typer.Option("--perm", min=0, max=7, help="4 read, 2 write, 6 both")] = 6,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Create a topic."""
    data = call_api("POST", url, "/topics", {"name": name, "queue_nums": queues, "perm": perm})
    out.print(f"created {data['name']} with {data['queue_nums']} queues", markup=False)


@admin_app.command("delete-topic")
def delete_topic(name: str, yes: YesOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """Delete a topic and every message stored in it (cannot be undone)."""
    _delete(f"/topics/{quote_part(name)}", f"topic {name}", "and all its messages", yes=yes, url=url)


@admin_app.command("delete-group")
def delete_group(name: str, yes: YesOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """Delete an idle consumer group and its progress (refused while it has live members)."""
    _delete(f"/groups/{quote_part(name)}", f"group {name}", "and its progress", yes=yes, url=url)


def _delete(path: str, what: str, with_it: str, *, yes: bool, url: str) -> None:
    if not yes:
        typer.confirm(f"Delete {what} {with_it}?", abort=True)
    call_api("DELETE", url, path)
    out.print(f"deleted {what}", markup=False)


@admin_app.command("groups")
def groups(url: UrlOption = DEFAULT_URL, as_json: JsonOption = False) -> None:
    """List consumer groups."""
    data = call_api("GET", url, "/groups")
    if not print_json(data, as_json):
        print_table("groups", data, ["group", "mode", "consistency", "clients", "topics", "inconsistencies"])


@admin_app.command("group")
def group(name: str, url: UrlOption = DEFAULT_URL, as_json: JsonOption = False) -> None:
    """Describe a group: clients, subscriptions, filter work and lag (matching messages only)."""
    data = call_api("GET", url, f"/groups/{quote_part(name)}")
    if print_json(data, as_json):
        return
    out.print(f"group {data['group']}: {data['mode']}, {data['consistency']}, "
               f"{data['inconsistencies']} inconsistencies", markup=False)  # fmt: skip
    if data["last_inconsistency"]:
        out.print(f"last inconsistency: {data['last_inconsistency']}", markup=False)
    print_table("clients", data["clients"], ["client_id", "client_type", "address", "last_seen_s"])
    for sub in data["subscriptions"]:
        stats = sub["filter_stats"]
        out.print(
            f"{sub['topic']}: {sub['type']} {sub['expression']} (v{sub['version']}); "
            f"evaluated {stats['evaluated']}, matched {stats['matched']}, "
            f"skipped by tags code {stats['skipped_by_tags_code']}, "
            f"skipped by bitmap {stats['skipped_by_bitmap']}",
            markup=False,
        )
        columns = ["queue_id", "committed_offset", "max_offset", "lag", "matching_lag", "estimated"]
        print_table(f"lag of {name} on {sub['topic']}", sub["lag"], columns)


@admin_app.command("set-group")
def set_group(
    name: str,
    mode: Annotated[str | None, typer.Option("--mode", help="clustering or broadcasting")] = None,
    consistency: Annotated[str | None, typer.Option("--consistency", help="strict or compat")] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Change a group's message model or subscription-consistency policy (a mode creates a group
    not known yet; a consistency alone needs one that exists)."""
    if mode is None and consistency is None:
        fail("set-group: give --mode, --consistency or both (nothing to change)", code=2)
    data = call_api("PATCH", url, f"/groups/{quote_part(name)}", {"mode": mode, "consistency": consistency})
    out.print(f"group {name}: {data['mode']}, {data['consistency']}", markup=False)


@admin_app.command("message")
def message(message_id: str, url: UrlOption = DEFAULT_URL) -> None:
    """Look a message up by its id."""
    found = call_api("GET", url, f"/messages/{quote_part(message_id)}")
    out.print(json.dumps(found, ensure_ascii=False, indent=2), markup=False)
