// rlx view: the page. Data comes from the JSON routes of rlx/view/app.py, or, in an export opened from disk,
// from window.RLX_EXPORT (data.js): the same answers keyed by route.
"use strict";

const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
const POLL_MS = 2000;
const WHOLE_STEPS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 2.5e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7];
const state = {
  runs: [], groups: [], selected: new Set(), data: {}, metricGroups: {}, flags: {}, charts: {},
  docsUrl: "", exported: typeof window.RLX_EXPORT !== "undefined", steps: {}, samples: null, follow: null,
};
window.rlxView = state; // the browser test reads the drawn values from here

async function api(route) {
  if (state.exported) {
    if (route in window.RLX_EXPORT) return window.RLX_EXPORT[route];
    if (route.startsWith("/api/metrics/")) return null; // an export does not grow
    throw new Error(`${route} is not in this export`);
  }
  const response = await fetch(route, {cache: "no-store"});
  if (!response.ok) throw new Error(`${route}: ${response.status} ${await response.text()}`);
  return response.json();
}

const $ = (id) => document.getElementById(id);
function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value; else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children.flat()) node.append(child instanceof Node ? child : document.createTextNode(child ?? ""));
  return node;
}
const fmt = (v, digits = 4) => (v === null || v === undefined) ? "–" : (typeof v === "number" ? (Number.isInteger(v) ? String(v) : v.toPrecision(digits)) : String(v));
function note(parent, text) { parent.append(el("div", {class: "note"}, text)); }

// ------------------------------------------------------------------------------------------------ runs
async function loadRuns() {
  const payload = await api("/api/runs");
  const known = new Set(state.runs.map((r) => r.id));
  state.runs = payload.runs; state.groups = payload.groups; state.docsUrl = payload.docs_url;
  const notes = $("notes"); notes.replaceChildren();
  payload.notes.forEach((text) => notes.append(el("div", {}, text)));
  if (!payload.runs.length) notes.append(el("div", {}, "No runs found: pass run, eval or sweep directories to rlx view."));
  for (const run of payload.runs) if (!known.has(run.id) && run.kind === "train") state.selected.add(run.id);
  renderRunList(); fillRunSelects();
  return payload;
}

function runColor(id) { return COLORS[state.runs.findIndex((r) => r.id === id) % COLORS.length]; }

function renderRunList() {
  const list = $("run-list"); list.replaceChildren();
  for (const run of state.runs) {
    const box = el("input", {type: "checkbox", "data-run": run.id, onchange: (e) => {
      e.target.checked ? state.selected.add(run.id) : state.selected.delete(run.id); refreshMetrics().then(drawCurves);
    }});
    box.checked = state.selected.has(run.id);
    list.append(el("label", {class: "run", title: run.path}, box, el("span", {class: "swatch", style: `background:${runColor(run.id)}`}),
      run.name, " ", el("span", {class: "kind"}, run.kind + (run.seed !== null ? ` seed ${run.seed}` : "")),
      run.live ? el("span", {class: "live"}, " live") : "", ...run.notes.map((t) => el("div", {class: "note"}, t))));
  }
}

function fillRunSelects() {
  const train = state.runs.filter((r) => r.kind === "train");
  for (const [id, runs] of [["sample-run", train], ["config-run", state.runs], ["config-other", state.runs]]) {
    const select = $(id), before = select.value;
    const keep = id === "config-other" ? [el("option", {value: ""}, "(none)")] : [];
    select.replaceChildren(...keep, ...runs.map((r) => el("option", {value: r.id}, `${r.id} ${r.name}`)));
    if ([...select.options].some((o) => o.value === before)) select.value = before;
  }
}

// ------------------------------------------------------------------------------------------------ metrics
async function refreshMetrics() {
  let grew = false;
  for (const run of state.runs) {
    if (run.kind !== "train" || !state.selected.has(run.id)) continue;
    const have = state.data[run.id];
    const payload = await api(`/api/metrics/${run.id}?since=${have ? have.step.length : 0}`);
    if (!payload) continue;
    if (!have) {
      state.data[run.id] = {step: payload.step, time: payload.time, metrics: payload.metrics};
      grew = true;
    } else if (payload.step.length) {
      const n = have.step.length;
      have.step.push(...payload.step); have.time.push(...payload.time);
      for (const [name, values] of Object.entries(payload.metrics)) {
        if (!have.metrics[name]) have.metrics[name] = new Array(n).fill(null);
        have.metrics[name].push(...values);
      }
      for (const values of Object.values(have.metrics)) while (values.length < have.step.length) values.push(null);
      grew = true;
    }
    state.metricGroups[run.id] = payload.groups; state.flags[run.id] = payload.flags;
    state.notesOf = state.notesOf || {}; state.notesOf[run.id] = payload.notes;
  }
  return grew;
}

// TensorBoard's smoothing: an exponential moving average, debiased so that the first points are not pulled to 0.
function smooth(values, weight) {
  if (!weight) return values;
  let last = 0, count = 0;
  return values.map((v) => {
    if (v === null || !isFinite(v)) return null;
    last = last * weight + (1 - weight) * v; count += 1;
    return last / (1 - Math.pow(weight, count));
  });
}

function xValues(run, data) {
  const mode = $("x-axis").value;
  if (mode === "samples" && run.samples_per_step) return data.step.map((s) => s * run.samples_per_step);
  if (mode === "time") { const t0 = data.time.find((t) => t !== null) ?? 0; return data.time.map((t) => t === null ? null : t - t0); }
  return data.step;
}

function seriesFor(metric) {
  // one (x, y) pair per drawn line: a seed group's mean and band, or a run
  const weight = parseFloat($("smoothing").value), out = [], inBand = new Set();
  if ($("bands").checked && $("x-axis").value === "step") {
    for (const group of state.groups) {
      const band = state.bands && state.bands[group.id] && state.bands[group.id].bands[metric];
      if (!band || !group.runs.every((id) => state.selected.has(id))) continue;
      group.runs.forEach((id) => inBand.add(id));
      const color = runColor(group.runs[0]);
      out.push({label: group.label, x: band.step, y: smooth(band.mean, weight), color, width: 2});
      out.push({label: "band low", x: band.step, y: smooth(band.low, weight), color, width: 0.5, band: "low"});
      out.push({label: "band high", x: band.step, y: smooth(band.high, weight), color, width: 0.5, band: "high"});
    }
  }
  for (const run of state.runs) {
    const data = state.data[run.id];
    if (!data || !state.selected.has(run.id) || inBand.has(run.id) || !data.metrics[metric]) continue;
    out.push({label: run.name, run: run.id, x: xValues(run, data), y: smooth(data.metrics[metric], weight), color: runColor(run.id), width: 1.5});
  }
  return out;
}

function chartData(series, log) {
  // uPlot wants one x array: join the lines on the union of their x values (null where a line has none)
  const xs = [...new Set(series.flatMap((s) => s.x.filter((x) => x !== null)))].sort((a, b) => a - b);
  const index = new Map(xs.map((x, i) => [x, i]));
  const table = [xs];
  for (const s of series) {
    const column = new Array(xs.length).fill(null);
    s.x.forEach((x, i) => { if (x !== null && s.y[i] !== null && (!log || s.y[i] > 0)) column[index.get(x)] = s.y[i]; });
    table.push(column);
  }
  return table;
}

function drawChart(container, metric) {
  const series = seriesFor(metric), log = $("log-scale").checked;
  if (!series.length) return;
  const data = chartData(series, log);
  const bands = [];
  series.forEach((s, i) => { if (s.band === "high") bands.push({series: [i + 1, i], fill: s.color + "33"}); });
  const opts = {
    width: 380, height: 210, legend: {show: true, live: true},
    scales: {x: {time: false}, y: {distr: log ? 3 : 1}},
    axes: [{label: {step: "step", samples: "samples", time: "seconds"}[$("x-axis").value],
      ...($("x-axis").value === "time" ? {} : {incrs: WHOLE_STEPS})}, {}],
    series: [{label: "x"}, ...series.map((s) => ({label: s.label, stroke: s.color, width: s.width, spanGaps: true,
      points: {show: data[0].length < 30}}))],
    bands,
  };
  const box = el("div", {class: "chart", "data-metric": metric}, el("h3", {}, metric));
  container.append(box);
  const plot = new uPlot(opts, data, box);
  const rows = plot.root.querySelectorAll(".u-legend .u-series");
  series.forEach((s, i) => { if (s.band && rows[i + 1]) rows[i + 1].style.display = "none"; }); // the band's edges
  state.charts[metric] = {plot, series: series.map((s) => s.label)};
}

function drawCurves() {
  const root = $("curves"), open = new Set([...root.querySelectorAll("details[open]")].map((d) => d.dataset.group));
  const first = !root.children.length;
  Object.values(state.charts).forEach((c) => c.plot.destroy()); state.charts = {};
  root.replaceChildren();
  const filter = $("metric-filter").value.toLowerCase();
  const groups = new Map();
  for (const id of state.selected) for (const g of state.metricGroups[id] || []) {
    if (!groups.has(g.title)) groups.set(g.title, {anchor: g.anchor, metrics: new Set()});
    g.metrics.forEach((m) => { if (!filter || m.toLowerCase().includes(filter)) groups.get(g.title).metrics.add(m); });
  }
  let index = 0;
  for (const [title, group] of groups) {
    if (!group.metrics.size) continue;
    const details = el("details", {class: "group", "data-group": title});
    if ((first && index < 4) || open.has(title) || filter) details.open = true;
    const charts = el("div", {class: "charts"});
    details.append(el("summary", {}, `${title} (${group.metrics.size})`), charts);
    root.append(details);
    const fill = () => { if (!charts.children.length) [...group.metrics].sort().forEach((m) => drawChart(charts, m)); };
    if (details.open) fill();
    details.addEventListener("toggle", () => details.open && fill());
    index += 1;
  }
  if (!groups.size) note(root, state.selected.size ? "No metrics logged yet." : "Select a training run on the left.");
}

async function loadBands() {
  state.bands = state.bands || {};
  for (const group of state.groups) state.bands[group.id] = await api(`/api/bands/${group.id}`);
}

// ------------------------------------------------------------------------------------------------ samples
async function loadSampleSteps() {
  const runId = $("sample-run").value;
  if (!runId) { $("samples").replaceChildren(); note($("samples"), "No training run to show samples of."); return; }
  const {steps} = await api(`/api/samples/${runId}`);
  state.steps[runId] = steps;
  const select = $("sample-step"), before = select.value;
  select.replaceChildren(...steps.map((s) => el("option", {value: s}, String(s))));
  if (steps.map(String).includes(before)) select.value = before;
  if (!steps.length) { $("samples").replaceChildren(); note($("samples"), "This run has no samples files yet (samples/step_*.jsonl; log.samples_every)."); }
}

async function showSamples() {
  const runId = $("sample-run").value, step = $("sample-step").value;
  if (!runId || step === "") return;
  state.samples = await api(`/api/samples/${runId}/${step}`);
  renderSamples();
}

function matches(group, kind, query) {
  if (["wrong", "right", "mixed"].includes(kind) && group.kind !== kind) return false;
  if ((kind === "truncated" || kind === "tied") && !group[kind]) return false;
  if (!query) return true;
  return [group.prompt, group.answer, ...group.completions.map((c) => c.text)].some((t) => String(t ?? "").toLowerCase().includes(query));
}

function completionTable(group) {
  const components = [...new Set(group.completions.flatMap((c) => Object.keys(c.components)))];
  const head = el("tr", {}, ["#", "reward", ...components, "advantage", "length", "correct", "completion"].map((h) => el("th", {}, h)));
  const rows = group.completions.map((c, i) => el("tr", {class: c.correct === true ? "correct" : c.correct === false ? "incorrect" : ""},
    el("td", {}, String(i)), el("td", {class: "num"}, fmt(c.reward)),
    ...components.map((k) => el("td", {class: "num"}, fmt(c.components[k]))),
    el("td", {class: "num"}, fmt(c.advantage)), el("td", {class: "num"}, `${c.length}${c.length_unit === "tokens" ? "" : " " + c.length_unit}${c.truncated ? " cut" : ""}`),
    el("td", {}, c.correct === null ? "?" : c.correct ? "yes" : "no"),
    el("td", {}, c.turns ? turnsTable(c) : el("pre", {}, c.text), c.error ? el("div", {class: "note"}, c.error) : "")));
  return el("table", {class: "completions"}, head, ...rows);
}

function turnsTable(episode) {
  return el("table", {class: "turns"}, el("tr", {}, ["turn", "observation", "action", "reward", "credit"].map((h) => el("th", {}, h))),
    ...episode.turns.map((t, i) => el("tr", {}, el("td", {}, String(i)), el("td", {}, el("pre", {}, t.observation)),
      el("td", {}, el("pre", {}, t.action)), el("td", {class: "num"}, fmt(t.reward)), el("td", {class: "num"}, fmt(t.credit)))));
}

function groupBox(group, title) {
  return el("div", {class: "prompt-group", "data-kind": group.kind},
    el("div", {class: "head"}, el("strong", {}, title), el("span", {class: `badge ${group.kind}`}, group.kind),
      group.tied ? el("span", {class: "badge"}, "rewards tied") : "", group.truncated ? el("span", {class: "badge"}, "truncated") : "",
      el("span", {}, "answer: ", el("code", {}, fmt(group.answer))),
      el("button", {class: "follow", onclick: () => followPrompt(group.prompt)}, "follow this prompt across steps")),
    el("pre", {class: "prompt"}, group.prompt), completionTable(group));
}

function renderSamples() {
  const root = $("samples"), notes = $("sample-notes");
  root.replaceChildren(); notes.replaceChildren();
  if (!state.samples) return;
  state.samples.notes.forEach((t) => note(notes, t));
  const kind = $("sample-filter").value, query = $("sample-search").value.toLowerCase();
  const kept = state.samples.groups.filter((g) => matches(g, kind, query));
  $("sample-count").textContent = `${kept.length} of ${state.samples.groups.length} prompts`;
  kept.forEach((g, i) => root.append(groupBox(g, `prompt ${i + 1}`)));
  if (!kept.length) note(root, "No prompt of this step matches.");
}

async function followPrompt(prompt) {
  const runId = $("sample-run").value;
  let steps;
  if (state.exported) { // the export holds every samples file: follow the prompt here
    steps = [];
    for (const step of state.steps[runId] || []) {
      const payload = window.RLX_EXPORT[`/api/samples/${runId}/${step}`];
      (payload ? payload.groups : []).filter((g) => g.prompt === prompt).forEach((g) => steps.push({step, group: g}));
    }
  } else {
    steps = (await api(`/api/follow/${runId}?prompt=${encodeURIComponent(prompt)}`)).steps;
  }
  state.follow = {prompt, steps};
  const root = $("follow");
  root.replaceChildren(el("h3", {}, `This prompt in ${steps.length} samples file(s) `,
    el("button", {onclick: () => { root.replaceChildren(); state.follow = null; }}, "close")));
  root.append(el("table", {class: "follow-summary"}, el("tr", {}, ["step", "kind", "mean reward", "correct"].map((h) => el("th", {}, h))),
    ...steps.map(({step, group}) => {
      const rewards = group.completions.map((c) => c.reward).filter((r) => r !== null);
      const correct = group.completions.filter((c) => c.correct).length;
      return el("tr", {"data-step": step}, el("td", {}, String(step)), el("td", {}, group.kind),
        el("td", {class: "num"}, fmt(rewards.reduce((a, b) => a + b, 0) / Math.max(rewards.length, 1))),
        el("td", {class: "num"}, `${correct}/${group.completions.length}`));
    })));
  steps.forEach(({step, group}) => root.append(groupBox(group, `step ${step}`)));
}

// ------------------------------------------------------------------------------------------------ eval
async function showEval() {
  const root = $("eval"); root.replaceChildren();
  const evals = state.runs.filter((r) => r.kind === "eval");
  if (!evals.length) { note(root, "No rlx eval directory among the runs (one holds summary.json)."); return; }
  for (const run of evals) {
    const payload = await api(`/api/eval/${run.id}`);
    root.append(el("h2", {}, run.name));
    payload.notes.forEach((t) => note(root, t));
    const summary = payload.summary, models = summary.models || {};
    const labels = {model: (models.model || {}).label || "model", compare: (models.compare || {}).label || "compare"};
    for (const [bench, result] of Object.entries(summary.benchmarks || {})) {
      root.append(el("h3", {}, bench));
      const names = Object.keys(result.model || {});
      const hasCompare = !!result.compare;
      const cell = (e) => e ? `${fmt(e.value, 3)} [${fmt(e.low, 3)}, ${fmt(e.high, 3)}]` : "–";
      root.append(el("table", {class: "eval-table"},
        el("tr", {}, ["metric", labels.model, ...(hasCompare ? [labels.compare, "difference (paired)", "P(diff>0)"] : [])].map((h) => el("th", {}, h))),
        ...names.map((name) => el("tr", {}, el("td", {}, name), el("td", {class: "num"}, cell(result.model[name])),
          ...(hasCompare ? [el("td", {class: "num"}, cell(result.compare[name])), el("td", {class: "num"}, cell((result.diff || {})[name])),
            el("td", {class: "num"}, fmt(((result.diff || {})[name] || {}).frac_positive, 3))] : [])))));
      const ks = names.filter((n) => n.startsWith("pass@")).map((n) => parseInt(n.slice(5))).sort((a, b) => a - b);
      if (ks.length) {
        const box = el("div", {class: "chart"}, el("h3", {}, `${bench}: pass@k`));
        root.append(box);
        const roles = hasCompare ? ["model", "compare"] : ["model"];
        const data = [ks];
        const series = [{label: "k"}];
        roles.forEach((role, i) => {
          for (const part of ["value", "low", "high"]) {
            data.push(ks.map((k) => (result[role][`pass@${k}`] || {})[part] ?? null));
            series.push({label: part === "value" ? labels[role] : `${labels[role]} ${part}`, stroke: COLORS[i], width: part === "value" ? 2 : 0.5});
          }
        });
        const bands = roles.map((_, i) => ({series: [3 * i + 3, 3 * i + 2], fill: COLORS[i] + "33"}));
        new uPlot({width: 420, height: 240, scales: {x: {time: false, distr: 3, log: 2}}, series, bands, axes: [{label: "k"}, {label: "pass@k"}]}, data, box);
      }
      const disagree = payload.disagree[bench] || [];
      if (hasCompare) {
        root.append(el("h4", {}, `${disagree.length} problem(s) where ${labels.model} and ${labels.compare} disagree`));
        disagree.forEach((d) => root.append(el("div", {class: "prompt-group"}, el("div", {}, el("strong", {}, d.id), " answer: ", el("code", {}, fmt(d.answer))),
          el("pre", {class: "prompt"}, d.prompt),
          el("div", {class: "side"}, ...["model", "compare"].map((role) => el("div", {},
            el("strong", {}, `${labels[role]}: score ${fmt(d[role].score, 3)}`), el("pre", {}, d[role].completion ?? "")))))));
      }
    }
  }
}

// ------------------------------------------------------------------------------------------------ health
function showHealth() {
  const root = $("health"); root.replaceChildren();
  const train = state.runs.filter((r) => r.kind === "train" && state.selected.has(r.id));
  if (!train.length) note(root, "Select a training run on the left.");
  for (const run of train) {
    root.append(el("h3", {}, run.name));
    ((state.notesOf || {})[run.id] || []).forEach((t) => note(root, t));
    const flags = state.flags[run.id] || [];
    if (!flags.length) root.append(el("div", {class: "ok"}, "no health flag raised"));
    flags.forEach((f) => root.append(el("div", {class: "flag", "data-flag": f.name}, el("strong", {}, f.name),
      f.step !== null ? ` (step ${f.step})` : "", ": ", f.reason, " ",
      el("a", {href: `${state.docsUrl}/view.html#${f.anchor}`, target: "_blank"}, "what to do"))));
  }
}

// ------------------------------------------------------------------------------------------------ config
async function showConfig() {
  const root = $("config"); root.replaceChildren();
  const runId = $("config-run").value, other = $("config-other").value;
  if (!runId) return;
  const payload = await api(`/api/config/${runId}`);
  payload.notes.forEach((t) => note(root, t));
  root.append(el("h3", {}, "command line"), el("pre", {class: "command"}, payload.command || "(no env.json)"));
  root.append(el("h3", {}, "overrides"), el("pre", {}, payload.overrides.join("\n") || "(none)"));
  if (other && other !== runId) {
    const diff = await api(`/api/diff/${runId}/${other}`);
    root.append(el("h3", {}, `${diff.diff.length} setting(s) differ`),
      el("table", {class: "config-diff"}, el("tr", {}, el("th", {}, "setting"), el("th", {}, runId), el("th", {}, other)),
        ...diff.diff.map((d) => el("tr", {}, el("td", {}, d.key), el("td", {class: "diff-a"}, JSON.stringify(d.a)), el("td", {class: "diff-b"}, JSON.stringify(d.b))))));
  }
  root.append(el("h3", {}, "config.yaml"), el("pre", {class: "config"}, payload.text || JSON.stringify(payload.config, null, 2)));
}

// ------------------------------------------------------------------------------------------------ wiring
function showTab(name) {
  document.querySelectorAll("#tabs button").forEach((b) => b.classList.toggle("active", b.dataset.tab === name));
  document.querySelectorAll(".tab").forEach((t) => t.classList.toggle("active", t.id === `tab-${name}`));
  if (name === "eval") showEval(); if (name === "health") showHealth(); if (name === "config") showConfig();
  if (name === "samples" && !state.samples) loadSampleSteps().then(showSamples);
}

async function poll() {
  try {
    const before = state.runs.length;
    await loadRuns();
    if (state.runs.length !== before) await loadBands();
    if (await refreshMetrics()) { if (state.groups.length) await loadBands(); drawCurves(); if ($("tab-health").classList.contains("active")) showHealth(); }
    if ($("tab-samples").classList.contains("active")) {
      const stepsBefore = $("sample-step").options.length;
      await loadSampleSteps();
      if (!state.samples && $("sample-step").options.length !== stepsBefore) await showSamples();
    }
    $("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (error) { $("status").textContent = `update failed: ${error.message}`; }
}

async function start() {
  document.querySelectorAll("#tabs button").forEach((b) => b.addEventListener("click", () => showTab(b.dataset.tab)));
  for (const id of ["x-axis", "log-scale", "bands"]) $(id).addEventListener("change", drawCurves);
  $("smoothing").addEventListener("input", () => { $("smoothing-value").textContent = $("smoothing").value; drawCurves(); });
  $("metric-filter").addEventListener("input", drawCurves);
  $("sample-run").addEventListener("change", () => { state.samples = null; loadSampleSteps().then(showSamples); });
  $("sample-step").addEventListener("change", showSamples);
  $("sample-filter").addEventListener("change", renderSamples);
  $("sample-search").addEventListener("input", renderSamples);
  const move = (delta) => { const s = $("sample-step"); const i = s.selectedIndex + delta; if (i >= 0 && i < s.options.length) { s.selectedIndex = i; showSamples(); } };
  $("step-prev").addEventListener("click", () => move(-1)); $("step-next").addEventListener("click", () => move(1));
  $("config-run").addEventListener("change", showConfig); $("config-other").addEventListener("change", showConfig);
  try {
    const mark = (name) => { state.timings[name] = Math.round(performance.now()); };
    state.timings = {};
    await loadRuns(); await loadBands(); mark("runs"); await refreshMetrics(); mark("metrics"); drawCurves(); mark("curves");
    if (!state.runs.some((r) => r.kind === "train") && state.runs.some((r) => r.kind === "eval")) showTab("eval");
    $("status").textContent = state.exported ? "exported page (does not update)" : "live: updates every 2 s";
  } catch (error) { note($("notes"), `could not load the runs: ${error.message}`); }
  document.body.dataset.ready = "1";
  if (!state.exported) setInterval(poll, POLL_MS);
}

start();
