// The portal's pages (no inline script: the page's CSP forbids it):
// - redraw the session thumbnails every few seconds;
// - keep the list's states current: every few seconds, and at once when the page is seen again
//   (back from a viewer tab that was closed, the list must not go on saying Running);
// - "Start and open": send the viewer's form the page carries for the new session.
"use strict";
(function () {
  var period = 3000;

  function refreshPictures() {
    var pictures = document.querySelectorAll("img.thumb");
    for (var i = 0; i < pictures.length; i++) {
      var img = pictures[i];
      var base = img.getAttribute("data-src") || img.getAttribute("src").split("?")[0];
      img.setAttribute("data-src", base);
      img.src = base + "?t=" + Date.now();
    }
  }

  /* The list as the server has it now: the same page fetched again, its table (or "No sessions.")
     put in place of ours.  The start form, and anything typed into it, stays. */
  /* What the list says, not how its pictures were last fetched (their URLs change every round). */
  function signature(list) {
    var rows = list.querySelectorAll("tr.session");
    if (!rows.length) return list.textContent;
    return Array.prototype.map.call(rows, function (row) {
      var handles = Array.prototype.map.call(row.querySelectorAll("form"), function (form) {
        var handle = form.querySelector("input[name=handle]");
        return form.getAttribute("action") + ":" + (handle ? handle.value : "");
      });
      return row.textContent + "|" + handles.join(",") + "|" + (row.querySelector("img.thumb") ? "picture" : "");
    }).join("\n");
  }

  var listing = false;
  function refreshList() {
    var current = document.querySelector("table.sessions, p.empty");
    if (!current || listing || document.visibilityState === "hidden") return;
    listing = true;
    /* The header says this is no activity of the user's: the login's idle timeout runs on. */
    fetch(location.pathname, { credentials: "same-origin", cache: "no-store", headers: { "X-Nxgate-Refresh": "1" } })
      .then(function (answer) { return answer.ok && !answer.redirected ? answer.text() : null; })
      .then(function (html) {
        if (!html) return;
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("table.sessions, p.empty");
        var now = document.querySelector("table.sessions, p.empty");
        if (fresh && now && signature(fresh) !== signature(now)) {
          now.replaceWith(document.importNode(fresh, true));
          refreshPictures();
        }
      })
      .catch(function () { /* the next round tries again */ })
      .then(function () { listing = false; });
  }

  var opening = document.querySelector("form.open-now");
  if (opening) {
    history.replaceState(null, "", location.pathname);  /* back from the viewer: no second opening */
    opening.submit();
    return;
  }
  window.setInterval(function () { refreshPictures(); refreshList(); }, period);
  document.addEventListener("visibilitychange", refreshList);
  window.addEventListener("focus", refreshList);
  window.addEventListener("pageshow", refreshList);
})();
