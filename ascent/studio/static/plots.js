// ascent studio: live metric plots (one chart per metric, grouped by prefix, one trace per run) and the
// phase timeline of an iteration. Plots poll /api/metrics?since=<last step> every POLL_MS, keep every point
// they got, and redraw only the charts that gained points with Plotly.react (same div, zoom kept). The
// toolbar's settings (EMA smoothing as TensorBoard's, log y axis, x = step or wall-clock time) redraw every
// chart from the points kept; they are remembered in localStorage.
"use strict";

const POLL_MS = 2000;
const GROUP_ORDER = ["reward", "val", "rollout", "train", "time", "perf"];
const RUN_COLORS = ["#2f6fdf", "#e0702f", "#2a9d5b", "#c0392b", "#8e44ad", "#7f8c8d", "#b8860b", "#16a0a8"];
const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };
const SETTINGS_KEY = "ascent-studio-plots";
const TIME_UNITS = [[7200, 3600, "h"], [120, 60, "min"], [0, 1, "s"]]; // [span above (s), divisor, label]

function groupRank(group) {
  const i = GROUP_ORDER.indexOf(group);
  return i < 0 ? GROUP_ORDER.length : i;
}

function plotSettings() {
  const saved = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "{}");
  return { smoothing: 0, log: false, x: "step", ...saved };
}

// TensorBoard's smoothing: an exponential moving average, debiased so the first points are not pulled to 0.
function ema(values, weight) {
  let last = 0;
  let debias = 0;
  return values.map((v) => {
    if (v === null || !Number.isFinite(v)) return null;
    last = last * weight + (1 - weight) * v;
    debias = debias * weight + (1 - weight);
    return last / debias;
  });
}

// [low, high] around the values when they span nothing (one point, or a flat line), in the axis's units.
function padRange(values, log) {
  const finite = values.filter((v) => v !== null && Number.isFinite(v) && (!log || v > 0));
  if (!finite.length || Math.min(...finite) !== Math.max(...finite)) return null;
  const v = finite[0];
  if (log) return [Math.log10(v) - 0.3, Math.log10(v) + 0.3];
  const pad = (v === 0 ? 1 : Math.abs(v)) * 0.12; // not 0.1: a tick on the edge would meet the x labels
  return [v - pad, v + pad];
}

// Tick labels in fixed notation, or exponential (7e-7, 1.2e+6) beyond; never SI prefixes (Plotly's "700n").
// A log axis formats every tick the same way (Plotly would label the ticks between decades "2", "3", ...).
function tickStyle(values, log) {
  if (log) return { tickformat: ".2~g" };
  const finite = values.filter((v) => v !== null && Number.isFinite(v) && v !== 0).map(Math.abs);
  const big = finite.length ? Math.max(...finite) : 1;
  return big < 1e-3 || big >= 1e6 ? { tickformat: ".3~e" } : { exponentformat: "none", separatethousands: true };
}

// [divisor, label] for the wall-clock axis: seconds, minutes or hours, by the longest run shown.
function wallClockUnit(series, runs) {
  let span = 0;
  for (const { perRun } of series.values()) {
    perRun.forEach((pts, i) => {
      const last = pts.time[pts.time.length - 1];
      if (last !== undefined && last !== null && runs[i].t0 !== null) span = Math.max(span, last - runs[i].t0);
    });
  }
  const [, divisor, label] = TIME_UNITS.find(([above]) => span >= above);
  return [divisor, label];
}

function xOf(pts, run, settings, divisor) {
  if (settings.x === "step") return pts.step.slice(); // copies: Plotly.react compares arrays by reference
  return pts.time.map((t) => (t === null || run.t0 === null ? null : (t - run.t0) / divisor));
}

// One trace per run (the raw points; faint under smoothing), then one smoothed trace per run when smoothing.
function chartTraces(perRun, runs, settings, divisor) {
  const smooth = settings.smoothing > 0;
  const color = (i) => RUN_COLORS[i % RUN_COLORS.length];
  const raw = perRun.map((pts, i) => {
    const single = pts.value.filter((v) => v !== null).length === 1;
    return { type: "scatter", mode: single || !smooth ? "lines+markers" : "lines", name: runs[i].id,
      x: xOf(pts, runs[i], settings, divisor), y: pts.value.slice(), line: { width: smooth ? 1 : 1.6, color: color(i) },
      marker: { size: single ? 8 : 4, color: color(i) }, opacity: smooth ? 0.3 : 1, showlegend: !smooth,
      hovertemplate: `%{y:.4~g}<extra>${smooth ? "raw" : runs[i].id}</extra>` };
  });
  if (!smooth) return raw;
  return raw.concat(perRun.map((pts, i) => ({ type: "scatter", mode: "lines", name: runs[i].id,
    x: xOf(pts, runs[i], settings, divisor), y: ema(pts.value, settings.smoothing), line: { width: 1.8, color: color(i) },
    hovertemplate: `%{y:.4~g}<extra>${runs[i].id} (smoothed)</extra>` })));
}

// Axis titles (x: iteration / optimizer step / wall-clock time; y: the unit), tick style, and a range around
// a lone point or a flat line.
function chartLayout(metric, unit, data, runs, settings, timeLabel) {
  const xs = data.flatMap((t) => t.x).filter((v) => v !== null);
  const ys = data.flatMap((t) => t.y);
  const xSpan = xs.length ? Math.max(...xs) - Math.min(...xs) : 0;
  const byStep = settings.x === "step";
  const xTitle = byStep ? [...new Set(runs.map((r) => r.xTitle))].join(" / ") : `wall-clock time since the run's first metric (${timeLabel})`;
  return {
    title: { text: metric, font: { size: 13 }, x: 0.02 }, margin: { l: 62, r: 12, t: 30, b: 40 }, height: 232,
    showlegend: runs.length > 1 && settings.smoothing === 0, legend: { orientation: "h", y: -0.3, font: { size: 11 } },
    hovermode: "x unified", paper_bgcolor: "rgba(0,0,0,0)", uirevision: `${settings.x}/${settings.log}`,
    xaxis: { zeroline: false, title: { text: xTitle, font: { size: 11 }, standoff: 4 }, exponentformat: "none",
      range: xSpan === 0 && xs.length ? [xs[0] - 0.5, xs[0] + 0.5] : undefined,
      dtick: byStep && xSpan < 8 ? 1 : undefined, hoverformat: byStep ? "d" : ".3~f" },
    yaxis: { zeroline: false, automargin: true, type: settings.log ? "log" : "linear", ...tickStyle(ys, settings.log),
      range: padRange(ys, settings.log) || undefined, title: { text: unit || "value", font: { size: 11 }, standoff: 4 } },
  };
}

function renderPlots(view, runIds) {
  if (!runIds.length) {
    view.append(h("p", { class: "muted" }, "No runs chosen: tick runs on the runs page, then Compare selected."));
    return;
  }
  const settings = plotSettings();
  const runs = runIds.map((id) => ({ id, since: -1, generation: null, t0: null, xTitle: "step" }));
  const series = new Map(); // metric -> {group, unit, perRun: [{step, time, value}]}
  const charts = new Map(); // metric -> div
  const groups = new Map(); // group -> {details, grid, count}
  const filter = h("input", { type: "search", placeholder: "filter metrics (e.g. kl, reward)", oninput: applyFilter });
  const smoothLabel = h("span", { id: "smoothing-value", class: "num" }, settings.smoothing.toFixed(2));
  const smoothing = h("input", { id: "smoothing", type: "range", min: 0, max: 0.99, step: 0.01, value: settings.smoothing,
    oninput: () => { smoothLabel.textContent = Number(smoothing.value).toFixed(2); change({ smoothing: Number(smoothing.value) }); } });
  const logScale = h("input", { id: "log-scale", type: "checkbox", checked: settings.log, onchange: () => change({ log: logScale.checked }) });
  const xAxis = h("select", { id: "x-axis", onchange: () => change({ x: xAxis.value }) },
    h("option", { value: "step", selected: settings.x === "step" }, "step"),
    h("option", { value: "time", selected: settings.x === "time" }, "wall-clock time"));
  const statusLine = h("span", { id: "run-status", class: "muted" });
  const container = h("div", { id: "groups" });
  const title = runIds.length > 1 ? h("h2", {}, `Comparing ${runIds.length} runs`) : null;
  view.append(title || "",
    h("div", { class: "toolbar", id: "plot-controls" }, filter,
      h("label", { title: "exponential moving average, as TensorBoard's (0: raw points)" }, "smoothing", smoothing, smoothLabel),
      h("label", {}, logScale, "log scale"), h("label", {}, "x axis", xAxis)),
    h("div", { class: "toolbar" }, statusLine), container);

  function change(update) {
    Object.assign(settings, update);
    localStorage.setItem(SETTINGS_KEY, JSON.stringify(settings));
    for (const metric of charts.keys()) draw(metric);
  }

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

  function makeChart(metric) {
    const entry = groupFor(series.get(metric).group);
    const div = h("div", { class: "plot", id: `plot:${metric}`, dataset: { metric } });
    const after = [...entry.grid.children].find((c) => c.dataset.metric > metric) || null;
    entry.grid.insertBefore(div, after);
    entry.count += 1;
    entry.summary.textContent = `${entry.details.dataset.group} (${entry.count})`;
    charts.set(metric, div);
    if (filter.value) applyFilter();
    return div;
  }

  function draw(metric) {
    const div = charts.get(metric) || makeChart(metric);
    const [divisor, label] = wallClockUnit(series, runs);
    const data = chartTraces(series.get(metric).perRun, runs, settings, divisor);
    Plotly.react(div, data, chartLayout(metric, series.get(metric).unit, data, runs, settings, label), PLOT_CONFIG);
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
    series.clear();
    groups.clear();
    container.replaceChildren();
    runs.forEach((run) => { run.since = -1; run.generation = null; });
  }

  // Keep the run's new points; returns the metrics that got some, or "reset" when the file was rewritten.
  async function pollRun(run, index) {
    const data = await api(`/api/metrics?run=${enc(run.id)}&since=${run.since}`);
    if (run.generation !== null && data.generation !== run.generation) return "reset"; // file rewritten (resume)
    Object.assign(run, { generation: data.generation, since: data.last_step, t0: data.t0, xTitle: data.x_title });
    for (const [metric, points] of Object.entries(data.series)) {
      if (!series.has(metric)) {
        series.set(metric, { group: data.groups[metric], unit: data.units[metric],
          perRun: runs.map(() => ({ step: [], time: [], value: [] })) });
      }
      const kept = series.get(metric).perRun[index];
      for (const key of ["step", "time", "value"]) kept[key].push(...points[key]);
    }
    return Object.keys(data.series).filter((m) => data.series[m].step.length);
  }

  async function refreshStatus() {
    const data = await api("/api/runs");
    const byId = new Map(data.runs.map((r) => [r.id, r]));
    statusLine.replaceChildren(...runs.flatMap((run) => {
      const r = byId.get(run.id);
      if (!r) return [h("span", { class: "error" }, `${run.id}: not found `)];
      const step = r.total_steps ? `${r.step ?? "–"}/${r.total_steps}` : `${r.step ?? "–"}`;
      const kind = { sft: "SFT · ", train: "RL · " }[r.kind] || "";
      return [h("span", {}, runs.length > 1 ? `${run.id} ` : "", badge(r.state, r.detail), ` ${kind}${run.xTitle} ${step} · `, `updated ${ago(r.updated_at || r.modified)}   `)];
    }));
  }

  let stopped = false;
  let timer = null;
  let tick = 0;
  async function loop() {
    try {
      const results = await Promise.all(runs.map(pollRun));
      if (results.includes("reset")) reset();
      else new Set(results.flat()).forEach(draw);
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

async function renderTimeline(view, runId, iteration, info) {
  const query = iteration ? `&iteration=${enc(iteration)}` : "";
  const data = await api(`/api/timeline?run=${enc(runId)}${query}`);
  if (!data.phases.length) {
    const hint = info.trace_hint || "No phases recorded in this run's trace.json yet.";
    view.append(h("p", { class: "muted", id: "no-timeline" }, hint));
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
