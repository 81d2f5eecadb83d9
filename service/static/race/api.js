// Talking to the service: the API key (asked once on a 401, kept for the tab's session, sent as
// a Bearer token on every request) and reading a server-sent event stream from fetch().

import { $ } from "./util.js";

const KEY = "batching-race.api-key";
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

export async function keyRefused() {
  const had = sessionStorage.getItem(KEY);
  if (had) sessionStorage.removeItem(KEY);
  await askKey(Boolean(had));
}

export async function apiFetch(url, options = {}) {
  for (;;) {
    const headers = { ...(options.headers || {}), ...authHeaders() };
    const response = await fetch(url, { ...options, headers });
    if (response.status !== 401) return response;
    await keyRefused();
  }
}

export async function readEvents(response, onEvent) {
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
