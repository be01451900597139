// runyard dashboard: live refresh of the runs table, live run pages over SSE, relative times.
// Same-origin only (the Content-Security-Policy allows nothing else); no framework, no build.
"use strict";

const TERMINAL = new Set(["succeeded", "failed", "timed_out", "cancelled"]);
const TIMELINE_EVENTS = ["status", "claimed", "adopted", "lease_expired", "requeued",
  "released", "cancel_requested"];

function relative(iso) {
  let seconds = (Date.now() - Date.parse(iso)) / 1000;
  const future = seconds < 0;
  seconds = Math.abs(seconds);
  let amount;
  if (seconds < 60) amount = Math.floor(seconds) + " s";
  else if (seconds < 3600) amount = Math.floor(seconds / 60) + " min";
  else if (seconds < 86400) amount = Math.floor(seconds / 3600) + " h";
  else amount = Math.floor(seconds / 86400) + " d";
  return "(" + (future ? "in " + amount : amount + " ago") + ")";
}

function refreshRelativeTimes(root) {
  for (const el of (root || document).querySelectorAll(".rel[data-since]")) {
    el.textContent = relative(el.dataset.since);
  }
}

async function fetchFragment(url) {
  const response = await fetch(url, {
    credentials: "same-origin",
    headers: { "X-Runyard-Fragment": "1" },
    cache: "no-store",
  });
  if (response.status === 401) {
    window.location.reload();  // the session ended: the page itself goes to the login form
    return null;
  }
  if (!response.ok) return null;
  return response.text();
}

function liveRunsTable(tbody) {
  let busy = false;
  async function tick() {
    if (busy || document.hidden) return;
    // Never pull the rug from under a keyboard user's focus.
    if (tbody.contains(document.activeElement)) return;
    busy = true;
    try {
      const html = await fetchFragment(tbody.dataset.refresh);
      if (html !== null && html.trim() !== tbody.innerHTML.trim()) {
        tbody.innerHTML = html;
        refreshRelativeTimes(tbody);
      }
    } catch (err) {
      // The API restarting is no reason to stop: try again on the next tick.
    } finally {
      busy = false;
    }
  }
  setInterval(tick, 2000);
}

function liveRunPage(page) {
  const panel = document.getElementById("run-panel");
  let logs = document.getElementById("run-logs");
  let lastId = Number(logs.dataset.upto || "0");
  let attempt = Number(logs.dataset.attempt || "0");
  let panelTimer = null;
  let finished = page.dataset.terminal === "true";

  async function refreshPanel() {
    panelTimer = null;
    const html = await fetchFragment(page.dataset.panel);
    if (html === null) return;
    if (!panel.contains(document.activeElement)) {
      panel.innerHTML = html;
      refreshRelativeTimes(panel);
    } else {
      panelTimer = setTimeout(refreshPanel, 1000);
    }
  }

  function schedulePanel() {
    if (panelTimer === null) panelTimer = setTimeout(refreshPanel, 150);
  }

  async function showStoredLogs() {
    const html = await fetchFragment(page.dataset.logs);
    if (html === null) return;
    logs.outerHTML = html;
    logs = document.getElementById("run-logs");
  }

  function append(stream, text) {
    const pre = document.getElementById(stream);
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.append(document.createTextNode(text));
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function fresh(event) {
    const id = Number(event.lastEventId || "0");
    if (id && id <= lastId) return false;  // a reconnect may resend what we have
    if (id) lastId = id;
    return true;
  }

  async function finish() {
    finished = true;
    source.close();
    await refreshPanel();
    await showStoredLogs();
  }

  const source = new EventSource(page.dataset.events, { withCredentials: true });
  for (const stream of ["stdout", "stderr"]) {
    source.addEventListener(stream, (event) => {
      if (!fresh(event)) return;
      const data = JSON.parse(event.data);
      if (data.attempt > attempt) {
        // A new attempt starts with empty streams; the timeline says why.
        attempt = data.attempt;
        document.getElementById("stdout").textContent = "";
        document.getElementById("stderr").textContent = "";
      }
      if (data.attempt === attempt) append(stream, data.text || "");
    });
  }
  for (const type of TIMELINE_EVENTS) {
    source.addEventListener(type, (event) => {
      if (!fresh(event)) return;
      const data = JSON.parse(event.data);
      if (type === "status" && TERMINAL.has(data.status)) {
        finish();
      } else {
        schedulePanel();
      }
    });
  }
  source.addEventListener("error", () => {
    // Closed for good (204: the run is over, or 401/404): show the final state once.
    if (source.readyState === EventSource.CLOSED && !finished) finish();
  });
}

document.addEventListener("DOMContentLoaded", () => {
  refreshRelativeTimes();
  setInterval(refreshRelativeTimes, 15000);
  const rows = document.getElementById("run-rows");
  if (rows) liveRunsTable(rows);
  const page = document.getElementById("run-page");
  if (page && page.dataset.terminal !== "true") liveRunPage(page);
});
