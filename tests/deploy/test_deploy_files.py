"""deploy/: the Helm chart's values against its templates, the alert rules and the
dashboard against the series a running server serves, the systemd unit's command line
against `fusee server`'s options. The tools made for these files run in the slow tests,
once scripts/check-deploy has built them."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fusee_server import main as server_main

from tests.support.procs import Server, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "fusee"
ALERTS = DEPLOY / "monitoring" / "prometheus" / "fusee-alerts.yml"
DASHBOARD = DEPLOY / "monitoring" / "grafana" / "fusee-dashboard.json"
UNIT = DEPLOY / "systemd" / "fusee.service"
TOOLS = ROOT / ".cache" / "deploy-tools" / "bin"  # scripts/check-deploy builds them here

# Continuous backup's series (docs/backup.md): served with --backup, by a server that
# has it. The alert rules and the dashboard name them either way; where the server has
# no --backup yet they are the only series allowed to be missing.
BACKUP_SERIES = {"fusee_backup_lag_seconds", "fusee_backup_failing"}
PROMETHEUS_OWN = {"up"}  # what Prometheus records about a scrape
SERIES = re.compile(r"\b(fusee_[a-z0-9_]+|up)\b")


# -- the series a real server serves ----------------------------------------------------


@pytest.fixture(scope="module")
def server_options() -> set[str]:
    """The options `fusee server --help` lists."""
    shown = subprocess.run(
        [sys.executable, "-m", "fusee", "server", "--help"], capture_output=True, text=True, check=True
    )
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", shown.stdout))


@pytest.fixture(scope="module")
def unserved(server_options: set[str]) -> set[str]:
    """The series the files may name that the server does not serve: the backup's,
    until the server has --backup."""
    return set() if "--backup" in server_options else BACKUP_SERIES


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, server_options: set[str]
) -> Iterator[dict[str, set[str]]]:
    """Series name -> its label names, read from /metrics of a real server with --http,
    --invoke and (where it has it) --backup to a directory: the invoker's and the
    backup's series exist from the start (at zero), so no traffic is needed. The endpoint
    refuses every invocation; that is no matter."""
    tmp = tmp_path_factory.mktemp("served")
    secret = tmp / "invoke-secret"
    secret.write_text("s" * 32)
    secret.chmod(0o600)
    endpoint = f"http://127.0.0.1:{free_port()}/"
    extra = ["--http", "127.0.0.1:0", "--invoke", endpoint, "--invoke-secret-file", str(secret)]
    if "--backup" in server_options:
        extra += ["--backup", str(tmp / "backup")]
    server = Server(tmp / "data", *extra)
    try:
        url = server.wait_for(r"metrics on (http://\S+/metrics)").group(1)
        with urllib.request.urlopen(url, timeout=10) as answer:
            text = answer.read().decode()
    finally:
        server.stop()
    found: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, labels = line.partition("{")
            name = name.split()[0]
            keys = re.findall(r'(\w+)="', labels.partition("}")[0]) if labels else []
            found.setdefault(name, set()).update(keys)
    yield found


def named_series(expr: str) -> set[str]:
    return set(SERIES.findall(re.sub(r'"[^"]*"', '""', expr)))  # not inside label values


# -- alert rules ------------------------------------------------------------------------


def alert_rules() -> dict[str, dict[str, Any]]:
    loaded = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule for group in loaded["groups"] for rule in group["rules"]}


def test_the_alerts_asked_for_are_there_each_with_a_summary_and_a_severity() -> None:
    rules = alert_rules()
    asked = {"FuseeInvocationsFailing", "FuseeShardsOverdue", "FuseeBackupLagging", "FuseeDiskFlushSlow"}
    assert asked <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and re.fullmatch(r"\d+m", rule["for"]), name


def test_every_series_an_alert_names_is_one_the_server_serves(
    served: dict[str, set[str]], unserved: set[str]
) -> None:
    for name, rule in alert_rules().items():
        unknown = named_series(rule["expr"]) - set(served) - PROMETHEUS_OWN - unserved
        assert not unknown, f"{name}: {unknown} is not among the server's series"
    assert not unserved & set(served)  # a server with --backup serves every backup series
    assert named_series(alert_rules()["FuseeBackupLagging"]["expr"]) == {"fusee_backup_lag_seconds"}


def test_the_labels_the_alerts_group_and_match_on_exist(
    served: dict[str, set[str]], unserved: set[str]
) -> None:
    added_by_prometheus = {"instance", "job"}
    for name, rule in alert_rules().items():
        expr = rule["expr"]
        used = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        for group in re.findall(r"by \(([^)]*)\)", expr):
            used.update(label.strip() for label in group.split(","))
        series = named_series(expr) - PROMETHEUS_OWN - unserved
        known = set().union(*(served.get(s, set()) for s in series)) | added_by_prometheus
        assert used <= known, f"{name}: labels {used - known}"
    # The outcomes matched are ones the server counts.
    failing = alert_rules()["FuseeInvocationsFailing"]["expr"]
    outcomes = re.search(r'outcome=~"([^"]+)"', failing)
    assert outcomes and set(outcomes.group(1).split("|")) <= {"failed", "timed_out"}


# -- the dashboard ----------------------------------------------------------------------


def test_the_dashboard_queries_only_served_series(served: dict[str, set[str]], unserved: set[str]) -> None:
    board = json.loads(DASHBOARD.read_text())
    assert board["uid"] and board["title"]
    exprs = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    assert len(exprs) >= 10
    shown: set[str] = set()
    for expr in exprs:
        unknown = named_series(expr) - set(served) - PROMETHEUS_OWN - unserved
        assert not unknown, f"{expr}: {unknown}"
        shown |= named_series(expr)
    # What the alerts watch is on the dashboard too.
    watched = set().union(*(named_series(r["expr"]) for r in alert_rules().values()))
    assert watched <= shown
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "instance"} <= variables


# -- the Helm chart ---------------------------------------------------------------------


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def test_chart_yaml_names_the_chart_and_the_server_release() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["apiVersion"], chart["name"], chart["type"]) == ("v2", "fusee", "application")
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    server = (ROOT / "server" / "pyproject.toml").read_text()
    assert f'version = "{chart["appVersion"]}"' in server  # the image's fusee-server


def test_every_value_a_template_names_is_declared_and_every_declared_one_used() -> None:
    declared = values()
    used: set[str] = set()
    for template in sorted((CHART / "templates").iterdir()):
        for path in re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()):
            node: Any = declared
            for key in path.split("."):
                assert isinstance(node, dict) and key in node, f"{template.name}: .Values.{path}"
                node = node[key]
            used.add(path.split(".")[0])
    assert set(declared) - used == set()


def test_the_chart_runs_one_server_on_a_disk_and_refuses_the_store_not_built() -> None:
    assert values()["store"] == "disk"
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    assert 'eq .Values.store "postgres"' in helpers and "not built yet" in helpers
    statefulset = (CHART / "templates" / "statefulset.yaml").read_text()
    assert "replicas: 1" in statefulset and "volumeClaimTemplates:" in statefulset
    for name in ("statefulset.yaml", "secret.yaml"):
        assert (CHART / "templates" / name).read_text().startswith('{{- include "fusee.checkStore" . }}')
    # The chart's ports and paths are the image's.
    assert values()["ports"] == {"protocol": 7600, "http": 7601}
    for path in ("/var/lib/fusee", "/etc/fusee/token", "fusee-healthcheck", "/healthz"):
        assert path in statefulset
    assert "lookup" in helpers  # an upgrade keeps the generated token


# -- the Terraform configuration --------------------------------------------------------
# `terraform validate` needs the providers, which cannot be fetched here
# (scripts/check-deploy says so): what it would check of names is checked here.

TERRAFORM = DEPLOY / "terraform"


def terraform_text() -> str:
    return "\n".join(path.read_text() for path in sorted(TERRAFORM.glob("*.tf")))


def test_terraform_names_only_variables_and_resources_it_declares() -> None:
    text = terraform_text()
    declared = set(re.findall(r'^variable "(\w+)"', text, re.M))
    assert set(re.findall(r"\bvar\.(\w+)", text)) == declared  # each used, none undeclared
    resources = set(re.findall(r'^resource "(\w+)" "(\w+)"', text, re.M))
    referenced = set(re.findall(r"\b((?:helm|kubernetes|random)_\w+)\.(\w+)\b", text))
    assert referenced == resources  # nothing undeclared named, nothing declared left unused
    providers = dict(
        re.findall(r'^\s+(\w+) = \{\s+source\s+= "hashicorp/\1"\s+version = "([^"]+)"', text, re.M)
    )
    assert set(providers) == {kind.split("_")[0] for kind, _ in resources} == {"helm", "kubernetes", "random"}
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", version) for version in providers.values())  # exact pins
    assert 'chart     = "${path.module}/../helm/fusee"' in text
    # The chart is pointed at the Secret Terraform made, under the names values.yaml declares.
    sets = set(re.findall(r'\{ name = "([\w.]+)"', text))
    for path in sets:
        node: Any = values()
        for key in path.split("."):
            assert isinstance(node, dict) and key in node, path
            node = node[key]
    assert {"existingSecret", "existingSecretKey"} <= sets


# -- the systemd unit -------------------------------------------------------------------


def unit() -> dict[str, list[tuple[str, str]]]:
    """Section -> its settings in order (a key may repeat, as systemd allows)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = ""
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = line.strip("[]")
            sections[current] = []
        else:
            key, _, value = line.partition("=")
            sections[current].append((key, value))
    return sections


def setting(section: str, key: str) -> str:
    found = [value for k, value in unit()[section] if k == key]
    assert len(found) == 1, f"{key}= in [{section}]: {found}"
    return found[0]


def test_execstart_runs_fusee_server_with_options_it_accepts(server_options: set[str]) -> None:
    argv = shlex.split(setting("Service", "ExecStart"))
    assert argv[0].endswith("/bin/fusee") and argv[1] == "server"
    given = [a for a in argv[2:] if a.startswith("--")]
    assert given and set(given) <= server_options, set(given) - server_options
    # And the server's own parser takes the whole line: values, choices, nothing left over.
    parser = argparse.ArgumentParser(prog="fusee server", allow_abbrev=False, exit_on_error=False)
    server_main.add_arguments(parser)
    args = parser.parse_args(argv[2:])
    assert str(args.dir) == "/var/lib/fusee" and args.http.endswith(":7601")
    assert args.token_file == "/etc/fusee/token" and args.listen.endswith(":7600")
    assert str(args.dir) in setting("Service", "ReadWritePaths").split()
    assert setting("Service", "StateDirectory") == Path(args.dir).name


def test_the_unit_is_hardened_and_stops_the_server_by_sigterm() -> None:
    expected = {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "yes",
        "MemoryDenyWriteExecute": "yes",
        "SystemCallFilter": "@system-service",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
        "User": "fusee",
    }
    assert {key: setting("Service", key) for key in expected} == expected
    assert set(setting("Service", "RestrictAddressFamilies").split()) == {"AF_UNIX", "AF_INET", "AF_INET6"}
    assert int(setting("Service", "TimeoutStopSec")) >= 10
    assert int(setting("Service", "LimitNOFILE")) >= 4096
    assert setting("Service", "ExecReload") == "/bin/kill -HUP $MAINPID"  # reloads the tokens
    assert setting("Install", "WantedBy") == "multi-user.target"


def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("no systemd-analyze here (apt-get install systemd); scripts/check-deploy installs it")
    # verify wants ExecStart's program to exist: this checkout's fusee stands for /opt/fusee's.
    fusee = Path(sys.executable).parent / "fusee"
    (tmp_path / "fusee.service").write_text(UNIT.read_text().replace("/opt/fusee/bin/fusee", str(fusee)))
    checked = subprocess.run(
        [tool, "verify", "./fusee.service"], cwd=tmp_path, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0 and not checked.stderr.strip(), checked.stderr


# -- the tools, where scripts/check-deploy built them -----------------------------------


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.skip(f"{path} is not built: run scripts/check-deploy")
    return str(path)


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.mark.slow
def test_helm_lints_and_renders_the_chart_and_refuses_postgres() -> None:
    helm = tool("helm")
    linted = run(helm, "lint", "--strict", str(CHART))
    assert linted.returncode == 0, linted.stdout + linted.stderr
    rendered = run(helm, "template", "fusee", str(CHART))
    assert rendered.returncode == 0, rendered.stderr
    kinds = sorted(d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d)
    assert kinds == ["Secret", "Service", "Service", "StatefulSet"]
    mine = run(helm, "template", "fusee", str(CHART), "--set", "existingSecret=mine")
    assert "kind: Secret" not in mine.stdout and "secretName: mine" in mine.stdout
    refused = run(helm, "template", "fusee", str(CHART), "--set", "store=postgres")
    assert refused.returncode != 0 and "PostgreSQL store, which is not built yet" in refused.stderr


@pytest.mark.slow
def test_promtool_checks_the_rules_and_the_dashboard_queries(tmp_path: Path) -> None:
    promtool = tool("promtool")
    checked = run(promtool, "check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    board = json.loads(DASHBOARD.read_text())
    rules = [
        {"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": t["expr"]}
        for p in board["panels"]
        for t in p["targets"]
    ]
    (tmp_path / "dashboard.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    checked = run(promtool, "check", "rules", str(tmp_path / "dashboard.yml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.slow
def test_terraform_formats_the_configuration_as_written(tmp_path: Path) -> None:
    found = TOOLS / "terraform"
    terraform = str(found) if found.exists() else shutil.which("terraform")
    if terraform is None:
        pytest.skip(
            "no terraform: `go install` refuses its module (replace directives) and none is installed"
        )
    (tmp_path / "terraformrc").write_text("")
    env = {
        "PATH": "/usr/bin:/bin",
        "TF_CLI_CONFIG_FILE": str(tmp_path / "terraformrc"),
        "CHECKPOINT_DISABLE": "1",
    }
    checked = subprocess.run(
        [terraform, "fmt", "-check", "-diff", str(DEPLOY / "terraform")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
