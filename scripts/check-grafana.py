"""Checks deploy/grafana/pgoutbox.json without a Grafana (scripts/check-deploy.sh runs
it): a dashboard whose data source is a variable (every panel and query uses it, so the
import asks for one), panels with unique ids on the 24-column grid without overlaps, and
every PromQL expression valid: they are written, with the dashboard variables replaced,
into a rules file for `promtool check rules`. Exits 1 naming each problem.

That each queried metric is one pgoutbox exports is tested against the real binary in
tests/cases/deploy_assets.rs."""

import json
import pathlib
import re
import subprocess
import sys
import tempfile

root = pathlib.Path(__file__).resolve().parent.parent
path = root / "deploy" / "grafana" / "pgoutbox.json"
problems = []
dashboard = json.loads(path.read_text())

variables = {v["name"]: v for v in dashboard.get("templating", {}).get("list", [])}
source = [v for v in variables.values() if v.get("type") == "datasource"]
if len(source) != 1 or source[0].get("query") != "prometheus":
    problems.append("one templating variable of type datasource, query prometheus, is needed")
uid = "${%s}" % source[0]["name"] if source else None
for key in ("title", "uid", "schemaVersion", "panels"):
    if key not in dashboard:
        problems.append(f"no {key}")

exprs = []
for v in variables.values():
    if v.get("type") == "query" and v.get("datasource", {}).get("uid") != uid:
        problems.append(f"variable {v['name']}: data source must be {uid}")

ids, cells = set(), {}
for panel in dashboard.get("panels", []):
    where = f"panel {panel.get('id')} ({panel.get('title')!r})"
    if panel.get("id") in ids:
        problems.append(f"{where}: id used twice")
    ids.add(panel.get("id"))
    g = panel.get("gridPos", {})
    if g.get("x", 0) + g.get("w", 0) > 24:
        problems.append(f"{where}: wider than the grid")
    for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
        for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
            if (x, y) in cells:
                problems.append(f"{where}: overlaps panel {cells[(x, y)]}")
                break
            cells[(x, y)] = panel.get("id")
        else:
            continue
        break
    if panel.get("type") == "row":
        continue
    if panel.get("datasource", {}).get("uid") != uid:
        problems.append(f"{where}: data source must be {uid}")
    targets = panel.get("targets", [])
    if not targets:
        problems.append(f"{where}: no query")
    for t in targets:
        if t.get("datasource", {}).get("uid") != uid:
            problems.append(f"{where} query {t.get('refId')}: data source must be {uid}")
        if not t.get("expr"):
            problems.append(f"{where} query {t.get('refId')}: no expr")
        else:
            exprs.append((f"{where} query {t.get('refId')}", t["expr"]))
    if len({t.get("refId") for t in targets}) != len(targets):
        problems.append(f"{where}: refIds repeat")

substitutions = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
rules = []
for i, (where, expr) in enumerate(exprs):
    for name, value in substitutions.items():
        expr = expr.replace(name, value)
    expr = re.sub(r"\$\{?(\w+)\}?", "x", expr)
    rules.append({"record": f"dashboard:query_{i}", "expr": expr, "labels": {"where": where}})
with tempfile.NamedTemporaryFile("w", suffix=".yml") as f:
    json.dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
    f.flush()
    check = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
    if check.returncode != 0:
        problems.append("a PromQL expression does not parse:\n" + check.stdout + check.stderr)

for p in problems:
    print(f"deploy/grafana: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
