"""The chart's alerts, as Prometheus evaluates them: the PrometheusRule's groups rendered by
Helm's engine, checked by `promtool check rules` and exercised by `promtool test rules`
on made-up series (promtool comes with ./dev, from Debian's prometheus package). Every
alert has a runbook link to its section of docs/operations.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_deploy import NAMESPACE, RELEASE, _object, _render

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = Path(sys.executable).with_name("promtool")
OPERATIONS = ROOT / "docs" / "operations.md"
PROCESSOR = {
    "namespace": NAMESPACE,
    "app_kubernetes_io_instance": RELEASE,
    "app_kubernetes_io_component": "processor",
}
WORKER = {**PROCESSOR, "app_kubernetes_io_component": "activities"}


def _rules() -> list[dict[str, Any]]:
    group = _object("PrometheusRule", "", _render())["spec"]["groups"][0]
    return list(group["rules"])


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    shown = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{shown}}}", "values": values}


def _expanded(rule: dict[str, Any], labels: dict[str, str], value: str) -> dict[str, str]:
    """The annotations as Prometheus fills them in for one alert."""

    def fill(text: str) -> str:
        text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m.group(1)], text)
        return text.replace("{{ $value }}", value)

    return {k: fill(v) for k, v in rule["annotations"].items()}


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.is_file(), f"no promtool at {PROMTOOL}: run ./dev test once to install it"
    return subprocess.run(
        [str(PROMTOOL), *args], capture_output=True, text=True, timeout=60, check=False
    )


# (alert, input series, time an alert must fire, its own labels, its value, a time it must not)
CASES: list[tuple[str, list[dict[str, str]], str, dict[str, str], str, str]] = [
    (
        # every processor gone at 10 min: its series goes stale 5 min later, absent() holds
        # for the rule's 5 min, so the alert fires by 21 min, and not while they report
        "InstancedStreamProcessorsDown",
        [_series("instanced_stream_build_info", {**PROCESSOR, "version": "0.1.0"}, "1x10")],
        "22m",
        {},
        "1",
        "9m",
    ),
    (
        "InstancedStreamPartitionsFailing",
        [
            _series("instanced_stream_partitions", {**PROCESSOR, "state": "failing"}, "0 0 2x15"),
            _series("instanced_stream_partitions", {**PROCESSOR, "state": "open"}, "4 4 2x15"),
        ],
        "9m",
        {},
        "2",
        "5m",
    ),
    (
        # one processor sees ten rebalances a minute from the third minute on
        "InstancedStreamGroupUnstable",
        [_series("instanced_stream_rebalances_last_minute", PROCESSOR, "0 1 10x15")],
        "7m",
        {},
        "10",
        "3m",
    ),
    (
        # two members: 6 partitions, from the third minute only 4 open between them
        "InstancedStreamPartitionsUnowned",
        [
            _series("instanced_stream_input_partitions", {**PROCESSOR, "pod": "a"}, "6x20"),
            _series("instanced_stream_input_partitions", {**PROCESSOR, "pod": "b"}, "6x20"),
            _series(
                "instanced_stream_partitions", {**PROCESSOR, "pod": "a", "state": "open"}, "3x20"
            ),
            _series(
                "instanced_stream_partitions",
                {**PROCESSOR, "pod": "b", "state": "open"},
                "3 3 1x18",
            ),
        ],
        "9m",
        {},
        "2",
        "4m",
    ),
    (
        "InstancedStreamLLMRefusing",
        [_series("instanced_stream_llm_refusing", PROCESSOR, "0 0 1x15")],
        "9m",
        {},
        "1",
        "5m",
    ),
    (
        "InstancedStreamActivitiesFailing",
        [
            _series(
                "instanced_stream_activity_failed_total", {**WORKER, "tool": "notify"}, "0x3 0+2x20"
            ),
            _series("instanced_stream_activity_failed_total", {**WORKER, "tool": "record"}, "0x25"),
        ],
        "12m",
        {"tool": "notify"},
        "0.03333333333333333",
        "3m",
    ),
]


def _test_file(rules_file: Path) -> dict[str, Any]:
    rules = {r["alert"]: r for r in _rules()}
    tests = []
    for alert, series, firing, own, value, quiet in CASES:
        rule = rules[alert]
        labels = {**(rule.get("labels") or {}), **own}
        if alert == "InstancedStreamProcessorsDown":
            labels |= PROCESSOR  # absent() takes its selector's equality matchers
        tests.append(
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {"eval_time": quiet, "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": firing,
                        "alertname": alert,
                        "exp_alerts": [
                            {
                                "exp_labels": labels,
                                "exp_annotations": _expanded(rule, labels, value),
                            }
                        ],
                    },
                ],
            }
        )
    return {"rule_files": [str(rules_file)], "evaluation_interval": "1m", "tests": tests}


@pytest.fixture
def rules_file(tmp_path: Path) -> Path:
    group = _object("PrometheusRule", "", _render())["spec"]["groups"][0]
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": [group]}))
    return path


def test_promtool_accepts_the_rules(rules_file: Path) -> None:
    done = _promtool("check", "rules", str(rules_file))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout


def test_promtool_fires_each_new_alert_when_it_should_and_not_before(
    rules_file: Path, tmp_path: Path
) -> None:
    tests = tmp_path / "alerts.test.yml"
    tests.write_text(yaml.safe_dump(_test_file(rules_file)))
    done = _promtool("test", "rules", str(tests))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_fails_a_wrong_expectation(rules_file: Path, tmp_path: Path) -> None:
    """The harness can fail: an alert expected where the series say otherwise."""
    wrong = _test_file(rules_file)
    case = wrong["tests"][4]["alert_rule_test"][0]  # LLMRefusing, before it refuses
    case["exp_alerts"] = wrong["tests"][4]["alert_rule_test"][1]["exp_alerts"]
    tests = tmp_path / "wrong.test.yml"
    tests.write_text(yaml.safe_dump(wrong))
    done = _promtool("test", "rules", str(tests))
    assert done.returncode != 0 and "InstancedStreamLLMRefusing" in done.stdout + done.stderr


def test_every_alert_links_its_runbook_section() -> None:
    text = OPERATIONS.read_text()
    heads = {h.strip().lower() for h in re.findall(r"^#{2,4} (InstancedStream\w+)$", text, re.M)}
    for rule in _rules():
        url = rule["annotations"]["runbook_url"]
        assert url == f"docs/operations.md#{rule['alert'].lower()}", url
        assert rule["alert"].lower() in heads, f"docs/operations.md has no section {rule['alert']}"
