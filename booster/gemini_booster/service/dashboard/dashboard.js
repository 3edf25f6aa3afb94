// Gemini Booster's operator dashboard: a thin client of the REST API (/v1). It keeps the token
// in sessionStorage (gone with the tab), sends it as a bearer credential, and builds every cell
// with textContent, so nothing from the API is ever parsed as HTML.
"use strict";

const TOKEN_KEY = "gemini-booster-token";
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

const fmt = (x, digits = 2) => (x === null || x === undefined ? "–" : Number(x).toFixed(digits));
const UNIT_TEXT = { percent: " %", ratio: "", packets: " pkts" };
let spec = {};  // θ parameter name → its entry in /v1/theta-spec (symbol, unit)

function thetaText(natural) {
  return Object.entries(natural).map(([name, v]) => {
    const p = spec[name] || { symbol: name, unit: "" };
    const unit = p.unit in UNIT_TEXT ? UNIT_TEXT[p.unit] : ` ${p.unit}`;
    return `${p.symbol} ${Number(v.toPrecision(4))}${unit}`;
  }).join(", ");
}

function showPolicy(p) {
  const settings = $("settings");
  settings.replaceChildren();
  for (const [k, v] of Object.entries({
    "σ": p.sigma, "exploration share": p.exploration_share, "region": p.region,
    "mode": p.mode, "acquisition": p.acq_func, "target CC": p.target_cc, "revision": p.revision,
  })) {
    settings.append(Object.assign(document.createElement("dt"), { textContent: k }));
    settings.append(Object.assign(document.createElement("dd"), { textContent: String(v) }));
  }
  $("sigma").value = p.sigma;
  $("exploration").value = p.exploration_share;
}

function showPlans(plans) {
  fill("plans", plans, (row, p) => {
    cell(row, p.label);
    cell(row, thetaText(p.incumbent_natural));
    cell(row, fmt(p.predicted_utility), true);
    cell(row, `v${p.plan_version}`, true);
    cell(row, String(p.exploration_candidates), true);
  });
}

function showComparison(contexts, sigma, preview) {
  $("comparison-sigma").textContent = preview ? `(at σ = ${sigma}, not saved)` : `(at σ = ${sigma})`;
  const arms = contexts.flatMap((c) => c.arms.map((a) => ({ label: c.label, ...a })));
  fill("comparison", arms, (row, a) => {
    cell(row, a.label);
    cell(row, a.arm);
    cell(row, String(a.flows), true);
    cell(row, `${fmt(a.utility)} ± ${fmt(a.utility_stderr)}`, true);
    cell(row, fmt(a.mean_throughput_mbps), true);
    cell(row, fmt(a.mean_queue_delay_ms, 1), true);
    cell(row, `${fmt(100 * a.slow_flow_share, 1)} %`, true);
  });
  const pairs = contexts.flatMap((c) => c.versus.map((v) => ({ label: c.label, ...v })));
  fill("versus", pairs, (row, v) => {
    cell(row, v.label);
    cell(row, `${v.arm} − ${v.baseline}`);
    cell(row, `${fmt(v.utility_difference)} ± ${fmt(v.utility_difference_stderr)}`, true);
    cell(row, v.throughput_ratio === null ? "–" : `${fmt(v.throughput_ratio)}×`, true);
  });
}

async function loadPolicy() {
  const name = encodeURIComponent($("policy").value);
  if (!name) return;
  const [policy, plans, comparison] = await Promise.all([
    api(`/v1/policies/${name}`), api(`/v1/policies/${name}/parameters`),
    api(`/v1/policies/${name}/comparison`),
  ]);
  showPolicy(policy);
  showPlans(plans);
  showComparison(comparison, policy.sigma, false);
}

async function loadPolicies() {
  const [policies, thetaSpec] = await Promise.all([api("/v1/policies"), api("/v1/theta-spec")]);
  spec = Object.fromEntries(thetaSpec.params.map((p) => [p.name, p]));
  const chosen = $("policy").value;
  $("policy").replaceChildren(...policies.map((p) => new Option(p.name, p.name)));
  if (policies.some((p) => p.name === chosen)) $("policy").value = chosen;
  $("main").hidden = false;
  $("sign-out").hidden = false;
  await loadPolicy();
  if (!policies.length) say("No policies yet: create one through POST /v1/policies.", "");
}

async function guarded(action) {
  try {
    await action();
  } catch (e) {
    say(e instanceof ApiError ? e.message : `error: ${e.message}`, "error");
  }
}

$("sign-in").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value);
  $("token").value = "";
  guarded(async () => {
    await loadPolicies();
    say("Signed in.", "ok");
  });
});

$("sign-out").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  $("main").hidden = true;
  $("sign-out").hidden = true;
  say("Signed out.", "");
});

$("policy").addEventListener("change", () => guarded(loadPolicy));

$("preview").addEventListener("click", () => guarded(async () => {
  const name = encodeURIComponent($("policy").value);
  const sigma = $("sigma").value;
  const comparison = await api(`/v1/policies/${name}/comparison?sigma=${encodeURIComponent(sigma)}`);
  showComparison(comparison, sigma, true);
  say(`Comparison at σ = ${sigma} shown; the policy is unchanged.`, "");
}));

$("policy-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  guarded(async () => {
    const name = encodeURIComponent($("policy").value);
    const change = { sigma: Number($("sigma").value),
                     exploration_share: Number($("exploration").value) };
    const p = await api(`/v1/policies/${name}`, { method: "PATCH", body: JSON.stringify(change) });
    await loadPolicy();
    say(`Saved: σ = ${p.sigma}, exploration share = ${p.exploration_share} (revision ${p.revision}).`,
        "ok");
  });
});

if (sessionStorage.getItem(TOKEN_KEY)) guarded(loadPolicies);
