"""Every connector property with its kind, default and meaning, as Markdown: the docs' property reference is
made from the specs the config is validated by, so it cannot drift from them."""

from __future__ import annotations

from mongocdc_core.config.specs import PROPERTY_SPECS, PropertySpec

#: The groups in the order the reference lists them, with their headings.
GROUPS = {
    "common": "Connection and capture",
    "signal": "Signals and incremental snapshots",
    "notification": "Notifications",
    "worker": "Kafka Connect worker settings mongocdc reads",
    "mongocdc": "mongocdc's own",
    "advanced": "Advanced",
}


def _cell(text: str) -> str:
    """Table-cell text: pipes escaped, and ``<db>``-style placeholders kept from reading as HTML."""
    return text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")


def _kind(spec: PropertySpec) -> str:
    if spec.allowed:
        return "one of " + ", ".join(f"`{a}`" for a in spec.allowed)
    bounds = [f">= {spec.minimum}" if spec.minimum is not None else "", f"<= {spec.maximum}" if spec.maximum is not None else ""]
    return " ".join([spec.kind, *[b for b in bounds if b]])


def property_reference() -> str:
    """One table per group: property, kind, default, what it does."""
    out: list[str] = []
    for group, heading in GROUPS.items():
        specs = sorted((s for s in PROPERTY_SPECS if s.group == group), key=lambda s: s.name)
        if not specs:
            continue
        out += [f"## {heading}", "", "| property | kind | default | what it does |", "| --- | --- | --- | --- |"]
        out += [f"| `{s.name}` | {_cell(_kind(s))} | {'`' + _cell(s.default) + '`' if s.default not in (None, '') else ''} "
                f"| {_cell(s.doc)} |" for s in specs]
        out.append("")
    return "\n".join(out)
