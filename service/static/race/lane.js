// One engine's lane: a row per prompt, drawn from the events of POST /race, and its counters.
// Marks carry their times in ms (--a, --b, --t) and the page's --scale places them (race.css).

import { $, el, hue, ms, percentile, runs } from "./util.js";

export class Lane {
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
