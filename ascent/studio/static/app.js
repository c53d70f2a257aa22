// ascent studio: the router, shared helpers and the runs page. The views live in plots.js, episodes.js and
// config.js (index.html loads them all); each `render*` function fills #view and pushes whatever
// must stop when the user leaves (polling timers) onto `cleanup`.
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const enc = encodeURIComponent;
let cleanup = [];

// h("a", {href: "#/"}, "text", child): a DOM element; attrs starting with "on" become listeners.
function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

async function api(path, options) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) {
    const err = new Error(body.error || response.statusText);
    err.status = response.status;
    err.problems = body.problems;
    throw err;
  }
  return body;
}

function post(path, body) {
  return api(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value) && Math.abs(value) < 1e6) return String(value);
  if (!Number.isFinite(value)) return String(value);
  if (Math.abs(value) >= 1e5 || (Math.abs(value) < 1e-3 && value !== 0)) return value.toExponential(2);
  return String(Number(value.toPrecision(digits + 1))); // 4 significant digits, no SI prefixes
}

function ago(unixSeconds) {
  if (!unixSeconds) return "–";
  const s = Math.max(0, Date.now() / 1000 - unixSeconds);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(unixSeconds * 1000).toLocaleString();
}

function badge(state, title) {
  return h("span", { class: `badge ${state}`, title: title || null }, state);
}

function showError(view, err) {
  view.replaceChildren(h("p", { class: "error" }, err.message || String(err)));
}

// ------------------------------------------------------------------------------------------------ router

function parseHash() {
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: new URLSearchParams(query || "") };
}

const RUN_TABS = [["plots", "Plots"], ["timeline", "Timeline"], ["episodes", "Episodes"], ["config", "Config"]];

// The run's tabs; an SFT run has no timeline and no episodes (ascent sft writes neither), so it has no tabs
// for them unless it has the files after all.
function runTabs(info, active) {
  const nav = $("#run-tabs");
  nav.hidden = false;
  const sft = info.kind === "sft";
  const has = { timeline: info.has_trace || !sft, episodes: info.has_episodes || !sft };
  nav.replaceChildren(
    h("span", { class: "title" }, info.id),
    info.kind ? h("span", { class: "kind", id: "run-kind" }, sft ? "SFT" : "RL") : "",
    ...RUN_TABS.filter(([tab]) => has[tab] !== false || tab === active).map(([tab, label]) =>
      h("a", { href: `#/run/${enc(info.id)}/${tab}`, class: tab === active ? "active" : null, dataset: { tab } }, label)),
  );
}

async function route() {
  cleanup.forEach((stop) => stop());
  cleanup = [];
  const view = $("#view");
  const { parts, params } = parseHash();
  $("#run-tabs").hidden = true;
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.dataset.nav === (parts[0] || "runs")));
  view.replaceChildren();
  try {
    if (parts[0] === "run" && parts[1]) {
      const [runId, tab = "plots", arg] = parts.slice(1);
      const info = await api(`/api/run?run=${enc(runId)}`);
      runTabs(info, tab === "episode" ? "episodes" : tab);
      if (tab === "plots") renderPlots(view, [runId]);
      else if (tab === "timeline") await renderTimeline(view, runId, params.get("iteration"), info);
      else if (tab === "episodes") await renderEpisodes(view, runId, params);
      else if (tab === "episode") await renderEpisode(view, runId, Number(arg));
      else if (tab === "config") await renderConfig(view, runId);
    } else if (parts[0] === "compare") {
      renderPlots(view, (params.get("runs") || "").split(",").filter(Boolean).map(decodeURIComponent));
    } else if (parts[0] === "editor") {
      await renderEditor(view, params.get("run"));
    } else {
      await renderRuns(view);
    }
  } catch (err) {
    showError(view, err);
  }
}

// ------------------------------------------------------------------------------------------------ runs page

async function renderRuns(view) {
  const selected = new Set();
  const compare = h("button", { id: "compare", disabled: true, onclick: () => {
    location.hash = `#/compare?runs=${[...selected].map(enc).join(",")}`;
  } }, "Compare selected");
  const body = h("tbody");
  const table = h("table", { id: "runs" },
    h("thead", {}, h("tr", {}, ["", "run", "kind", "status", "step", "latest", "updated", "views"].map((t) => h("th", {}, t)))),
    body);
  const empty = h("p", { class: "muted", hidden: true }, "No runs here yet: a run directory holds metrics.jsonl or config.yaml.");
  view.append(h("h2", {}, "Runs"),
    h("div", { class: "toolbar" }, compare, h("span", { class: "muted" }, "Tick runs to overlay their curves.")),
    table, empty);

  function row(run) {
    const link = (tab, label, ok) => ok ? h("a", { href: `#/run/${enc(run.id)}/${tab}` }, label) : null;
    const box = h("input", { type: "checkbox", checked: selected.has(run.id), onchange: (e) => {
      e.target.checked ? selected.add(run.id) : selected.delete(run.id);
      compare.disabled = selected.size === 0;
    } });
    const step = run.step === null ? "–" : run.total_steps ? `${run.step} / ${run.total_steps}` : String(run.step);
    const why = [run.detail, run.error].filter(Boolean).join(": ");
    return h("tr", { dataset: { run: run.id } },
      h("td", {}, box),
      h("td", {}, h("a", { href: `#/run/${enc(run.id)}/plots` }, run.id)),
      h("td", {}, run.kind === "sft" ? "SFT" : run.kind === "train" ? "RL" : "–"),
      h("td", {}, badge(run.state, why), run.error ? h("div", { class: "error" }, run.error) : null),
      h("td", { class: "num" }, step),
      h("td", { class: "headline" }, Object.entries(run.headline).map(([k, v]) => h("div", {}, h("span", { class: "muted" }, `${k} `), fmt(v)))),
      h("td", {}, ago(run.updated_at || run.modified)),
      h("td", {}, [link("plots", "plots", run.has_metrics), link("timeline", "timeline", run.has_trace),
        link("episodes", "episodes", run.has_episodes), link("config", "config", run.has_config)]
        .filter(Boolean).flatMap((a, i) => (i ? [" · ", a] : [a]))),
    );
  }

  async function refresh() {
    const data = await api("/api/runs");
    $("#root").textContent = data.root;
    body.replaceChildren(...data.runs.map(row));
    empty.hidden = data.runs.length > 0;
  }
  await refresh();
  const timer = setInterval(() => refresh().catch(() => {}), 5000);
  cleanup.push(() => clearInterval(timer));
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);
