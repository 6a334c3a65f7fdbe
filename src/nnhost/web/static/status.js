// The status page keeps itself current: it reads /api/overview every few seconds
// and rewrites the cells and the chart in place (no reload, no inline script).
"use strict";

const EVERY_MS = 3000;
const SVG = "http://www.w3.org/2000/svg";

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  if (seconds < 1) return `${Math.round(seconds * 1000)} ms`;
  if (seconds < 120) return `${seconds.toFixed(1)} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 3600)} h`;
}

function when(timestamp) {
  const moment = new Date(timestamp * 1000);
  return moment.toISOString().slice(0, 16).replace("T", " ") + " UTC";
}

function setClass(element, base, value) {
  element.className = `${base} ${String(value).toLowerCase()}`;
  element.textContent = value;
}

function containment(report) {
  if (!report) return "reported once a worker runs";
  const active = report.active.length ? report.active.join(", ") : "none";
  const missing = Object.keys(report.unavailable);
  return missing.length ? `${active} (not available: ${missing.join(", ")})` : active;
}

function updateModel(row, model) {
  const cell = (name) => row.querySelector(`[data-field="${name}"]`);
  setClass(cell("level"), "level", model.level);
  setClass(cell("state"), "state", model.state);
  cell("description").textContent = model.description;
  cell("replicas").textContent = `${model.replicas.running}/${model.replicas.configured}`;
  for (const name of ["queued", "running"]) {
    cell(name).dataset.value = model[name];
    cell(name).textContent = model[name];
  }
  for (const name of ["median_wait_seconds", "median_run_seconds"]) {
    cell(name).dataset.value = model[name] === null ? "" : model[name];
    cell(name).textContent = duration(model[name]);
  }
  cell("containment").textContent = containment(model.containment);
}

function drawChart(svg, buckets) {
  const peak = Math.max(1, ...buckets.map((b) => b.completed + b.errors));
  for (const group of Array.from(svg.querySelectorAll("g[data-minute]"))) group.remove();
  const axis = svg.querySelector("line.axis");
  buckets.forEach((bucket, index) => {
    const group = document.createElementNS(SVG, "g");
    group.dataset.minute = index;
    group.dataset.completed = bucket.completed;
    group.dataset.errors = bucket.errors;
    const total = bucket.completed + bucket.errors;
    const bars = [
      ["completed", 90 - (90 * total) / peak, (90 * bucket.completed) / peak],
      ["errors", 90 - (90 * bucket.errors) / peak, (90 * bucket.errors) / peak],
    ];
    for (const [name, y, height] of bars) {
      const rect = document.createElementNS(SVG, "rect");
      rect.setAttribute("class", name);
      rect.setAttribute("x", index * 10 + 1);
      rect.setAttribute("width", 8);
      rect.setAttribute("y", y);
      rect.setAttribute("height", height);
      group.appendChild(rect);
    }
    svg.insertBefore(group, axis);
  });
  document.querySelector("[data-testid=peak]").textContent = peak;
}

async function refresh(section) {
  try {
    const response = await fetch(section.dataset.poll, { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    const data = await response.json();
    setClass(section.querySelector("[data-testid=service-state]"), "service", data.service.state);
    section.querySelector("[data-testid=updated]").textContent = when(data.generated_at);
    for (const model of data.models) {
      const row = section.querySelector(`tr[data-model="${CSS.escape(model.name)}"]`);
      if (row) updateModel(row, model);
    }
    drawChart(document.querySelector("svg.chart"), data.per_minute);
    section.dataset.refreshed = String(Number(section.dataset.refreshed || 0) + 1);
  } catch (error) {
    setClass(section.querySelector("[data-testid=service-state]"), "service", "unreachable");
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const section = document.querySelector("#status[data-poll]");
  if (!section) return;
  setInterval(() => refresh(section), EVERY_MS);
  refresh(section);
});
