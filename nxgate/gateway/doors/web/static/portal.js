// Redraw the session thumbnails every few seconds (no inline script: the page's CSP forbids it).
"use strict";
(function () {
  var period = 3000;
  function refresh() {
    var pictures = document.querySelectorAll("img.thumb");
    for (var i = 0; i < pictures.length; i++) {
      var img = pictures[i];
      var base = img.getAttribute("data-src") || img.getAttribute("src").split("?")[0];
      img.setAttribute("data-src", base);
      img.src = base + "?t=" + Date.now();
    }
  }
  window.setInterval(refresh, period);
})();
