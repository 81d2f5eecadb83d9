// Small helpers the race page's modules share: DOM, numbers, formatting.

export const $ = (sel, root = document) => root.querySelector(sel);

export function percentile(values, p) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.max(0, Math.ceil((p / 100) * sorted.length) - 1)];
}

export const ms = (v) => (v == null ? "–" : v < 1000 ? `${Math.round(v)} ms` : `${(v / 1000).toFixed(2)} s`);

export function niceScale(t) {
  const target = Math.max(500, t * 1.08);
  const power = 10 ** Math.floor(Math.log10(target));
  for (const step of [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10]) if (step * power >= target) return step * power;
  return 10 * power;
}

export function runs(values) { // [1, 4, 4, 4, 3] -> "1 · 4×3 · 3"
  const out = [];
  for (const v of values) {
    const last = out.at(-1);
    if (last && last[0] === v) last[1] += 1;
    else out.push([v, 1]);
  }
  return out.map(([v, k]) => (k > 1 ? `${v}×${k}` : `${v}`)).join(" · ");
}

export function hue(round) {
  return (Number(round) * 67) % 360;
}

export function el(tag, className, style) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (style) for (const [k, v] of Object.entries(style)) node.style.setProperty(k, v);
  return node;
}

export const count = (k, word) => `${k} ${word}${k === 1 ? "" : "s"}`;
