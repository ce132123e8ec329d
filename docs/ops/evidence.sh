#!/bin/bash
# #14 evidence: gateway with tracing (console exporter), access log, a rate-limited key; null workers; real Redis; dashboard screenshot
set -u
cd /work/main
PY=.venv/bin/python
OUT=${OUT:-/tmp/specroute-ops-evidence}
mkdir -p $OUT
RP=$($PY -c "from specroute.readiness import free_port; print(free_port())")
redis-server --port $RP --save '' --appendonly no --daemonize yes --logfile $OUT/redis.log
W1=$($PY -c "from specroute.readiness import free_port; print(free_port())")
W2=$($PY -c "from specroute.readiness import free_port; print(free_port())")
GP=$($PY -c "from specroute.readiness import free_port; print(free_port())")
.venv/bin/specroute worker --engine null --port $W1 --pool mtp --redis-url redis://127.0.0.1:$RP/0 > $OUT/w1.log 2>&1 &
P1=$!
.venv/bin/specroute worker --engine null --port $W2 --pool dfly --redis-url redis://127.0.0.1:$RP/0 > $OUT/w2.log 2>&1 &
P2=$!
echo "ops-admin-token-123" > $OUT/admin_token
export SPECROUTE_API_KEYS="team-a:key-a-secret"
export SPECROUTE_API_KEY_LIMITS='{"team-a": {"rpm": 3}}'
.venv/bin/specroute gateway --port $GP --pool mtp=127.0.0.1:$W1 --pool dfly=127.0.0.1:$W2 --redis-url redis://127.0.0.1:$RP/0 \
  --admin-token-file $OUT/admin_token --access-log --access-log-file $OUT/access.log --tracing --trace-exporter console \
  > $OUT/gateway.out 2> $OUT/gateway.err &
PG=$!
for i in $(seq 60); do curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:$GP/readyz 2>/dev/null | grep -q 200 && break; sleep 0.5; done
MODEL=$(curl -s http://127.0.0.1:$GP/v1/models -H "authorization: Bearer key-a-secret" | python3 -c "import json,sys; print(json.load(sys.stdin)['data'][0]['id'])")
echo "model $MODEL"
for i in 1 2 3 4; do
  curl -s -D $OUT/resp$i.headers -o $OUT/resp$i.json http://127.0.0.1:$GP/v1/chat/completions \
    -H 'authorization: Bearer key-a-secret' -H 'content-type: application/json' -H "x-request-id: ops-demo-$i" \
    -d '{"model":"'"$MODEL"'","messages":[{"role":"user","content":"Write a Python function that reverses a string."}],"max_tokens":8,"temperature":0}'
done
sleep 6   # one time-series sample
$PY - <<PYEOF
from playwright.sync_api import sync_playwright
with sync_playwright() as p:
    b = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
    for name, w, h in (("dashboard", 1280, 1400), ("dashboard-phone", 390, 1600)):
        pg = b.new_page(viewport={"width": w, "height": h})
        pg.goto("http://127.0.0.1:$GP/dashboard?refresh=1000")
        pg.evaluate("sessionStorage.setItem('specroute-admin-token', 'ops-admin-token-123')")
        pg.goto("http://127.0.0.1:$GP/dashboard?refresh=1000")
        pg.wait_for_timeout(3000)
        pg.screenshot(path="$OUT/%s.png" % name, full_page=True)
    b.close()
PYEOF
kill $PG; sleep 1; kill $P1 $P2; redis-cli -p $RP shutdown nosave >/dev/null 2>&1
echo done
