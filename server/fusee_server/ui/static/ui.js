// The run page's buttons: each calls the /v1 route itself with a JSON body (or
// X-Fusee-Action: 1 when it has none), as the API's guard asks of any change, then
// shows the answer and refreshes the live part of the page. No other script runs here.
"use strict";

function say(text, failed) {
  const box = document.getElementById("message");
  if (!box) return;
  box.textContent = text; // text, never HTML: an error message may echo user input
  box.className = failed ? "error" : "ok";
}

function bodyOf(action, form) {
  const data = new FormData(form);
  if (action === "signal") {
    const raw = (data.get("value") || "").trim();
    return { value: raw === "" ? null : JSON.parse(raw) };
  }
  if (action === "cancel" || action === "terminate") {
    const reason = (data.get("reason") || "").trim();
    return reason ? { reason } : {};
  }
  if (action === "reset") return { beforeStep: data.get("beforeStep") };
  return null; // retry, resume: no body
}

async function act(event) {
  const form = event.target.closest("form.action");
  if (!form) return;
  event.preventDefault();
  const action = form.dataset.action;
  const run = form.closest(".actions").dataset.run; // already one encoded path segment
  if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
  let body;
  try {
    body = bodyOf(action, form);
  } catch (error) {
    say("The payload is not JSON: " + error.message, true);
    return;
  }
  let path = `/v1/runs/${run}/${action}`;
  if (action === "signal") path = `/v1/runs/${run}/signals/${encodeURIComponent(new FormData(form).get("name"))}`;
  const headers = { "X-Fusee-Action": "1" };
  const init = { method: "POST", headers, credentials: "same-origin" };
  if (body !== null) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  try {
    const response = await fetch(path, init);
    const answer = await response.json().catch(() => ({}));
    if (response.ok) {
      say(`${action}: done` + (answer.run ? ` (run ${answer.run})` : ""), false);
    } else {
      say(`${action}: ${answer.code || response.status}: ${answer.message || response.statusText}`, true);
    }
  } catch (error) {
    say(`${action}: ${error.message}`, true);
  }
  const live = document.getElementById("live");
  if (live && window.htmx) window.htmx.trigger(live, "refresh");
}

document.addEventListener("submit", act);

// The sign-in page: the token goes into the cookie the API's guard reads as a bearer
// (SameSite=Strict: no other site's page makes the browser send it), then the page the
// browser asked for loads again.
document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.id !== "sign-in") return;
  event.preventDefault();
  const token = new FormData(form).get("token") || "";
  const secure = location.protocol === "https:" ? "; Secure" : "";
  document.cookie = `fusee-token=${encodeURIComponent(token)}; Path=/; SameSite=Strict${secure}`;
  location.reload();
});

// Encrypted payloads: with a codec endpoint (`fusee server --codec-url`, served by `fusee
// codec-server` where the keys are), the page sends the sealed bytes it shows to it and
// puts the decoded values in their place. The keys and the plain payloads never reach the
// Fusee server; without an endpoint they stay "encrypted".
async function decodePayloads(root) {
  const url = document.body.dataset.codecUrl;
  if (!url) return;
  const shown = Array.from(root.querySelectorAll("pre.encoded[data-encoded]"));
  if (shown.length === 0) return;
  try {
    const response = await fetch(url + "/decode", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ payloads: shown.map((pre) => pre.dataset.encoded) }),
    });
    const answer = await response.json();
    shown.forEach((pre, i) => {
      const value = answer.payloads ? answer.payloads[i] : null;
      if (value === null || value === undefined) {
        pre.textContent = "encrypted (the codec endpoint cannot decode it)";
        return;
      }
      pre.textContent = JSON.stringify(value, null, 2); // text, never HTML
      pre.classList.replace("encoded", "decoded");
    });
  } catch (error) {
    shown.forEach((pre) => { pre.textContent = `encrypted (codec endpoint: ${error.message})`; });
  }
}

document.addEventListener("DOMContentLoaded", () => decodePayloads(document));
document.addEventListener("htmx:afterSwap", () => decodePayloads(document));
