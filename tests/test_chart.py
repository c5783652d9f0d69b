"""The Helm chart, checked without a cluster: its default mm.yaml loads, and every value the templates read
exists in values.yaml (a misspelt `.Values.x` renders as nothing, silently)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from chatops.config import load_config

CHART = Path(__file__).resolve().parent.parent / "charts" / "mm-chatops"


def test_chart_metadata_and_values_parse() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2" and chart["name"] == "mm-chatops"
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["bot"]["port"] == 3000


def test_the_default_config_in_values_is_a_valid_mm_yaml(tmp_path: Path) -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    (tmp_path / "mm.yaml").write_text(values["config"])
    config = load_config(tmp_path / "mm.yaml", environ={})
    assert config.agent.yolo is False


def test_every_value_the_templates_read_is_defined() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    used = set()
    for template in (CHART / "templates").iterdir():
        used |= set(re.findall(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)", template.read_text()))
    assert used, "no .Values references found"
    for path in sorted(used):
        node = values
        for key in path.strip(".").split("."):
            assert isinstance(node, dict) and key in node, f".Values{path} is not in values.yaml"
            node = node[key]


def test_templates_balance_their_actions() -> None:
    for template in (CHART / "templates").iterdir():
        text = template.read_text()
        assert text.count("{{") == text.count("}}"), template.name
        opened = len(re.findall(r"\{\{-?\s*(?:if|with|range|define)\b", text))
        assert opened == len(re.findall(r"\{\{-?\s*end\b", text)), template.name
