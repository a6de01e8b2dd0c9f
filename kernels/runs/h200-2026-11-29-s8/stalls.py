"""Warp-stall samples of ncu's source page (SASS, CSV; gzip allowed) summed per warp role of
fp32_bf16x3: the roles' code regions start at their setmaxnreg instructions (S: TRY_ALLOC, O: the larger
DEALLOC, softmax: the smaller), and the mbarrier retry loops sit after the last EXIT. Prints each region's
samples, its top stall reasons and its hottest instructions. Usage: python3 stalls.py sass.csv[.gz]"""
import csv, gzip, sys
from collections import defaultdict

path = sys.argv[1]
rows = list(csv.reader((gzip.open if path.endswith(".gz") else open)(path, "rt")))
hdr, data = rows[1], rows[2:]
col = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
src = lambda r: r[col["Source"]]
deallocs = {i: int(src(r).split()[-1].rstrip(";"), 16) for i, r in enumerate(data) if "USETMAXREG.DEALLOC" in src(r)}
starts = [(i, "S") for i, r in enumerate(data) if "USETMAXREG.TRY_ALLOC" in src(r)]   # (index, role) where a region begins
starts += [(i, "O" if v == max(deallocs.values()) else "softmax") for i, v in deallocs.items()]
starts.sort()
last_exit = max(i for i, r in enumerate(data) if "EXIT" in src(r))
def role(i):
    if i > last_exit:
        return "mbarrier retry loops"
    name = "prologue"
    for j, n in starts:
        if i >= j:
            name = n
    return name
tot, reasons, hot = defaultdict(int), defaultdict(lambda: defaultdict(int)), defaultdict(list)
for i, r in enumerate(data):
    n = int(r[col["Warp Stall Sampling (All Samples)"]] or 0)
    k = role(i)
    tot[k] += n
    hot[k].append((n, src(r)[:72]))
    for c in stall_cols:
        if r[col[c]]:
            reasons[k][c[6:]] += int(float(r[col[c]]))
for k in tot:
    top = sorted(((v, c) for c, v in reasons[k].items()), reverse=True)[:5]
    print(f"{k:<22} {tot[k]:6d} samples   " + ", ".join(f"{c} {v}" for v, c in top))
    for n, s in sorted(hot[k], reverse=True)[:4]:
        print(f"    {n:5d}  {s}")
