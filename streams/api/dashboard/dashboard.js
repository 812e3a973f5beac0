// costline's dashboard: everything it shows comes from /api/v1 of the server that served it,
// read again every few seconds. Amounts arrive exact (six-decimal strings) and are written
// for people the way costline writes them everywhere (rules/money.py): $1,804.92.
"use strict";

const EVERY_MS = 5000;
const TOKEN_KEY = "costline.token";
const SVG = "http://www.w3.org/2000/svg";
const SYMBOLS = { USD: "$", EUR: "€", GBP: "£", JPY: "¥" };
let polls = 0;
let timer = null;

// ── money and time for people ─────────────────────────────────────────────────────────

function money(text, currency) {
  const match = /^(-?)(\d+)\.(\d{6})$/.exec(String(text));
  if (!match) return String(text);
  const micro = BigInt(match[2]) * 1000000n + BigInt(match[3]);
  let cents = (micro + 5000n) / 10000n;
  let number;
  if (micro !== 0n && cents === 0n) {
    number = `0.${match[3]}`.replace(/0+$/, "");
  } else {
    const whole = (cents / 100n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
    number = `${whole}.${(cents % 100n).toString().padStart(2, "0")}`;
  }
  const sign = match[1] && /[1-9]/.test(number) ? "-" : "";
  const symbol = SYMBOLS[currency];
  return symbol ? `${sign}${symbol}${number}` : `${sign}${number} ${currency}`;
}

function decimal(text) {
  return Number(text);
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov",
  "Dec"];

function shortTime(iso) {
  const at = new Date(iso);
  if (Number.isNaN(at.getTime())) return String(iso || "");
  const two = (n) => String(n).padStart(2, "0");
  return `${MONTHS[at.getUTCMonth()]} ${two(at.getUTCDate())} ${two(at.getUTCHours())}:` +
    `${two(at.getUTCMinutes())}Z`;
}

function groupText(group) {
  const pairs = Object.entries(group || {});
  return pairs.length ? pairs.map(([k, v]) => `${k}=${v || "—"}`).join(", ") : "everything";
}

// ── DOM helpers (text only: nothing the API returns is parsed as markup) ──────────────

function el(name, attrs, ...children) {
  const node = document.createElement(name);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) {
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  if (text !== undefined) node.textContent = text;
  return node;
}

function fill(parent, nodes, emptyText, columns) {
  parent.replaceChildren(...nodes);
  if (!nodes.length) {
    const cell = el("td", { class: "empty" }, emptyText);
    if (columns) cell.setAttribute("colspan", String(columns));
    parent.append(columns ? el("tr", {}, cell) : el("p", { class: "empty" }, emptyText));
  }
}

// ── the sections ──────────────────────────────────────────────────────────────────────

function budgetChart(row, currency) {
  const width = 420, height = 170, left = 8, right = 8, top = 12, bottom = 18;
  const start = Date.parse(row.period.start), end = Date.parse(row.period.end);
  const points = (row.points || []).map(([at, amount]) => [Date.parse(at), decimal(amount)]);
  const spent = decimal(row.spent);
  const lines = row.lines.map((line) => ({ name: line.name, text: line.amount,
    amount: decimal(line.amount) }));
  // The scale shows the lines and the spend; a projection far past the budget line runs off
  // the top (its figure is written above the chart) rather than flatten everything else.
  const highest = Math.max(spent, ...lines.map((l) => l.amount), 1e-6) * 1.25;
  const x = (t) => left + (width - left - right) * Math.min(1, Math.max(0, (t - start) /
    Math.max(1, end - start)));
  const y = (v) => top + (height - top - bottom) * (1 - Math.min(v, highest) / highest);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `${row.rule} ${groupText(row.group)}: ${money(row.spent, currency)} spent` });
  chart.append(svg("title", {}, `${row.rule} · ${groupText(row.group)}`));
  chart.append(svg("line", { class: "axis", x1: left, x2: width - right, y1: y(0), y2: y(0) }));
  for (const line of lines) {
    const limit = line.name === "limit";
    chart.append(svg("line", { class: limit ? "limit-line" : "warn-line", x1: left,
      x2: width - right, y1: y(line.amount), y2: y(line.amount) }));
    chart.append(svg("text", { class: limit ? "limit-label" : "warn-label",
      x: limit ? width - right : left + 2, y: y(line.amount) - 3,
      "text-anchor": limit ? "end" : "start" },
    `${limit ? "budget" : line.name.replace("warn_", "") + "%"} ${money(line.text, currency)}`));
  }
  if (points.length) {
    chart.append(svg("polyline", { class: "spend-line",
      points: points.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ") }));
  }
  if (row.forecast) {
    const from = Date.parse(row.forecast.at), projected = decimal(row.forecast.spent);
    // Where the projection leaves the chart, if it does: along the same straight line.
    const share = projected > highest ? (highest - spent) / Math.max(1e-9, projected - spent)
      : 1;
    const to = from + (end - from) * Math.max(0, Math.min(1, share));
    chart.append(svg("line", { class: "forecast-line", x1: x(from), y1: y(spent), x2: x(to),
      y2: y(spent + (projected - spent) * Math.max(0, Math.min(1, share))) }));
  }
  chart.append(svg("text", { x: left, y: height - 4 }, shortTime(row.period.start)));
  chart.append(svg("text", { x: width - right, y: height - 4, "text-anchor": "end" },
    shortTime(row.period.end)));
  return chart;
}

function budgetCard(row, currency) {
  const state = el("span", { class: `state ${row.state}` }, row.state);
  const figures = el("p", { class: "figures" },
    el("span", { class: "spent", "data-amount": row.spent }, money(row.spent, currency)),
    ` of ${row.limit === null ? "—" : money(row.limit, currency)} this ${row.period.kind}`);
  if (row.forecast) {
    figures.append(`; projected ${money(row.forecast.spent, currency)} by its end`);
    if (row.forecast.crosses_at) {
      figures.append(`, past the budget line ${shortTime(row.forecast.crosses_at)}`);
    }
  }
  if (row.alert) {
    const muted = row.alert.muted_until ? `, muted until ${shortTime(row.alert.muted_until)}`
      : "";
    figures.append(el("br"), `alert ${row.alert.state} (${row.alert.line}${muted})`);
  }
  return el("article", { class: "budget", "data-rule": row.rule,
    "data-group": groupText(row.group), "data-state": row.state },
  el("h3", {}, `${row.rule} · ${groupText(row.group)}`, state), figures,
  budgetChart(row, currency));
}

function renderBudgets(doc) {
  const cards = doc.budgets.map((row) => budgetCard(row, doc.currency));
  fill(document.getElementById("budgets"), cards, "No budget rule has spend in its period.");
}

function figure(row, field) {
  const text = row[field];
  if (text === null || text === undefined || text === "") return "";
  if (row.unit === "currency") return money(Number(text).toFixed(6), row.currency);
  if (row.unit === "currency_per_hour") return `${money(Number(text).toFixed(6),
    row.currency)}/h`;
  if (row.unit === "fraction") return `${Math.round(Number(text) * 100)}%`;
  return `${text} ${row.unit || ""}`;
}

function renderAlerts(doc) {
  const rows = doc.alerts.map((row) => {
    let state = row.state;
    if (row.muted_by) {
      const how = row.muted_by.startsWith("silence:") ? "silenced" : "muted by a fault";
      state += `, ${how} until ${shortTime(row.muted_until)}`;
    }
    return el("tr", { "data-rule": row.rule, "data-state": row.state },
      el("td", {}, `${row.rule} · ${groupText(row.group)}`),
      el("td", {}, el("span", { class: `state ${row.state}` }, row.state),
        state === row.state ? "" : ` ${state.slice(row.state.length + 2)}`),
      el("td", { class: "num" }, figure(row, "value")),
      el("td", { class: "num" }, figure(row, "threshold")),
      el("td", {}, shortTime(row.since)));
  });
  fill(document.querySelector("#alerts tbody"), rows, "No alert is pending or firing.", 5);
  const silences = doc.silences.map((s) => el("li", {},
    `${s.rule || "any rule"} ${Object.entries(s.matchers).map(([k, v]) => `${k}=${v}`)
      .join(" ")} until ${shortTime(s.ends_at)}${s.comment ? ` — ${s.comment}` : ""}`));
  fill(document.getElementById("silences"), silences, "none");
  const resolved = doc.resolved.slice(0, 8).map((r) => el("li", {},
    `${r.rule} · ${groupText(r.group)}, resolved ${shortTime(r.at)}`));
  fill(document.getElementById("resolved"), resolved, "none");
}

function renderRefused(doc) {
  const rows = doc.reasons.map((r) => el("tr", { "data-code": r.code },
    el("td", {}, r.code), el("td", { class: "num" }, r.messages),
    el("td", { class: "num" }, r.events),
    el("td", { class: "num", "data-amount": r.amount }, money(r.amount, doc.currency)),
    el("td", {}, r.unpriced.map((u) => `${Number(u.quantity)} ${u.unit} of ${u.resource_type}`)
      .join("; "))));
  fill(document.querySelector("#refused tbody"), rows, "Nothing was refused.", 5);
}

function renderWaste(doc) {
  const faults = doc.rows.filter((row) => row.group.fault && decimal(row.waste) !== 0)
    .sort((a, b) => decimal(b.waste) - decimal(a.waste));
  const box = document.getElementById("waste");
  if (!faults.length) {
    fill(box, [], "No fault waste this month.");
    return;
  }
  const most = Math.max(...faults.map((row) => decimal(row.waste)));
  const rowHeight = 24, width = 520, label = 170;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${faults.length * rowHeight + 4}`,
    role: "img", "aria-label": "waste by fault type" });
  faults.forEach((row, i) => {
    const top = i * rowHeight + 2;
    const group = svg("g", { class: "fault", "data-fault": row.group.fault });
    group.append(svg("text", { x: 0, y: top + 15 }, row.group.fault));
    group.append(svg("rect", { class: "bar", x: label, y: top + 3, height: rowHeight - 8,
      width: Math.max(1, (width - label - 110) * decimal(row.waste) / most) }));
    group.append(svg("text", { class: "amount", x: width, y: top + 15, "text-anchor": "end",
      "data-amount": row.waste }, money(row.waste, doc.currency)));
    chart.append(group);
  });
  box.replaceChildren(chart);
}

function renderActions(doc) {
  const rows = doc.map((a) => {
    const amount = a.saved || a.would_save;
    return el("tr", { "data-step": a.step || "" },
      el("td", {}, shortTime(a.at)), el("td", {}, a.step || ""), el("td", {}, a.rule || ""),
      el("td", {}, a.resource_id || ""), el("td", {}, `${a.connector || ""} (${a.mode || ""})`),
      el("td", { class: "num" }, amount ? money(Number(amount).toFixed(6), a.currency) : ""),
      el("td", {}, a.reason || ""));
  });
  fill(document.querySelector("#actions tbody"), rows, "No reclamation step yet.", 7);
}

// ── reading the API ───────────────────────────────────────────────────────────────────

class Unauthorized extends Error {}

async function read(path) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  const answer = await fetch(path, { headers, cache: "no-store" });
  if (answer.status === 401) throw new Unauthorized();
  if (!answer.ok) throw new Error(`${path}: ${answer.status}`);
  return answer.json();
}

async function refresh() {
  const status = document.getElementById("status");
  try {
    const [budgets, alerts, refused, waste, actions] = await Promise.all([
      read("/api/v1/budgets?points=true"), read("/api/v1/alerts?resolved=20"),
      read("/api/v1/refused"), read("/api/v1/spend?by=fault"), read("/api/v1/actions?limit=15"),
    ]);
    renderBudgets(budgets);
    renderAlerts(alerts);
    renderRefused(refused);
    renderWaste(waste);
    renderActions(actions);
    polls += 1;
    status.className = "";
    status.dataset.polls = String(polls);
    status.textContent = `updated ${new Date().toLocaleTimeString()} · every ${EVERY_MS / 1000} s`;
  } catch (error) {
    if (error instanceof Unauthorized) {
      sessionStorage.removeItem(TOKEN_KEY);
      document.getElementById("login").hidden = false;
      status.textContent = "a bearer token is needed";
      return;
    }
    status.className = "failing";
    status.textContent = `could not update (${error.message}); trying again`;
  }
  timer = setTimeout(refresh, EVERY_MS);
}

function start() {
  document.getElementById("login").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
    document.getElementById("login").hidden = true;
    clearTimeout(timer);
    refresh();
  });
  if (document.body.dataset.token === "required" && !sessionStorage.getItem(TOKEN_KEY)) {
    document.getElementById("login").hidden = false;
    document.getElementById("status").textContent = "a bearer token is needed";
    return;
  }
  refresh();
}

document.addEventListener("DOMContentLoaded", start);
