// ascent studio: live metric plots (one chart per metric, grouped by prefix, one trace per run) and the
// phase timeline of an iteration. Plots poll /api/metrics?since=<last step> every POLL_MS and append the new
// points with Plotly.extendTraces, so a chart never reloads while the run trains.
"use strict";

const POLL_MS = 2000;
const GROUP_ORDER = ["reward", "val", "rollout", "train", "time", "perf"];
const RUN_COLORS = ["#2f6fdf", "#e0702f", "#2a9d5b", "#c0392b", "#8e44ad", "#7f8c8d", "#b8860b", "#16a0a8"];
const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

function groupRank(group) {
  const i = GROUP_ORDER.indexOf(group);
  return i < 0 ? GROUP_ORDER.length : i;
}

function renderPlots(view, runIds) {
  if (!runIds.length) {
    view.append(h("p", { class: "muted" }, "No runs chosen: tick runs on the runs page, then Compare selected."));
    return;
  }
  const runs = runIds.map((id) => ({ id, since: -1, generation: null }));
  const charts = new Map(); // metric -> div
  const groups = new Map(); // group -> {details, grid, count}
  const filter = h("input", { type: "search", placeholder: "filter metrics (e.g. kl, reward)", oninput: applyFilter });
  const statusLine = h("span", { id: "run-status", class: "muted" });
  const container = h("div", { id: "groups" });
  const title = runIds.length > 1 ? h("h2", {}, `Comparing ${runIds.length} runs`) : null;
  view.append(title || "", h("div", { class: "toolbar" }, filter, statusLine), container);

  function groupFor(name) {
    if (groups.has(name)) return groups.get(name);
    const grid = h("div", { class: "grid" });
    const summary = h("summary", {}, name);
    const details = h("details", { class: "group", open: true, dataset: { group: name } }, summary, grid);
    const entry = { details, grid, summary, count: 0 };
    const names = [...groups.keys(), name].sort((a, b) => groupRank(a) - groupRank(b) || a.localeCompare(b));
    const next = names[names.indexOf(name) + 1];
    container.insertBefore(details, next ? groups.get(next).details : null);
    groups.set(name, entry);
    return entry;
  }

  function makeChart(metric, group, runIndex, points) {
    const entry = groupFor(group);
    const div = h("div", { class: "plot", id: `plot:${metric}`, dataset: { metric } });
    const after = [...entry.grid.children].find((c) => c.dataset.metric > metric) || null;
    entry.grid.insertBefore(div, after);
    entry.count += 1;
    entry.summary.textContent = `${group} (${entry.count})`;
    const traces = runs.map((run, i) => ({
      type: "scatter", mode: "lines+markers", name: run.id, line: { width: 1.6, color: RUN_COLORS[i % RUN_COLORS.length] },
      marker: { size: 4 }, x: i === runIndex ? points.step : [], y: i === runIndex ? points.value : [],
    }));
    const layout = {
      title: { text: metric, font: { size: 13 }, x: 0.02 }, margin: { l: 52, r: 12, t: 32, b: 30 }, height: 210,
      showlegend: runs.length > 1, legend: { orientation: "h", y: -0.22, font: { size: 11 } },
      hovermode: "x unified", xaxis: { zeroline: false }, yaxis: { zeroline: false, automargin: true },
      paper_bgcolor: "rgba(0,0,0,0)",
    };
    Plotly.newPlot(div, traces, layout, PLOT_CONFIG);
    charts.set(metric, div);
    if (filter.value) applyFilter();
  }

  function applyFilter() {
    const needle = filter.value.trim().toLowerCase();
    for (const [metric, div] of charts) div.style.display = !needle || metric.toLowerCase().includes(needle) ? "" : "none";
    for (const entry of groups.values()) {
      entry.details.style.display = [...entry.grid.children].some((d) => d.style.display !== "none") ? "" : "none";
    }
  }

  function reset() {
    charts.forEach((div) => Plotly.purge(div));
    charts.clear();
    groups.clear();
    container.replaceChildren();
    runs.forEach((run) => { run.since = -1; run.generation = null; });
  }

  async function pollRun(run, index) {
    const data = await api(`/api/metrics?run=${enc(run.id)}&since=${run.since}`);
    if (run.generation !== null && data.generation !== run.generation) return "reset"; // file rewritten (resume)
    run.generation = data.generation;
    run.since = data.last_step;
    for (const [metric, points] of Object.entries(data.series)) {
      const div = charts.get(metric);
      if (!div) makeChart(metric, data.groups[metric], index, points);
      else if (points.step.length) Plotly.extendTraces(div, { x: [points.step], y: [points.value] }, [index]);
    }
    return "ok";
  }

  async function refreshStatus() {
    const data = await api("/api/runs");
    const byId = new Map(data.runs.map((r) => [r.id, r]));
    statusLine.replaceChildren(...runs.flatMap((run) => {
      const r = byId.get(run.id);
      if (!r) return [h("span", { class: "error" }, `${run.id}: not found `)];
      const step = r.total_steps ? `${r.step ?? "–"}/${r.total_steps}` : `${r.step ?? "–"}`;
      return [h("span", {}, runs.length > 1 ? `${run.id} ` : "", badge(r.state, r.detail), ` step ${step} · `, `updated ${ago(r.updated_at || r.modified)}   `)];
    }));
  }

  let stopped = false;
  let timer = null;
  let tick = 0;
  async function loop() {
    try {
      const results = await Promise.all(runs.map(pollRun));
      if (results.includes("reset")) reset();
      if (tick++ % 3 === 0) await refreshStatus();
      if (!charts.size && tick === 1) statusLine.append(h("span", { class: "muted" }, " no metrics logged yet"));
    } catch (err) {
      statusLine.replaceChildren(h("span", { class: "error" }, err.message));
    }
    if (!stopped) timer = setTimeout(loop, POLL_MS);
  }
  loop();
  cleanup.push(() => { stopped = true; clearTimeout(timer); charts.forEach((div) => Plotly.purge(div)); });
}

// ------------------------------------------------------------------------------------------------ timeline

async function renderTimeline(view, runId, iteration) {
  const query = iteration ? `&iteration=${enc(iteration)}` : "";
  const data = await api(`/api/timeline?run=${enc(runId)}${query}`);
  if (!data.phases.length) {
    view.append(h("p", { class: "muted" }, "No phases recorded: the run has no trace.json yet (tracking.trace=true writes it)."));
    return;
  }
  const select = h("select", { id: "iteration", onchange: (e) => { location.hash = `#/run/${enc(runId)}/timeline?iteration=${e.target.value}`; } },
    data.iterations.map((it) => h("option", { value: it, selected: it === data.iteration }, `iteration ${it}`)));
  const processes = new Set(data.phases.map((p) => p.process));
  const label = (p) => `${processes.size > 1 ? p.process + ": " : ""}${"· ".repeat(p.depth)}${p.name}`;
  const total = Math.max(...data.phases.map((p) => p.start_s + p.duration_s));
  const rows = [...new Set(data.phases.map(label))];
  const chart = h("div", { id: "gantt", class: "card" });
  view.append(h("div", { class: "toolbar" }, select, h("span", { class: "muted" }, `${fmt(total)} s from first to last phase; nested phases are indented`)), chart);
  Plotly.newPlot(chart, [{
    type: "bar", orientation: "h", y: data.phases.map(label), base: data.phases.map((p) => p.start_s),
    x: data.phases.map((p) => p.duration_s), text: data.phases.map((p) => `${fmt(p.duration_s)} s`), textposition: "auto",
    marker: { color: data.phases.map((p) => RUN_COLORS[p.depth % RUN_COLORS.length]) },
    hovertemplate: "%{y}<br>start %{base:.4f} s<br>duration %{x:.4f} s<extra></extra>",
  }], {
    height: 80 + 30 * rows.length, margin: { l: 160, r: 20, t: 10, b: 40 }, bargap: 0.25,
    xaxis: { title: { text: "seconds since the iteration's first phase" }, zeroline: false },
    yaxis: { autorange: "reversed", categoryorder: "array", categoryarray: rows },
  }, PLOT_CONFIG);
  cleanup.push(() => Plotly.purge(chart));
  const top = data.phases.filter((p) => p.depth === 0);
  const spanOfTop = top.reduce((s, p) => s + p.duration_s, 0) || total;
  view.append(h("table", {}, h("thead", {}, h("tr", {}, ["phase", "process", "start (s)", "duration (s)", "share"].map((t) => h("th", {}, t)))),
    h("tbody", {}, data.phases.map((p) => h("tr", {},
      h("td", {}, `${"\u00a0\u00a0".repeat(p.depth)}${p.name}`), h("td", {}, p.process), h("td", { class: "num" }, fmt(p.start_s, 4)),
      h("td", { class: "num" }, fmt(p.duration_s, 4)), h("td", { class: "num" }, p.depth === 0 ? `${Math.round((100 * p.duration_s) / spanOfTop)}%` : ""))))));
}
