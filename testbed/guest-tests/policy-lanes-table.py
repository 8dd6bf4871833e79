"""Tables of policy-lanes.sh runs: per bench, size and policy, each binary's time against
the best single engine of its own rep, and binary B's speed-up over A (A's time / B's,
paired by pass and rep). Usage: python3 policy-lanes-table.py OUTDIR... [--a NAME --b NAME]"""
import glob
import json
import statistics as st
import sys

args = sys.argv[1:]
names = {"a": "A", "b": "B"}
for k in ("a", "b"):
    if f"--{k}" in args:
        i = args.index(f"--{k}")
        names[k] = args[i + 1]
        del args[i : i + 2]
dirs = args


def load(bin_, bench):
    """(size, policy) -> wall times, in (dir, pass, rep) order; module-only as only:module."""
    runs = {}
    for d in dirs:
        for f in sorted(glob.glob(f"{d}/{bin_}-{bench}-[0-9]*/bench.json")):
            for s in json.load(open(f))["sizes"]:
                for p in s["policies"]:
                    name = p["policy"]
                    if name.startswith("only:") and name != "only:cpu":
                        name = "only:module"
                    runs.setdefault((s["size"], name), []).extend(r["wall_s"] for r in p["runs"])
    return runs


def size(n):
    return f"{n // 1024} KiB" if n >= 1024 else f"{n} B"


def cell(r):
    return f"{st.median(r):.2f} ({min(r):.2f}-{max(r):.2f})" if r else "-"


for bench in ("seeds", "devcrypto", "short"):
    a, b = load("hc-a", bench), load("hc-b", bench)
    if not a or not b:
        continue
    sizes = sorted({k[0] for k in a})
    pols = []
    for k in a:
        if k[1] not in pols:
            pols.append(k[1])
    n = len(a[(sizes[0], "only:cpu")])
    print(f"\n### {bench}: {n} runs per cell and binary; A = {names['a']}, B = {names['b']}\n")
    print("best single engine's time over the policy's, same rep (median, range); B's speed-up over A (A's time / B's, paired)\n")
    print("| size | policy | A vs best single | B vs best single | B over A |")
    print("|---|---|---:|---:|---:|")
    for s in sizes:
        for p in pols:
            def vs_best(runs):
                return [min(c, m) / t for t, c, m in zip(runs[(s, p)], runs[(s, "only:cpu")], runs[(s, "only:module")])]
            ra = vs_best(a) if not p.startswith("only:") else []
            rb = vs_best(b) if not p.startswith("only:") else []
            sp = [x / y for x, y in zip(a[(s, p)], b[(s, p)])]
            print(f"| {size(s)} | {p} | {cell(ra)} | {cell(rb)} | {cell(sp)} |")
