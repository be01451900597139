// runyard dashboard: live refresh of the runs and batches tables and of batch pages, live run
// pages over SSE, relative times.
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

function pauseToggle() {
  // WCAG 2.2.2: content that updates by itself can be paused.
  const state = { paused: false };
  const toggle = document.getElementById("pause-updates");
  if (toggle) {
    toggle.hidden = false;
    toggle.addEventListener("click", () => {
      state.paused = !state.paused;
      toggle.setAttribute("aria-pressed", String(state.paused));
      toggle.textContent = state.paused ? "Resume live updates" : "Pause live updates";
    });
  }
  return state;
}

function liveRunsTable(tbody) {
  let busy = false;
  const pause = pauseToggle();
  async function tick() {
    if (busy || pause.paused || document.hidden) return;
    // Never pull the rug from under a keyboard user's focus.
    if (tbody.contains(document.activeElement)) return;
    // Nor wipe a selection made for a bulk action.
    if (tbody.querySelector("input[type=checkbox]:checked")) return;
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

function focusPlace(root) {
  // Where keyboard focus is inside root, as [selector, index] to find it again after the
  // content is replaced; null when it is elsewhere, undefined when it cannot be found again.
  const el = document.activeElement;
  if (!el || el === document.body || !root.contains(el)) return null;
  let selector;
  if (el.id) selector = "#" + CSS.escape(el.id);
  else if (el.getAttribute("href")) selector = 'a[href="' + CSS.escape(el.getAttribute("href")) + '"]';
  else if (el.classList.contains("graph-wrap")) selector = ".graph-wrap";
  else return undefined;
  return [selector, [...root.querySelectorAll(selector)].indexOf(el)];
}

function liveBatch(panel) {
  // Re-fetch the batch's fragment (graph, counts, runs) until the batch ends; the server
  // answers 304 while it is what the page shows, so a big batch costs little when idle.
  const summary = () => panel.querySelector("#batch-summary");
  if (summary() && summary().dataset.terminal === "true") return;  // it has ended
  let etag = panel.dataset.etag || "";
  let busy = false;
  const pause = pauseToggle();
  const announce = document.getElementById("live-status");
  const toggle = document.getElementById("pause-updates");
  async function tick() {
    const shown = summary();
    if (shown && shown.dataset.terminal === "true") {
      if (toggle) toggle.hidden = true;  // nothing left to follow
      clearInterval(timer);
      return;
    }
    if (busy || pause.paused || document.hidden) return;
    const focused = focusPlace(panel);
    if (focused === undefined) return;  // never pull the rug from under a keyboard user
    busy = true;
    try {
      const response = await fetch(panel.dataset.refresh, {
        credentials: "same-origin",
        headers: { "X-Runyard-Fragment": "1", "If-None-Match": etag },
        cache: "no-store",
      });
      if (response.status === 401) {
        window.location.reload();
        return;
      }
      if (response.status !== 200) return;
      const html = await response.text();
      etag = response.headers.get("ETag") || "";
      const before = shown ? shown.dataset.status : "";
      // Keep where the reader has scrolled the graph and the runs table.
      const boxes = [...panel.querySelectorAll(".graph-wrap, .table-wrap")].map(
        (box) => [box.scrollLeft, box.scrollTop]);
      panel.innerHTML = html;
      panel.querySelectorAll(".graph-wrap, .table-wrap").forEach((box, i) => {
        if (boxes[i]) [box.scrollLeft, box.scrollTop] = boxes[i];
      });
      if (focused) {
        const again = panel.querySelectorAll(focused[0])[focused[1]];
        if (again) again.focus({ preventScroll: true });
      }
      refreshRelativeTimes(panel);
      confirmForms();
      const after = summary() ? summary().dataset.status : "";
      if (after && after !== before && announce) announce.textContent = "Batch " + after;
    } catch (err) {
      // Try again on the next tick.
    } finally {
      busy = false;
    }
  }
  const timer = setInterval(tick, Number(panel.dataset.interval || "2000"));
}

function clockOf(iso) {
  // The UTC time of day of an ISO timestamp, as the server stamps log lines.
  const at = new Date(iso);
  return Number.isNaN(at.getTime()) ? "" : at.toISOString().slice(11, 19);
}

function liveRunPage(page) {
  const panel = document.getElementById("run-panel");
  const details = document.getElementById("run-details");
  const announce = document.getElementById("live-status");
  let logs = document.getElementById("run-logs");
  let lastId = Number(logs.dataset.upto || "0");
  let attempt = Number(logs.dataset.attempt || "0");
  let panelTimer = null;
  let panelSeq = 0;
  let panelRetry = 1000;
  let finished = false;
  let source = null;
  let retryDelay = 1000;

  function currentStatus() {
    const status = document.getElementById("run-status");
    return status ? status.dataset.status : "";
  }

  async function refreshPanel() {
    panelTimer = null;
    const seq = ++panelSeq;
    const before = currentStatus();
    let html = null;
    let more = null;
    try {
      [html, more] = await Promise.all([
        fetchFragment(page.dataset.panel),
        details ? fetchFragment(page.dataset.details) : Promise.resolve(null),
      ]);
    } catch (error) {
      html = null;  // a dropped connection reads as a failed answer
    }
    // An answer older than a later request's must not overwrite it.
    if (seq !== panelSeq) return;
    if (html === null) {
      // A failed read (a dropped connection, a 503 on a busy server) is tried again: the
      // next event that would refresh the panel may be minutes away.
      if (panelTimer === null) panelTimer = setTimeout(refreshPanel, panelRetry);
      panelRetry = Math.min(panelRetry * 2, 30000);
      return;
    }
    panelRetry = 1000;
    if (panel.contains(document.activeElement) ||
        (details && details.contains(document.activeElement))) {
      panelTimer = setTimeout(refreshPanel, 1000);
      return;
    }
    panel.innerHTML = html;
    refreshRelativeTimes(panel);
    if (details && more !== null) {
      details.innerHTML = more;
      refreshRelativeTimes(details);
    }
    const after = currentStatus();
    if (after && after !== before && announce) announce.textContent = "Run " + after;
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

  function append(stream, text, at) {
    const pre = document.getElementById(stream);
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    if (!text) return;
    const chunk = document.createElement("span");
    chunk.className = "chunk";
    // A chunk that starts a line shows its time, as the server renders stored chunks.
    const shown = pre.textContent;
    if (at && (shown === "" || shown.endsWith("\n"))) {
      chunk.dataset.time = clockOf(at);
      chunk.title = at;
    }
    chunk.textContent = text;
    pre.append(chunk);
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  }

  function remember(event) {
    // Events come in commit order, so an id may be smaller than the one before: resume from
    // the last id received, never the largest. The server sends each event once.
    const id = Number(event.lastEventId || "0");
    if (id) lastId = id;
  }

  async function finish() {
    if (finished) return;
    finished = true;
    if (source) source.close();
    if (panelTimer !== null) clearTimeout(panelTimer);
    await refreshPanel();
    await showStoredLogs();
  }

  function eventsUrl() {
    const url = new URL(page.dataset.events, window.location.href);
    url.searchParams.set("after", String(lastId));
    return url.pathname + url.search;
  }

  function open() {
    source = new EventSource(eventsUrl(), { withCredentials: true });
    source.addEventListener("open", () => { retryDelay = 1000; });
    for (const stream of ["stdout", "stderr"]) {
      source.addEventListener(stream, (event) => {
        remember(event);
        const data = JSON.parse(event.data);
        if (data.attempt > attempt) {
          // A new attempt starts with empty streams; the timeline says why.
          attempt = data.attempt;
          document.getElementById("stdout").textContent = "";
          document.getElementById("stderr").textContent = "";
        }
        if (data.attempt === attempt) append(stream, data.text || "", data.at);
      });
    }
    for (const type of TIMELINE_EVENTS) {
      source.addEventListener(type, (event) => {
        remember(event);
        const data = JSON.parse(event.data);
        if (type === "status" && TERMINAL.has(data.status)) {
          finish();
        } else {
          schedulePanel();
        }
      });
    }
    source.addEventListener("error", async () => {
      // EventSource retries by itself unless the answer was not a stream (204 when the run
      // is over, 401, 404, 503 too many streams, a proxy's 502): then decide here.
      if (source.readyState !== EventSource.CLOSED || finished) return;
      await refreshPanel();
      if (TERMINAL.has(currentStatus())) {
        finish();
      } else {
        setTimeout(() => { if (!finished) open(); }, retryDelay);
        retryDelay = Math.min(retryDelay * 2, 30000);
      }
    });
  }

  open();
}

function onceForms() {
  // A form that starts work (bulk actions) is sent once: a second click does nothing.
  for (const form of document.querySelectorAll("form[data-once]")) {
    form.addEventListener("submit", (event) => {
      if (form.dataset.sent) {
        event.preventDefault();
        return;
      }
      form.dataset.sent = "1";
    });
  }
}

function confirmForms() {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    if (form.dataset.confirmBound) continue;
    form.dataset.confirmBound = "1";
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
}

function schemaFields() {
  // The submit form: show (and send) only the chosen tool's fields.
  const select = document.getElementById("tool");
  const sets = document.querySelectorAll("fieldset[data-tool-fields]");
  if (!select || sets.length === 0) return;
  select.addEventListener("change", () => {
    for (const set of sets) {
      const mine = set.dataset.toolFields === select.value;
      set.hidden = !mine;
      set.disabled = !mine;
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  schemaFields();
  onceForms();
  refreshRelativeTimes();
  setInterval(refreshRelativeTimes, 15000);
  confirmForms();
  // The run panel is re-rendered live; bind its cancel confirmation again each time.
  const panel = document.getElementById("run-panel");
  if (panel) new MutationObserver(confirmForms).observe(panel, { childList: true });
  const rows = document.getElementById("run-rows") || document.getElementById("batch-rows");
  if (rows) liveRunsTable(rows);
  const batch = document.getElementById("batch-panel");
  if (batch) liveBatch(batch);
  const page = document.getElementById("run-page");
  if (page && page.dataset.terminal !== "true") liveRunPage(page);
});
