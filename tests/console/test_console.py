"""The web console in a real browser (Debian's chromium driven by Playwright) against a real broker
process with real traffic: every page loads without console errors and shows what the admin API
reports; the playground's caret; a filtered browse showing exactly the matching messages; dead
letters resent; topics created and deleted; the login and log-out when authentication is on;
hostile message contents shown as text, bodies exactly as sent; names that are Object.prototype
members; the refresh keeping what was typed and opened; a narrow window and the keyboard."""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from security_users import ALICE, ROOT, auth_file
from siftmq.client import FilterExpression, Producer, SimpleConsumer
from siftmq.testing import running_broker

pytestmark = pytest.mark.integration

TOPIC = "Orders"
COUNT = 40
HOSTILE = "<img src=x onerror=alert(1)>"
ODD = "Odd"  # one queue of messages the console must show exactly as they were sent
SLASHED_ID = "order/42"
BIG_JSON = (  # what a double cannot hold, and every token that could be mistaken for structure
    '{"id": 12345678901234567891, "amount": 0.1000000000000000055511151231257827, "exp": 1E+2,'
    ' "s": "a \\"q\\" {b}, [c]: d\\\\", "empty": { }, "list": [],  "nested":[{"x":-0.0,"u":"\\u00e9"}]}'
)
PROTO_TOPICS = ("constructor", "__proto__", "toString")  # names a plain object's lookup finds
FAILS_ON_3 = (
    "import json\ndef match(message):\n"
    "    if json.loads(message.body)['id'] % 10 == 3:\n        raise ValueError('no threes')\n"
    "    return True\n"
)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_api = pytest.importorskip("playwright.sync_api")
    executable = chromium()
    if executable is None:
        if os.environ.get("SIFTMQ_REQUIRE_BROWSER"):
            pytest.fail("chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable)
        yield b
        b.close()


def run_async(fn: Any) -> Any:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, fn()).result()


def order(i: int) -> dict[str, Any]:
    return {"id": i, "total": i * 10, "region": "eu" if i % 4 == 0 else "us"}


@pytest.fixture(scope="module")
def broker() -> Iterator[Any]:
    with running_broker({"filter_server_nums": 1}) as b:
        admin = b.admin_url
        for name, queues in ((TOPIC, 4), (ODD, 1), *((t, 1) for t in PROTO_TOPICS)):
            topic = {"name": name, "queue_nums": queues}
            httpx.post(f"{admin}/topics", json=topic, timeout=10).raise_for_status()
        tag_all = {"type": "TAG", "expression": "*"}
        for name in PROTO_TOPICS:
            route = f"{admin}/groups/g-proto/subscriptions/{name}"
            httpx.put(route, json=tag_all, timeout=10).raise_for_status()

        async def traffic() -> None:
            async with Producer(b.endpoint) as p:
                await p.send_many([
                    p.message(TOPIC, json.dumps(order(i)).encode(), tag="A" if i % 2 else "B",
                              properties={"region": order(i)["region"], "n": str(i)})
                    for i in range(COUNT)
                ])  # fmt: skip
                await p.send(TOPIC, f"<script>alert(2)</script>{HOSTILE}".encode(), tag="X",
                             properties={"note": HOSTILE, "n": "hostile"})  # fmt: skip
                await p.send_many([
                    p.message(ODD, b"slashed", keys=["slashed"], message_id=SLASHED_ID),
                    p.message(ODD, BIG_JSON.encode(), keys=["bigint"]),
                    p.message(ODD, bytes(range(256)) * 40, keys=["binary"]),
                ])  # fmt: skip
            async with SimpleConsumer(b.endpoint, "g-prog", {TOPIC: FilterExpression.tag("A || B")},
                                      await_duration=1) as c:  # fmt: skip
                empty = 0
                while empty < 2:
                    batch = await c.receive(32, 30)
                    for m in batch:
                        await c.ack(m)
                    empty = 0 if batch else empty + 1

        program = {"source": FAILS_ON_3, "sample": {"body": json.dumps(order(0))}}
        httpx.put(f"{admin}/groups/g-prog/programs/{TOPIC}", json=program, timeout=30).raise_for_status()
        sql = {"type": "SQL92", "expression": "region = 'eu'"}
        httpx.put(f"{admin}/groups/g-sql/subscriptions/{TOPIC}", json=sql, timeout=10).raise_for_status()
        run_async(traffic)  # Playwright's sync API holds this thread's event loop
        yield b


class Page:
    """A browser page on the console that records console errors, page errors and dialogs."""

    def __init__(self, browser: Any, base: str, **context: Any) -> None:
        self.context = browser.new_context(**context)
        self.page = self.context.new_page()
        self.base = base
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def open(self, route: str) -> Any:
        self.page.goto("about:blank")  # a fresh load: nothing of the last page is left to match
        self.page.goto(f"{self.base}/#/{route}")
        self.page.wait_for_selector("main h1")
        return self.page

    def log_in(self, route: str, user: tuple[str, str]) -> Any:
        """Open ``route`` and log in through the page's form as ``user`` (name, password)."""
        self.page.goto(f"{self.base}/#/{route}")
        self.page.fill("#login-user", user[0])
        self.page.fill("#login-password", user[1])
        self.page.click("button:has-text('Log in')")
        return self.page

    def screenshot(self, name: str) -> Path:
        """The page as it looks, kept as a test artifact (``SIFTMQ_ARTIFACTS``, default ``artifacts/``)."""
        path = Path(os.environ.get("SIFTMQ_ARTIFACTS", "artifacts")) / "console" / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def close(self) -> None:
        self.context.close()


@pytest.fixture
def console(browser: Any, broker: Any) -> Iterator[Page]:
    page = Page(browser, broker.admin_url, viewport={"width": 1280, "height": 900})
    yield page
    page.close()


def api(broker: Any, path: str) -> Any:
    r = httpx.get(f"{broker.admin_url}{path}", timeout=10)
    r.raise_for_status()
    return r.json()


def test_every_page_loads_and_shows_what_the_api_reports(console: Page, broker: Any) -> None:
    page = console.open("overview")
    page.wait_for_selector("text=siftmq-broker")
    assert "CommitLog" in page.inner_text("main")
    assert console.screenshot("overview").stat().st_size > 0

    page = console.open("topics")
    page.wait_for_selector(f"a[data-topic='{TOPIC}']")
    rows = {r.split("\t")[0]: r.split("\t") for r in page.locator("tbody tr").all_inner_texts()}
    assert rows[TOPIC][2] == f"{COUNT + 1}" and "%DLQ%g-prog" in rows
    console.screenshot("topics")

    page = console.open("groups")
    page.wait_for_selector("a[href='#/groups/g-sql']")
    assert "g-prog" in page.inner_text("main")
    console.screenshot("groups")

    page.click("a[href='#/groups/g-sql']")
    page.wait_for_selector(".lag-total")
    report = api(broker, "/groups/g-sql")
    (sub,) = report["subscriptions"]
    matching = sum(int(q["matching_lag"]) for q in sub["lag"])
    assert 0 < matching <= COUNT + 1  # from the index: an upper bound of what the filter matches
    assert page.inner_text(f".lag-total[data-topic='{TOPIC}']") == str(matching)
    assert page.locator(".matching-lag").all_inner_texts() == [str(q["matching_lag"]) for q in sub["lag"]]
    assert "region = 'eu'" in page.inner_text("main")
    # the chart: the broker's point (it keeps one every 30 s), then the page's
    assert page.locator("svg.chart polyline").count() == 1
    console.screenshot("group-g-sql")

    page = console.open("groups/g-prog")
    page.wait_for_selector("text=Filter program")
    program = api(broker, f"/groups/g-prog/programs/{TOPIC}")
    assert "active" in page.inner_text("main")
    assert f"{program['counters']['errors']}" in page.locator("section table").nth(3).inner_text()

    console.screenshot("group-g-prog")
    for route in ("messages", "playground", "dead-letters"):
        console.open(route)
        console.screenshot(route)
    assert console.errors == []


def test_the_playground_puts_the_caret_where_the_broker_says(console: Page, broker: Any) -> None:
    page = console.open("playground")
    page.select_option("#pg-topic", TOPIC)
    for text in ("region = 'eu", "region = 'eu' AND\n  n >> 3"):
        answer = httpx.post(f"{broker.admin_url}/filter/check", json={"type": "SQL92", "expression": text},
                            timeout=10).json()["error"]  # fmt: skip
        page.fill("#pg-expression", text)
        page.wait_for_selector(f"#check-error:has-text('line {answer['line']}, column {answer['column']}')")
        line, caret = page.inner_text("pre.caret").split("\n")
        assert line == text.splitlines()[answer["line"] - 1]
        assert caret.index("^") == answer["column"] - 1, (text, answer)
    page.fill("#pg-expression", "region = 'eu'")
    page.wait_for_selector("#check-ok")
    page.click("#pg-try")
    page.wait_for_selector("#pg-result table")
    body = {"type": "SQL92", "expression": "region = 'eu'", "last": 100}
    tried = httpx.post(f"{broker.admin_url}/topics/{TOPIC}/try", json=body, timeout=10).json()
    assert (tried["matched"], tried["tried"]) == (COUNT // 4, COUNT + 1)
    assert f"{tried['matched']} of {tried['tried']}" in page.inner_text("#pg-result")
    assert page.locator("#pg-result tbody tr").count() == COUNT + 1
    assert console.errors == []


@pytest.mark.parametrize(("kind", "expression", "keep"), [
    ("TAG", "A", lambda m: m["tag"] == "A"),
    ("SQL92", "region = 'us' AND n <> '7'",
     lambda m: m["properties"].get("region") == "us" and m["properties"]["n"] != "7"),
])  # fmt: skip
def test_a_filtered_browse_shows_exactly_the_matching_messages(
    console: Page, broker: Any, kind: str, expression: str, keep: Any
) -> None:
    queues = api(broker, f"/topics/{TOPIC}")["queues"]
    queue = max(queues, key=lambda q: q["max_offset"] - q["min_offset"])["queue_id"]
    everything = api(broker, f"/topics/{TOPIC}/queues/{queue}/browse?count=200")["messages"]
    expected = [m["queue_offset"] for m in everything if keep(m)]
    assert expected and len(expected) < len(everything)
    page = console.open("messages")
    page.select_option("#browse-topic", TOPIC)
    page.fill("#browse-queue", str(queue))
    page.fill("#browse-count", "200")
    page.select_option("#browse-type", kind)
    page.fill("#browse-expression", expression)
    page.click("#browse button[type=submit]")
    page.wait_for_selector("#results h2")
    shown = [
        int(x) for x in page.locator("#results article").evaluate_all("els => els.map(e => e.dataset.offset)")
    ]
    assert shown == expected
    first = page.locator("#results article").first
    assert '"total": ' in first.locator("pre.body").inner_text()  # JSON, pretty-printed
    first.locator("button[role=tab]", has_text="hex").click()
    assert first.locator("pre.body").inner_text().startswith("7b 22")  # '{"'
    assert console.errors == []


def test_a_message_is_looked_up_by_an_id_holding_a_slash(console: Page) -> None:
    page = console.open("messages")
    page.fill("#by-id", SLASHED_ID)
    page.click("form:has(#by-id) button")
    page.wait_for_selector("#results article")
    assert page.get_attribute("#results article", "aria-label") == f"message {SLASHED_ID}"
    assert page.inner_text("#results pre.body") == "slashed"
    assert console.errors == []


def test_names_of_object_members_are_looked_up_as_names(console: Page) -> None:
    """Topic names are the user's: a group page's and the Topics page's lookups by name must not
    find Object.prototype's members (constructor, __proto__, toString, valueOf)."""
    page = console.open("groups/g-proto")
    page.wait_for_selector("section .lag-total")
    assert page.locator("section h2").all_inner_texts() == [f"Topic {t}" for t in sorted(PROTO_TOPICS)]
    for t in PROTO_TOPICS:
        section = page.locator(f"section[aria-label='subscription to {t}']")
        assert section.locator(".lag-total").inner_text() == "0"
        assert section.locator("h3:has-text('Filter program') + *").inner_text() == "none"
        assert section.locator("svg.chart polyline").count() == 1  # the broker's point and the page's
    page = console.open("topics")
    page.fill("#new-topic", "valueOf")
    page.fill("#new-queues", "1")
    page.click("form.row button[type=submit]")
    page.wait_for_selector("a[data-topic='valueOf']")
    rows = {r.split("\t")[0]: r.split("\t") for r in page.locator("tbody tr").all_inner_texts()}
    assert rows["valueOf"][3] == "–"  # no rate before a second sample of it
    assert console.errors == []


def test_the_json_view_shows_every_token_as_it_was_sent(console: Page) -> None:
    page = console.open("messages")
    page.select_option("#key-topic", ODD)
    page.fill("#by-key", "bigint")
    page.click("form:has(#by-key) button")
    page.wait_for_selector("#results pre.body")
    assert page.inner_text("#results pre.body") == "\n".join([  # the JSON view is the default
        "{",
        '  "id": 12345678901234567891,',
        '  "amount": 0.1000000000000000055511151231257827,',
        '  "exp": 1E+2,',
        '  "s": "a \\"q\\" {b}, [c]: d\\\\",',
        '  "empty": {},',
        '  "list": [],',
        '  "nested": [',
        "    {",
        '      "x": -0.0,',
        '      "u": "\\u00e9"',
        "    }",
        "  ]",
        "}",
    ])  # fmt: skip
    assert console.errors == []


def test_the_hex_view_says_how_much_of_the_body_it_shows(console: Page) -> None:
    page = console.open("messages")
    page.select_option("#key-topic", ODD)
    page.fill("#by-key", "binary")
    page.click("form:has(#by-key) button")
    page.wait_for_selector("#results pre.body")
    assert page.inner_text("#results .hex-note") == ""  # the text view
    page.click("#results button[role=tab]:has-text('hex')")
    assert page.inner_text("#results .hex-note") == "hex of the first 4,096 of 10,240 bytes"
    assert len(page.inner_text("#results pre.body").split()) == 4096
    assert console.errors == []


def test_next_page_goes_on_with_the_query_shown(console: Page, broker: Any) -> None:
    """'Next page' continues the browse on the page, whatever the form says meanwhile."""
    queues = api(broker, f"/topics/{TOPIC}")["queues"]
    queue = max(queues, key=lambda q: q["max_offset"] - q["min_offset"])["queue_id"]
    everything = api(broker, f"/topics/{TOPIC}/queues/{queue}/browse?count=200")["messages"]
    expected = [m["queue_offset"] for m in everything if m["properties"].get("region") == "us"]
    assert len(expected) >= 6
    page = console.open("messages")
    page.select_option("#browse-topic", TOPIC)
    page.fill("#browse-queue", str(queue))
    page.fill("#browse-count", "3")
    page.select_option("#browse-type", "SQL92")
    page.fill("#browse-expression", "region = 'us'")
    page.click("#browse button[type=submit]")
    page.wait_for_selector("#results button:has-text('Next page')")
    offsets = "els => els.map(e => Number(e.dataset.offset))"
    assert page.locator("#results article").evaluate_all(offsets) == expected[:3]
    page.select_option("#browse-topic", ODD)  # the form changed, not sent
    page.fill("#browse-queue", "0")
    page.fill("#browse-count", "200")
    page.select_option("#browse-type", "none")
    page.eval_on_selector("#results h2", "h => { h.dataset.old = '1'; }")
    page.click("#results button:has-text('Next page')")
    page.wait_for_selector("#results h2:not([data-old])")  # the next page drawn
    assert page.inner_text("#results h2") == f"{TOPIC} queue {queue}"
    assert page.locator("#results article").evaluate_all(offsets) == expected[3:6]
    assert console.errors == []


def test_the_refresh_keeps_what_was_typed_and_opened(console: Page) -> None:
    """The pages refresh every 5 s (the page's clock is driven here): a half-typed topic name, the
    queues shown, a program's opened source stay as they were; the figures are new."""
    console.page.clock.install()
    page = console.open("topics")
    rate = f"tr:has(a[data-topic='{TOPIC}']) td:nth-child(4)"
    page.wait_for_selector(rate)
    assert page.inner_text(rate) == "–"  # no rate before the second sample
    page.fill("#new-topic", "half-typed")
    page.click(f"a[data-topic='{TOPIC}']")
    page.wait_for_selector("#queues h2")
    page.clock.run_for(5_100)
    page.wait_for_function("s => document.querySelector(s).textContent !== '–'", arg=rate)  # refreshed
    assert page.input_value("#new-topic") == "half-typed"
    assert page.inner_text("#queues h2") == f"Queues of {TOPIC}"

    page = console.open("groups/g-prog")
    page.click("summary:has-text('Source')")
    assert page.is_visible("details pre")
    points = "document.querySelector('svg.chart polyline').getAttribute('points').split(' ').length"
    before = page.evaluate(f"() => {points}")
    page.clock.run_for(5_100)
    page.wait_for_function(f"n => {points} > n", arg=before)  # refreshed: the page's next point
    assert page.is_visible("details pre") and page.get_attribute("details", "open") is not None
    assert console.errors == []


def test_hostile_message_contents_are_shown_as_text(console: Page) -> None:
    page = console.open("messages")
    page.on("dialog", lambda d: console.dialogs.append(d.message) or d.dismiss())
    page.select_option("#browse-topic", TOPIC)
    for queue in range(4):
        page.fill("#browse-queue", str(queue))
        page.fill("#browse-count", "200")
        page.click("#browse button[type=submit]")
        page.wait_for_selector(f"#results h2:has-text('queue {queue}')")
        if HOSTILE in page.inner_text("#results"):
            break
    else:
        pytest.fail("the hostile message was not shown")
    assert "<script>alert(2)</script>" in page.inner_text("#results")
    assert page.locator("#results img").count() == 0 and page.locator("#results script").count() == 0
    page.wait_for_timeout(300)
    assert console.dialogs == [] and console.errors == []


def test_dead_letters_are_listed_and_resent_once(console: Page, broker: Any) -> None:
    page = console.open("dead-letters")
    page.on("dialog", lambda d: d.accept())
    page.click("text=%DLQ%g-prog")
    page.wait_for_selector("#dlq-messages table")
    rows = page.locator("#dlq-messages tbody tr")
    assert rows.count() == 4  # ids 3, 13, 23, 33
    assert "filter program: ValueError: no threes" in rows.first.inner_text()
    before = api(broker, f"/topics/{TOPIC}")["messages"]
    rows.first.locator("button").click()
    page.wait_for_selector("#status:has-text('resent to Orders')")
    assert api(broker, f"/topics/{TOPIC}")["messages"] == before + 1
    resent_id = page.inner_text("#status").rsplit(" as ", 1)[1]
    arrived = api(broker, f"/messages/{resent_id}?body=true")  # on its origin topic, with its body
    assert arrived["topic"] == TOPIC and json.loads(base64.b64decode(arrived["body_base64"]))["id"] % 10 == 3
    rows.first.locator("button").click()
    page.wait_for_selector("#status:has-text('already resent')")
    assert api(broker, f"/topics/{TOPIC}")["messages"] == before + 1
    assert console.errors == []


def test_topics_are_created_and_deleted_with_confirmation(console: Page, broker: Any) -> None:
    page = console.open("topics")
    page.fill("#new-topic", "ConsoleMade")
    page.fill("#new-queues", "2")
    page.click("form.row button[type=submit]")
    page.wait_for_selector("a[data-topic='ConsoleMade']")
    assert api(broker, "/topics/ConsoleMade")["queue_nums"] == 2
    answers = iter([False, True])
    page.on("dialog", lambda d: d.accept() if next(answers) else d.dismiss())
    page.click("button[aria-label='Delete topic ConsoleMade']")
    page.wait_for_timeout(300)
    assert httpx.get(f"{broker.admin_url}/topics/ConsoleMade", timeout=10).status_code == 200  # dismissed
    page.click("button[aria-label='Delete topic ConsoleMade']")
    page.wait_for_selector("a[data-topic='ConsoleMade']", state="detached")
    assert httpx.get(f"{broker.admin_url}/topics/ConsoleMade", timeout=10).status_code == 404
    assert console.errors == []


def test_a_narrow_window_and_the_keyboard(browser: Any, broker: Any) -> None:
    narrow = Page(browser, broker.admin_url, viewport={"width": 400, "height": 800})
    try:
        for route in ("overview", "topics", "groups/g-sql", "playground"):
            page = narrow.open(route)
            page.wait_for_timeout(200)
            overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 1, (route, overflow)  # wide tables scroll inside their box
        page = narrow.open("topics")
        assert page.get_attribute("nav a[href='#/topics']", "aria-current") == "page"
        assert page.evaluate("document.activeElement.id") == "main"  # a new page: its content has focus
        first = "document.querySelector('a, button, input, select, textarea').textContent"
        assert page.evaluate(first) == "Skip to content"  # the first stop of the tab order
        page.keyboard.press("Shift+Tab")  # back from the content: the last page of the menu
        assert page.evaluate("document.activeElement.getAttribute('href')") == "#/dead-letters"
        page.keyboard.press("Enter")
        page.wait_for_selector("main h1:has-text('Dead letters')")
        assert narrow.errors == []
    finally:
        narrow.close()


def test_the_console_logs_in_when_authentication_is_on(browser: Any, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    users = [
        {"username": "root", "password": "R00t-s3cret-pw", "userType": "Super"},
        {"username": "bob", "password": "B0b-s3cret-pw", "userType": "Normal"},  # no ACL: may do nothing
    ]
    auth.write_text(json.dumps({"users": users}))
    auth.chmod(0o600)
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth)}
    with running_broker(config) as secured:
        assert httpx.get(f"{secured.admin_url}/", timeout=10).status_code == 200  # the page holds no data
        assert httpx.get(f"{secured.admin_url}/overview", timeout=10).status_code == 401
        console = Page(browser, secured.admin_url)
        try:
            page = console.page
            page.goto(f"{secured.admin_url}/#/overview")
            page.wait_for_selector("#login-user")
            assert not page.is_visible("#logout")
            page.fill("#login-user", "root")
            page.fill("#login-password", "wrong-password")
            page.click("button:has-text('Log in')")
            page.wait_for_selector("p.error:has-text('a user and password')")
            page.fill("#login-password", "R00t-s3cret-pw")
            page.click("button:has-text('Log in')")
            page.wait_for_selector("text=siftmq-broker")
            assert page.inner_text("#who") == "logged in as root"
            stored = page.evaluate("JSON.stringify(sessionStorage)")
            assert "R00t-s3cret-pw" not in stored and "siftmq-admin-token" in stored
            console.open("topics")  # the token serves the other pages
            page.wait_for_selector("text=Create a topic")
            token = page.evaluate("sessionStorage.getItem('siftmq-admin-token')")
            bearer = {"authorization": f"Bearer {token}"}
            assert httpx.get(f"{secured.admin_url}/overview", headers=bearer, timeout=10).status_code == 200
            page.click("#logout")
            page.wait_for_selector("#login-user")
            assert page.evaluate("sessionStorage.length") == 0
            assert page.inner_text("#who") == "" and not page.is_visible("#logout")
            assert httpx.get(f"{secured.admin_url}/overview", headers=bearer, timeout=10).status_code == 401
            assert [e for e in console.errors if "401" not in e] == []  # the first calls were refused
        finally:
            console.close()
        bob = Page(browser, secured.admin_url)
        try:
            page = bob.log_in("overview", ("bob", "B0b-s3cret-pw"))
            page.wait_for_selector("#forbidden")  # the API's 403, said on the page
            assert "user bob may not" in page.inner_text("#forbidden")
            bob.screenshot("forbidden")
        finally:
            bob.close()


def test_the_topics_page_asks_once_a_refresh_whatever_the_number_of_topics(console: Page) -> None:
    """Every topic's figures come in one call (a call a topic would be thousands every 5 s at
    thousands of topics); the queues shown are the one more."""
    asked: list[str] = []
    console.page.on("request", lambda r: asked.append(r.url) if "/topics" in r.url else None)
    console.page.clock.install()
    page = console.open("topics")
    page.wait_for_selector(f"a[data-topic='{TOPIC}']")
    assert page.locator("tbody tr").count() >= 6
    assert [u.split("/", 3)[3] for u in asked] == ["topics?figures=true"]
    page.click(f"a[data-topic='{TOPIC}']")
    page.wait_for_selector("#queues h2")
    asked.clear()
    page.clock.run_for(5_100)
    for _ in range(100):  # the refresh's calls, one after the other
        if len(asked) >= 2:
            break
        page.wait_for_timeout(50)
    page.wait_for_timeout(300)  # and no more
    assert sorted(u.split("/", 3)[3] for u in asked) == [f"topics/{TOPIC}", "topics?figures=true"]
    assert console.errors == []


def test_a_topic_the_user_may_not_read_is_marked_and_the_others_shown(browser: Any, tmp_path: Path) -> None:
    auth = tmp_path / "auth.json"
    alice_may = [
        {"resource": ["Cluster"], "actions": ["List"]},
        {"resource": ["Topic:Public"], "actions": ["Get"]},
    ]
    auth.write_text(json.dumps(auth_file(alice_may)))
    auth.chmod(0o600)
    config = {"authentication_enabled": True, "authorization_enabled": True, "auth_file": str(auth)}
    with running_broker(config) as secured:
        for name in ("Payroll", "Public"):
            topic = {"name": name, "queue_nums": 1}
            httpx.post(f"{secured.admin_url}/topics", json=topic, auth=ROOT, timeout=10).raise_for_status()
        listed = httpx.get(f"{secured.admin_url}/topics?figures=true", auth=ALICE, timeout=10).json()
        assert listed == [
            {"name": "Payroll", "queue_nums": 1, "perm": 6, "readable": False},  # no figures of it
            {"name": "Public", "queue_nums": 1, "perm": 6, "readable": True, "messages": 0, "sent": 0},
        ]
        alice = Page(browser, secured.admin_url)
        try:
            page = alice.log_in("topics", ALICE)
            page.wait_for_selector("a[data-topic='Public']")
            rows = {r.split("\t")[0]: r.split("\t") for r in page.locator("tbody tr").all_inner_texts()}
            assert rows["Public"][2] == "0"
            assert rows["Payroll (not allowed to read)"][1:4] == ["1", "–", "–"]
            assert page.locator("a[data-topic='Payroll']").count() == 0
            page.click("a[data-topic='Public']")
            page.wait_for_selector("#queues h2:has-text('Queues of Public')")
            alice.screenshot("topics-partly-readable")
            assert [e for e in alice.errors if "401" not in e] == []  # the first call, before the login
        finally:
            alice.close()


# where the first and the last character of each text are drawn, left to right
DRAWN = """(box, texts) => texts.map((text) => {
    const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT);
    let node = null;
    while (walk.nextNode()) if (walk.currentNode.data.includes(text)) { node = walk.currentNode; break; }
    const at = node.data.indexOf(text), x = (i) => {
        const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);
        return r.getBoundingClientRect().left;
    };
    return [x(at), x(at + text.length - 1)];
})"""


def test_a_direction_control_in_a_property_turns_round_nothing_else(console: Page, broker: Any) -> None:
    """A property value holding U+202E (RIGHT-TO-LEFT OVERRIDE) is drawn in its own box: the
    properties after it read left to right as sent (price=0001 is not drawn 1000), on the Messages
    page and in the playground."""
    topic = {"name": "Bidi", "queue_nums": 1}
    httpx.post(f"{broker.admin_url}/topics", json=topic, timeout=10).raise_for_status()

    async def go() -> None:
        async with Producer(broker.endpoint) as p:
            props = {"a_note": "\u202e", "price": "0001", "z": "1"}
            await p.send("Bidi", b"order", tag="a", properties=props)

    run_async(go)

    def left_to_right(box: Any) -> None:
        (price_0, price_1), (z, _) = box.evaluate(DRAWN, ["0001", "z"])
        assert price_0 < price_1, "0001 drawn turned round"
        assert price_1 < z, "z=1 drawn before price=0001"

    page = console.open("messages")
    page.select_option("#browse-topic", "Bidi")
    page.click("#browse button[type=submit]")
    page.wait_for_selector("#results article")
    left_to_right(page.locator("#results .props"))
    page = console.open("playground")
    page.select_option("#pg-topic", "Bidi")
    page.fill("#pg-expression", "a")
    page.click("#pg-try")
    page.wait_for_selector("#pg-result tbody tr")
    left_to_right(page.locator("#pg-result tbody td").nth(4))
    assert console.errors == []


# the texts under a box holding a direction control or isolate, and those whose nearest isolating
# element (a <bdi>, a table cell...) holds more than them
NOT_ISOLATED = r"""box => {
    const walk = document.createTreeWalker(box, NodeFilter.SHOW_TEXT), held = [], bad = [];
    while (walk.nextNode()) {
        const node = walk.currentNode;
        if (!/[\u202a-\u202e\u2066-\u2069]/.test(node.data)) continue;
        held.push(node.data);
        let el = node.parentElement;
        while (getComputedStyle(el).unicodeBidi !== "isolate") el = el.parentElement;
        if (el.textContent !== node.data) bad.push(el.textContent);
    }
    return [held, bad];
}"""


def test_text_clients_chose_is_drawn_isolated(console: Page, broker: Any) -> None:
    """A tag, keys, property values and a subscription's expression holding U+202E (RIGHT-TO-LEFT
    OVERRIDE), some after a stray U+2069 (POP DIRECTIONAL ISOLATE, which would end an isolate drawn
    round it early), are each drawn alone in an isolating box (<bdi>): the text after them reads
    left to right as sent. Names are isolated in headings, and with U+2068...U+2069 where no element
    can go: <option>s, the tab's title, the confirmations of a deletion and of a resend."""
    admin = broker.admin_url
    for name in ("BidiNames", "BidiGone"):
        httpx.post(f"{admin}/topics", json={"name": name, "queue_nums": 1}, timeout=10).raise_for_status()
    route = f"{admin}/groups/g-bidi/subscriptions/BidiNames"
    httpx.put(route, json={"type": "TAG", "expression": "\u202ex || 0001"}, timeout=10).raise_for_status()

    async def go() -> None:
        async with Producer(broker.endpoint) as p:
            props = {"a_note": "\u2069\u202e", "price": "0001", "z": "1"}
            keys = ["\u2069\u202e", "0001", "z"]
            await p.send("BidiNames", b"order", tag="\u2069\u202etag", keys=keys, properties=props)

    run_async(go)

    def isolated(box: Any, at_least: int) -> None:
        held, bad = box.evaluate(NOT_ISOLATED)
        assert len(held) >= at_least and bad == [], (held, bad)

    page = console.open("messages")
    assert page.locator("#browse-topic option[value='BidiNames']").text_content() == "\u2068BidiNames\u2069"
    page.select_option("#browse-topic", "BidiNames")
    page.click("#browse button[type=submit]")
    page.wait_for_selector("#results article")
    assert page.inner_text("#results h2 bdi") == "BidiNames"
    isolated(page.locator("#results article"), 5)  # the tag, a key, a_note, TAGS and KEYS
    for box in ("#results .meta span:nth-child(4)", "#results .props"):  # the keys, the properties
        (n_0, n_1), (z, _) = page.locator(box).evaluate(DRAWN, ["0001", "z"])
        assert n_0 < n_1 < z, (box, "0001 drawn turned round, or after z")

    page = console.open("playground")
    page.select_option("#pg-topic", "BidiNames")
    page.fill("#pg-expression", "a")
    page.click("#pg-try")
    page.wait_for_selector("#pg-result tbody tr")
    isolated(page.locator("#pg-result"), 4)  # the tag, a_note, TAGS and KEYS
    (n_0, n_1), (z, _) = page.locator("#pg-result tbody td").nth(4).evaluate(DRAWN, ["0001", "z"])
    assert n_0 < n_1 < z, "0001 drawn turned round, or after z"

    page = console.open("groups/g-bidi")
    page.wait_for_selector("section .lag-total")
    assert page.inner_text("main h1 bdi") == "g-bidi" and page.inner_text("section h2 bdi") == "BidiNames"
    assert page.title() == "Group \u2068g-bidi\u2069 · siftmq console"
    isolated(page.locator("section table").first, 1)  # the expression

    page = console.open("topics")
    page.on("dialog", lambda d: console.dialogs.append(d.message) or d.dismiss())
    page.click("button[aria-label='Delete topic BidiGone']")
    page = console.open("dead-letters")
    page.click("text=%DLQ%g-prog")
    page.wait_for_selector("#dlq-messages table")
    first = page.locator("#dlq-messages tbody tr").first
    offset = first.locator("td").first.inner_text()
    first.locator("button").click()
    page.wait_for_timeout(300)
    assert console.dialogs == [
        "Delete topic \u2068BidiGone\u2069 and every message in it? This cannot be undone.",
        f"Send the message at offset {offset} back to \u2068Orders\u2069? Every group subscribed to it "
        "receives it again.",
    ]
    assert httpx.get(f"{admin}/topics/BidiGone", timeout=10).status_code == 200  # dismissed
    assert console.errors == []


def test_another_sites_page_cannot_lock_the_operator_out(browser: Any, tmp_path: Path) -> None:
    """A page on another site makes the operator's browser send wrong Basic credentials, again and
    again (a popup navigated to http://nobody:guess@<admin>/..., which Chromium allows, and the icon
    it then fetches there with them): none is counted against the operator's address, whose
    password logins (the console's, a tool's) go on working. A tool's wrong passwords still are."""
    import http.server
    import socketserver
    import threading

    from siftmq.auth.throttle import FAILURES as LOGIN_FAILURES

    auth = tmp_path / "auth.json"
    auth.write_text(json.dumps(auth_file([])))
    auth.chmod(0o600)
    config = {"authentication_enabled": True, "auth_file": str(auth)}
    with running_broker(config) as secured:
        target = secured.admin_url.replace("http://", "http://nobody:guess@") + "/overview"
        tries = 2 * LOGIN_FAILURES
        html = f"""<!doctype html><button id=go>Play</button><script>
document.getElementById("go").onclick = () => {{
  const w = window.open("about:blank", "_blank");
  let n = 0;
  const t = setInterval(() => {{
    w.location = "{target}?" + n;
    if (++n >= {tries}) {{ clearInterval(t); setTimeout(() => {{ document.title = "done"; }}, 1000); }}
  }}, 200);
}};</script>""".encode()

        class Site(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.end_headers()
                self.wfile.write(html)

            def log_message(self, *args: Any) -> None:
                pass

        site = socketserver.TCPServer(("127.0.0.1", 0), Site)
        threading.Thread(target=site.serve_forever, daemon=True).start()
        other = Page(browser, f"http://localhost:{site.server_address[1]}")  # another origin
        try:
            other.page.goto(f"{other.base}/")
            other.page.click("#go")
            other.page.wait_for_function("document.title === 'done'", timeout=60_000)
        finally:
            other.close()
            site.shutdown()
            site.server_close()
        metrics = secured.metrics_with('siftmq_auth_failures_total{reason="admin"}', auth=ROOT)
        (line,) = [
            x for x in metrics.splitlines() if x.startswith('siftmq_auth_failures_total{reason="admin"}')
        ]
        assert float(line.split()[-1]) >= tries  # they came, and were refused
        console = Page(browser, secured.admin_url)
        try:
            page = console.log_in("overview", ROOT)
            page.wait_for_selector("text=siftmq-broker")  # not 429
        finally:
            console.close()
        with httpx.Client(base_url=secured.admin_url, timeout=10) as tool:
            wrong = [
                tool.get("/topics", auth=(ROOT[0], f"guess-{i}")).status_code for i in range(LOGIN_FAILURES)
            ]
            assert wrong == [401] * LOGIN_FAILURES
            assert tool.get("/topics", auth=ROOT).status_code == 429
