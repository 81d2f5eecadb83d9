// The race page: sends the same prompts to both engines through POST /race (the service's own
// generate routes, see service/demo/race.py) and draws one row per prompt as its events arrive.
// Plain JS modules, no library: the drawing is a few absolutely placed elements, positioned by CSS.

import { apiFetch, keyRefused, readEvents } from "./api.js";
import { applyQuery, form, readControls, syncCustom, writeQuery } from "./controls.js";
import { pollHealth } from "./health.js";
import { Lane } from "./lane.js";
import { $, count, el, ms, niceScale } from "./util.js";

const body = document.body;
const verdict = $("#verdict");
const runButton = $("#run");
const stopButton = $("#stop");
const raceEl = $("#race");
const ENGINE_NAMES = { static: "static batching", vllm: "continuous batching" };

let lanes = [];
let raceAbort = null;
let scale = 0;
let frame = null;

function drawAxis() {
  for (const axis of raceEl.querySelectorAll(".axis")) {
    const marks = el("div", "scale");
    for (let i = 0; i <= 4; i += 1) {
      const span = el("span", "", { "--t": (scale * i) / 5 });
      span.textContent = i === 0 ? "0" : ms((scale * i) / 5);
      marks.append(span);
    }
    axis.replaceChildren(el("div"), marks);
  }
}

function tick() {
  const longest = Math.max(0, ...lanes.map((lane) => lane.now()));
  const wanted = niceScale(longest);
  if (wanted !== scale) {
    scale = wanted;
    raceEl.style.setProperty("--scale", scale);
    drawAxis();
  }
  for (const lane of lanes) if (!lane.finished || lane.dirty) lane.render();
  frame = body.dataset.state === "running" ? requestAnimationFrame(tick) : null;
}

function rowHeight(n, laneCount) {
  // fit every lane in the window where it can; below 9 px rows drop their labels
  const top = raceEl.getBoundingClientRect().top + window.scrollY + 28; // after the verdict line
  const room = Math.max(120, (window.innerHeight - top - 8) / laneCount - 46);
  return Math.max(3, Math.min(16, Math.floor(room / n)));
}

async function runLane(lane, c) {
  const payload = JSON.stringify({
    engine: lane.engine, mode: c.mode, prompts: lane.prompts, max_tokens: c.max_tokens, ignore_eos: c.ignore_eos,
  });
  for (;;) { // once more after asking for the key, if a route answered 401 inside the feed
    const abort = new AbortController();
    const stopAll = () => abort.abort();
    raceAbort.signal.addEventListener("abort", stopAll);
    let needKey = false;
    lane.reset();
    lane.start();
    try {
      const response = await apiFetch("/race", {
        method: "POST", headers: { "Content-Type": "application/json" }, body: payload, signal: abort.signal,
      });
      if (!response.ok) {
        const err = await response.json().catch(() => ({}));
        lane.fail(`${response.status} ${err.type || ""}: ${err.error || response.statusText}`);
      } else {
        await readEvents(response, (ev) => {
          if (ev.status === 401) { needKey = true; abort.abort(); } else lane.on(ev);
        });
      }
    } catch (err) {
      if (!needKey) lane.fail(raceAbort.signal.aborted ? "stopped" : err.message || String(err));
    } finally {
      raceAbort.signal.removeEventListener("abort", stopAll);
    }
    if (!needKey) break;
    try {
      await keyRefused();
    } catch (err) {
      lane.fail(err.message);
      break;
    }
  }
  lane.finish();
}

function closingLine(c) {
  const n = count(c.n, "prompt");
  const parts = [];
  const ok = lanes.filter((lane) => !lane.failure);
  if (ok.length === 2) {
    const [a, b] = [...ok].sort((x, y) => x.now() - y.now());
    const ratio = b.now() / Math.max(a.now(), 1);
    parts.push(`${ENGINE_NAMES[a.engine]} finished ${n} ${ratio.toFixed(1)}x sooner`
      + ` (${ms(a.now())} against ${ms(b.now())}, ${c.order === "together" ? "at once" : "one after the other"}).`);
  } else {
    for (const lane of ok) {
      const unit = count(lane.groups.size, lane.engine === "static" ? "round" : "join step");
      parts.push(`${ENGINE_NAMES[lane.engine]} finished ${n} in ${ms(lane.now())} (${unit}).`);
    }
  }
  for (const lane of lanes) if (lane.failure) parts.push(`${ENGINE_NAMES[lane.engine]}: ${lane.failure}`);
  return parts.join(" ");
}

async function runRace() {
  if (body.dataset.state === "running" || !form.reportValidity()) return;
  const c = readControls();
  if (!c.prompts.length || !c.engines.length || !(c.n >= 1)) {
    verdict.textContent = "Choose at least one prompt, one engine and N of 1 or more.";
    return;
  }
  writeQuery(c);
  const prompts = Array.from({ length: c.n }, (_, i) => c.prompts[i % c.prompts.length]);
  body.dataset.state = "running";
  runButton.disabled = true;
  stopButton.disabled = false;
  verdict.className = "";
  verdict.textContent = `Racing ${c.n} prompts, ${c.mode === "batch" ? "as one request" : "as concurrent streams"}…`;
  for (const section of raceEl.querySelectorAll("section")) section.hidden = true;
  raceAbort = new AbortController();
  const height = rowHeight(c.n, c.engines.length);
  lanes = c.engines.map((engine) => new Lane(engine, prompts, height));
  scale = 0;
  frame ??= requestAnimationFrame(tick);
  try {
    if (c.order === "together") await Promise.all(lanes.map((lane) => runLane(lane, c)));
    else for (const lane of lanes) await runLane(lane, c);
  } finally {
    tick(); // the final scale and counters
    verdict.className = "final";
    verdict.textContent = closingLine(c);
    runButton.disabled = false;
    stopButton.disabled = true;
    body.dataset.state = "done";
  }
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  runRace();
});
form.elements.n.addEventListener("change", syncCustom);
stopButton.addEventListener("click", () => raceAbort?.abort());

const query = new URLSearchParams(location.search);
applyQuery(query);
pollHealth();
if (query.get("run") === "1") runRace();
