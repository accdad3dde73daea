#!/usr/bin/env bash
# Checks the ready-made operations in deploy/: the Prometheus alert rules parse
# (`promtool check rules`) and behave (`promtool test rules`, one test group or more per
# alert), every alert has a test and is described in docs/operations.md (and the doc
# names no alert the file lacks); the Kubernetes manifests parse and keep their decisions
# (scripts/check-kubernetes.py); the Grafana dashboard is well formed and its PromQL
# parses (scripts/check-grafana.py). Installs promtool (Debian's `prometheus` package,
# without starting a Prometheus server) and PyYAML (python3-yaml) when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
rules=deploy/prometheus/pgoutbox.rules.yml
tests=deploy/prometheus/pgoutbox.rules.test.yml

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
# A python3 with PyYAML: the first on PATH, else Debian's (with python3-yaml installed).
python=python3
if ! "$python" -c 'import yaml' 2>/dev/null; then
  python=/usr/bin/python3
  if ! "$python" -c 'import yaml' 2>/dev/null; then
    echo "installing PyYAML (Debian's python3-yaml package)" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-yaml >/dev/null
  fi
fi
if ! command -v promtool >/dev/null 2>&1; then
  echo "installing promtool (Debian's prometheus package)" >&2
  running_before=$(pgrep -x prometheus || true)
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    prometheus >/dev/null
  # The package may start its server (where an init system runs); only promtool is wanted.
  if [ -z "$running_before" ] && pgrep -x prometheus >/dev/null; then
    $sudo service prometheus stop >/dev/null 2>&1 || $sudo systemctl stop prometheus || true
  fi
fi

start=$(date +%s%N)
promtool check rules "$rules"
(cd "$(dirname "$tests")" && promtool test rules "$(basename "$tests")")

alerts=$(grep -oP '^\s*- alert:\s*\K\w+' "$rules" | sort -u)
tested=$(grep -oP '^\s*alertname:\s*\K\w+' "$tests" | sort -u)
documented=$(awk '/^### Alert rules/ { on = 1; next } on && /^##/ { exit } on' docs/operations.md \
  | grep -oP '`\KPgoutbox\w+(?=`)' | sort -u)
status=0
if [ "$alerts" != "$tested" ]; then
  echo "check-deploy: alerts without a test in $tests:" >&2
  comm -23 <(echo "$alerts") <(echo "$tested") >&2
  comm -13 <(echo "$alerts") <(echo "$tested") | sed 's/$/ (tested, not in the rules)/' >&2
  status=1
fi
if [ "$alerts" != "$documented" ]; then
  echo "check-deploy: docs/operations.md (\"Alert rules\") and $rules disagree:" >&2
  comm -23 <(echo "$alerts") <(echo "$documented") | sed 's/$/: in the rules, not in the doc/' >&2
  comm -13 <(echo "$alerts") <(echo "$documented") | sed 's/$/: in the doc, not in the rules/' >&2
  status=1
fi
"$python" scripts/check-kubernetes.py || status=1
"$python" scripts/check-grafana.py || status=1
[ "$status" -eq 0 ] || exit 1
echo "check-deploy: $(echo "$alerts" | wc -l) alerts checked, tested and documented;" \
  "Kubernetes manifests and the Grafana dashboard checked; in $(( ($(date +%s%N) - start) / 1000000 )) ms"
