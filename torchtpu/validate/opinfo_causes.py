"""Why an OpInfo that passes in strict does not pass in another mode: one line per OpInfo,
read by the OpInfo sweep's report (`python -m torchtpu.validate ops --mode ...`). An entry
states a diagnosed cause (upstream, by design, or a torchtpu limit with its reason); an OpInfo
missing here shows in the report as "undiagnosed"."""
from __future__ import annotations

CAUSES: dict[str, dict[str, str]] = {
    "compile": {},
    "defer_and_fuse": {},
}
