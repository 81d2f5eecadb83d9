// The race page: sends the same prompts to both engines through POST /race (the service's own
// generate routes, see service/race.py) and draws one row per prompt as its events arrive.
// Plain JS, no library: the drawing is a few absolutely placed elements positioned by CSS.
"use strict";
(() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const body = document.body;
  const form = $("#controls");
  const verdict = $("#verdict");
  const runButton = $("#run");
  const stopButton = $("#stop");
  const raceEl = $("#race");
  const HEALTH_EVERY_MS = 2000; // the idle page's only traffic: one /health per 2 s while visible
  const KEY = "batching-race.api-key";
  const ENGINE_NAMES = { static: "static batching", vllm: "continuous batching" };

  // --- API key: asked once on a 401, kept for the tab's session, sent as a Bearer token -------
  let keyPrompt = null;

  function authHeaders() {
    const key = sessionStorage.getItem(KEY);
    return key ? { Authorization: `Bearer ${key}` } : {};
  }

  function askKey(refused) {
    keyPrompt ??= new Promise((resolve, reject) => {
      const dialog = $("#key-dialog");
      const input = $("#key-input");
      $("#key-message").textContent = refused
        ? "The service refused that key. Enter its API key."
        : "This service needs an API key (its API_KEY).";
      input.value = "";
      dialog.addEventListener("close", () => {
        keyPrompt = null;
        if (dialog.returnValue === "ok" && input.value) {
          sessionStorage.setItem(KEY, input.value);
          resolve();
        } else {
          reject(new Error("an API key is required"));
        }
      }, { once: true });
      dialog.returnValue = "";
      dialog.showModal();
    });
    return keyPrompt;
  }

  async function keyRefused() {
    const had = sessionStorage.getItem(KEY);
    if (had) sessionStorage.removeItem(KEY);
    await askKey(Boolean(had));
  }

  async function apiFetch(url, options = {}) {
    for (;;) {
      const headers = { ...(options.headers || {}), ...authHeaders() };
      const response = await fetch(url, { ...options, headers });
      if (response.status !== 401) return response;
      await keyRefused();
    }
  }

  // --- the replica: /health every 2 s --------------------------------------------------------
  function describeEngine(name, e) {
    if (!e) return `${name}: ?`;
    const parts = [`${name}: ${e.status}`];
    if (e.status === "ready") {
      parts.push(`queued ${e.queued}`);
      if ("inflight" in e) parts.push(`in flight ${e.inflight}`, `rounds ${e.rounds}`);
      if ("running" in e) parts.push(`running ${e.running}`, `steps ${e.steps}`);
    } else if (e.error) {
      parts.push(e.error);
    }
    return parts.join(" · ");
  }

  async function pollHealth() {
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

  // --- controls and the query string ---------------------------------------------------------
  const presetN = ["1", "4", "16", "64"];

  function syncCustom() {
    $(".custom-n").hidden = form.elements.n.value !== "custom";
  }

  function applyQuery(query) {
    const f = form.elements;
    if (query.has("n")) {
      const n = query.get("n");
      if (presetN.includes(n)) f.n.value = n;
      else { f.n.value = "custom"; f.custom_n.value = n; }
    }
    if (query.has("max_tokens")) f.max_tokens.value = query.get("max_tokens");
    if (query.has("ignore_eos")) f.ignore_eos.checked = ["1", "true", "yes", "on"].includes(query.get("ignore_eos"));
    if (query.has("engines")) {
      const wanted = query.get("engines").split(",");
      for (const box of form.querySelectorAll("[name=engine]")) box.checked = wanted.includes(box.value);
    }
    if (query.has("mode")) f.mode.value = query.get("mode");
    if (query.has("order")) f.order.value = query.get("order");
    if (query.has("prompts")) f.prompts.value = query.get("prompts");
    syncCustom();
  }

  function readControls() {
    const f = form.elements;
    return {
      prompts: f.prompts.value.split("\n").filter((line) => line.trim()),
      n: Number(f.n.value === "custom" ? f.custom_n.value : f.n.value),
      max_tokens: Number(f.max_tokens.value),
      ignore_eos: f.ignore_eos.checked,
      engines: [...form.querySelectorAll("[name=engine]:checked")].map((box) => box.value),
      mode: f.mode.value || "concurrent",
      order: f.order.value || "sequential",
    };
  }

  function writeQuery(c) {
    const query = new URLSearchParams({
      n: c.n, engines: c.engines.join(","), mode: c.mode, order: c.order, max_tokens: c.max_tokens,
    });
    if (c.ignore_eos) query.set("ignore_eos", "1");
    history.replaceState(null, "", `?${query}`);
  }

  // --- numbers -------------------------------------------------------------------------------
  function percentile(values, p) {
    if (!values.length) return null;
    const sorted = [...values].sort((a, b) => a - b);
    return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)];
  }

  const ms = (v) => (v == null ? "–" : v < 1000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(2)} s`);

  function niceScale(t) {
    const target = Math.max(500, t * 1.08);
    const power = 10 ** Math.floor(Math.log10(target));
    for (const step of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (step * power >= target) return step * power;
    return 10 * power;
  }

  function runs(values) { // [1, 4, 4, 4, 3] -> "1 · 4×3 · 3"
    const out = [];
    for (const v of values) {
      const last = out.at(-1);
      if (last && last[0] === v) last[1] += 1;
      else out.push([v, 1]);
    }
    return out.map(([v, k]) => (k > 1 ? `${v}×${k}` : `${v}`)).join(" · ");
  }

  function hue(round) {
    return (Number(round) * 67) % 360;
  }

  function el(tag, className, style) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (style) for (const [k, v] of Object.entries(style)) node.style.setProperty(k, v);
    return node;
  }

  // --- one engine's lane ---------------------------------------------------------------------
  class Lane {
    constructor(engine, prompts, rowHeight) {
      this.engine = engine;
      this.section = $(`section[data-engine="${engine}"]`);
      this.rowsEl = $(".rows", this.section);
      this.counters = $(".counters", this.section);
      this.prompts = prompts;
      this.rowHeight = rowHeight;
      this.reset();
    }

    reset() {
      this.section.hidden = false;
      this.rowsEl.replaceChildren();
      this.rowsEl.style.setProperty("--row", `${this.rowHeight}px`);
      this.rowsEl.classList.toggle("dense", this.rowHeight < 9);
      this.section.querySelector(".error-note")?.remove();
      this.groups = new Map(); // round or step -> prompts of this race in it
      this.sizes = new Map(); // static round -> its batch size
      this.firstOfRound = new Map();
      this.baseRound = null;
      this.done = this.errors = this.tokens = 0;
      this.t0 = null;
      this.lastT = 0;
      this.finished = false;
      this.failure = null;
      this.rows = this.prompts.map((prompt, index) => {
        const row = el("div", "row");
        row.dataset.index = index;
        row.dataset.state = "queued";
        row.style.order = 2e9 + index;
        const label = el("span", "label");
        label.textContent = `#${index + 1}`;
        label.title = prompt;
        const track = el("div", "track");
        const wait = el("i", "wait", { "--a": 0, "--b": "var(--now)" });
        track.append(wait);
        row.append(label, track);
        this.rowsEl.append(row);
        return { el: row, label, track, wait, run: null, index, sent: 0, entered: null, first: null, end: null };
      });
      this.render();
    }

    start() {
      this.t0 = performance.now();
    }

    now() {
      if (this.t0 == null) return 0;
      return this.finished ? this.lastT : Math.max(this.lastT, performance.now() - this.t0);
    }

    on(ev) {
      const row = this.rows[ev.index];
      if (!row) return;
      const t = ev.t_ms;
      this.lastT = Math.max(this.lastT, t);
      if (ev.sent) {
        row.sent = t;
        row.wait.style.setProperty("--a", t);
      } else if ("error" in ev) {
        this.fail_row(row, t, ev);
      } else if ("token" in ev) {
        if (row.entered == null) this.enter(row, t, ev);
        row.first ??= t;
        this.tokens += 1;
        row.track.append(el("b", "", { "--t": t }));
      } else if (ev.done) {
        this.finish_row(row, t, ev);
      } else if ("round" in ev) {
        // the server's queue time says when it entered; the event itself may be a little later
        this.enter(row, Math.min(t, row.sent + ev.queue_ms), ev);
      }
      this.dirty = true;
    }

    enter(row, t, detail) {
      row.entered = t;
      row.wait.style.setProperty("--b", t);
      row.run = el("i", "run", { "--a": t, "--b": "var(--now)" });
      row.track.prepend(row.run);
      if (detail.round == null) return;
      const isStep = typeof detail.round === "string";
      const number = isStep ? Number(detail.round.replace("step-", "")) : detail.round;
      row.el.dataset[isStep ? "step" : "round"] = number;
      row.label.textContent = `#${row.index + 1} ${isStep ? "step" : "round"} ${number}`;
      this.groups.set(number, (this.groups.get(number) || 0) + 1);
      if (isStep) return; // vLLM rows stay in prompt order, marked with the step they joined
      this.baseRound ??= number;
      row.el.style.order = (number - this.baseRound) * 100000 + row.index; // grouped by round
      row.el.style.setProperty("--hue", hue(number));
      this.sizes.set(number, detail.batch_size);
      const first = this.firstOfRound.get(number); // the group's top row gets the gap above it
      if (!first || first.index > row.index) {
        first?.el.classList.remove("first-of-round");
        row.el.classList.add("first-of-round");
        this.firstOfRound.set(number, row);
      }
    }

    finish_row(row, t, ev) {
      if ("tokens" in ev) { // one request: the reply's details say when it ran
        if (row.entered == null) this.enter(row, row.sent + ev.queue_ms, ev);
        const ran = row.entered + ev.inference_ms;
        row.run.style.setProperty("--b", ran);
        row.track.append(el("i", "reply", { "--a": ran, "--b": t }));
        this.tokens += ev.tokens;
        row.first = t; // a client sees its first token when the whole reply arrives
      } else if (row.run) {
        row.run.style.setProperty("--b", t);
      }
      this.close(row, t, "done");
      this.done += 1;
    }

    fail_row(row, t, ev) {
      row.label.textContent = `#${row.index + 1} ${ev.status} ${ev.type}`;
      row.label.title = ev.error;
      if (row.entered == null) row.wait.style.setProperty("--b", t);
      else row.run.style.setProperty("--b", t);
      this.close(row, t, "error");
      this.errors += 1;
      this.failure ??= `${ev.status} ${ev.type}: ${ev.error}`;
    }

    close(row, t, state) {
      row.end = t;
      row.el.dataset.state = state;
      row.track.append(el("b", "end", { "--t": t }));
    }

    fail(message) {
      this.failure = message;
      for (const row of this.rows) {
        if (row.end == null) this.fail_row(row, this.now(), { status: "", type: "not finished", error: message });
      }
      this.errors = this.rows.filter((r) => r.el.dataset.state === "error").length;
    }

    finish() {
      this.lastT = Math.max(this.lastT, ...this.rows.map((r) => r.end ?? 0));
      this.finished = true;
      this.dirty = true;
    }

    stats() {
      const done = this.rows.filter((r) => r.el.dataset.state === "done");
      const elapsed = this.now();
      return {
        elapsed,
        ttft: done.map((r) => r.first - r.sent),
        latency: done.map((r) => r.end - r.sent),
        tokensPerSecond: elapsed > 0 ? (this.tokens * 1000) / elapsed : 0,
      };
    }

    render() {
      const s = this.stats();
      const unit = this.engine === "static" ? "rounds" : "steps joined";
      const items = [
        ["elapsed", ms(s.elapsed)],
        ["done", `${this.done}/${this.rows.length}`],
        ["tokens/s", s.tokensPerSecond.toFixed(1)],
        ["TTFT p50/p99", `${ms(percentile(s.ttft, 50))} / ${ms(percentile(s.ttft, 99))}`],
        ["latency p50/p99", `${ms(percentile(s.latency, 50))} / ${ms(percentile(s.latency, 99))}`],
        [unit, this.groups.size],
      ];
      if (this.sizes.size) {
        const sizes = [...this.sizes].sort((a, b) => a[0] - b[0]).map(([, size]) => size); // by round
        items.push(["batch sizes", runs(sizes)]);
      }
      if (this.errors) items.push(["errors", this.errors]);
      this.counters.replaceChildren(...items.map(([k, v]) => {
        const div = el("div");
        const dt = el("dt");
        const dd = el("dd");
        dt.textContent = k;
        dd.textContent = v;
        div.append(dt, dd);
        return div;
      }));
      this.section.style.setProperty("--now", this.now());
      this.section.dataset.done = this.done;
      this.section.dataset.errors = this.errors;
      this.section.dataset.elapsedMs = Math.round(s.elapsed);
      this.section.dataset[this.engine === "static" ? "rounds" : "steps"] = this.groups.size;
      this.dirty = false;
    }
  }

  // --- the race ------------------------------------------------------------------------------
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

  async function readEvents(response, onEvent) {
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const chunk = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        if (chunk.startsWith("data: ")) onEvent(JSON.parse(chunk.slice(6)));
      }
    }
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

  const count = (k, word) => `${k} ${word}${k === 1 ? "" : "s"}`;

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
})();
