#!/usr/bin/env bash
# The dashboard in a real browser: a local cluster under load (the dashboard example), headless
# Chromium (Debian's, which scripts/setup_test_tools.sh installs) loads the page while it computes; the
# DOM must show the workers and task bars; a screenshot is saved (target/dashboard.png, or
# the path given). `dask-comm status` must print the same summary, and /metrics must be
# Prometheus text. Skips, saying why, only where Chromium is not there (in CI: fails).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
shot=${1:-$PWD/target/dashboard.png}
browser=$(command -v chromium || command -v chromium-browser || true)
[ -n "$browser" ] || skip_or_fail dashboard "chromium not found (not installable here)"
stack_build dask-comm --example dashboard --bin dask-comm
work=$(mktemp -d)
demo=""
cleanup() { [ -n "$demo" ] && kill "$demo" 2> /dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
"$STACK_DIR/examples/dashboard" --seconds 60 --dashboard-address 127.0.0.1:0 > "$work/demo.txt" 2>&1 &
demo=$!
url=""
for _ in $(seq 100); do
  url=$(grep -o "http://[^ ]*" "$work/demo.txt" || true)
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "dashboard: FAILED: no address"; cat "$work/demo.txt"; exit 1; }
echo "dashboard: $url"
sleep 4 # a few rounds of tasks and a heartbeat's fetches
chrome=("$browser" --headless=new --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars
        --user-data-dir="$work/profile" --virtual-time-budget=4000)
timeout 120 "${chrome[@]}" --dump-dom "$url" > "$work/dom.html" 2> "$work/chrome.txt" \
  || { echo "dashboard: FAILED: chromium"; tail -20 "$work/chrome.txt"; exit 1; }
# Rendered elements only (the page's script holds the same tags as text).
workers=$(grep -o '<tr class="worker"><td class="name">local-[0-9]' "$work/dom.html" | wc -l)
bars=$(grep -o 'class="bar" data-group="sleep_ms" style="left:[0-9]' "$work/dom.html" | wc -l)
fetches=$(grep -o 'class="bar fetch" style="left:[0-9]' "$work/dom.html" | wc -l)
progress=$(grep -o '<div class="progress"><span class="name">sleep_ms</span>' "$work/dom.html" | wc -l)
states=$(grep -o '<span class="state" data-state="[a-z]*">' "$work/dom.html" | wc -l)
# The page redraws itself every second from /api/status: in its 4 s of virtual time, several times.
updates=$(grep -o '<body data-updates="[0-9]*"' "$work/dom.html" | grep -o '[0-9]*' || echo 0)
echo "dashboard: the page shows $workers workers, $bars task bars, $fetches fetch bars," \
  "$progress progress row(s) for sleep_ms, $states task states; it redrew itself $updates times"
# Each round's sum takes values from both workers: fetches, the stream's red bars.
if [ "$workers" -ne 2 ] || [ "$bars" -lt 1 ] || [ "$fetches" -lt 1 ] || [ "$progress" -ne 1 ] \
    || [ "$states" -lt 1 ] || [ "$updates" -lt 2 ]; then
  echo "dashboard: FAILED: expected 2 workers, task and fetch bars, a progress row, task states and live updates"
  head -c 3000 "$work/dom.html"; exit 1
fi
mkdir -p "$(dirname "$shot")"
timeout 120 "${chrome[@]}" --window-size=1280,720 --screenshot="$shot" "$url" > /dev/null 2>> "$work/chrome.txt" \
  || { echo "dashboard: FAILED: the screenshot"; tail -20 "$work/chrome.txt"; exit 1; }
[ -s "$shot" ] || { echo "dashboard: FAILED: an empty screenshot"; exit 1; }
echo "dashboard: screenshot $shot"
at=${url#http://}; at=${at%/}
"$STACK_DIR/dask-comm" status --dashboard "$at" > "$work/status.txt" 2>&1 \
  || { echo "dashboard: FAILED: dask-comm status"; cat "$work/status.txt"; exit 1; }
sed 's/^/  /' "$work/status.txt"
grep -q "^2 workers" "$work/status.txt" || { echo "dashboard: FAILED: dask-comm status"; exit 1; }
python3 - "$url" <<'PY' || { echo "dashboard: FAILED: /metrics or the refusals"; exit 1; }
import sys, urllib.request, urllib.error
url = sys.argv[1]
text = urllib.request.urlopen(url + "metrics", timeout=10).read().decode()
for want in ("dask_comm_workers 2\n", "dask_comm_tasks_finished_total ", 'dask_comm_tasks{state="memory"}',
             "dask_comm_scheduler_seconds_per_task "):
    assert want in text, f"/metrics lacks {want!r}"
for path, method, code in (("nothing", "GET", 404), ("", "POST", 405)):
    try:
        urllib.request.urlopen(urllib.request.Request(url + path, method=method, data=b"" if method == "POST" else None), timeout=10)
        raise SystemExit(f"{method} /{path} answered 200")
    except urllib.error.HTTPError as e:
        assert e.code == code, f"{method} /{path}: {e.code}, expected {code}"
print("dashboard: /metrics is Prometheus text; other paths and methods are refused")
PY
# The example ends by itself after its --seconds; bounded here all the same.
for _ in $(seq 1200); do kill -0 "$demo" 2> /dev/null || break; sleep 0.1; done
kill -0 "$demo" 2> /dev/null && { echo "dashboard: FAILED: the example outlived its time"; exit 1; }
wait "$demo" || { echo "dashboard: FAILED: the example"; cat "$work/demo.txt"; exit 1; }
demo=""
tail -1 "$work/demo.txt"
