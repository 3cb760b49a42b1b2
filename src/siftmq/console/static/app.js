// siftmq console: pages drawn from the admin API. Everything fetched goes into the page as text
// (textContent, attributes), never as markup; the Content-Security-Policy allows no inline code.
// Text a client chose is drawn isolated from the text around it (iso, isoText).
// Anything looked up by a name the user chose (a topic, a group) is looked up in a Map: a plain
// object's lookup finds Object.prototype's members for names like "constructor" or "__proto__".
"use strict";

const TOKEN_KEY = "siftmq-admin-token";
const USER_KEY = "siftmq-admin-user";
const REFRESH_MS = 5000;
let refresh = null; // the current page's periodic refresh
let generation = 0; // bumped on every navigation: late answers of a left page are dropped

// ------------------------------------------------------------------------------ building the page

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  setAttrs(el, attrs);
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  setAttrs(el, attrs);
  for (const kid of kids.flat(Infinity)) {
    if (kid !== null && kid !== undefined) el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
}

function setAttrs(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.setAttribute("class", v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
}

function table(headers, rows, numeric = []) {
  return h("div", { class: "scroll" },
    h("table", {},
      h("thead", {}, h("tr", {}, headers.map((t, i) => h("th", { scope: "col", class: numeric.includes(i) ? "num" : null }, t)))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c, i) => h("td", { class: numeric.includes(i) ? "num" : null }, c)))))));
}

// replace ``el``'s children with ``kids`` (arrays flattened; null, undefined and false left out)
function fill(el, ...kids) {
  el.replaceChildren(...kids.flat(Infinity).filter((k) => k !== null && k !== undefined && k !== false)
    .map((k) => (k instanceof Node ? k : String(k))));
  return el;
}

function card(label, value, extra) {
  return h("div", { class: "card" }, h("div", { class: "label" }, label), h("div", { class: "value" }, value), extra || null);
}

function status(...parts) {
  fill(document.getElementById("status"), parts.filter((p) => p !== ""));
}

// Text the broker's clients chose — topic and group names, tags, keys, message and client ids,
// expressions, property names and values, what a filter program's error says — is drawn isolated
// from the text around it: a direction control in it (U+202E RIGHT-TO-LEFT OVERRIDE) would otherwise
// turn round what follows it on the line, and make one name or message look like another.

// ``text`` with its isolates balanced: a PDI (U+2069) closing none opened in it is left out, and one
// is added for each LRI, RLI or FSI it leaves open. A stray PDI would end the isolate drawn around
// it early, <bdi> included (Chromium, measured), and free a direction control after it.
function balanced(text) {
  let open = 0;
  const kept = text.replace(/[\u2066-\u2069]/g, (c) => {
    if (c !== "\u2069") open += 1;
    else if (open) open -= 1;
    else return "";
    return c;
  });
  return kept + "\u2069".repeat(open);
}

// text a client chose, in its own direction box (<bdi>); null for none, so ``iso(x) ?? "–"``
function iso(text) {
  return text === null || text === undefined ? null : h("bdi", {}, balanced(String(text)));
}

// the same where no element can go (a confirm(), an <option>): between U+2068 FIRST STRONG
// ISOLATE and U+2069 POP DIRECTIONAL ISOLATE
function isoText(text) {
  return `\u2068${balanced(String(text))}\u2069`;
}

// ``items`` (texts clients chose) each isolated, ``sep`` between them
function isoList(items, sep) {
  return items.map((t, i) => [i ? sep : "", iso(t)]);
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fmtNum(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

function fmtTime(ms) {
  return ms ? new Date(ms).toISOString().replace("T", " ").replace("Z", "") : "–";
}

function fmtDuration(s) {
  const d = Math.floor(s / 86400), hr = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  return d ? `${d}d ${hr}h` : hr ? `${hr}h ${m}m` : `${m}m ${Math.floor(s % 60)}s`;
}

// a line over ``values`` (the newest last); its label says the range for screen readers
function sparkline(values, label, width = 200, height = 40) {
  const box = svg("svg", { class: "spark", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label });
  if (values.length < 2) {
    box.append(svg("text", { x: 4, y: height / 2, "font-size": 10, fill: "#5b6570" }, "collecting…"));
    return box;
  }
  const lo = Math.min(...values), hi = Math.max(...values), span = hi - lo || 1;
  const pts = values.map((v, i) => `${((i / (values.length - 1)) * (width - 2) + 1).toFixed(1)},${(height - 2 - ((v - lo) / span) * (height - 4)).toFixed(1)}`);
  box.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: "#2f6f9f", "stroke-width": 1.5 }));
  return box;
}

// a chart of ``points`` ([time ms, value]) with its range written on the axes
function chart(points, label, width = 600, height = 160) {
  const box = svg("svg", { class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label });
  if (points.length < 2) {
    box.append(svg("text", { x: 8, y: 20 }, "collecting… (the broker keeps a point every 30 s)"));
    return box;
  }
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs), y1 = Math.max(...ys, 1);
  const px = (x) => 40 + ((x - x0) / (x1 - x0 || 1)) * (width - 50);
  const py = (y) => height - 20 - (y / y1) * (height - 30);
  box.append(
    svg("line", { x1: 40, y1: height - 20, x2: width - 10, y2: height - 20, stroke: "#d6dbe0" }),
    svg("text", { x: 2, y: 14 }, String(y1)),
    svg("text", { x: 2, y: height - 22 }, "0"),
    svg("text", { x: 40, y: height - 4 }, fmtTime(x0).slice(11, 19)),
    svg("text", { x: width - 60, y: height - 4 }, fmtTime(x1).slice(11, 19)),
    svg("polyline", { points: points.map((p) => `${px(p[0]).toFixed(1)},${py(p[1]).toFixed(1)}`).join(" "), fill: "none", stroke: "#2f6f9f", "stroke-width": 2 }),
  );
  return box;
}

// ------------------------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(code, message) { super(message); this.code = code; }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json", "X-Siftmq-Console": "1" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, credentials: "omit", body: body === undefined ? undefined : JSON.stringify(body) });
  if (r.status === 401) {
    sessionStorage.removeItem(TOKEN_KEY);
    throw new ApiError(401, "a login is needed");
  }
  if (r.status === 204) return null;
  const data = await r.json().catch(() => null);
  if (!r.ok) throw new ApiError(r.status, (data && data.message) || `${r.status} ${r.statusText}`);
  return data;
}

const enc = encodeURIComponent;

function base64Utf8(text) {
  return btoa(String.fromCharCode(...new TextEncoder().encode(text)));
}

function showLogin(why) {
  stopRefresh();
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;
  const error = h("p", { class: "error", role: "alert" }, why || "");
  const user = h("input", { id: "login-user", name: "user", autocomplete: "username", required: true });
  const pass = h("input", { id: "login-password", name: "password", type: "password", autocomplete: "current-password", required: true });
  const form = h("form", {
    onsubmit: async (ev) => {
      ev.preventDefault();
      error.textContent = "";
      try {
        const r = await fetch("/tokens", { method: "POST", credentials: "omit", headers: { Accept: "application/json", "X-Siftmq-Console": "1", Authorization: `Basic ${base64Utf8(`${user.value}:${pass.value}`)}` } });
        const data = await r.json().catch(() => null);
        if (!r.ok) throw new Error((data && data.message) || `login failed (${r.status})`);
        sessionStorage.setItem(TOKEN_KEY, data.token);
        sessionStorage.setItem(USER_KEY, user.value);
        route();
      } catch (e) {
        error.textContent = e.message;
        pass.value = "";
      }
    },
  },
  h("label", { for: "login-user" }, "User", user),
  h("label", { for: "login-password" }, "Password", pass),
  h("button", { type: "submit" }, "Log in"));
  page("Log in", h("div", { class: "login" }, h("p", {}, "This broker asks for a user of its auth file."), form, error));
  user.focus();
}

// The token is ended on the broker too: one left in a closed tab's memory would serve until it expires.
async function logOut() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  sessionStorage.removeItem(TOKEN_KEY);
  sessionStorage.removeItem(USER_KEY);
  generation += 1; // the left page's late answers are dropped
  let why = "Logged out.";
  try {
    const r = await fetch("/tokens", { method: "DELETE", credentials: "omit", headers: { "X-Siftmq-Console": "1", Authorization: `Bearer ${token}` } });
    if (!r.ok && r.status !== 401) why = `Logged out here; the broker answered ${r.status}: the token may serve until it expires.`;
  } catch (e) {
    why = `Logged out here; the broker could not be reached (${e.message}): the token may serve until it expires.`;
  }
  showLogin(why);
}

// ---------------------------------------------------------------------------------- navigation

// ``title`` is text, or nodes holding a client's names (isolated, as in the heading, in the tab's title)
function page(title, ...content) {
  const heading = h("h1", {}, title);
  const text = Array.from(heading.childNodes, (n) => (n.nodeName === "BDI" ? isoText(n.textContent) : n.textContent));
  document.title = `${text.join("")} · siftmq console`;
  const main = document.getElementById("main");
  fill(main, heading, content);
  return main;
}

function stopRefresh() {
  if (refresh) clearInterval(refresh);
  refresh = null;
}

function every(fn) {
  stopRefresh();
  refresh = setInterval(fn, REFRESH_MS);
}

async function guarded(gen, fn) {
  try {
    await fn();
  } catch (e) {
    if (gen !== generation) return;
    if (e instanceof ApiError && e.code === 401) showLogin("Log in to continue.");
    else if (e instanceof ApiError && e.code === 403 && !document.querySelector("main h1")) {
      page("Not allowed", h("p", { class: "error", role: "alert", id: "forbidden" }, e.message)); // nothing drawn yet
    } else status("Error: ", iso(e.message)); // the broker's messages quote the names clients chose
  }
}

const ROUTES = [
  [/^#\/overview$/, overviewPage],
  [/^#\/topics$/, topicsPage],
  [/^#\/groups$/, groupsPage],
  [/^#\/groups\/(.+)$/, groupPage],
  [/^#\/messages$/, messagesPage],
  [/^#\/playground$/, playgroundPage],
  [/^#\/dead-letters$/, deadLettersPage],
];

function route() {
  stopRefresh();
  status("");
  generation += 1;
  const gen = generation;
  const hash = location.hash || "#/overview";
  for (const a of document.querySelectorAll("nav a")) {
    const here = hash === a.getAttribute("href") || hash.startsWith(`${a.getAttribute("href")}/`);
    if (here) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const user = sessionStorage.getItem(USER_KEY);
  fill(document.getElementById("who"), user ? ["logged in as ", iso(user)] : null);
  document.getElementById("logout").hidden = !sessionStorage.getItem(TOKEN_KEY);
  for (const [pattern, render] of ROUTES) {
    const m = hash.match(pattern);
    if (m) {
      fill(document.getElementById("main"), h("p", { class: "muted" }, "Loading…"));
      guarded(gen, () => render(gen, ...m.slice(1).map(decodeURIComponent)));
      document.getElementById("main").focus({ preventScroll: true });
      return;
    }
  }
  location.hash = "#/overview";
}

// ------------------------------------------------------------------------------------- overview

function rates(history, field) {
  const out = [];
  for (let i = 1; i < history.length; i += 1) {
    const dt = (history[i].t - history[i - 1].t) / 1000;
    out.push(dt > 0 ? Math.max(0, (history[i][field] - history[i - 1][field]) / dt) : 0);
  }
  return out;
}

async function overviewPage(gen) {
  const draw = async () => {
    const o = await api("/overview");
    if (gen !== generation) return;
    const hist = o.history || [];
    const sendRates = rates(hist, "sent"), deliveryRates = rates(hist, "delivered");
    const last = (xs) => (xs.length ? xs[xs.length - 1].toFixed(1) : "–");
    page("Overview",
      h("div", { class: "cards" },
        card("Broker", o.broker, h("div", { class: "muted" }, `siftmq ${o.version}`)),
        card("Uptime", fmtDuration(o.uptime_s), h("div", { class: "muted" }, `since ${fmtTime(o.started_ms)}`)),
        card("CommitLog", fmtBytes(o.commit_log_bytes), sparkline(hist.map((s) => s.commit_log_bytes), "CommitLog size over the last samples")),
        card("Sends /s", last(sendRates), sparkline(sendRates, "messages sent per second")),
        card("Deliveries /s", last(deliveryRates), sparkline(deliveryRates, "messages delivered per second")),
        card("Clients", fmtNum(o.clients), sparkline(hist.map((s) => s.clients), "live clients")),
        card("Topics / groups", `${fmtNum(o.topics)} / ${fmtNum(o.groups)}`),
        card("Disk used", `${(o.disk.used_ratio * 100).toFixed(1)} %`, h("div", { class: o.disk.full ? "error" : "muted" }, o.disk.full ? "refusing sends: disk full" : `${fmtBytes(o.disk.free_bytes)} free`)),
      ),
      h("p", { class: "muted" }, `Totals: ${fmtNum(o.sent)} sent, ${fmtNum(o.delivered)} delivered. One sample every ${o.sample_every_s} s.`));
  };
  await draw();
  every(() => guarded(gen, draw));
}

// --------------------------------------------------------------------------------------- topics

async function topicsPage(gen) {
  // The page is built once and a refresh redraws its table and the queues shown, nothing else: a
  // half-typed name in the form, the queues opened and the focus stay as they are
  let previous = null;
  let opened = null; // the topic whose queues are shown
  const list = h("div", {});
  const queuesBox = h("div", { id: "queues" });
  const name = h("input", { id: "new-topic", name: "name", required: true, maxlength: 127 });
  const queues = h("input", { id: "new-queues", name: "queues", type: "number", min: 1, value: 8 });
  const form = h("form", { class: "row", onsubmit: async (ev) => { ev.preventDefault(); await guarded(gen, async () => { await api("/topics", { method: "POST", body: { name: name.value, queue_nums: Number(queues.value) } }); status("created ", iso(name.value)); await draw(); }); } },
    h("label", { for: "new-topic" }, "Name", name), h("label", { for: "new-queues" }, "Queues", queues), h("button", { type: "submit" }, "Create"));
  const showQueues = (t) => {
    opened = t.name;
    fill(queuesBox, h("h2", {}, "Queues of ", iso(t.name)),
      table(["Queue", "Min offset", "Max offset", "Messages"], t.queues.map((q) => [String(q.queue_id), fmtNum(q.min_offset), fmtNum(q.max_offset), fmtNum(q.max_offset - q.min_offset)]), [0, 1, 2, 3]));
  };
  const openQueues = (topic) => guarded(gen, async () => {
    const t = await api(`/topics/${enc(topic)}`);
    if (gen === generation) showQueues(t);
  });
  // One call lists every topic with its figures (a call a topic would be thousands every refresh);
  // a topic the user may not Get comes without them and is marked, the others are shown all the same
  const draw = async () => {
    const topics = await api("/topics?figures=true");
    const open = opened !== null && topics.some((t) => t.name === opened && t.readable) ? opened : null;
    const shown = open === null ? null : await api(`/topics/${enc(open)}`).catch((e) => {
      if (e instanceof ApiError && e.code === 404) return null; // deleted meanwhile
      throw e;
    });
    if (gen !== generation) return;
    const now = Date.now();
    const rows = topics.map((t) => {
      const before = previous && previous.sent.get(t.name);
      const rate = t.readable && before !== undefined && previous ? ((t.sent - before) / ((now - previous.t) / 1000)).toFixed(1) : "–";
      return [
        t.readable
          ? h("a", { href: `#/topics`, "data-topic": t.name, onclick: (ev) => { ev.preventDefault(); openQueues(t.name); } }, iso(t.name))
          : h("span", { "data-topic": t.name, class: "unreadable" }, iso(t.name), " ", h("span", { class: "muted" }, "(not allowed to read)")),
        fmtNum(t.queue_nums), t.readable ? fmtNum(t.messages) : "–", rate, String(t.perm),
        h("button", { class: "danger", type: "button", "aria-label": `Delete topic ${t.name}`, onclick: () => deleteTopic(t.name) }, "Delete"),
      ];
    });
    previous = { t: now, sent: new Map(topics.filter((t) => t.readable).map((t) => [t.name, t.sent])) };
    fill(list, table(["Topic", "Queues", "Messages", "Sends /s", "Perm", ""], rows, [1, 2, 3]));
    if (shown) showQueues(shown);
    else if (opened !== null) { opened = null; fill(queuesBox); } // deleted meanwhile, or no longer readable
    if (!list.isConnected) page("Topics", list, queuesBox, h("h2", {}, "Create a topic"), form);
  };
  const deleteTopic = async (topic) => {
    if (!confirm(`Delete topic ${isoText(topic)} and every message in it? This cannot be undone.`)) return;
    await guarded(gen, async () => { await api(`/topics/${enc(topic)}`, { method: "DELETE" }); status("deleted ", iso(topic)); await draw(); });
  };
  await draw();
  every(() => guarded(gen, draw));
}

// --------------------------------------------------------------------------------------- groups

async function groupsPage(gen) {
  const draw = async () => {
    const groups = await api("/groups");
    if (gen !== generation) return;
    page("Consumer groups",
      groups.length ? table(["Group", "Mode", "Consistency", "Clients", "Topics", "Inconsistencies"],
        groups.map((g) => [h("a", { href: `#/groups/${enc(g.group)}` }, iso(g.group)), g.mode, g.consistency, fmtNum(g.clients), isoList(g.topics, ", "), fmtNum(g.inconsistencies)]), [3, 5])
        : h("p", { class: "muted" }, "No consumer group yet."));
  };
  await draw();
  every(() => guarded(gen, draw));
}

// ``kids`` as ``el``'s children, touching nothing when they are these already (a node taken out
// and put back loses the focus)
function keepChildren(el, kids) {
  if (kids.length === el.children.length && kids.every((k, i) => el.children[i] === k)) return;
  el.replaceChildren(...kids);
}

// One subscription's section of the group page, built once; ``update`` redraws its figures and
// keeps the rest (an opened program source stays open)
function subscriptionSection(group, topic) {
  const sub = h("div", {}), total = h("span", { class: "lag-total", "data-topic": topic });
  const lag = h("div", {}), lagChart = h("div", {}), work = h("div", {}), program = h("div", {});
  const programHead = h("p", {}), counters = h("div", {}), source = h("pre", {});
  const details = h("details", {}, h("summary", {}, "Source"), source);
  const none = h("p", { class: "muted" }, "none");
  const el = h("section", { "aria-label": `subscription to ${topic}` },
    h("h2", {}, "Topic ", iso(topic)), sub, h("h3", {}, "Matching lag ", total), lag, lagChart,
    h("h3", {}, "Filter work"), work, h("h3", {}, "Filter program"), program);
  const update = (s, p, history) => {
    const f = s.filter_stats || {};
    fill(sub, table(["Type", "Expression", "Version", "Held by", "Pinned"], [[s.type, h("code", {}, iso(s.expression)), String(s.version), s.holders.join(", ") ? isoList(s.holders, ", ") : "–", s.pinned ? "yes" : "no"]]));
    total.textContent = fmtNum(s.lag.reduce((n, q) => n + Number(q.matching_lag), 0));
    fill(lag, table(["Queue", "Committed", "Max offset", "Behind", "Matching lag"],
      s.lag.map((q) => [String(q.queue_id), fmtNum(q.committed_offset), fmtNum(q.max_offset), fmtNum(q.lag), h("span", { class: "matching-lag" }, fmtNum(q.matching_lag))]), [0, 1, 2, 3, 4]));
    fill(lagChart, chart(history, `matching lag of ${group} on ${topic} over time`));
    fill(work, table(["Evaluated", "Matched", "Skipped by tag code", "Skipped by bitmap"], [[fmtNum(f.evaluated), fmtNum(f.matched), fmtNum(f.skipped_by_tags_code), fmtNum(f.skipped_by_bitmap)]], [0, 1, 2, 3]));
    if (p === null) {
      keepChildren(program, [none]);
      return;
    }
    fill(programHead, `version ${p.version}, `, h("strong", { class: p.status === "active" ? "ok" : "error" }, p.status), p.last_error ? [" — ", iso(p.last_error)] : "");
    fill(counters, table(["Evaluated", "Matched", "Errors", "Timeouts", "Worker restarts"], [[fmtNum(p.counters.evaluated), fmtNum(p.counters.matched), fmtNum(p.counters.errors), fmtNum(p.counters.timeouts), fmtNum(p.counters.worker_restarts)]], [0, 1, 2, 3, 4]));
    if (source.textContent !== p.source) source.textContent = p.source;
    keepChildren(program, [programHead, counters, details]);
  };
  return { el, update };
}

async function groupPage(gen, name) {
  // topic -> [[t, matching lag]]: the broker's last hour (a point every 30 s), then this page's own points
  const lagHistory = new Map(Object.entries(await api(`/groups/${enc(name)}/lag-history`)));
  const cards = h("div", { class: "cards" }), members = h("div", {}), subs = h("div", {});
  const none = h("p", { class: "muted" }, "No subscription.");
  const sections = new Map(); // topic -> its section, kept across refreshes
  const draw = async () => {
    const g = await api(`/groups/${enc(name)}`);
    const programs = new Map((await api(`/groups/${enc(name)}/programs`)).map((p) => [p.topic, p]));
    if (gen !== generation) return;
    const now = Date.now();
    fill(cards,
      card("Mode", g.mode), card("Consistency", g.consistency),
      card("Conflicts", fmtNum(g.inconsistencies), h("div", { class: "muted" }, g.last_inconsistency ? iso(g.last_inconsistency) : "none")),
      card("Dropped by conflicts", fmtNum(g.dropped_by_inconsistency)));
    fill(members, g.clients.length ? table(["Client", "Type", "Address", "Last seen (s)", "Subscriptions"],
      g.clients.map((c) => [iso(c.client_id), c.client_type, iso(c.address), String(c.last_seen_s), Object.entries(c.subscriptions).map(([t, e], i) => [i ? "; " : "", iso(t), ": ", iso(e)])]), [3])
      : h("p", { class: "muted" }, "No live member."));
    for (const s of g.subscriptions) {
      if (!lagHistory.has(s.topic)) lagHistory.set(s.topic, []);
      lagHistory.get(s.topic).push([now, s.lag.reduce((n, q) => n + Number(q.matching_lag), 0)]);
      if (!sections.has(s.topic)) sections.set(s.topic, subscriptionSection(g.group, s.topic));
      sections.get(s.topic).update(s, programs.get(s.topic) ?? null, lagHistory.get(s.topic));
    }
    const current = new Set(g.subscriptions.map((s) => s.topic));
    for (const topic of [...sections.keys()]) if (!current.has(topic)) sections.delete(topic);
    keepChildren(subs, g.subscriptions.length ? g.subscriptions.map((s) => sections.get(s.topic).el) : [none]);
    if (!subs.isConnected) page(["Group ", iso(g.group)], cards, h("h2", {}, "Members"), members, subs);
  };
  await draw();
  every(() => guarded(gen, draw));
}

// ------------------------------------------------------------------------------------- messages

function bodyBytes(m) {
  return Uint8Array.from(atob(m.body_base64 || ""), (c) => c.charCodeAt(0));
}

const HEX_BYTES = 4096; // of a body shown in hex: 3 characters a byte

const JSON_SPACE = " \t\n\r";

// ``text`` indented by two spaces a level when it is JSON (null otherwise). Only whitespace between
// tokens changes: every number and string is kept as written, where JSON.parse would round a 64-bit
// integer or a long decimal to a double and JSON.stringify would rewrite escapes and exponents.
function prettyJson(text) {
  try { JSON.parse(text); } catch (e) { return null; } // the check only: its values are not shown
  const out = [];
  let depth = 0, inString = false, escaped = false;
  const newline = () => `\n${"  ".repeat(depth)}`;
  for (let i = 0; i < text.length; i += 1) {
    const c = text[i];
    if (inString) {
      out.push(c);
      if (escaped) escaped = false;
      else if (c === "\\") escaped = true;
      else if (c === '"') inString = false;
    } else if (c === '"') {
      inString = true;
      out.push(c);
    } else if (c === "{" || c === "[") {
      let j = i + 1;
      while (JSON_SPACE.includes(text[j])) j += 1;
      if (text[j] === (c === "{" ? "}" : "]")) { // empty: {} or [] on the line
        out.push(c, text[j]);
        i = j;
      } else {
        depth += 1;
        out.push(c, newline());
      }
    } else if (c === "}" || c === "]") {
      depth -= 1;
      out.push(newline(), c);
    } else if (c === ",") out.push(",", newline());
    else if (c === ":") out.push(": ");
    else if (!JSON_SPACE.includes(c)) out.push(c);
  }
  return out.join("");
}

function bodyViewer(m) {
  const bytes = bodyBytes(m);
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
  const json = prettyJson(text);
  const hex = Array.from(bytes.slice(0, HEX_BYTES), (b) => b.toString(16).padStart(2, "0")).join(" ").replace(/((?:\S\S ){16})/g, "$1\n");
  const hexPart = m.body_size > HEX_BYTES ? `hex of the first ${fmtNum(HEX_BYTES)} of ${fmtNum(m.body_size)} bytes` : "";
  const views = { text, json: json ?? "(not JSON)", hex };
  const out = h("pre", { class: "body", "aria-live": "polite" }, json ?? text);
  const note = h("p", { class: "muted hex-note" });
  const tabs = h("div", { class: "tabs", role: "tablist", "aria-label": "body as" });
  for (const kind of ["text", "json", "hex"]) {
    tabs.append(h("button", { type: "button", role: "tab", "aria-selected": String(kind === (json ? "json" : "text")), onclick: (ev) => {
      for (const b of tabs.children) b.setAttribute("aria-selected", String(b === ev.target));
      out.textContent = views[kind];
      note.textContent = kind === "hex" ? hexPart : "";
    } }, kind));
  }
  return h("div", {}, tabs, out, note, m.body_truncated ? h("p", { class: "muted" }, "(first 64 KiB)") : null);
}

// A message's properties, each name and value isolated: a value holding a direction control
// (U+202E) would otherwise turn round how every property after it on the line is drawn
function propertyList(props) {
  return Object.entries(props).map(([k, v], i) => h("span", { class: "prop" }, i ? "  " : "", iso(k), "=", iso(v)));
}

function messageBox(m) {
  const props = propertyList(m.properties || {});
  return h("article", { class: "msg", "data-offset": String(m.queue_offset), "aria-label": `message ${m.message_id}` },
    h("div", { class: "meta" },
      h("span", {}, h("strong", {}, "id "), iso(m.message_id)),
      h("span", {}, iso(m.topic), ` · queue ${m.queue_id} · offset ${m.queue_offset}`),
      h("span", {}, "tag ", iso(m.tag) ?? "–"), h("span", {}, "keys ", m.keys && m.keys.length ? isoList(m.keys, " ") : "–"),
      h("span", {}, `stored ${fmtTime(m.store_timestamp)}`), h("span", {}, `${fmtNum(m.body_size)} B`)),
    h("div", { class: "muted props" }, props),
    m.body_base64 !== undefined ? bodyViewer(m) : null);
}

function field(id, label, attrs) {
  const input = h(attrs && attrs.options ? "select" : "input", { id, name: id, ...(attrs || {}), options: null },
    ...((attrs && attrs.options) || []).map((o) => h("option", { value: o }, isoText(o)))); // an option holds text only
  return [h("label", { for: id }, label, input), input];
}

async function messagesPage(gen) {
  const topics = (await api("/topics")).map((t) => t.name);
  if (gen !== generation) return;
  const results = h("div", { id: "results", "aria-live": "polite" });
  const show = (title, msgs, note) => fill(results, h("h2", {}, title), note ? h("p", { class: "muted" }, note) : null,
    msgs.length ? msgs.map(messageBox) : h("p", { class: "muted" }, "No message."));
  const run = (fn) => async (ev) => { ev.preventDefault(); await guarded(gen, fn); };

  const [idLabel, id] = field("by-id", "Message id", { required: true });
  const [keyTopicLabel, keyTopic] = field("key-topic", "Topic", { options: topics });
  const [keyLabel, key] = field("by-key", "Key", { required: true });
  const [bTopicLabel, bTopic] = field("browse-topic", "Topic", { options: topics });
  const [bQueueLabel, bQueue] = field("browse-queue", "Queue", { type: "number", min: 0, value: 0 });
  const [bOffsetLabel, bOffset] = field("browse-offset", "From offset", { type: "number", min: 0, value: 0 });
  const [bCountLabel, bCount] = field("browse-count", "Count", { type: "number", min: 1, max: 200, value: 20 });
  const [bTypeLabel, bType] = field("browse-type", "Filter", { options: ["none", "TAG", "SQL92"] });
  const [bExprLabel, bExpr] = field("browse-expression", "Expression", { size: 40 });
  // ``query`` is the form as it was sent: the next page goes on with what is shown, whatever the
  // form says by then
  const browse = async (query, from) => {
    const q = new URLSearchParams({ offset: String(from), count: query.count });
    if (query.type !== "none" && query.expression) { q.set("type", query.type); q.set("expression", query.expression); }
    const r = await api(`/topics/${enc(query.topic)}/queues/${enc(query.queue)}/browse?${q}`);
    show([iso(r.topic), ` queue ${r.queue_id}`], r.messages, `${r.messages.length} shown of ${fmtNum(r.scanned)} read; next offset ${fmtNum(r.next_offset)} of ${fmtNum(r.max_offset)}`);
    if (r.next_offset < r.max_offset) results.append(h("button", { type: "button", class: "secondary", onclick: run(() => browse(query, r.next_offset)) }, "Next page"));
  };
  const browseForm = () => browse({ topic: bTopic.value, queue: bQueue.value, count: bCount.value, type: bType.value, expression: bExpr.value }, Number(bOffset.value));
  page("Messages",
    h("h2", {}, "Look up"),
    h("form", { class: "row", onsubmit: run(async () => show("By id", [await api(`/messages/${enc(id.value)}?body=true`)])) }, idLabel, h("button", { type: "submit" }, "Find")),
    h("form", { class: "row", onsubmit: run(async () => show("By key", await api(`/messages?${new URLSearchParams({ topic: keyTopic.value, key: key.value, body: "true" })}`))) }, keyTopicLabel, keyLabel, h("button", { type: "submit" }, "Find")),
    h("h2", {}, "Browse a queue"),
    h("form", { class: "row", id: "browse", onsubmit: run(browseForm) }, bTopicLabel, bQueueLabel, bOffsetLabel, bCountLabel, bTypeLabel, bExprLabel, h("button", { type: "submit" }, "Browse")),
    results);
}

// ----------------------------------------------------------------------------------- playground

function caretView(expression, error) {
  const lines = expression.split(/\r\n|\r|\n/);
  const line = lines[(error.line || 1) - 1] ?? "";
  const col = error.column || 1;
  const width = Math.max(1, Math.min((error.end ?? error.start + 1) - error.start, line.length - col + 1));
  return h("div", { class: "caret-box" },
    h("p", { class: "error", id: "check-error" }, `${error.description || error.message} (line ${error.line}, column ${col})`),
    h("pre", { class: "caret", "aria-hidden": "true" }, `${line}\n${" ".repeat(col - 1)}${"^".repeat(width)}`));
}

async function playgroundPage(gen) {
  const topics = (await api("/topics")).map((t) => t.name).filter((t) => !t.startsWith("%"));
  if (gen !== generation) return;
  const [topicLabel, topic] = field("pg-topic", "Topic", { options: topics });
  const [typeLabel, type] = field("pg-type", "Type", { options: ["SQL92", "TAG"] });
  const [lastLabel, last] = field("pg-last", "Newest messages", { type: "number", min: 1, max: 1000, value: 100 });
  const expr = h("textarea", { id: "pg-expression", rows: 3, spellcheck: "false", "aria-describedby": "pg-check" });
  const check = h("div", { id: "pg-check", "aria-live": "polite" });
  const result = h("div", { id: "pg-result", "aria-live": "polite" });
  let pending = null, asked = 0;
  const checkNow = async () => {
    const mine = (asked += 1);
    const r = await api("/filter/check", { method: "POST", body: { type: type.value, expression: expr.value } });
    if (mine !== asked || gen !== generation) return; // typed on meanwhile
    fill(check, r.valid ? h("p", { class: "ok", id: "check-ok" }, "valid: ", iso(r.normalized))
      : r.error.line ? caretView(expr.value, r.error) : h("p", { class: "error", id: "check-error" }, r.error.message));
  };
  expr.addEventListener("input", () => { clearTimeout(pending); pending = setTimeout(() => guarded(gen, checkNow), 150); });
  type.addEventListener("change", () => guarded(gen, checkNow));
  const tryIt = async () => {
    const r = await api(`/topics/${enc(topic.value)}/try`, { method: "POST", body: { type: type.value, expression: expr.value, last: Number(last.value) } });
    if (gen !== generation) return;
    const pct = r.selectivity === null ? "–" : `${(r.selectivity * 100).toFixed(1)} %`;
    fill(result,
      h("div", { class: "cards" },
        card("Matched", `${fmtNum(r.matched)} of ${fmtNum(r.tried)}`), card("Selectivity", pct),
        card("Body bytes saved", fmtBytes(r.body_bytes_saved), h("div", { class: "muted" }, `of ${fmtBytes(r.body_bytes)} — what a broker-side filter keeps off the network`))),
      table(["Match", "Queue", "Offset", "Tag", "Properties", "Stored"], r.messages.map((m) => [
        h("span", { class: m.matched ? "ok" : "muted", "aria-label": m.matched ? "matches" : "does not match" }, m.matched ? "✓" : "✗"),
        String(m.queue_id), fmtNum(m.queue_offset), iso(m.tag) ?? "–",
        propertyList(Object.fromEntries(Object.entries(m.properties).filter(([k]) => !k.startsWith("__")))), fmtTime(m.store_timestamp)]), [1, 2]));
  };
  page("Filter playground",
    h("p", { class: "muted" }, "The broker checks the expression as you type and tries it on a topic's newest messages with its own engine."),
    h("form", { class: "row", onsubmit: (ev) => { ev.preventDefault(); guarded(gen, tryIt); } },
      topicLabel, typeLabel, lastLabel, h("button", { type: "submit", id: "pg-try" }, "Try on the topic")),
    h("label", { for: "pg-expression" }, "Expression", expr), check, result);
  expr.focus();
}

// --------------------------------------------------------------------------------- dead letters

async function deadLettersPage(gen) {
  const list = await api("/dead-letters");
  if (gen !== generation) return;
  const box = h("div", { id: "dlq-messages", "aria-live": "polite" });
  const open = async (topic, from = 0) => {
    const r = await api(`/topics/${enc(topic)}/queues/0/browse?offset=${from}&count=50`);
    if (gen !== generation) return;
    fill(box, h("h2", {}, iso(topic)),
      r.messages.length ? table(["Offset", "Origin", "Reason", "Attempts", "Stored", ""], r.messages.map((m) => [
        fmtNum(m.queue_offset), iso(m.properties.DLQ_ORIGIN_TOPIC || null) ?? "–",
        m.properties.FILTER_ERROR ? ["filter program: ", iso(m.properties.FILTER_ERROR)] : `${m.reconsume_times} delivery attempts`,
        fmtNum(m.reconsume_times), fmtTime(m.store_timestamp),
        h("button", { type: "button", "aria-label": `Resend message at offset ${m.queue_offset} to ${m.properties.DLQ_ORIGIN_TOPIC}`, onclick: () => resend(topic, m) }, "Resend")]), [0, 3])
        : h("p", { class: "muted" }, "Empty."),
      r.next_offset < r.max_offset ? h("button", { type: "button", class: "secondary", onclick: () => guarded(gen, () => open(topic, r.next_offset)) }, "Next page") : null);
  };
  const resend = async (topic, m) => {
    if (!confirm(`Send the message at offset ${m.queue_offset} back to ${isoText(m.properties.DLQ_ORIGIN_TOPIC)}? Every group subscribed to it receives it again.`)) return;
    await guarded(gen, async () => {
      const r = await api(`/topics/${enc(topic)}/queues/${m.queue_id}/messages/${m.queue_offset}/resend`, { method: "POST" });
      status(`${r.duplicate ? "already resent" : "resent"} to `, iso(r.topic), " as ", iso(r.message_id));
    });
  };
  page("Dead letters",
    list.length ? table(["Dead-letter topic", "Group", "Messages"], list.map((d) => [
      h("a", { href: "#/dead-letters", onclick: (ev) => { ev.preventDefault(); guarded(gen, () => open(d.topic)); } }, iso(d.topic)),
      h("a", { href: `#/groups/${enc(d.group)}` }, iso(d.group)), fmtNum(d.messages)]), [2])
      : h("p", { class: "muted" }, "No dead letters."),
    box);
}

document.getElementById("logout").addEventListener("click", logOut);
window.addEventListener("hashchange", route);
document.addEventListener("DOMContentLoaded", route);
