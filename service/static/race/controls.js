// The controls, and the query string that sets them (and that a run writes back).

import { $ } from "./util.js";

export const form = $("#controls");
const presetN = ["1", "4", "16", "64"];

export function syncCustom() {
  $(".custom-n").hidden = form.elements.n.value !== "custom";
}

export function applyQuery(query) {
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

export function readControls() {
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

export function writeQuery(c) {
  const query = new URLSearchParams({
    n: c.n, engines: c.engines.join(","), mode: c.mode, order: c.order, max_tokens: c.max_tokens,
  });
  if (c.ignore_eos) query.set("ignore_eos", "1");
  history.replaceState(null, "", `?${query}`);
}
