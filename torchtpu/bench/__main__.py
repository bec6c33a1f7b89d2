import sys

from . import BENCHMARKS, get

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print("usage: python -m torchtpu.bench {" + ",".join(sorted(BENCHMARKS)) + "} [options]")
    sys.exit(0 if len(sys.argv) >= 2 else 2)
sys.exit(get(sys.argv[1])(sys.argv[2:]))
