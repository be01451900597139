// runyard dashboard: the sandbox page's terminal, a shell over the dashboard's WebSocket
// (/ui/sandboxes/{id}/terminal; frames as in api/actions/sandbox_terminal.py).
// Plain text: escape sequences are dropped, carriage return and backspace move the cursor.
// The output is hostile: lines and their length are capped, nothing is parsed as HTML.
"use strict";

(function () {
  const MAX_LINES = 2000;
  const MAX_LINE = 1000;
  // Whole escape sequences (CSI, OSC ended by BEL or ST, and the short ones such as a charset
  // choice or keypad mode), and one cut off at the end of a frame, kept for the next.
  const ESCAPE = /\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[ -/]*[0-Z\\^-~])/g;
  const CUT_ESCAPE = /\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*\x1b?|[ -/]*)$/;
  const KEYS = {
    Enter: "\r", Backspace: "\x7f", Tab: "\t", Escape: "\x1b", Delete: "\x1b[3~",
    ArrowUp: "\x1b[A", ArrowDown: "\x1b[B", ArrowRight: "\x1b[C", ArrowLeft: "\x1b[D",
    Home: "\x1b[H", End: "\x1b[F",
  };

  const panel = document.getElementById("terminal");
  if (!panel) return;
  const output = document.getElementById("terminal-output");
  const status = document.getElementById("terminal-status");
  const reconnect = document.getElementById("terminal-reconnect");
  const measure = panel.querySelector(".terminal-measure");

  let lines = [""];
  let column = 0;
  let pending = "";
  let socket = null;
  let exitCode;
  let serverError = "";

  function write(text) {
    text = (pending + text).replace(ESCAPE, "");
    const cut = text.match(CUT_ESCAPE);
    pending = cut && cut[0].length < 256 ? cut[0] : "";
    if (cut) text = text.slice(0, cut.index);
    for (const ch of text) {
      const last = lines.length - 1;
      if (ch === "\n") {
        lines.push("");
        column = 0;
      } else if (ch === "\r") {
        column = 0;
      } else if (ch === "\b") {
        column = Math.max(0, column - 1);
      } else if (ch >= " " || ch === "\t") {
        if (column >= MAX_LINE) continue;
        const line = lines[last].padEnd(column, " ");
        lines[last] = line.slice(0, column) + ch + line.slice(column + 1);
        column += 1;
      }
    }
    if (lines.length > MAX_LINES) lines = lines.slice(lines.length - MAX_LINES);
    output.textContent = lines.join("\n");
    output.scrollTop = output.scrollHeight;
  }

  function size() {
    const cell = measure.getBoundingClientRect();
    const width = cell.width / measure.textContent.length || 8;
    const height = cell.height || 16;
    const clamp = (n) => Math.min(1000, Math.max(1, Math.floor(n)));
    return { rows: clamp((output.clientHeight - 24) / height), cols: clamp((output.clientWidth - 32) / width) };
  }

  function send(data) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(new TextEncoder().encode(data));
  }

  function sendResize() {
    if (socket && socket.readyState === WebSocket.OPEN) {
      socket.send(JSON.stringify({ type: "resize", ...size() }));
    }
  }

  async function sandboxEnded() {
    // The page as it is now says whether the sandbox still runs.
    try {
      const response = await fetch(window.location.pathname, { credentials: "same-origin", cache: "no-store" });
      const html = new DOMParser().parseFromString(await response.text(), "text/html");
      const facts = html.getElementById("sandbox-facts");
      return facts !== null && facts.dataset.sandboxStatus !== "running";
    } catch (error) {
      return false;
    }
  }

  async function closed(event) {
    socket = null;
    let why;
    if (event.code >= 4000) why = "The terminal was refused: " + (event.reason || event.code) + ".";
    else if (exitCode !== undefined && exitCode !== null) why = "The shell exited with code " + exitCode + ".";
    else if (exitCode === null) why = "The shell ended.";
    else why = "The connection was lost.";
    if (await sandboxEnded()) {
      status.textContent = "The sandbox ended; the terminal is closed.";
      return;
    }
    status.textContent = why;
    reconnect.hidden = false;
  }

  function connect() {
    reconnect.hidden = true;
    exitCode = undefined;
    serverError = "";
    status.textContent = "Connecting…";
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const { rows, cols } = size();
    socket = new WebSocket(`${scheme}//${window.location.host}${panel.dataset.socket}?rows=${rows}&cols=${cols}`);
    socket.binaryType = "arraybuffer";
    const decoder = new TextDecoder();
    socket.onopen = () => {
      status.textContent = "Connected: click the terminal and type.";
      sendResize();
    };
    socket.onmessage = (message) => {
      if (typeof message.data !== "string") {
        write(decoder.decode(message.data, { stream: true }));
        return;
      }
      let frame;
      try {
        frame = JSON.parse(message.data);
      } catch (error) {
        return;
      }
      if (frame.type === "exit") exitCode = frame.exit_code;
      else if (frame.type === "error") serverError = String(frame.detail).slice(0, 300);
      if (serverError) status.textContent = "Connected (the server said: " + serverError + ")";
    };
    socket.onclose = closed;
  }

  output.addEventListener("keydown", (event) => {
    if (event.metaKey || event.isComposing) return;
    let data;
    if (event.ctrlKey && !event.altKey && event.key.length === 1) {
      // Ctrl-C is the TTY's interrupt (a byte, so it reaches the foreground command, not only
      // the shell); Ctrl-D, Ctrl-Z and the rest are control bytes the same way.
      const code = event.key.toUpperCase().charCodeAt(0);
      if (code < 64 || code > 95) return;
      data = String.fromCharCode(code - 64);
    } else if (KEYS[event.key] !== undefined) {
      data = KEYS[event.key];
    } else if (event.key.length === 1 && !event.ctrlKey) {
      data = event.key;
    } else {
      return;
    }
    event.preventDefault();
    send(data);
  });
  output.addEventListener("paste", (event) => {
    event.preventDefault();
    send(event.clipboardData.getData("text"));
  });
  reconnect.addEventListener("click", () => {
    write("\r\n");
    connect();
    output.focus();
  });
  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(sendResize, 200);
  });
  connect();
})();
