// ascent studio: a run's resolved config with every field's description (as `ascent config show --explain`),
// and the config editor: YAML validated as you type by the real config loader (debounced POST /api/validate;
// the problems are the CLI's own lines, each naming the field and the fix), saved under RUNS_DIR or downloaded.
"use strict";

const VALIDATE_DELAY_MS = 350;
const NEW_CONFIG = `# A run config; every field you leave out takes its default (see \`ascent config show --explain\`).
run_dir: runs/my-run
iterations: 10
model:
  path: models/my-model
data:
  train_path: data/train.jsonl
rollout:
  prompts_per_step: 8
  samples_per_prompt: 8
train:
  lr: 1.0e-06
`;

async function renderConfig(view, runId) {
  const data = await api(`/api/config?run=${enc(runId)}`);
  view.append(h("div", { class: "toolbar" },
    h("a", { href: `#/editor?run=${enc(runId)}` }, h("button", { type: "button" }, "Open in the editor")),
    h("span", { class: "muted" }, `${data.kind === "sft" ? "SFT" : "RL"} config; bold values differ from the default`)));
  if (data.problems.length) {
    view.append(h("div", { class: "card" }, h("p", { class: "error" }, "config.yaml does not load with this ascent:"),
      h("ul", {}, data.problems.map((p) => h("li", { class: "error" }, p)))));
  }
  for (const [section, rows] of Object.entries(data.sections)) {
    view.append(h("h2", {}, section), h("table", { class: "config", dataset: { section } },
      h("thead", {}, h("tr", {}, ["field", "value", "default", "description"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.map((r) => h("tr", { dataset: { field: section === "run" ? r.name : `${section}.${r.name}` } },
        h("td", {}, r.name), h("td", { class: r.changed ? "changed" : null }, r.value), h("td", { class: "muted" }, r.default),
        h("td", { class: "desc" }, r.description))))));
  }
}

// The dotted path of the YAML key on each line (indentation-based; enough for config files).
function yamlPaths(text) {
  const stack = [];
  return text.split("\n").map((line) => {
    const m = line.match(/^(\s*)([A-Za-z_][\w-]*)\s*:/);
    if (!m) return null;
    const indent = m[1].length;
    while (stack.length && stack[stack.length - 1][0] >= indent) stack.pop();
    stack.push([indent, m[2]]);
    return stack.map(([, key]) => key).join(".");
  });
}

async function renderEditor(view, runId) {
  let kind = "train";
  let text = NEW_CONFIG;
  if (runId) {
    const data = await api(`/api/config?run=${enc(runId)}`);
    kind = data.kind;
    text = data.yaml;
  }
  const descriptions = {};
  const area = h("textarea", { id: "yaml", spellcheck: "false", wrap: "off" });
  area.value = text;
  const kindSelect = h("select", { id: "kind", onchange: () => { kind = kindSelect.value; loadSchema(); validateSoon(); } },
    h("option", { value: "train", selected: kind === "train" }, "ascent train (RL)"),
    h("option", { value: "sft", selected: kind === "sft" }, "ascent sft"));
  const verdict = h("div", { id: "verdict", class: "muted" }, "checking…");
  const problems = h("ul", { id: "problems" });
  const hint = h("div", { id: "hint", class: "card muted" }, "Put the cursor on a field to read its description.");
  const target = h("input", { id: "save-path", size: 34, value: runId ? `${runId === "." ? "" : runId + "/"}edited.yaml` : "configs/run.yaml" });
  const saved = h("span", { id: "saved", class: "muted" });
  const saveButton = h("button", { id: "save", type: "button", onclick: () => save(false) }, "Save");
  const download = h("button", { type: "button", class: "secondary", onclick: () => {
    const url = URL.createObjectURL(new Blob([area.value], { type: "text/yaml" }));
    h("a", { href: url, download: target.value.split("/").pop() || "run.yaml" }).click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  } }, "Download");
  view.append(h("h2", {}, runId ? `Config editor: ${runId}/config.yaml` : "Config editor"),
    h("div", { class: "toolbar" }, h("label", {}, "schema", kindSelect),
      h("label", {}, "save as (under the runs directory)", target), saveButton, download, saved),
    h("div", { class: "editor" }, area, h("div", {}, verdict, problems, h("h2", {}, "Field"), hint)));

  let timer = null;
  let sequence = 0;
  function validateSoon() {
    clearTimeout(timer);
    timer = setTimeout(validate, VALIDATE_DELAY_MS);
  }
  async function validate() {
    const mine = ++sequence;
    const result = await post("/api/validate", { text: area.value, kind });
    if (mine !== sequence) return; // a newer check is on its way
    const lines = yamlPaths(area.value);
    area.classList.toggle("invalid", !result.ok);
    saveButton.disabled = !result.ok;
    verdict.className = result.ok ? "ok" : "error";
    verdict.textContent = result.ok ? "valid: ascent would accept this config" : `${result.problems.length} problem(s):`;
    problems.replaceChildren(...result.problems.map((p) => {
      const field = result.fields.find((f) => p.startsWith(f) || p.includes(`'${f}'`));
      const line = field ? lines.indexOf(field) + 1 : 0;
      return h("li", { class: "error", dataset: { field: field || "" }, title: line ? "click to go to the line" : null,
        onclick: line ? () => goToLine(line) : null }, p, line ? h("span", { class: "muted" }, ` (line ${line})`) : null);
    }));
  }
  function goToLine(line) {
    const lines = area.value.split("\n");
    const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    area.focus();
    area.setSelectionRange(start, start + lines[line - 1].length);
    area.scrollTop = Math.max(0, (line - 5) * parseFloat(getComputedStyle(area).lineHeight));
    showHint();
  }
  function showHint() {
    const lineNo = area.value.slice(0, area.selectionStart).split("\n").length - 1;
    const path = yamlPaths(area.value)[lineNo];
    if (!path) return;
    const description = descriptions[path];
    hint.replaceChildren(h("strong", {}, path), h("div", {}, description === undefined ? "not a field of this schema" : description || "(no description)"));
  }
  async function loadSchema() {
    const data = await api(`/api/schema?kind=${kind}`);
    Object.keys(descriptions).forEach((k) => delete descriptions[k]);
    Object.assign(descriptions, data.fields);
  }
  async function save(overwrite) {
    saved.className = "muted";
    try {
      const result = await post("/api/save", { text: area.value, kind, path: target.value, overwrite });
      saved.textContent = `saved ${result.relative}`;
    } catch (err) {
      if (!overwrite && err.status === 400 && /already exists/.test(err.message) && confirm(`${target.value} exists. Overwrite it?`)) return save(true);
      saved.className = "error";
      saved.textContent = err.message;
    }
  }
  area.addEventListener("input", () => { saved.textContent = ""; validateSoon(); });
  area.addEventListener("keyup", showHint);
  area.addEventListener("click", showHint);
  area.addEventListener("keydown", (ev) => {
    if (ev.key !== "Tab") return;
    ev.preventDefault();
    area.setRangeText("  ", area.selectionStart, area.selectionEnd, "end");
    validateSoon();
  });
  cleanup.push(() => clearTimeout(timer));
  await loadSchema();
  await validate();
}
