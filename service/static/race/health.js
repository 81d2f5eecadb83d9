// The replica: both engines' /health in the header, asked every 2 s while the tab is visible.

import { apiFetch } from "./api.js";
import { $ } from "./util.js";

const HEALTH_EVERY_MS = 2000; // the idle page's only traffic: one /health per 2 s while visible

function describeEngine(name, e) {
  if (!e) return `${name}: ?`;
  const parts = [`${name}: ${e.status}`];
  if (e.status === "ready") {
    parts.push(`queued ${e.queued}`);
    // the engine's own prediction for one prompt arriving now (null until it has measured a round)
    const ttft = e.predicted?.ttft_ms;
    parts.push(`predicted first token ${ttft == null ? "unknown" : `${Math.round(ttft)} ms`}`);
    if ("rounds" in e) parts.push(`in flight ${e.inflight}`, `rounds ${e.rounds}`);
    if ("steps" in e) parts.push(`running ${e.running}`, `steps ${e.steps}`);
  } else if (e.error) {
    parts.push(e.error);
  }
  return parts.join(" · ");
}

export async function pollHealth() {
  if (!document.hidden) {
    let engines = {};
    try {
      engines = (await (await apiFetch("/health", { cache: "no-store" })).json()).engines || {};
    } catch {
      engines = { static: { status: "down" }, vllm: { status: "down" } };
    }
    for (const [name, label] of [["static", "static"], ["vllm", "vLLM"]]) {
      const el = $(`[data-health="${name}"]`);
      el.textContent = describeEngine(label, engines[name]);
      el.dataset.status = engines[name]?.status ?? "down";
    }
  }
  setTimeout(pollHealth, HEALTH_EVERY_MS); // counted from the answer: never two at once
}
