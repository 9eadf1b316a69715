"""Writes the policy benchmarks' traces as CSV (second, rate) under out/bench/traces/; the
traces themselves are testkit.bench.policy_traces.

    python bench/traces/policy_traces.py
"""

import sys

from testkit.bench.policy_traces import main

if __name__ == "__main__":
    sys.exit(main())
