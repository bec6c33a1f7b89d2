"""Sections of one markdown report written by different sweeps: `docs/opinfo.md` holds the strict
sweep's part, the error-input sweep's section and one section per other mode; each sweep
rewrites only its own section and keeps the others."""
from __future__ import annotations

HEADING = "## "


def split(text: str) -> tuple[str, dict[str, str]]:
    """(what comes before the first level-2 heading, {heading line: the section's text})."""
    parts = text.split("\n" + HEADING)
    head, sections = parts[0], {}
    if head.startswith(HEADING):
        head, parts = "", [head[len(HEADING):]] + parts[1:]
    else:
        parts = parts[1:]
    for p in parts:
        title = HEADING + p.split("\n", 1)[0]
        sections[title] = (HEADING + p).rstrip("\n") + "\n"
    return head, sections


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return "# OpInfo conformance on tpu\n"


def replace(path: str, heading: str, body: str) -> None:
    """Replace the section titled `heading` (body starts with that heading line) or append it."""
    text = read(path)
    i = text.find("\n" + heading + "\n")
    if i >= 0:
        j = text.find("\n" + HEADING, i + len(heading) + 1)
        text = text[:i + 1] + body.rstrip("\n") + "\n" + ("\n" + text[j + 1:] if j >= 0 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + body
    with open(path, "w") as f:
        f.write(text.rstrip("\n") + "\n")


def kept(path: str, owned_prefixes: tuple[str, ...]) -> str:
    """The sections of the existing report whose headings start with one of `owned_prefixes`
    (another sweep's), to be written back after a sweep rewrites its own part."""
    _, sections = split(read(path))
    return "".join("\n" + s for t, s in sections.items() if t.startswith(owned_prefixes))
