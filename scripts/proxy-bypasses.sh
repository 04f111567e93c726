#!/usr/bin/env bash
# Tries the known ways around a rule against `tollgate proxy`, as an attacker would, and prints
# how many requests got through: 40 concurrent failed logins, path spellings of /login (as
# backends route them), a rotating Forwarded header behind the trusted proxy, and bad cost
# headers. Runs any build, so that two can be compared (e.g. a release binary of an older commit).
#   bash scripts/proxy-bypasses.sh [TOLLGATE_BINARY]   (default: this tree's release build;
#                                                       needs python3 and curl)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${1:-}"
if [ -z "$BIN" ]; then
  cargo build --release -q -p tollgate
  BIN=./target/release/tollgate
fi
free_port() {
  local port
  for port in $(seq "$1" $(( $1 + 999 ))); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then echo "$port"; return; fi
  done
  echo "no free port" >&2; exit 1
}
UP=$(free_port 22000); PX=$(free_port 23000); AD=$(free_port 24000)
DIR=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$DIR"' EXIT

# The protected service: POST /login is 401 unless x-password: right (after 50 ms); it routes
# paths as lenient backends do (docs/rules.md, "Paths as applications route them"): ;params cut
# (Tomcat), \ as / (IIS), %2F decoded (gunicorn), case and a trailing slash ignored (Express,
# ASP.NET), slashes merged. GET /hits: how many logins reached it.
cat > "$DIR/upstream.py" <<'PY'
import re, sys, threading, time, urllib.parse
from http.server import ThreadingHTTPServer, BaseHTTPRequestHandler
hits, lock = 0, threading.Lock()
def route(target):
    path = target.split("?")[0].replace("\\", "/")
    path = urllib.parse.unquote("/".join(segment.split(";")[0] for segment in path.split("/")))
    return re.sub("/+", "/", path.replace("\\", "/")).lower().rstrip("/") or "/"
class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args): pass
    def reply(self, code, body):
        data = body.encode()
        self.send_response(code); self.send_header("content-length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_POST(self):
        global hits
        if int(self.headers.get("content-length") or 0): self.rfile.read(int(self.headers["content-length"]))
        if route(self.path) == "/login":
            with lock: hits += 1
            time.sleep(0.05)
            return self.reply(200 if self.headers.get("x-password") == "right" else 401, "login")
        self.reply(200, "ok")
    def do_GET(self):
        global hits
        if self.path == "/reset":
            with lock: hits = 0
        self.reply(200, str(hits) if self.path in ("/hits", "/reset") else "home")
class Server(ThreadingHTTPServer):
    request_queue_size, daemon_threads = 256, True
Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
PY
cat > "$DIR/rules.toml" <<'TOML'
trusted_proxies = ["127.0.0.1/32"]

[[rules]]
name = "login-failures"
limit = "5/1m"
algorithm = "sliding-log"
key = ["client_ip"]
count_status = [401]
match = { method = "POST", path = "/login" }

[[rules]]
name = "api"
limit = "3/1m"
algorithm = "fixed-window"
key = ["client_ip"]
cost_header = "x-cost"
match = { path = "/api" }
TOML
python3 "$DIR/upstream.py" "$UP" &
"$BIN" proxy --listen "127.0.0.1:$PX" --upstream "http://127.0.0.1:$UP" --rules "$DIR/rules.toml" \
  --admin "127.0.0.1:$AD" --log-level error &
for _ in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$AD/healthz" && curl -sf -o /dev/null "http://127.0.0.1:$UP/hits" && break
  sleep 0.1
done
hits() { curl -s "http://127.0.0.1:$UP/hits"; }
reset() { curl -s -o /dev/null "http://127.0.0.1:$UP/reset"; }
statuses() { sort | uniq -c | awk '{printf "%s x %s; ", $1, $2}'; }
login() { curl -s -o /dev/null -w '%{http_code}\n' -X POST "http://127.0.0.1:$PX$1" -H "x-forwarded-for: $2" "${@:3}"; }
export -f login; export PX

reset
seq 40 | xargs -P 40 -I{} bash -c 'login /login 198.51.100.7' > "$DIR/a"
echo "40 concurrent failed logins from one client: $(hits) reached the service (limit 5); $(statuses < "$DIR/a")"
reset
for _ in $(seq 10); do login //login 198.51.100.20; login /%6Cogin 198.51.100.20; done > "$DIR/b"
echo "20 failed logins as //login and /%6Cogin: $(hits) reached the service (limit 5); $(statuses < "$DIR/b")"
reset
for _ in $(seq 4); do
  for spelled in /LOGIN /login/ '/login;jsessionid=1' /%2Flogin '/\login'; do login "$spelled" 198.51.100.25 --path-as-is; done
done > "$DIR/b2"
echo "20 failed logins as /LOGIN, /login/, /login;jsessionid=1, /%2Flogin and /\\login: $(hits) reached the service (limit 5); $(statuses < "$DIR/b2")"
reset
for i in $(seq 10); do login /login 198.51.100.30 -H "forwarded: for=203.0.113.$i"; done > "$DIR/c"
echo "10 failed logins with a rotating Forwarded: $(hits) reached the service (limit 5); $(statuses < "$DIR/c")"
for cost in 0 99999999999999999999 x; do
  for _ in $(seq 6); do
    curl -s -o /dev/null -w '%{http_code}\n' "http://127.0.0.1:$PX/api" -H "x-forwarded-for: 198.51.100.40" -H "x-cost: $cost"
  done > "$DIR/d"
  echo "6 requests with x-cost: $cost (limit 3/1m): $(statuses < "$DIR/d")"
done
