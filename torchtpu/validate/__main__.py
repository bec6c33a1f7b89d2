import sys

from . import VALIDATORS, get

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print("usage: python -m torchtpu.validate {" + ",".join(sorted(VALIDATORS)) + "} [options]")
    sys.exit(0 if len(sys.argv) >= 2 else 2)
sys.exit(get(sys.argv[1])(sys.argv[2:]))
