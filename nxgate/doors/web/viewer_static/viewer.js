/* nxgate browser viewer: asks for a one-time ticket, then shows the session
   with noVNC (Debian's novnc package, served under /view/novnc/).
   No inline script anywhere: the page's Content-Security-Policy forbids it. */
"use strict";

(function () {
  const section = document.getElementById("viewer");
  const status = document.getElementById("viewer-status");
  const screen = document.getElementById("viewer-screen");
  const state = { phase: "starting", openedAt: performance.now(), connectedAt: null, rfb: null, clipboard: "" };
  window.nxgateViewer = state;

  function say(phase, words) {
    state.phase = phase;
    section.dataset.state = phase;
    status.textContent = words;
  }

  function csrf() {
    const field = document.querySelector('input[name="csrf"]');
    return field ? field.value : "";
  }

  async function ticket() {
    const body = new URLSearchParams({
      handle: section.dataset.handle,
      purpose: section.dataset.purpose,
      width: String(Math.max(320, screen.clientWidth)),
      height: String(Math.max(200, screen.clientHeight)),
    });
    const answer = await fetch("/view/ticket", {
      method: "POST", body: body, credentials: "same-origin", cache: "no-store",
      headers: { "X-CSRF-Token": csrf() },
    });
    if (!answer.ok) {
      throw new Error(answer.status === 404 ? "No such session." : "Refused (" + answer.status + ").");
    }
    return (await answer.json()).ticket;
  }

  async function pasteLocalClipboard() {
    if (!state.rfb || !navigator.clipboard || !navigator.clipboard.readText) return;
    try {
      const text = await navigator.clipboard.readText();
      if (text && text !== state.clipboard) {
        state.clipboard = text;
        state.rfb.clipboardPasteFrom(text);
      }
    } catch (error) {
      /* no permission: the paste event below still works */
    }
  }

  async function start() {
    say("ticket", "Opening the session…");
    const secret = await ticket();
    const { default: RFB } = await import("/view/novnc/core/rfb.js");
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + "/view/ws?ticket=" + encodeURIComponent(secret);
    say("connecting", "Connecting…");
    const rfb = new RFB(screen, url, { wsProtocols: ["binary"] });
    state.rfb = rfb;
    rfb.scaleViewport = true;
    rfb.focusOnClick = true;
    rfb.addEventListener("connect", () => {
      state.connectedAt = performance.now();
      say("connected", "Connected. Closing this tab suspends the session.");
      rfb.focus();
    });
    rfb.addEventListener("disconnect", (event) => {
      say("disconnected", event.detail.clean ? "The session was suspended." : "Connection lost.");
    });
    rfb.addEventListener("clipboard", (event) => {
      state.clipboard = event.detail.text;
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(event.detail.text).catch(() => {});
      }
    });
    window.addEventListener("focus", pasteLocalClipboard);
    document.addEventListener("paste", (event) => {
      const text = event.clipboardData ? event.clipboardData.getData("text/plain") : "";
      if (text && state.rfb) {
        state.clipboard = text;
        state.rfb.clipboardPasteFrom(text);
      }
    });
  }

  start().catch((error) => say("failed", error.message || String(error)));
})();
