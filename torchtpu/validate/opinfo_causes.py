"""Why an OpInfo that passes in strict does not pass in another mode: one line per OpInfo,
read by the OpInfo sweep's report (`python -m torchtpu.validate ops --mode ...`). An entry
states a diagnosed cause (upstream, by design, or a torchtpu limit with its reason); an OpInfo
missing here shows in the report as "undiagnosed"."""
from __future__ import annotations

UPSTREAM_PINV = ("upstream: complex linalg_pinv under torch.compile; CPU's own torch.compile(backend='aot_eager') gives the same wrong values (5x5 complex64: 4.94 off CPU eager), and tpu compiled equals it exactly; eager tpu matches CPU")

CAUSES: dict[str, dict[str, str]] = {
    "compile": {
        "linalg.pinv": UPSTREAM_PINV,
        "linalg.pinv.singular": UPSTREAM_PINV,
        "pinverse": UPSTREAM_PINV,
    },
    "defer_and_fuse": {},
}
