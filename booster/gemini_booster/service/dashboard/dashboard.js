// Gemini Booster's operator dashboard: a thin client of the REST API (/v1). It keeps the token
// in sessionStorage (gone with the tab), sends it as a bearer credential, and builds every cell
// with textContent, so nothing from the API is ever parsed as HTML. Charts are drawn by the
// vendored uPlot (uPlot.iife.min.js: no other origin); each chart's element carries the values
// it plots in data-series (JSON), and a table beside it says the same in text.
"use strict";

const TOKEN_KEY = "gemini-booster-token";
const DEFAULT_REFRESH_S = 30;
const MIN_REFRESH_S = 2;
const Z95 = 1.959964;  // a normal 95 % interval: mean ± Z95 · s.e. (the rounds' many flows)
const CHART_HEIGHT = 240;
const SMALL_CHART = { width: 270, height: 150 };
const SMALL_FONT = "10px system-ui, sans-serif";
const ARM_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
const $ = (id) => document.getElementById(id);

class ApiError extends Error {}

function explain(status, body) {
  const detail = body && body.detail;
  if (Array.isArray(detail)) {  // pydantic's list of problems, each naming its field if any
    return detail.map((d) => {
      const field = d.loc.filter((p) => p !== "body").join(".");
      return field ? `${field}: ${d.msg}` : d.msg;  // a rule across fields names them itself
    }).join("; ");
  }
  return `${status}: ${detail || "request failed"}`;
}

async function api(path, options = {}) {
  const headers = { authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ""}` };
  if (options.body) headers["content-type"] = "application/json";
  const response = await fetch(path, { ...options, headers });
  const body = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(explain(response.status, body));
  return body;
}

// The API's CSV exports (?format=csv) need the token, so they are fetched, not linked, and
// saved under the file name the answer gives: the same rows as the tables' JSON.
async function downloadCsv(path) {
  const headers = { authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY) || ""}` };
  const response = await fetch(path, { headers });
  if (!response.ok) throw new ApiError(explain(response.status, await response.json().catch(() => null)));
  const named = /filename="([^"]+)"/.exec(response.headers.get("content-disposition") || "");
  const link = document.createElement("a");
  link.href = URL.createObjectURL(await response.blob());
  link.download = named ? named[1] : "export.csv";
  link.click();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  return link.download;
}

function say(text, kind) {
  $("status").textContent = text;
  $("status").className = kind;
}

function cell(row, text, numeric = false) {
  const td = row.insertCell();
  td.textContent = text;
  if (numeric) td.className = "num";
  return td;
}

function fill(tableId, rows, render) {
  const body = $(tableId).tBodies[0];
  body.replaceChildren();
  for (const r of rows) render(body.insertRow(), r);
}

const utcText = (iso) => `${new Date(iso).toISOString().slice(0, 16).replace("T", " ")} UTC`;
const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const pm = (mean, se, digits = 2) => `${fmt(mean, digits)} ± ${fmt(se, digits)}`;
const UNIT_TEXT = { percent: " %", ratio: "", packets: " pkts" };
let spec = {};  // θ parameter name → its symbol and unit, in the shown policy's datapath

function unitText(unit) {
  return unit in UNIT_TEXT ? UNIT_TEXT[unit] : ` ${unit}`;
}

function thetaText(natural) {
  return Object.entries(natural).map(([name, v]) => {
    const p = spec[name] || { symbol: name, unit: "" };
    return `${p.symbol} ${Number(v.toPrecision(4))}${unitText(p.unit)}`;
  }).join(", ");
}

// --- charts -----------------------------------------------------------------------------------

const charts = new Map();  // element id → its uPlot

const unixSeconds = (iso) => Date.parse(iso) / 1000;
const utcDate = (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC");

// Draw ``data`` (uPlot's columns: x first) into element ``id``, replacing what was there, and
// record ``series`` (name → values, as the API gave them) on the element for readers and tests.
function plot(id, series, options, data, size = null) {
  const el = $(id);
  if (charts.has(id)) charts.get(id).destroy();
  charts.delete(id);
  el.replaceChildren();
  el.dataset.series = JSON.stringify(series);
  if (!data[0].length) {
    el.append(Object.assign(document.createElement("p"), { className: "note", textContent: "No data yet." }));
    return;
  }
  const width = size ? size.width : Math.max(320, el.clientWidth || 480);
  const height = size ? size.height : CHART_HEIGHT;
  const chart = new uPlot({ width, height, tzDate: utcDate, legend: { live: false }, ...options }, data, el);
  const bounds = new Set(options.series.filter((s) => s.bound).map((s) => s.label));
  for (const entry of chart.root.querySelectorAll(".u-legend .u-series")) {
    const label = entry.querySelector(".u-label");
    if (label && bounds.has(label.textContent)) entry.style.display = "none";  // shown as a band
  }
  charts.set(id, chart);
}

// Full-width charts follow their box's width (the window's, a scroll bar appearing); small
// multiples keep theirs.
const resized = new ResizeObserver((entries) => {
  for (const { target } of entries) {
    const chart = charts.get(target.id);
    const width = Math.max(320, target.clientWidth);
    if (chart && chart.width !== width) chart.setSize({ width, height: CHART_HEIGHT });
  }
});
for (const id of ["rounds-chart", "percentiles-chart", "delay-chart", "days-chart", "difference-chart"]) {
  resized.observe($(id));
}

const isoOf = (t) => new Date(t * 1000).toISOString();
// Time axes in UTC, 24 h: hours (with the date at midnight and first) or whole days.
const HOUR_INCRS = [3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
const DAY_INCRS = [86400, 172800, 604800, 1209600];
const hourAxis = {
  incrs: HOUR_INCRS,
  values: (u, ticks) => ticks.map((t, i) => {
    const iso = isoOf(t);
    return i === 0 || iso.slice(11, 13) === "00" ? `${iso.slice(11, 16)}\n${iso.slice(0, 10)}` : iso.slice(11, 16);
  }),
};
const dayAxis = {
  label: "day (UTC)", incrs: DAY_INCRS, values: (u, ticks) => ticks.map((t) => isoOf(t).slice(5, 10)),
};
const CALENDAR_DAY_S = 86400;
// Compressed experiment days (a rehearsal's, ``day_seconds`` < 86400) are not calendar dates:
// their axis counts days from the start (day 0 holds it) and shows each tick's UTC time.
function compressedDayAxis(seconds, firstStart) {
  return {
    label: `experiment day (${seconds} s each, UTC)`,
    incrs: [1, 2, 5, 10, 20, 50, 100].map((k) => k * seconds),
    values: (u, ticks) => ticks.map((t) => `day ${Math.round((t - firstStart) / seconds)}\n${isoOf(t).slice(11, 19)}`),
  };
}
// How a day is named in tables and text: its date with calendar days; else its index and the
// stretch of time it was.
function dayText(d) {
  if (!results || results.day_seconds === CALENDAR_DAY_S) return d.day;
  return `day ${d.index} (${d.start.slice(11, 19)}–${d.end.slice(11, 19)})`;
}

function line(label, colour, extra = {}) {
  return { label, stroke: colour, width: 2, points: { show: true, size: 6 }, spanGaps: false, ...extra };
}

// Mean, low and high series of one estimate, the interval drawn as a band between the last two.
function withInterval(label, colour, index, bands) {
  bands.push({ series: [index + 2, index + 1], fill: `${colour}33` });
  return [
    line(label, colour),
    { label: `${label} 95 % low`, stroke: colour, width: 1, dash: [4, 4], points: { show: false }, bound: true },
    { label: `${label} 95 % high`, stroke: colour, width: 1, dash: [4, 4], points: { show: false }, bound: true },
  ];
}

// A uPlot hook drawing a labelled marker at each incumbent change (x: Unix seconds).
function marksAt(changes) {
  return (u) => { for (const [ts, text] of changes) markAt(ts, text)(u); };
}

function showRounds(r) {
  $("rounds-sigma").textContent = `(σ = ${r.sigma}, ${r.bucket_hours} h rounds)`;
  const inc = r.incumbent;
  const changes = r.changes || [];
  $("rounds-note").textContent =
    "One round is one trial bucket; the band is the 95 % interval of its mean utility. " +
    "Marked: the utility of the incumbent in force at each round's start, and each change of " +
    `incumbent where it was published (${changes.length} in these rounds). ` +
    (inc ? `Today's incumbent θ (${thetaText(inc.natural)}), predicted utility ${fmt(inc.predicted_utility)}.`
         : "This context has no published plan yet.");
  const x = r.rounds.map((b) => unixSeconds(b.bucket));
  const all = r.rounds.map((b) => b.utility);
  const stderr = r.rounds.map((b) => b.utility_stderr);
  const incumbent = r.rounds.map((b) => b.incumbent_utility);
  const since = r.rounds.map((b) => b.incumbent_published_at);
  const changedAt = changes.map((c) => c.published_at);
  const bands = [];
  plot("rounds-chart",
    { bucket: r.rounds.map((b) => b.bucket), utility: all, utility_stderr: stderr, incumbent_utility: incumbent,
      incumbent_since: since, changes: changedAt },
    {
      series: [
        { label: "round (UTC)" },
        ...withInterval("all Fusion flows", "#1f77b4", 1, bands),
        line("incumbent of the round", "#d62728", { points: { show: true, size: 9, fill: "#d62728" } }),
      ],
      bands,
      hooks: { draw: [marksAt(changes.map((c, i) => [unixSeconds(c.published_at), `θ${i + 1}`]))] },
      axes: [{ ...hourAxis }, { label: "utility (eq. 9)" }],
    },
    [x, all, all.map((u, i) => u - Z95 * stderr[i]), all.map((u, i) => u + Z95 * stderr[i]), incumbent]);
  fill("rounds-table", r.rounds, (row, b) => {
    cell(row, b.bucket.replace("T", " ").replace(/:00(\+00:00|Z)$/, ""));
    cell(row, String(b.flows), true);
    cell(row, String(b.thetas), true);
    cell(row, pm(b.utility, b.utility_stderr), true);
    cell(row, b.incumbent_published_at === null ? "none yet" : utcText(b.incumbent_published_at));
    cell(row, String(b.incumbent_flows), true);
    cell(row, b.incumbent_utility === null ? "–" : pm(b.incumbent_utility, b.incumbent_utility_stderr), true);
  });
  fill("changes-table", changes, (row, c) => {
    cell(row, `θ${changes.indexOf(c) + 1}`);
    cell(row, utcText(c.published_at));
    cell(row, thetaText(c.natural));
    cell(row, c.predicted_utility === null ? "–" : `${fmt(c.predicted_utility)} at σ = ${c.sigma}`, true);
    cell(row, c.plan_generation === null ? "(carried over)" : `#${c.plan_generation} by ${c.refit_owner}`);
  });
}

// One line per arm of ``field`` (its value at each percentile) into chart ``id``.
function percentileChart(id, p, field, label) {
  const series = { quantile: p.quantiles };
  const columns = [p.quantiles.map((q) => 100 * q)];
  const lines = [{ label: "percentile" }];
  p.arms.forEach((a, i) => {
    series[a.arm] = a[field];
    columns.push(a[field]);
    lines.push(line(a.arm, ARM_COLOURS[i % ARM_COLOURS.length]));
  });
  plot(id, series, {
    scales: { x: { time: false } },
    series: lines,
    axes: [{ label: "percentile of flows", values: (u, v) => v.map((t) => `p${t}`) }, { label }],
  }, p.arms.length ? columns : [[]]);
}

function showPercentiles(p) {
  percentileChart("percentiles-chart", p, "throughput_mbps", "throughput, Mbit/s");
  percentileChart("delay-chart", p, "queue_delay_ms", "queueing delay, ms");
  const head = $("percentiles-table").tHead.rows[0];
  head.replaceChildren();
  for (const h of ["arm", "flows", "sketched flows", ...p.quantiles.map((q) => `p${100 * q}, Mbit/s`),
                   "delay-sketched flows", ...p.quantiles.map((q) => `p${100 * q}, ms`),
                   "queueing delay, ms (mean ± s.d.)"]) {
    head.append(Object.assign(document.createElement("th"), { textContent: h }));
  }
  fill("percentiles-table", p.arms, (row, a) => {
    cell(row, a.arm);
    cell(row, String(a.flows), true);
    cell(row, String(a.sketched_flows), true);
    for (const v of a.throughput_mbps) cell(row, fmt(v), true);
    cell(row, String(a.delay_sketched_flows), true);
    for (const v of a.queue_delay_ms) cell(row, fmt(v, 1), true);
    cell(row, pm(a.mean_queue_delay_ms, a.queue_delay_sd_ms, 1), true);
  });
  const unsketched = p.arms.filter((a) => a.delay_sketched_flows < a.flows);
  $("delay-note").textContent = unsketched.length
    ? "Some flows came without a delay sketch (agents older than it): " +
      unsketched.map((a) => `${a.arm} ${a.delay_sketched_flows} of ${a.flows}`).join(", ") +
      "; the table's mean and deviation cover every flow."
    : "";
}

// One bar per value in use, or, past MAX_BARS values (an exploring fleet's θ are continuous),
// one per equal-width bin of the values' range, labelled by its centre.
const MAX_BARS = 12;
const BINS = 10;
const TICK_STEPS = [1, 2, 5, 10];
const short = (x) => String(Number(x.toPrecision(3)));

function thetaBars(values, flows, total) {
  const pct = (f) => (total ? (100 * f) / total : 0);
  if (values.length <= MAX_BARS) return { labels: values.map(short), shares: flows.map(pct) };
  const lo = values[0];
  const width = (values[values.length - 1] - lo) / BINS;
  const sums = new Array(BINS).fill(0);
  values.forEach((v, i) => { sums[Math.min(BINS - 1, Math.floor((v - lo) / width))] += flows[i]; });
  return { labels: sums.map((_, b) => short(lo + (b + 0.5) * width)), shares: sums.map(pct) };
}

function showTheta(d) {
  $("theta-title").textContent = `θ in use across hosts${d.context ? ` of ${d.context}` : ", every context"}`;
  const box = $("theta-charts");
  for (const id of [...charts.keys()].filter((k) => k.startsWith("theta-"))) {
    charts.get(id).destroy();
    charts.delete(id);
  }
  box.replaceChildren();
  const all = {};
  const rows = [];
  for (const p of d.params) {
    const values = p.values.map((v) => v.value);
    const flows = p.values.map((v) => v.flows);
    all[p.name] = { value: values, flows };
    const div = Object.assign(document.createElement("div"), { id: `theta-${p.name}`, className: "small" });
    const caption = `${p.symbol}${p.unit && p.unit !== "ratio" ? ` (${p.unit})` : ""}`;
    div.append(Object.assign(document.createElement("p"), { className: "small-title", textContent: caption }));
    const chart = document.createElement("div");
    chart.id = `theta-chart-${p.name}`;
    div.append(chart);
    box.append(div);
    const bars = thetaBars(values, flows, d.flows);
    plot(chart.id, { value: values, flows }, {
      scales: { x: { time: false, range: [-0.5, bars.labels.length - 0.5] }, y: { range: [0, 100] } },
      legend: { show: false },
      series: [{ label: p.symbol }, {
        label: "share of flows, %", stroke: "#1f77b4", fill: "#1f77b488",
        paths: uPlot.paths.bars({ size: [0.6, 40] }), points: { show: false },
      }],
      axes: [{ values: (u, ticks) => ticks.map((t) => bars.labels[t] ?? ""), incrs: TICK_STEPS,
               space: 28, font: SMALL_FONT },
             { size: 48, space: 20, font: SMALL_FONT, values: (u, ticks) => ticks.map((t) => `${t}%`) }],
    }, [bars.labels.map((_, i) => i), bars.shares], SMALL_CHART);
    p.values.forEach((v) => rows.push({ p, v }));
  }
  box.dataset.series = JSON.stringify(all);
  $("theta-note").textContent = `Share of ${d.flows} Fusion flows per parameter value over the ` +
    `last ${d.hours} h (${d.thetas.length} distinct θ); hosts: ${d.hosts} in the newest ` +
    `${d.reports} reports.`;
  fill("theta-table", rows, (row, { p, v }) => {
    cell(row, `${p.symbol} (${p.name})`);
    cell(row, `${Number(v.value.toPrecision(4))}${unitText(p.unit)}`, true);
    cell(row, String(v.flows), true);
    cell(row, `${fmt(d.flows ? (100 * v.flows) / d.flows : 0, 1)} %`, true);
    cell(row, String(v.hosts), true);
  });
}

// --- experiments --------------------------------------------------------------------------------

let results = null;  // the selected experiment's /results, redrawn when the metric changes
let crossover = null;  // its crossover day (YYYY-MM-DD), or null
let crossoverAt = null;  // the crossover's first instant (ISO), or null

// A uPlot hook drawing a dashed vertical line, labelled, at x = ``ts`` (the crossover).
function markAt(ts, text) {
  return (u) => {
    const x = u.valToPos(ts, "x", true);
    if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#555";
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(x, u.bbox.top);
    ctx.lineTo(x, u.bbox.top + u.bbox.height);
    ctx.stroke();
    ctx.fillStyle = "#333";
    ctx.textAlign = "left";
    ctx.textBaseline = "top";
    ctx.font = `${12 * devicePixelRatio}px system-ui, sans-serif`;
    ctx.fillText(text, x + 4 * devicePixelRatio, u.bbox.top + 2 * devicePixelRatio);
    ctx.restore();
  };
}

function estimateText(e, digits) {
  return [fmt(e.mean, digits), e.low === null ? "–" : `[${fmt(e.low, digits)}, ${fmt(e.high, digits)}]`];
}

function showExperimentMetric() {
  if (!results) return;
  const metric = $("metric").value;
  const digits = metric === "slow_flow_share" ? 4 : 2;
  const days = results.days;
  const x = days.map((d) => Date.parse(d.start) / 1000);  // each day's real first instant
  const axis = results.day_seconds === CALENDAR_DAY_S ? dayAxis
    : compressedDayAxis(results.day_seconds, x.length ? x[0] - days[0].index * results.day_seconds : 0);
  const arms = [...new Set(days.flatMap((d) => d.arms.map((a) => a.arm)))];
  const pairs = [...new Set(days.flatMap((d) => d.differences.map((v) => `${v.arm} − ${v.control}`)))];
  const pick = (list, key, name, part) => list.map((d) => {
    const found = d[key].find((a) => name(a));
    return found ? found[metric][part] : null;
  });
  // Differences are read against zero: the y scale always shows it.
  const withZero = { y: { range: (u, lo, hi) => [Math.min(0, lo), Math.max(0, hi)] } };
  const chartOf = (id, names, key, match, label, scales = {}) => {
    const series = { day: days.map((d) => d.day) };
    const columns = [x];
    const lines = [{ label: axis.label }];
    const bands = [];
    names.forEach((n, i) => {
      for (const part of ["mean", "low", "high"]) {
        const values = pick(days, key, (a) => match(a) === n, part);
        series[part === "mean" ? n : `${n} ${part}`] = values;
        columns.push(values);
      }
      lines.push(...withInterval(n, ARM_COLOURS[i % ARM_COLOURS.length], lines.length, bands));
    });
    const hooks = crossoverAt ? { draw: [markAt(Date.parse(crossoverAt) / 1000, "crossover")] } : {};
    plot(id, series, { series: lines, bands, scales, hooks, axes: [{ ...axis }, { label }] },
      names.length ? columns : [[]]);
    $(id).dataset.crossover = crossover || "";
    $(id).dataset.x = JSON.stringify(x);  // each day's first instant (Unix s), as plotted
    $(id).dataset.axis = axis.label;
  };
  const label = $("metric").selectedOptions[0].textContent;
  chartOf("days-chart", arms, "arms", (a) => a.arm, label);
  chartOf("difference-chart", pairs, "differences", (v) => `${v.arm} − ${v.control}`, `Δ ${label}`, withZero);
  fill("days-table", days.flatMap((d) => d.arms.map((a) => ({ d, a }))), (row, { d, a }) => {
    const [mean, interval] = estimateText(a[metric], digits);
    for (const [t, n] of [[dayText(d)], [String(d.period), 1], [a.arm], [String(a.hosts), 1],
                          [String(a.flows), 1], [mean, 1], [interval, 1]]) cell(row, t, Boolean(n));
  });
  fill("difference-table", days.flatMap((d) => d.differences.map((v) => ({ d, v }))), (row, { d, v }) => {
    const [mean, interval] = estimateText(v[metric], digits);
    for (const [t, n] of [[dayText(d)], [`${v.arm} − ${v.control}`], [v.method], [String(v.hosts), 1],
                          [mean, 1], [interval, 1]]) cell(row, t, Boolean(n));
  });
}

async function loadExperiments() {
  const list = await api("/v1/experiments");
  const chosen = $("experiment").value || linked.get("experiment");
  $("experiment").replaceChildren(...list.map((e) => new Option(`${e.name} (${e.status})`, e.name)));
  if (list.some((e) => e.name === chosen)) $("experiment").value = chosen;
  $("no-experiments").hidden = list.length > 0;
  const e = list.find((x) => x.name === $("experiment").value);
  if (!e) {
    results = null;
    return;
  }
  crossover = e.crossover_day;
  crossoverAt = e.crossover_at;
  results = await api(`/v1/experiments/${encodeURIComponent(e.name)}/results`);
  const when = !e.crossover_day ? ""
    : e.day_seconds === CALENDAR_DAY_S ? `, crossover on ${e.crossover_day}`
    : `, crossover at ${e.crossover_at.slice(11, 19)} UTC (days of ${e.day_seconds} s)`;
  $("experiment-summary").textContent = `${e.description || e.name}: arms ` +
    e.arms.map((a) => (a.name === e.control ? `${a.name} (control, ${a.cc})` : `${a.name} (${a.cc})`)).join(", ") +
    `; ${e.hosts} hosts, σ = ${results.sigma}, ${results.objective} objective` +
    when + `; ${e.status}.`;
  showExperimentMetric();
  showVerdict();
}

// The overall verdict the API computes (every day together): per arm, its difference to the
// control on the chosen metric with its interval, and which way the interval points.
function showVerdict() {
  if (!results) {
    $("experiment-verdict").textContent = "";
    return;
  }
  const metric = $("metric").value;
  const label = $("metric").selectedOptions[0].textContent;
  const digits = metric === "slow_flow_share" ? 4 : 2;
  const diffs = results.overall.differences;
  if (!diffs.length) {
    $("experiment-verdict").textContent = "Overall: no data from the arms yet.";
    return;
  }
  $("experiment-verdict").textContent = "Overall: " + diffs.map((v) => {
    const m = v[metric];
    const [mean, interval] = estimateText(m, digits);
    const way = m.low === null ? "not enough hosts for an interval"
      : m.low > 0 ? "higher than control" : m.high < 0 ? "lower than control"
      : "no significant difference";
    return `${v.arm} − ${v.control}: Δ ${label} ${mean} ${interval} (${Math.round(100 * results.level)} %, ${way})`;
  }).join("; ") + ".";
}

// --- policies ------------------------------------------------------------------------------------

// σ being previewed (not saved), or null: the policy's own (a deep link may carry one)
let previewSigma = new URLSearchParams(location.search).get("sigma");

function showPolicy(p, refill) {
  const settings = $("settings");
  settings.replaceChildren();
  for (const [k, v] of Object.entries({
    "σ": p.sigma, "exploration share": p.exploration_share, "region": p.region,
    "mode": p.mode, "acquisition": p.acq_func, "datapath": p.datapath, "target CC": p.target_cc,
    "objective": p.objective, "revision": p.revision,
  })) {
    settings.append(Object.assign(document.createElement("dt"), { textContent: k }));
    settings.append(Object.assign(document.createElement("dd"), { textContent: String(v) }));
  }
  if (refill) {  // not on an automatic refresh: the operator may be typing
    $("sigma").value = p.sigma;
    $("exploration").value = p.exploration_share;
  }
}

function showPlans(plans) {
  fill("plans", plans, (row, p) => {
    cell(row, p.label);
    cell(row, thetaText(p.incumbent_natural));
    cell(row, fmt(p.predicted_utility), true);
    cell(row, `v${p.plan_version}`, true);
    cell(row, String(p.exploration_candidates), true);
  });
  const chosen = $("context").value || linked.get("context");
  $("context").replaceChildren(...plans.map((p) => new Option(p.label, p.label)));
  if (plans.some((p) => p.label === chosen)) $("context").value = chosen;
  const scope = $("override-scope").value;
  $("override-scope").replaceChildren(
    new Option("whole policy", ""), ...plans.map((p) => new Option(p.label, p.label)));
  if (plans.some((p) => p.label === scope)) $("override-scope").value = scope;
}

// --- audit log: old and new values --------------------------------------------------------------

const AUDIT_ROWS = 50;
const compact = (v) => (v === null || v === undefined ? "–"
  : typeof v === "object" ? JSON.stringify(v) : String(v));

function auditValues(e) {
  const d = e.detail || {};
  if (Array.isArray(d.changes)) {  // overrides: per scope, old and new θ
    const scope = (c) => (c.context === null ? "" : `${c.context}: `);
    return [d.changes.map((c) => scope(c) + compact(c.old)).join("; "),
            d.changes.map((c) => scope(c) + compact(c.new)).join("; ")];
  }
  if (d.old && typeof d.old === "object") {  // policy.update: the new fields and what they replaced
    const { old, ...fresh } = d;
    return [compact(old), compact(fresh)];
  }
  return ["–", compact(d)];
}

function showAudit(entries) {
  fill("audit", entries.slice(0, AUDIT_ROWS), (row, e) => {
    cell(row, utcText(e.at));
    cell(row, e.actor);
    cell(row, e.action);
    cell(row, e.target);
    const [old, fresh] = auditValues(e);
    cell(row, old);
    cell(row, fresh);
  });
}

// --- overrides: pin, freeze, roll back, kill switch -----------------------------------------

const thetaKeys = (theta) => (theta === null ? "safe default"
  : Object.entries(theta).map(([k, v]) => `${k}=${v}`).join(", "));

function showOverrides(o) {
  $("kill-state").textContent = o.kill_switch ? "(KILL SWITCH ON: every host at the safe default)" : "";
  document.body.dataset.killSwitch = o.kill_switch ? "on" : "off";
  fill("overrides", o.overrides, (row, r) => {
    cell(row, r.context === null ? "whole policy" : r.context);
    cell(row, r.kind === "kill" ? "kill switch" : r.origin);
    cell(row, thetaKeys(r.theta));
    cell(row, r.set_by);
    cell(row, utcText(r.set_at));
  });
}

function overrideAction(path, method, body, done) {
  guarded(async () => {
    const scope = $("override-scope").value;
    let url = `${policyPath()}/${path}`;
    const options = { method };
    if (body === null) {
      if (scope) url += `?context=${encodeURIComponent(scope)}`;
    } else {
      options.body = JSON.stringify(scope ? { ...body, context: scope } : body);
    }
    const r = await api(url, options);
    await loadPolicy(false);
    say(`${done} (${r.changed} changed, ${scope || "whole policy"}).`, "ok");
  });
}

$("freeze").addEventListener("click", () => overrideAction("freeze", "POST", {}, "Frozen"));
$("pin").addEventListener("click", () => {
  let theta;
  try {
    theta = JSON.parse($("pin-theta").value);
  } catch (e) {
    say(`θ: not JSON (${e.message})`, "error");
    return;
  }
  overrideAction("pin", "POST", { theta }, "Pinned");
});
$("rollback").addEventListener("click", () => {
  const at = $("rollback-at").value;
  if (!at) {
    say("Roll back: choose the time to go back to.", "error");
    return;
  }
  overrideAction("rollback", "POST", { at: `${at.length === 16 ? `${at}:00` : at}Z` }, "Rolled back");
});
$("unpin").addEventListener("click", () => overrideAction("pin", "DELETE", null, "Unpinned"));
$("kill").addEventListener("click", () => overrideAction("kill-switch", "PUT", {}, "Kill switch on"));
$("release").addEventListener("click",
  () => overrideAction("kill-switch", "DELETE", null, "Kill switch released"));

function showComparison(contexts, sigma, preview) {
  $("comparison-sigma").textContent = preview ? `(at σ = ${sigma}, not saved)` : `(at σ = ${sigma})`;
  const arms = contexts.flatMap((c) => c.arms.map((a) => ({ label: c.label, ...a })));
  fill("comparison", arms, (row, a) => {
    cell(row, a.label);
    cell(row, a.arm);
    cell(row, String(a.flows), true);
    cell(row, pm(a.utility, a.utility_stderr), true);
    cell(row, fmt(a.mean_throughput_mbps), true);
    cell(row, fmt(a.mean_queue_delay_ms, 1), true);
    cell(row, `${fmt(100 * a.slow_flow_share, 1)} %`, true);
  });
  const pairs = contexts.flatMap((c) => c.versus.map((v) => ({ label: c.label, ...v })));
  fill("versus", pairs, (row, v) => {
    cell(row, v.label);
    cell(row, `${v.arm} − ${v.baseline}`);
    cell(row, pm(v.utility_difference, v.utility_difference_stderr), true);
    cell(row, v.throughput_ratio === null ? "–" : `${fmt(v.throughput_ratio)}×`, true);
  });
}

const policyPath = () => `/v1/policies/${encodeURIComponent($("policy").value)}`;
const sigmaQuery = () => (previewSigma === null ? "" : `sigma=${encodeURIComponent(previewSigma)}`);

// The charts below the context selector follow it, the θ in use included (every context's
// when none is chosen).
async function loadContextCharts() {
  const context = $("context").value;
  if (!context) {
    showRounds({ sigma: "–", bucket_hours: "–", incumbent: null, rounds: [] });
    showPercentiles({ quantiles: [], arms: [] });
    showTheta(await api(`${policyPath()}/charts/theta`));
    return;
  }
  const q = `context=${encodeURIComponent(context)}`;
  const [rounds, pct, theta] = await Promise.all([
    api(`${policyPath()}/charts/rounds?${q}&${sigmaQuery()}`),
    api(`${policyPath()}/charts/percentiles?${q}`),
    api(`${policyPath()}/charts/theta?${q}`),
  ]);
  showRounds(rounds);
  showPercentiles(pct);
  showTheta(theta);
}

async function loadPolicy(refill = true) {
  if (!$("policy").value) return;
  const base = policyPath();
  const [policy, plans, comparison, theta, overrides] = await Promise.all([
    api(base), api(`${base}/parameters`), api(`${base}/comparison?${sigmaQuery()}`),
    api(`${base}/charts/theta`), api(`${base}/overrides`),
  ]);
  spec = Object.fromEntries(theta.params.map((p) => [p.name, p]));  // the policy's datapath's
  showPolicy(policy, refill);
  showPlans(plans);
  showComparison(comparison, previewSigma === null ? policy.sigma : previewSigma, previewSigma !== null);
  showOverrides(overrides);
  rememberView();
  await loadContextCharts();
}

// --- deep links: the policy and context shown are in the URL (?policy=…&context=…) ----------

const linked = new URLSearchParams(location.search);

function rememberView() {
  const q = new URLSearchParams(location.search);
  for (const [key, id] of [["policy", "policy"], ["context", "context"], ["experiment", "experiment"]]) {
    if ($(id).value) q.set(key, $(id).value); else q.delete(key);
  }
  if (previewSigma === null) q.delete("sigma"); else q.set("sigma", previewSigma);
  history.replaceState(null, "", `${location.pathname}?${q}`);
}

async function loadPolicies(refill = true) {
  const policies = await api("/v1/policies");
  const chosen = $("policy").value || linked.get("policy");
  $("policy").replaceChildren(...policies.map((p) => new Option(p.name, p.name)));
  if (policies.some((p) => p.name === chosen)) $("policy").value = chosen;
  $("main").hidden = false;
  $("token-help").hidden = true;
  $("sign-out").hidden = false;
  await Promise.all([loadPolicy(refill), loadExperiments(),
                     api(`/v1/audit?limit=${AUDIT_ROWS}`).then(showAudit)]);
  $("updated").dateTime = new Date().toISOString();
  $("updated").textContent = new Date().toISOString().slice(11, 19) + " UTC";
  if (!policies.length) say("No policies yet: create one through POST /v1/policies.", "");
}

async function guarded(action) {
  try {
    await action();
  } catch (e) {
    say(e instanceof ApiError ? e.message : `error: ${e.message}`, "error");
  }
}

// --- auto-refresh ---------------------------------------------------------------------------------

const refreshSeconds = (() => {
  const asked = Number(new URLSearchParams(location.search).get("refresh"));
  return asked >= MIN_REFRESH_S ? asked : DEFAULT_REFRESH_S;
})();
let timer = null;

function schedule() {
  clearInterval(timer);
  timer = null;
  const paused = $("pause").getAttribute("aria-pressed") === "true";
  const on = !paused && !$("main").hidden;
  document.body.dataset.autoRefresh = on ? "on" : "paused";
  if (on) timer = setInterval(() => guarded(() => loadPolicies(false)), refreshSeconds * 1000);
}

$("refresh-seconds").textContent = String(refreshSeconds);

$("pause").addEventListener("click", () => {
  const paused = $("pause").getAttribute("aria-pressed") !== "true";
  $("pause").setAttribute("aria-pressed", String(paused));
  $("pause").textContent = paused ? "Resume" : "Pause";
  schedule();
  say(paused ? "Auto-refresh paused." : "Auto-refresh resumed.", "");
});

$("refresh").addEventListener("click", () => guarded(() => loadPolicies(false)));

// --- sign-in and forms --------------------------------------------------------------------------

$("sign-in").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  guarded(async () => {
    await loadPolicies();
    schedule();
    say("Signed in.", "ok");
  });
});

$("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  $("main").hidden = true;
  $("sign-out").hidden = true;
  $("token-help").hidden = false;
  schedule();
  say("Signed out.", "");
});

$("policy").addEventListener("change", () => {
  previewSigma = null;
  guarded(loadPolicy);
});
$("context").addEventListener("change", () => {
  rememberView();
  guarded(loadContextCharts);
});
$("experiment").addEventListener("change", () => guarded(async () => {
  await loadExperiments();
  rememberView();
}));
$("metric").addEventListener("change", () => {
  showExperimentMetric();
  showVerdict();
});

$("experiment-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  let body;
  try {
    body = JSON.parse($("experiment-json").value);
  } catch (e) {
    say(`experiment: not JSON (${e.message})`, "error");
    return;
  }
  guarded(async () => {
    const e = await api("/v1/experiments", { method: "POST", body: JSON.stringify(body) });
    await loadExperiments();
    $("experiment").value = e.name;
    await loadExperiments();
    rememberView();
    say(`Created experiment ${e.name} (${e.status}, ${e.hosts} hosts).`, "ok");
  });
});

$("experiment-stop").addEventListener("click", () => guarded(async () => {
  const name = $("experiment").value;
  if (!name) return;
  const e = await api(`/v1/experiments/${encodeURIComponent(name)}/stop`,
    { method: "POST", body: JSON.stringify({ reason: "stopped from the dashboard" }) });
  await loadExperiments();
  say(`Stopped experiment ${e.name} (${e.status}).`, "ok");
}));

function csvButton(id, path) {
  $(id).addEventListener("click", () => guarded(async () => {
    const sep = path().includes("?") ? "&" : "?";
    say(`Saved ${await downloadCsv(`${path()}${sep}format=csv`)}.`, "ok");
  }));
}
csvButton("comparison-csv", () => `${policyPath()}/comparison?${sigmaQuery()}`);
csvButton("trials-csv", () => `${policyPath()}/trials?${sigmaQuery()}`);
csvButton("experiment-csv", () => `/v1/experiments/${encodeURIComponent($("experiment").value)}/results`);

$("preview").addEventListener("click", () => guarded(async () => {
  const sigma = $("sigma").value;
  previewSigma = sigma;
  const [comparison] = await Promise.all([
    api(`${policyPath()}/comparison?${sigmaQuery()}`), loadContextCharts(),
  ]);
  showComparison(comparison, sigma, true);
  rememberView();
  say(`Comparison at σ = ${sigma} shown; the policy is unchanged.`, "");
}));

$("policy-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  guarded(async () => {
    const change = { sigma: Number($("sigma").value),
                     exploration_share: Number($("exploration").value) };
    const p = await api(policyPath(), { method: "PATCH", body: JSON.stringify(change) });
    previewSigma = null;
    await loadPolicy();
    say(`Saved: σ = ${p.sigma}, exploration share = ${p.exploration_share} (revision ${p.revision}).`,
        "ok");
  });
});

if (sessionStorage.getItem(TOKEN_KEY)) guarded(async () => {
  await loadPolicies();
  schedule();
});
