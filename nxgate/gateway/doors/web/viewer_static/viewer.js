/* nxgate browser viewer: asks for a one-time ticket, then shows the session
   with noVNC (Debian's novnc package, served under /view/novnc/).
   No inline script anywhere: the page's Content-Security-Policy forbids it. */
"use strict";

(function () {
  const section = document.getElementById("viewer");
  const status = document.getElementById("viewer-status");
  const screen = document.getElementById("viewer-screen");
  const shadow = section.dataset.purpose === "shadow";
  const state = { phase: "starting", openedAt: performance.now(), connectedAt: null, rfb: null, clipboard: "",
                  sent: "", size: null, resizes: 0, reconnecting: false, refusal: "" };
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

  /* The page's room for the session, in CSS pixels: the size the session is resumed at. */
  function screenSize() {
    return [Math.max(320, screen.clientWidth), Math.max(200, screen.clientHeight)];
  }

  async function ticket(size) {
    const body = new URLSearchParams({
      handle: section.dataset.handle,
      purpose: section.dataset.purpose,
      width: String(size[0]),
      height: String(size[1]),
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

  const field = document.getElementById("viewer-clipboard");
  const sendButton = document.getElementById("viewer-clipboard-send");

  /* Text to the session's clipboard.  RFB's cut text is Latin-1 bytes; x11vnc puts them in the
     viewer display's selection as STRING, and nxagent hands them to the session's programs as they
     are, which read them as UTF-8 (UTF8_STRING).  So the page sends the text's UTF-8 bytes, one
     "Latin-1 character" each: any character arrives whole. */
  function toSession(text) {
    if (!state.rfb || !text) return;
    const bytes = new TextEncoder().encode(text);
    let wire = "";
    for (const byte of bytes) wire += String.fromCharCode(byte);
    state.clipboard = text;
    state.sent = wire;
    state.rfb.clipboardPasteFrom(wire);
  }

  /* The session's text as x11vnc sends it: Latin-1 bytes of the selection's STRING, which nxagent
     fills with the session's UTF-8.  Bytes that are valid UTF-8 are read as such (Latin-1 text that
     is also valid UTF-8 is rare: "Ã©" and the like); anything else stays Latin-1. */
  function fromSession(text) {
    if (!/[\u0080-\u00ff]/.test(text) || /[^\u0000-\u00ff]/.test(text)) return text;
    try {
      return new TextDecoder("utf-8", { fatal: true }).decode(Uint8Array.from(text, (c) => c.charCodeAt(0)));
    } catch (error) {
      return text;
    }
  }

  async function pasteLocalClipboard() {
    if (!state.rfb || !navigator.clipboard || !navigator.clipboard.readText) return;
    try {
      const text = await navigator.clipboard.readText();
      if (text && text !== state.clipboard) toSession(text);
    } catch (error) {
      /* no permission: the paste event and the clipboard field still work */
    }
  }

  function failed(error) {
    say("failed", error.message || String(error));
  }

  /* noVNC loads while the ticket is asked for (the server starts the viewer meanwhile). */
  const novnc = import("/view/novnc/core/rfb.js");

  async function connect() {
    say("ticket", state.resizes ? "Resizing…" : "Opening the session…");
    const size = screenSize();
    const secret = await ticket(size);
    const { default: RFB } = await novnc;
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + "/view/ws?ticket=" + encodeURIComponent(secret);
    /* A shadow waits for the owner's answer to the question on her screen: say so, not a bare "Connecting". */
    say("connecting", shadow && section.dataset.asks === "1"
      ? "Asking the session's owner: the question is on their screen, and this waits for their answer…"
      : "Connecting…");
    const rfb = new RFB(screen, url, { wsProtocols: ["binary"] });
    state.rfb = rfb;
    state.size = size;
    rfb.scaleViewport = true;
    rfb.focusOnClick = true;
    rfb.addEventListener("connect", () => {
      state.connectedAt = performance.now();
      say("connected", shadow ? "Connected. Closing this tab ends the shadow."
                              : "Connected. Closing this tab suspends the session.");
      rfb.focus();
      resized();  /* the window may have changed while this connection was made */
    });
    rfb.addEventListener("disconnect", (event) => {
      if (state.rfb !== rfb) return;
      state.rfb = null;
      if (state.reconnecting) {
        state.reconnecting = false;
        connect().catch(failed);
        return;
      }
      if (state.refusal) {
        say("refused", state.refusal);
        return;
      }
      /* A shadow is not suspended: it ends (closed here, by the owner's notice, or with the session). */
      say("disconnected", shadow ? "The shadow ended."
                                 : event.detail.clean ? "The session was suspended." : "Connection lost.");
    });
    /* The gateway refuses a viewer that cannot start (the owner said no, limits, a session gone) as
       an RFB server would, with the reason in UTF-8. */
    rfb.addEventListener("securityfailure", (event) => {
      state.refusal = fromSession(event.detail.reason || "") || "The session cannot be shown.";
    });
    rfb.addEventListener("clipboard", (event) => {
      /* Empty: the gateway's nudge of x11vnc at the start (CUT_BUFFER0), not a copy in the session;
         it must not empty the browser's own clipboard. */
      if (!event.detail.text) return;
      const text = fromSession(event.detail.text);
      state.clipboard = text;
      field.value = text;
      if (navigator.clipboard && navigator.clipboard.writeText) {
        navigator.clipboard.writeText(text).catch(() => {});
      }
    });
  }

  /* The session takes the window's size when it is resumed (nxagent full screen in the viewer's
     own Xvfb), so following a new window size is a new resume: once the window has kept still
     for a moment, this connection ends (the session suspends for an instant) and a new one resumes
     the session at the new size.  Small changes are not worth it: scaling covers them. */
  let resizeTimer = null;
  function resized() {
    clearTimeout(resizeTimer);
    /* A shadow follows the watched session's size, and a new resume would ask its owner again; an
       open session is shown at its own size (x11vnc on its screen: no resume): the canvas scales. */
    if (shadow || section.dataset.follows !== "1") return;
    resizeTimer = setTimeout(() => {
      if (!state.rfb || state.phase !== "connected" || !state.size) return;
      const [width, height] = screenSize();
      if (Math.abs(width - state.size[0]) < 16 && Math.abs(height - state.size[1]) < 16) return;
      state.resizes += 1;
      state.reconnecting = true;
      state.rfb.disconnect();
    }, 700);
  }

  sendButton.addEventListener("click", () => {
    toSession(field.value);
    if (state.rfb) state.rfb.focus();
  });
  window.addEventListener("focus", pasteLocalClipboard);
  window.addEventListener("resize", resized);
  document.addEventListener("paste", (event) => {
    if (event.target === field) return;  /* the field is edited first, then sent with its button */
    const text = event.clipboardData ? event.clipboardData.getData("text/plain") : "";
    if (text) toSession(text);
  });

  connect().catch(failed);
})();
