"""How a compressed plan reads: which links carry which encoding, the bytes saved, the time against exact.

:func:`format_compression` is the text ``topocc compile --compress`` prints under its summary, from the
report's JSON (:meth:`topocc.planner.compiler.compress.CompressReport.to_json`, also what ``--json``
prints); :func:`compression_section` the HTML report's section for an encoded schedule.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from topocc.planner.report.table import format_table, indent
from topocc.planner.units import format_time

__all__ = ["compression_section", "format_compression"]


def _mib(nbytes: float) -> str:
    return f"{nbytes / (1 << 20):.1f} MiB"


def _rows(doc: Mapping[str, Any]) -> list[tuple[str, ...]]:
    return [(c["link_class"], c["encoding"], str(c["links"]), str(c["messages"]), _mib(c["exact_bytes"]),
             _mib(c["wire_bytes"]), f"{100 * c['saved']:.0f}%") for c in doc["encoded_classes"]]


_HEADER = ("link class", "encoding", "links", "messages", "exact bytes", "on the wire", "saved")


def _verdict(doc: Mapping[str, Any]) -> str:
    exact, now = doc["exact_time_s"], doc["predicted_time_s"]
    faster = exact / now if now > 0 else 1.0
    change = f"{faster:.2f}x faster" if faster >= 1 else f"{1 / faster:.2f}x slower"
    line = f"predicted {format_time(now)} against the exact plan's {format_time(exact)} ({change})"
    if faster < 1:
        line += ": encoding on the hosts costs more than the links save here"
    return line


def format_compression(doc: Mapping[str, Any]) -> str:
    """The compression report as text: the rules, a row per link class and encoding, the time, the proof."""
    rules = "; ".join(f"{r['rule']} -> {', '.join(r['classes']) or 'no link'}" for r in doc["rules"])
    lines = [f"  compression:    {doc['policy']} ({rules})",
             f"                  {doc['encoded_messages']} messages encoded, {doc['rounding_copies']} rounding copies "
             f"keep the ranks bitwise equal, {doc['kept_exact']} selected messages sent exact (consistency)",
             f"                  {_verdict(doc)}",
             f"                  {doc['approximate_chunks']} output chunks approximate (over all ranks)"]
    if doc["encoded_classes"]:
        lines.append("")
        lines.append(indent(format_table(_rows(doc), _HEADER, "<<>>>>>")))
    return "\n".join(lines)


def compression_section(doc: Mapping[str, Any]) -> str:
    """The HTML report's section on an encoded schedule (the same figures as :func:`format_compression`)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADER)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in _rows(doc))
    links = "".join(f"<tr><td>{html.escape(entry['link'])}</td><td>{html.escape(entry['encoding'])}</td>"
                    f"<td>{_mib(entry['exact_bytes'])}</td><td>{_mib(entry['wire_bytes'])}</td></tr>"
                    for entry in doc["encoded_links"])
    return (f"<section id='compression'><h2>Compression</h2>"
            f"<p>{doc['encoded_messages']} messages encoded ({html.escape(doc['policy'])}); "
            f"{doc['rounding_copies']} rounding copies keep every rank's result bitwise equal; "
            f"{html.escape(_verdict(doc))}.</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            f"<details><summary>per link</summary><table><thead><tr><th>link</th><th>encoding</th>"
            f"<th>exact bytes</th><th>on the wire</th></tr></thead><tbody>{links}</tbody></table></details>"
            f"</section>")
