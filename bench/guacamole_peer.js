/* The Apache Guacamole peer of bench/web_viewer.py: guacamole-lite (the Node WebSocket bridge to guacd)
   and a page with guacamole-common-js, on one loopback HTTP port.

     node guacamole_peer.js GUACD_PORT VNC_PORT COMMON_JS CERT KEY

   GET /          the page: it fetches /token, connects, and shows the remote screen (guacamole-common-js)
   GET /common.js guacamole-common-js (the file named by COMMON_JS)
   GET /token     a fresh encrypted connection token for VNC on 127.0.0.1:VNC_PORT
   WS  /ws        guacamole-lite
   HTTPS with CERT and KEY (PEM files), as nxgate's portal is served: the same TLS costs on both sides.
   Prints "listening PORT" once it accepts connections.  Loopback only; a benchmark's, not a product. */
"use strict";

const crypto = require("crypto");
const fs = require("fs");
const https = require("https");
const GuacamoleLite = require("guacamole-lite");

const [guacdPort, vncPort, commonJs, certFile, keyFile] = process.argv.slice(2);
const key = crypto.randomBytes(32);

function token() {
  const iv = crypto.randomBytes(16);
  const cipher = crypto.createCipheriv("aes-256-cbc", key, iv);
  const settings = { hostname: "127.0.0.1", port: String(vncPort), "color-depth": 24 };
  const value = Buffer.concat([cipher.update(JSON.stringify({ connection: { type: "vnc", settings } }), "utf8"),
                               cipher.final()]);
  return Buffer.from(JSON.stringify({ iv: iv.toString("base64"), value: value.toString("base64") })).toString("base64");
}

const PAGE = `<!doctype html><html><head><meta charset="utf-8"><title>guacamole peer</title>
<style>html, body { margin: 0; background: #000; } #display { display: inline-block; }</style></head>
<body><div id="display"></div>
<script>var module = { exports: {} };  /* the package's CommonJS build ends with module.exports = Guacamole */</script>
<script src="/common.js"></script><script>
(async function () {
  const tunnel = new Guacamole.WebSocketTunnel("wss://" + location.host + "/ws");
  const client = new Guacamole.Client(tunnel);
  window.guacClient = client;
  document.getElementById("display").appendChild(client.getDisplay().getElement());
  const secret = await (await fetch("/token", { cache: "no-store" })).text();
  client.connect("token=" + encodeURIComponent(secret) + "&width=" + innerWidth + "&height=" + innerHeight);
  window.addEventListener("beforeunload", () => client.disconnect());
})();
</script></body></html>`;

const server = https.createServer({ cert: fs.readFileSync(certFile), key: fs.readFileSync(keyFile) },
                                  (request, response) => {
  const path = request.url.split("?")[0];
  if (path === "/") {
    response.writeHead(200, { "Content-Type": "text/html", "Cache-Control": "no-store" });
    response.end(PAGE);
  } else if (path === "/common.js") {
    response.writeHead(200, { "Content-Type": "text/javascript" });
    response.end(fs.readFileSync(commonJs));
  } else if (path === "/token") {
    response.writeHead(200, { "Content-Type": "text/plain", "Cache-Control": "no-store" });
    response.end(token());
  } else {
    response.writeHead(404);
    response.end();
  }
});

new GuacamoleLite({ server: server, path: "/ws" }, { host: "127.0.0.1", port: Number(guacdPort) },
                  { crypt: { cypher: "AES-256-CBC", key: key }, log: { level: 0 }, maxInactivityTime: 0 });
server.listen(0, "127.0.0.1", () => console.log("listening " + server.address().port));
