"""JUnit XML for CI dashboards: one testcase per run and per gate check, the numbers as properties."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any, Sequence

from repro.report.model import ReportModel, RunView, clip

_NOT_XML = re.compile("[^\u0009\u000a\u000d\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(value: object) -> str:
    """Text XML 1.0 can carry, bounded in length: control characters from untrusted names or lines are replaced."""
    return _NOT_XML.sub("\ufffd", clip(value))


def add_properties(parent: ET.Element, values: dict[str, Any]) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in values.items():
        ET.SubElement(props, "property", name=xml_text(name), value=xml_text(value))


def _outcome(case: ET.Element, status: str, message: str) -> None:
    message = xml_text(message)
    if status in ("fail", "corrupt"):
        ET.SubElement(case, "failure", message=message, type=status).text = message
    elif status == "inconclusive":
        ET.SubElement(case, "skipped", message=message)


def _run_case(run: RunView) -> ET.Element:
    case = ET.Element("testcase", classname="repro.run", name=xml_text(run.name), time=f"{_duration(run):.3f}")
    c = run.counts
    add_properties(case, {
        "verdict": run.verdict.kind, "sessions": c.total, "clean": c.clean, "corrupt": c.corrupt,
        "timeout": c.timeout, "error": c.error, "interrupted": c.interrupted, "wedged": c.wedged,
        "corruption_rate": run.rate.estimate, "ci_low": run.rate.low, "ci_high": run.rate.high,
        "upper_bound": run.upper, "confidence": run.confidence,
    })
    _outcome(case, run.verdict.kind, run.verdict.headline)
    return case


def _duration(run: RunView) -> float:
    if run.run.summary is not None:
        return run.run.summary.duration_s
    return max((s.end_s for s in run.run.sessions), default=0.0)


def gate_cases(run_name: str, checks: Sequence[dict[str, Any]]) -> list[ET.Element]:
    """Testcases for gate checks in their stored form (GateResult.as_record()['checks'])."""
    cases = []
    for check in checks:
        case = ET.Element("testcase", classname=xml_text(f"repro.gate.{run_name}"),
                          name=xml_text(check.get("name", "check")))
        numbers = check.get("numbers")
        add_properties(case, numbers if isinstance(numbers, dict) else {})
        _outcome(case, str(check.get("status")), str(check.get("line", "")))
        cases.append(case)
    return cases


def junit_xml(cases: Sequence[ET.Element], *, suite: str = "repro") -> str:
    root = ET.Element("testsuites")
    tests = ET.SubElement(root, "testsuite", name=suite, tests=str(len(cases)),
                          failures=str(sum(1 for c in cases if c.find("failure") is not None)),
                          skipped=str(sum(1 for c in cases if c.find("skipped") is not None)), errors="0")
    tests.extend(cases)
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def render_junit(model: ReportModel) -> str:
    cases: list[ET.Element] = []
    for run in model.runs:
        cases.append(_run_case(run))
        checks = (run.gate or {}).get("checks")
        if isinstance(checks, list):
            cases.extend(gate_cases(run.name, [c for c in checks if isinstance(c, dict)]))
    return junit_xml(cases)
