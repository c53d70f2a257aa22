// ascent studio: the episode browser. A run's episodes newest first, a page at a time (the server pages them:
// offset/limit), filtered (iteration, reward range, environment, status incl. "dropped", text in the prompt or
// the response), and one episode turn by turn: every token, sampled tokens (loss mask 1) outlined and
// coloured by the sampler's probability, prompt and observation tokens (mask 0) in grey; hovering a token
// shows its id, mask, logprob and policy version. A simulator episode that rendered shows its frames first,
// each beside the action taken on it and the step's reward.
"use strict";

const STATUS_CHOICES = ["", "trained", "dropped", "filtered", "dropped_stale", "surplus", "served"];
const FILTERS = ["iteration", "min_reward", "max_reward", "env", "status", "search", "limit", "offset"];
const PAGE_SIZES = [25, 50, 100, 200];

async function renderEpisodes(view, runId, params) {
  const query = FILTERS.filter((k) => params.get(k)).map((k) => `&${k}=${enc(params.get(k))}`).join("");
  const data = await api(`/api/episodes?run=${enc(runId)}${query}`);
  if (data.missing) {
    view.append(h("p", { class: "muted", id: "no-episodes" }, data.missing));
    return;
  }
  const value = (k) => params.get(k) || "";
  const iteration = h("select", { name: "iteration" }, h("option", { value: "" }, "any"),
    data.iterations.map((it) => h("option", { value: it, selected: String(it) === value("iteration") }, it)));
  const env = h("select", { name: "env" }, h("option", { value: "" }, "any"),
    data.envs.map((e) => h("option", { value: e, selected: e === value("env") }, e)));
  const status = h("select", { name: "status" },
    STATUS_CHOICES.map((s) => h("option", { value: s, selected: s === value("status") }, s || "any")));
  const minReward = h("input", { name: "min_reward", type: "number", step: "any", size: 6, value: value("min_reward") });
  const maxReward = h("input", { name: "max_reward", type: "number", step: "any", size: 6, value: value("max_reward") });
  const search = h("input", { name: "search", id: "episode-search", type: "search", size: 22, placeholder: "text in prompt or response", value: value("search") });
  const limit = h("select", { name: "limit", form: "episode-filters" }, PAGE_SIZES.map((n) => h("option", { value: n, selected: n === data.limit }, n)));
  const go = (q) => { location.hash = `#/run/${enc(runId)}/episodes?${q}`; };
  const form = h("form", { class: "toolbar", id: "episode-filters", onsubmit: (e) => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const el of form.elements) if (el.name && el.value !== "") q.set(el.name, el.value);
    go(q); // a new filter starts at the newest page
  } },
  search, h("label", {}, "iteration", iteration), h("label", {}, "reward ≥", minReward), h("label", {}, "≤", maxReward),
  data.envs.length ? h("label", {}, "environment", env) : null, h("label", {}, "status", status),
  h("button", { type: "submit" }, "Filter"));
  for (const el of [iteration, env, status, limit]) el.addEventListener("change", () => form.requestSubmit());
  view.append(form, pager(data, params, go, limit));
  const columns = ["id", "it", "group", "row", "env", "status", "reward", "adv", "turns", "finish", "tokens", "prompt", "response"];
  const rows = data.episodes.map((e) => h("tr", {
    class: "clickable", dataset: { episode: e.id }, onclick: () => { location.hash = `#/run/${enc(runId)}/episode/${e.id}`; },
  },
  h("td", {}, e.id), h("td", {}, e.iteration), h("td", {}, e.group_index ?? "–"), h("td", {}, e.row_id), h("td", {}, e.env || "–"),
  h("td", {}, badge(e.status, e.drop_reason)), h("td", { class: "num" }, fmt(e.reward)), h("td", { class: "num" }, fmt(e.advantage)),
  h("td", { class: "num" }, e.turns), h("td", {}, e.finish_reason), h("td", { class: "num" }, e.response_len),
  h("td", { class: "prompt" }, e.prompt), h("td", { class: "muted response" }, e.preview)));
  view.append(h("table", { id: "episodes" }, h("thead", {}, h("tr", {}, columns.map((c) => h("th", { dataset: { column: c } }, c)))), h("tbody", {}, rows)));
  if (!rows.length) view.append(h("p", { class: "muted" }, "No episode matches these filters."));
}

// "41–90 of 1234 matching (5000 episodes), newest first" with newer/older buttons that keep the filters.
function pager(data, params, go, limit) {
  const first = data.matching ? data.offset + 1 : 0;
  const last = data.offset + data.episodes.length;
  const to = (offset) => {
    const q = new URLSearchParams(params);
    if (offset > 0) q.set("offset", offset); else q.delete("offset");
    go(q);
  };
  const newer = h("button", { type: "button", class: "secondary", id: "newer", disabled: data.offset === 0,
    onclick: () => to(Math.max(0, data.offset - data.limit)) }, "← newer");
  const older = h("button", { type: "button", class: "secondary", id: "older", disabled: last >= data.matching,
    onclick: () => to(data.offset + data.limit) }, "older →");
  const total = data.matching === data.total ? `${data.total} episodes` : `${data.matching} matching (of ${data.total})`;
  return h("div", { class: "toolbar", id: "episode-pager" }, newer, older,
    h("span", { class: "muted", id: "episode-count" }, `${first}–${last} of ${total}, newest first`),
    h("label", {}, "per page", limit));
}

// p = exp(logprob) -> red (unlikely) .. green (likely)
function probColor(logprob) {
  const p = Math.exp(Math.min(0, logprob));
  return `hsl(${Math.round(120 * p)}, 75%, 82%)`;
}

function tokenText(t) {
  if (t.text === null || t.text === undefined) return `[${t.id}]`;
  return t.text.replace(/\n/g, "⏎\n");
}

async function renderEpisode(view, runId, episodeId) {
  const e = await api(`/api/episode?run=${enc(runId)}&id=${episodeId}`);
  const components = Object.entries(e.reward_components).map(([k, v]) => `${k} ${fmt(v)}`).join(", ");
  const facts = [
    ["iteration", e.iteration], ["group", e.group_index ?? "–"], ["row", e.row_id], ["environment", e.env || "–"],
    ["status", e.status + (e.drop_reason ? ` (${e.drop_reason})` : "")], ["reward", fmt(e.reward) + (components ? ` (${components})` : "")],
    ["advantage", fmt(e.advantage)], ["finish", e.finish_reason], ["turns", e.turns],
    ["tokens", `${e.prompt_len} prompt, ${e.response_len} response, ${e.trained_tokens} trained`],
    ["policy version", e.policy_version], ["trainer version", e.trainer_version], ["staleness", e.staleness],
  ];
  const colour = h("input", { type: "checkbox", id: "by-logprob", checked: true, onchange: paint });
  const legend = h("div", { class: "legend" },
    h("label", {}, colour, " colour sampled tokens by probability"),
    h("span", {}, h("span", { class: "swatch", style: `background: linear-gradient(90deg, ${probColor(Math.log(0.01))}, ${probColor(Math.log(0.5))}, ${probColor(0)})` }), "p → 0 … 1"),
    h("span", {}, h("span", { class: "tok m1 plain" }, "sampled"), " loss mask 1"),
    h("span", {}, h("span", { class: "tok m0" }, "prompt / observation"), " loss mask 0"),
    e.tokens_decoded ? null : h("span", { class: "error" }, "token text unavailable (the run's tokenizer.json is gone): ids shown"));
  const segments = e.segments.map((seg) => h("div", { class: "segment", dataset: { mask: seg.mask } },
    h("div", { class: "label" }, `${seg.label} · ${seg.tokens.length} tokens · loss mask ${seg.mask}`),
    h("div", { class: "tokens" }, seg.tokens.map((t) => h("span", {
      class: `tok m${t.mask}`, dataset: { tip: tokenTip(t), logprob: t.logprob ?? "" },
    }, tokenText(t))))));
  view.append(
    h("p", {}, h("a", { href: `#/run/${enc(runId)}/episodes` }, "← all episodes")),
    h("h2", {}, `Episode ${e.id}`), h("div", { class: "card facts", id: "episode-facts" }, facts.map(([k, v]) => h("div", {}, h("span", {}, k), v))),
    simSteps(runId, e.steps), legend, h("div", { id: "episode" }, segments));
  if (Object.keys(e.metadata).length) {
    view.append(h("details", {}, h("summary", {}, "row and episode metadata"), h("pre", { class: "card" }, JSON.stringify(e.metadata, null, 2))));
  }
  function paint() {
    for (const span of view.querySelectorAll(".tok.m1")) {
      const lp = span.dataset.logprob;
      span.classList.toggle("plain", !colour.checked || lp === "");
      span.style.background = colour.checked && lp !== "" ? probColor(Number(lp)) : "";
    }
  }
  paint();
  attachTips(view);
}

// A simulator episode's frames, each beside the action the model took on it and that step's reward.
function simSteps(runId, steps) {
  if (!steps || !steps.length) return null;
  const row = (s) => h("tr", { dataset: { step: s.step } }, h("td", { class: "num" }, s.step),
    h("td", {}, h("img", { class: "frame", alt: `frame ${s.step}`, src: `/api/frame?run=${enc(runId)}&path=${enc(s.frame)}` })),
    h("td", {}, s.action ?? "–"), h("td", { class: "num" }, s.reward === null ? "–" : fmt(s.reward)));
  return h("details", { open: true, id: "episode-steps" }, h("summary", {}, `${steps.length} frames, with actions and rewards`),
    h("table", {}, h("thead", {}, h("tr", {}, ["step", "frame", "action", "reward"].map((c) => h("th", {}, c)))),
      h("tbody", {}, steps.map(row))));
}

function tokenTip(t) {
  const lines = [`id ${t.id}  ${JSON.stringify(t.text ?? "")}`, `loss mask ${t.mask}`];
  if (t.logprob !== undefined) lines.push(`logprob ${t.logprob.toFixed(4)}  (p ${Math.exp(t.logprob).toFixed(3)})`, `policy version ${t.version}`);
  return lines.join("\n");
}

function attachTips(root) {
  const tip = $("#tip") || document.body.appendChild(h("div", { id: "tip", hidden: true }));
  root.addEventListener("mouseover", (ev) => {
    const span = ev.target.closest(".tok");
    if (!span || !span.dataset.tip) return;
    tip.textContent = span.dataset.tip;
    tip.hidden = false;
  });
  root.addEventListener("mousemove", (ev) => { tip.style.left = `${ev.clientX + 12}px`; tip.style.top = `${ev.clientY + 14}px`; });
  root.addEventListener("mouseout", (ev) => { if (ev.target.closest(".tok")) tip.hidden = true; });
  cleanup.push(() => { tip.hidden = true; });
}
